// The CPU reference backend: float32 arithmetic over weights in their stored dtype, a paged KV
// cache in float32 / bfloat16 / float16 / fp8 (e5m2, or e4m3 with per-layer, per-KV-head
// scales), multi-threaded over output features and attention heads. Every other backend is
// compared with it.
#pragma once

#include <memory>
#include <vector>

#include "backend/backend.h"

namespace lmserve::backend {

struct CpuBackendOptions {
  KvCacheConfig kv;
  int threads = 0;  // 0: all cores (shared out among the ranks)
  // Tensor parallelism (model/shard.h): this many ranks, each a thread with its share of the
  // weights and KV heads, the partial sums added by an in-memory all-reduce. The same arithmetic
  // the GPU ranks do over NCCL; logits agree with TP 1 to float32 rounding (the sums of the
  // row-parallel products are split and added in another order).
  int tensor_parallel_size = 1;
  // fp8_e4m3 only: dequantised = stored * scale, [layer * num_kv_heads + head]. Empty: found
  // at start-up from the K/V absolute maxima of a fixed 256-token calibration batch (x2 head
  // room), so they do not depend on the requests served.
  std::vector<float> k_scales, v_scales;
};

Result<std::unique_ptr<Backend>> make_cpu_backend(std::shared_ptr<const model::ModelWeights> weights,
                                                  const CpuBackendOptions& options);

}  // namespace lmserve::backend
