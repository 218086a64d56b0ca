// A model's architecture, read from a Hugging Face config.json (+ generation_config.json).
// Supported: LlamaForCausalLM (rope_scaling "llama3" and "linear"), MistralForCausalLM,
// Qwen2ForCausalLM (q/k/v bias), Qwen3ForCausalLM (q/k RMSNorm); tied embeddings. Both the
// hub layout (rope_theta + rope_scaling, torch_dtype) and transformers 5's (rope_parameters,
// dtype) are read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace lmserve::model {

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3 };
// kF8E4M3: FP8 weights only (a linear projection quantized with per-channel or per-tensor
// scales, Tensor::scales); never an activation dtype.
enum class DType { kF32, kF16, kBF16, kF8E4M3 };

std::string_view dtype_name(DType d);          // "float32", "float16", "bfloat16", "float8_e4m3fn"
std::string_view safetensors_dtype(DType d);   // "F32", "F16", "BF16", "F8_E4M3"
int dtype_bytes(DType d);
// "auto" | "float32" | "bfloat16" | "float16" (also "fp32", "bf16", "fp16", "half", "float").
Result<DType> parse_dtype(std::string_view name);

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string architecture_name;  // as written in config.json
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2
  bool qk_norm = false;   // Qwen3
  DType dtype = DType::kBF16;  // torch_dtype / dtype
  std::vector<std::int32_t> eos_token_ids;  // config + generation_config, deduplicated
  // The checkpoint's linear projections are FP8 (config.json's quantization_config:
  // compressed-tensors float-quantized, 8-bit float weights, dynamic per-token activations).
  bool fp8_checkpoint = false;
  std::int32_t bos_token_id = -1;

  // Elements of each weight tensor, for the capacity planner and the memory plan.
  std::int64_t num_parameters() const;
  // Of them, the linear projections' (q, k, v, o, gate, up, down: what FP8 quantizes), and their
  // output channels (one FP8 scale each).
  std::int64_t num_projection_parameters() const;
  std::int64_t num_projection_rows() const;
};

// InvalidArgument naming the field for anything missing, inconsistent (heads not dividing
// hidden, kv heads not dividing heads) or unsupported (architecture, rope type, activation).
Result<ModelConfig> parse_config(std::string_view config_json, std::string_view generation_config_json = {});
Result<ModelConfig> load_config(const std::filesystem::path& model_dir);

}  // namespace lmserve::model
