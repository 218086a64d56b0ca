#include "backend/backend.h"

namespace lmserve::backend {

Result<KvDtype> parse_kv_dtype(std::string_view n, model::DType model_dtype) {
  if (n == "auto") {
    switch (model_dtype) {
      case model::DType::kF32: return KvDtype::kFloat32;
      case model::DType::kF16: return KvDtype::kFloat16;
      case model::DType::kBF16: return KvDtype::kBFloat16;
    }
  }
  if (n == "float32" || n == "fp32") return KvDtype::kFloat32;
  if (n == "bfloat16" || n == "bf16") return KvDtype::kBFloat16;
  if (n == "float16" || n == "fp16" || n == "half") return KvDtype::kFloat16;
  if (n == "fp8" || n == "fp8_e5m2") return KvDtype::kFp8E5M2;
  if (n == "fp8_e4m3") return KvDtype::kFp8E4M3;
  return error(StatusCode::kInvalidArgument, "unknown KV cache dtype '" + std::string(n) +
                                                 "' (auto, float32, bfloat16, float16, fp8_e5m2, fp8_e4m3)");
}

std::string_view kv_dtype_name(KvDtype d) {
  switch (d) {
    case KvDtype::kFloat32: return "float32";
    case KvDtype::kBFloat16: return "bfloat16";
    case KvDtype::kFloat16: return "float16";
    case KvDtype::kFp8E5M2: return "fp8_e5m2";
    case KvDtype::kFp8E4M3: return "fp8_e4m3";
  }
  return "?";
}

int kv_dtype_bytes(KvDtype d) {
  switch (d) {
    case KvDtype::kFloat32: return 4;
    case KvDtype::kBFloat16:
    case KvDtype::kFloat16: return 2;
    default: return 1;
  }
}

std::uint64_t kv_block_bytes(const model::ModelConfig& c, KvDtype dtype, int block_size) {
  return static_cast<std::uint64_t>(2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * kv_dtype_bytes(dtype));
}

}  // namespace lmserve::backend
