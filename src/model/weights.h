// A model's weights, checked against its architecture: every tensor the architecture needs
// is present with the right shape and a supported dtype (F32, F16, BF16), nothing is left
// over. Tensors stay in their stored dtype, memory-mapped, unless a --dtype conversion was
// asked for. Immutable after loading; share one instance across threads.
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

  std::int64_t numel() const;
  // Element i as float.
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
};

class ModelWeights {
 public:
  static Result<std::shared_ptr<const ModelWeights>> load(const std::filesystem::path& model_dir, const LoadOptions& options);
  // From a parsed config and an open set of files (tests build these in memory).
  static Result<std::shared_ptr<const ModelWeights>> from_files(ModelConfig config, WeightFiles files, const std::string& dtype);
  static Result<std::shared_ptr<const ModelWeights>> dummy(ModelConfig config, const std::string& dtype, std::uint64_t seed);

  const ModelConfig& config() const { return config_; }
  const Tensor& embed_tokens() const { return embed_; }
  const Tensor& final_norm() const { return norm_; }
  const Tensor& lm_head() const { return tied_ ? embed_ : lm_head_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  DType dtype() const { return dtype_; }
  std::uint64_t bytes() const { return bytes_; }

 private:
  Status bind(const std::function<Result<Tensor>(const std::string&, std::vector<std::int64_t>)>& get);

  ModelConfig config_;
  WeightFiles files_;
  std::vector<std::shared_ptr<std::vector<std::byte>>> owned_;  // converted or dummy tensors
  Tensor embed_, norm_, lm_head_;
  bool tied_ = false;
  std::vector<LayerWeights> layers_;
  DType dtype_ = DType::kBF16;
  std::uint64_t bytes_ = 0;
};

}  // namespace lmserve::model
