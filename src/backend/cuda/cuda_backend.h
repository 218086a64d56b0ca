// The CUDA backend (Hopper first, sm_90a): the Backend of backend.h on one GPU. Plain C++ —
// callers never see a CUDA header.
//
// Start-up (make_cuda_backend) is the memory plan: upload weights (fused QKV and gate/up), set
// up activation buffers for max_num_batched_tokens and run one maximal dummy batch to measure
// the activation peak, capture one CUDA graph per decode batch-size bucket (unless
// enforce_eager), then give the KV pool gpu_memory_utilization x total minus everything in use
// — one arena for all layers. fp8_e4m3 scales come from a fixed 256-token calibration batch
// on the device, as the CPU backend does it, unless given.
//
// Per step: the batch's metadata goes to the device in one copy; a pure decode batch runs as the
// captured graph of the smallest bucket that holds it, anything else eagerly; logits of the
// requested rows come back as float32. A batch beyond the planned limits is InvalidArgument.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace lmserve::backend {

struct CudaBackendOptions {
  int device = 0;
  // Tensor parallelism (model/shard.h, cuda/comm/tp_group.h): rank r on GPU devices[r] (empty:
  // device + r), a host thread each; the KV cache has the blocks every rank can hold. The engine
  // sees one backend.
  int tensor_parallel_size = 1;
  std::vector<int> devices;
  bool nccl = false;  // the ranks' collectives through NCCL (else over peer pointers: cuda/comm/tp_group.h)
  KvDtype kv_dtype = KvDtype::kBFloat16;
  int block_size = 16;
  std::int64_t num_blocks = 0;  // 0: what the memory plan leaves
  double gpu_memory_utilization = 0.9;
  std::int64_t max_num_batched_tokens = 8192;  // tokens of the largest step
  std::int64_t max_num_seqs = 256;             // sequences of the largest step
  std::int64_t max_model_len = 0;              // 0: the config's max_position_embeddings
  bool enforce_eager = false;                  // no CUDA graphs
  // Rows the engine lets the backend decide (Batch::sample_rows) are sampled on the GPU and
  // only their tokens cross to the host; off: every row's logits come back.
  bool device_sampling = true;
  std::vector<float> k_scales, v_scales;       // fp8_e4m3, [layer * num_kv_heads + head]
  // Measurement (bench's --step-report and --profile-step): a table of where forward() spends
  // its time, on stderr when the backend goes; and one step, "N", "decode:N" or "prefill:N" (the
  // N-th forward of any kind, of one-token items only, or of the others), bracketed by
  // cudaProfilerStart/Stop for `ncu --profile-from-start off`. Empty: none.
  bool step_report = false;
  std::string profile_step;
  // The GEMM tuning cache's directory (backend/device/tuning_cache.h); "": every plan is timed.
  std::string tuning_cache;
};

// Unavailable when this build has no CUDA or no GPU can be used; InvalidArgument for options
// or models the kernels do not support (named); ResourceExhausted when the plan leaves no KV.
Result<std::unique_ptr<Backend>> make_cuda_backend(std::shared_ptr<const model::ModelWeights> weights, const CudaBackendOptions& options);

}  // namespace lmserve::backend
