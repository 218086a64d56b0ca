// The model on one GPU, behind a plain C++17 interface (no CUDA types, no C++20), so that
// backend/cuda/cuda_backend.cpp — a g++ file — can drive it. Errors are returned as strings
// (empty = success); cuda_backend.cpp turns them into Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/dtypes.h"

namespace lmserve::backend {
class AlgoCache;
}

namespace lmserve::cuda {

class TpGroup;

// How the device decides one logits row (backend.h, RowSampling): mode 0 leaves it to the
// host (token -1), 1 takes the argmax (ties: the lowest id), 2 draws from softmax(logits /
// temperature) restricted to the top_k largest logits (ties with the k-th kept), then to the
// smallest set of largest logits whose mass reaches top_p (ties kept), then to those with
// probability >= min_p x the largest; the draw is a Gumbel-max over Philox4x32-10 numbers
// keyed by `key` at `counter`, so a row's token depends on nothing else in the batch.
struct SampleSpec {
  float temperature = 1.0f, top_p = 1.0f, min_p = 0.0f;
  std::int32_t top_k = 0;  // <= 0: off
  std::uint32_t key_lo = 0, key_hi = 0, counter = 0;
  std::int16_t mode = 0;
  // Constrained decoding (backend.h, RowSampling::masked): the row is decided again, under its
  // mask, once DeviceModel::supply_masks gives it.
  std::int16_t masked = 0;
};
static_assert(sizeof(SampleSpec) == 32, "SampleSpec: 32 bytes, as the staging layout and the kernels read it");

struct ModelDims {
  std::int64_t vocab = 0, hidden = 0, intermediate = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float eps = 1e-6f;
  backend::ActDtype act = backend::ActDtype::kFloat32;  // weights and GEMM inputs
  bool qkv_bias = false, qk_norm = false, tied = false;
  // The linear projections (kQkv, kO, kGateUp, kDown) in e4m3 with a float32 scale per output
  // row (the k*Scale slots); the activations quantized per token before each (Gemm, "FP8 weights").
  bool fp8_weights = false;
  std::vector<float> inv_freq;
  // Tensor parallelism (model/shard.h; create_device_model's group): heads, kv_heads and
  // intermediate are the rank's share, `vocab` stays the whole vocabulary (the logits' width), and
  // rank k's rows of the embedding and LM head are vocab_ranges[k] .. vocab_ranges[k + 1] - 1.
  // Empty: one rank, every row.
  std::vector<std::int64_t> vocab_ranges;
};

// Where set_weight puts a tensor. Fused: kQkv = [q; k; v] rows, kGateUp = [gate; up] rows.
enum class Slot { kEmbed, kFinalNorm, kLmHead, kInputNorm, kPostNorm, kQkv, kQkvBias, kQNorm, kKNorm, kO, kGateUp, kDown,
                  kQkvScale, kOScale, kGateUpScale, kDownScale };

struct PlanOptions {
  backend::KvDtype kv = backend::KvDtype::kFloat32;
  int block_size = 16;
  std::int64_t num_blocks = 0;
  double gpu_memory_utilization = 0.9;
  std::int64_t max_tokens = 8192, max_seqs = 256, max_model_len = 0;
  bool enforce_eager = false;
  bool device_sampling = false;  // rows with a SampleSpec mode > 0 are decided on the device
  std::vector<float> k_scales, v_scales;
  std::vector<std::int32_t> calibration_tokens;  // fp8_e4m3 without scales
  // Measurement, set by `bench` (backend/cuda/cuda_backend.h, CudaBackendOptions): the step
  // report, and the profiled step (kind 0 any, 1 decode, 2 prefill; its n-th forward; 0: none).
  bool step_report = false;
  int profile_step_kind = 0, profile_step = 0;
  // While plan() runs: timed GEMM algorithms come from and go to this cache (Gemm::set_algo_cache).
  backend::AlgoCache* algo_cache = nullptr;
};

// What the GEMM tuning cache keys its file by (backend/device/tuning_cache.h).
struct DeviceIdentity {
  std::string name;
  int multiprocessors = 0, compute_capability = 0, driver = 0, runtime = 0;
  std::size_t cublaslt = 0;
};
DeviceIdentity device_identity(int device);

struct MemoryPlan {
  std::uint64_t total = 0, weights = 0, activations = 0, graphs = 0, kv = 0, other = 0;
  std::int64_t num_blocks = 0;
  int graph_buckets = 0;
  std::vector<float> k_scales, v_scales;  // as used (fp8_e4m3)
};

struct StepInput {
  const std::int32_t* tokens = nullptr;
  const std::int32_t* positions = nullptr;
  const std::int64_t* slots = nullptr;
  int num_tokens = 0;
  const std::int32_t* seq_start = nullptr;  // per sequence
  const std::int32_t* seq_len = nullptr;
  const std::int32_t* seq_context = nullptr;
  const std::int32_t* const* seq_table = nullptr;
  int num_seqs = 0;
  const std::int32_t* logits_rows = nullptr;
  int num_rows = 0;
  float* logits = nullptr;  // host, num_rows x vocab
  // Optional, one per row (backend.h, Batch::sample_rows): with device_sampling on, rows of
  // mode > 0 get their token in sampled_tokens; logits come back only if some row has mode 0
  // (else they are left unspecified). Without device_sampling sampled_tokens is untouched.
  const SampleSpec* sample = nullptr;
  std::int32_t* sampled_tokens = nullptr;
};

struct StepTimes {
  double host_seconds = 0;    // staging the inputs and launching
  double stage_seconds = 0;   // of it, laying out the metadata (before the first launch)
  double device_seconds = 0;  // waiting for the device and copying logits back
  bool graph = false;
};

class DeviceModel {
 public:
  virtual ~DeviceModel() = default;
  // Copies `bytes` to `slot` of `layer`, starting at element `offset`: in the act dtype, or with
  // fp8_weights e4m3 bytes for the projections and float32 for their scales.
  virtual std::string set_weight(Slot slot, std::int64_t layer, std::int64_t offset, const void* host, std::size_t bytes) = 0;
  virtual std::string plan(const PlanOptions& options, MemoryPlan* out) = 0;
  // A step in three calls (backend.h, Backend::prepare / launch / wait): prepare stages `in`,
  // whose arrays stay valid until finish(), and may run while the step before is in flight;
  // launch writes tokens[patch_index[i]] = patch_token[i] into the staged copy and starts the
  // step after the one before; finish waits for it and writes its sampled_tokens and logits.
  virtual std::string prepare(const StepInput& in) = 0;
  virtual std::string launch(const std::int32_t* patch_index, const std::int32_t* patch_token, int patches) = 0;
  virtual std::string finish(StepTimes* times) = 0;
  // The masks of the launched step's masked rows (SampleSpec::masked with mode > 0), in row
  // order, (vocab + 63) / 64 words each: the rows' logits outside their masks become -infinity
  // and the rows are sampled again, after the step's own work and before its results come
  // back. A step with masked rows needs this call between launch and finish.
  virtual std::string supply_masks(const std::uint64_t* masks, int n) = 0;
  // One step start to end, with no patches.
  std::string forward(const StepInput& in, StepTimes* times) {
    if (std::string e = prepare(in); !e.empty()) return e;
    if (std::string e = launch(nullptr, nullptr, 0); !e.empty()) return e;
    return finish(times);
  }
  // Copies n whole KV blocks between the cache and host memory from alloc_mapped_host(), on the
  // model's stream (after the steps before, before the next): to_host, block blocks[i] to
  // host[i], else host[i] to block blocks[i]. A host block holds K then V of layer 0, then of
  // layer 1, ...
  virtual std::string swap(const std::int32_t* blocks, char* const* host, int n, bool to_host) = 0;
};

// Pinned host memory that kernels can read and write (the swap space); nullptr on failure.
void* alloc_mapped_host(std::size_t bytes);
void free_mapped_host(void* p);

// Selects `device`, allocates the weight buffers for `dims`. With a tensor-parallel group
// (comm/tp_group.h) the model is rank `rank` of it: its o_proj and down products and its
// embedding rows are all-reduced over the group, its logits gathered on rank 0, and only rank 0
// samples and hands results back (the others' finish() only waits). Every rank's plan() and
// steps must run at once, each on its own host thread.
std::unique_ptr<DeviceModel> create_device_model(int device, const ModelDims& dims, std::string* error,
                                                 std::shared_ptr<TpGroup> group = nullptr, int rank = 0);

bool kernels_support(std::int64_t head_dim, std::int64_t group);

}  // namespace lmserve::cuda
