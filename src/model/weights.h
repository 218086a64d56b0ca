// A model's weights, checked against its architecture: every tensor the architecture needs
// is present with the right shape and a supported dtype (F32, F16, BF16; F8_E4M3 for the linear
// projections of an FP8 checkpoint, with their weight_scale tensors), nothing is left over.
// Tensors stay in their stored dtype, memory-mapped, unless a --dtype conversion was asked for.
// With quantization "fp8" every linear projection (q, k, v, o, gate, up, down; not the
// embedding or the LM head, as vLLM's fp8) is quantized at load to e4m3 with one scale per
// output channel: scale = max|row| / 448, element = e4m3(w / scale) rounded to nearest even and
// saturated. Immutable after loading; share one instance across threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/config.h"
#include "model/safetensors.h"

namespace lmserve::model {

struct Tensor {
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  const void* data = nullptr;
  std::string name;

  // kF8E4M3: element (r, c) is e4m3(data[r, c]) x scales[r] (x scales[0] when num_scales is 1).
  const float* scales = nullptr;
  std::int64_t num_scales = 0;

  std::int64_t numel() const;
  // Bytes of the elements and their scales.
  std::uint64_t bytes() const;
  // Element i as float (dequantized).
  float at(std::int64_t i) const;
  // Converts `count` elements starting at `offset` into `out`.
  void to_float(std::int64_t offset, std::int64_t count, float* out) const;
};

struct LayerWeights {
  Tensor input_norm, post_attention_norm;
  Tensor q_proj, k_proj, v_proj, o_proj;
  Tensor q_bias, k_bias, v_bias;  // Qwen2 (empty otherwise)
  Tensor q_norm, k_norm;          // Qwen3 (empty otherwise)
  Tensor gate_proj, up_proj, down_proj;
};

struct LoadOptions {
  enum class Format { kAuto, kSafetensors, kDummy };
  Format format = Format::kAuto;
  std::string dtype = "auto";  // auto = as stored (dummy: config.json's torch_dtype)
  std::uint64_t dummy_seed = 0;
  std::string quantization = "none";  // none | fp8 (the linear projections to e4m3 at load)
};

class ModelWeights {
 public:
  static Result<std::shared_ptr<const ModelWeights>> load(const std::filesystem::path& model_dir, const LoadOptions& options);
  // From a parsed config and an open set of files (tests build these in memory).
  static Result<std::shared_ptr<const ModelWeights>> from_files(ModelConfig config, WeightFiles files, const std::string& dtype,
                                                                const std::string& quantization = "none");
  static Result<std::shared_ptr<const ModelWeights>> dummy(ModelConfig config, const std::string& dtype, std::uint64_t seed,
                                                           const std::string& quantization = "none");

  const ModelConfig& config() const { return config_; }
  const Tensor& embed_tokens() const { return embed_; }
  const Tensor& final_norm() const { return norm_; }
  const Tensor& lm_head() const { return tied_ ? embed_ : lm_head_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  // The activation dtype: the embedding's, the norms' (FP8 projections aside).
  DType dtype() const { return dtype_; }
  // Whether the linear projections are FP8 (an FP8 checkpoint, or quantized at load).
  bool fp8() const { return fp8_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  Status bind(const std::function<Result<Tensor>(const std::string&, std::vector<std::int64_t>)>& get);
  // quantization "fp8": every projection not FP8 yet to e4m3 with per-channel scales.
  Status quantize(const std::string& quantization);

  ModelConfig config_;
  WeightFiles files_;
  std::vector<std::shared_ptr<void>> owned_;  // the buffers of converted, quantized or dummy tensors
  Tensor embed_, norm_, lm_head_;
  bool tied_ = false;
  std::vector<LayerWeights> layers_;
  DType dtype_ = DType::kBF16;
  bool fp8_ = false;
  std::uint64_t bytes_ = 0;
  std::vector<std::shared_ptr<std::vector<float>>> scales_;
};

}  // namespace lmserve::model
