// The device boundary: a Backend runs the model's forward pass over one flattened batch and
// owns the paged KV cache. Nothing here includes device headers; the CPU backend
// (backend/cpu) is the reference every other backend is compared with.
//
// Batch layout (what the engine's scheduler produced for one step):
//  - tokens, positions, slot_mapping: one entry per new token, sequences back to back. The
//    K/V of token i is written to cache slot slot_mapping[i] = block * block_size + offset.
//  - seqs: for each sequence, where its tokens start in the flattened arrays, how many there
//    are (1 for a decode, a chunk for prefill), the sequence length once they are added
//    (context_len, including tokens already in the cache) and its block table.
//  - logits_indices: flattened token indices whose next-token logits are wanted (usually the
//    last token of each sequence that will sample).
// Attention for a token at position p reads positions 0..p of its own sequence from the
// cache, so chunked prefill and prefix-cache hits need nothing special.
//
// Threading: one engine thread calls forward(); a backend is not re-entrant.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/dtypes.h"
#include "common/status.h"
#include "model/weights.h"

namespace lmserve::backend {

// "auto" (the model's dtype; float32 for float32 models), "float32", "bfloat16", "float16",
// "fp8" / "fp8_e5m2", "fp8_e4m3".
Result<KvDtype> parse_kv_dtype(std::string_view name, model::DType model_dtype);
std::string_view kv_dtype_name(KvDtype d);
int kv_dtype_bytes(KvDtype d);

// One block's move between the device KV cache and the host swap space (Backend::swap_blocks):
// the KV of every layer, K and V, of device block `device` and host block `host`.
struct BlockCopy {
  std::int32_t device = 0;
  std::int32_t host = 0;
};

struct KvCacheConfig {
  KvDtype dtype = KvDtype::kFloat32;
  int block_size = 16;
  std::int64_t num_blocks = 0;
};

struct SeqBatch {
  std::int32_t query_start = 0;  // first token in the flattened arrays
  std::int32_t query_len = 0;    // new tokens this step
  std::int32_t context_len = 0;  // tokens in the sequence after this step's tokens
  std::span<const std::int32_t> block_table;
};

// How a backend that samples on the device may decide one logits row (Batch::sample_rows).
// kGreedy: the argmax (ties: the lowest id). kRandom: a draw from softmax(logits /
// temperature) restricted to the top_k largest logits (ties with the k-th are kept, as vLLM
// does), then to the smallest set of largest logits whose probability mass reaches top_p
// (ties kept), then to the tokens whose probability is at least min_p x the largest's. The
// draw uses a counter-based generator at (key, counter), so a request's tokens do not depend
// on what else is in the batch. kHost: the caller samples this row from its logits.
struct RowSampling {
  enum class Mode : std::uint8_t { kHost, kGreedy, kRandom };
  Mode mode = Mode::kHost;
  float temperature = 1.0f;
  float top_p = 1.0f;
  float min_p = 0.0f;
  std::int32_t top_k = 0;     // <= 0: off
  std::uint64_t key = 0;      // the request's random stream
  std::uint32_t counter = 0;  // which draw of it (the index of the token in the output)
  // Constrained decoding (only where Backend::supports_masks(), with mode kGreedy or kRandom):
  // the token is drawn as above from the logits with every token outside the row's mask set
  // to -infinity; the mask comes after launch(), through supply_masks().
  bool masked = false;
};

struct Batch {
  std::span<const std::int32_t> tokens;
  std::span<const std::int32_t> positions;
  std::span<const std::int64_t> slot_mapping;
  std::span<const SeqBatch> seqs;
  std::span<const std::int32_t> logits_indices;
  // Optional, one entry per logits row. A backend that samples on the device writes the token
  // of every row whose mode is not kHost to sampled_tokens[k]; if no row is kHost it may leave
  // the logits unspecified (only tokens cross to the host). The caller fills sampled_tokens
  // with -1; a -1 left there means "sample from the logits yourself". Backends without device
  // sampling ignore both.
  std::span<const RowSampling> sample_rows;
  std::span<std::int32_t> sampled_tokens;
};

// A token that the step in flight samples, written into the next step's prepared batch before
// it starts (Backend::launch): tokens[index] = token.
struct TokenPatch {
  std::int32_t index = 0;
  std::int32_t token = 0;
};

// The start-up memory plan. On a GPU: weights, the activation peak of a maximal batch, CUDA
// graph pools, and the KV pool sized from what gpu_memory_utilization leaves.
struct MemoryInfo {
  std::uint64_t total_bytes = 0;   // the device's memory (0 on the CPU)
  std::uint64_t used_bytes = 0;    // by this backend
  std::uint64_t kv_cache_bytes = 0;
  std::uint64_t weight_bytes = 0;
  std::uint64_t activation_bytes = 0;
  std::uint64_t graph_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string_view name() const = 0;
  virtual const model::ModelConfig& config() const = 0;
  virtual const KvCacheConfig& kv_config() const = 0;

  // Runs the batch; writes logits_indices.size() x vocab_size floats to `logits`.
  // InvalidArgument for a malformed batch (ids out of range, slots outside the cache,
  // positions past the cache); the cache is unchanged then.
  virtual Status forward(const Batch& batch, std::span<float> logits) = 0;

  // A step in three calls, so that the engine plans the next step while the device runs this
  // one: prepare() checks and stages a batch and where its logits go; launch() starts the
  // prepared batch once `patches` are written into its tokens (tokens the step before sampled:
  // the caller has written them into batch.tokens too, so a backend that reads the caller's
  // spans at launch needs no patch; one that staged a copy applies them); wait() returns when
  // the launched step is done, its logits and sampled_tokens written. Order: prepare, launch,
  // wait. While a launched step is not yet waited for, the next batch may be prepared and
  // swap_blocks called; they run after it. The spans a prepared batch names stay valid and
  // unchanged (but for the patches, written before launch()) until its wait() returns. A
  // malformed batch gets forward()'s error from prepare() or, with the defaults, which run
  // forward() inside launch(), from wait().
  virtual Status prepare(const Batch& batch, std::span<float> logits);
  virtual Status launch(std::span<const TokenPatch> patches);
  virtual Status wait();
  // True when launch() returns before the step is done (the engine's host work then overlaps
  // the device's) and every logits row whose RowSampling mode is not kHost gets its token in
  // sampled_tokens. The engine plans a step ahead only on such a backend.
  virtual bool asynchronous() const { return false; }

  // Constrained decoding: whether rows may be sampled under a mask (RowSampling::masked).
  virtual bool supports_masks() const { return false; }
  // The masks of a launched step's masked rows, in row order: mask_words(vocab_size) 64-bit
  // words each, bit t % 64 of word t / 64 set when token t may come. Called once per step with
  // masked rows, after launch() and before wait() (the host computes them while the device
  // runs the step); the spans need live only until the call returns. InvalidArgument when the
  // count does not match the step's masked rows.
  virtual Status supply_masks(std::span<const std::uint64_t> masks) {
    (void)masks;
    return Status(StatusCode::kUnimplemented, "this backend does not sample under masks");
  }

  // Bytes of one KV block across all layers (K and V).
  virtual std::uint64_t kv_block_bytes() const = 0;
  virtual MemoryInfo memory() const = 0;

  // Host swap space: the KV of a preempted request can wait in host memory instead of being
  // computed again when it resumes. set_host_blocks(n) lets swap_blocks address host blocks
  // 0..n-1 of kv_block_bytes() each; memory is taken as blocks are first used, in chunks, so
  // n costs nothing until preemption. Unimplemented (for n > 0) from a backend without it.
  virtual Status set_host_blocks(std::int64_t n) {
    return n == 0 ? Status::ok() : Status(StatusCode::kUnimplemented, "this backend has no host swap space");
  }
  // Copies whole blocks: every to_host pair (device -> host) first, then every to_device pair
  // (host -> device). The copies are ordered after the previous forward() and before the next,
  // so a device block given up by a swap-out may be written by the next forward, and a host
  // block read by a swap-in may take a later swap-out. InvalidArgument for a block id out of
  // range, ResourceExhausted when host memory for the host blocks cannot be had; nothing is
  // copied then.
  virtual Status swap_blocks(std::span<const BlockCopy> to_host, std::span<const BlockCopy> to_device) {
    if (to_host.empty() && to_device.empty()) return Status::ok();
    return Status(StatusCode::kUnimplemented, "this backend has no host swap space");
  }
  // Host swap memory taken so far (bytes).
  virtual std::uint64_t host_swap_bytes() const { return 0; }

  // Of the time forward() has taken so far, the part a device backend did not spend waiting for
  // the device: checking and staging batches, launching their work (a graph step's device idles
  // meanwhile; an eager step's launches overlap the kernels before them). 0 for a host backend.
  virtual double staging_seconds_total() const { return 0.0; }

 private:
  // The defaults of prepare / launch / wait.
  Batch prepared_;
  std::span<float> prepared_logits_;
  Status launched_;
  bool has_prepared_ = false;
};

// 64-bit words of one token mask over a vocabulary of `vocab` tokens.
inline std::size_t mask_words(std::int64_t vocab) { return static_cast<std::size_t>((vocab + 63) / 64); }

// Bytes one KV block needs for `config` with `dtype` and `block_size` (all layers, K and V), for
// `kv_heads` KV heads (0: the model's; a tensor-parallel rank's share: model/shard.h).
std::uint64_t kv_block_bytes(const model::ModelConfig& config, KvDtype dtype, int block_size, std::int64_t kv_heads = 0);

// The checks every backend makes before touching the cache: InvalidArgument ("batch: ...") for
// ids, slots, blocks, positions or logits rows out of range, or a logits buffer of the wrong size.
Status validate_batch(const Batch& batch, const model::ModelConfig& config, const KvCacheConfig& kv, std::size_t logits_size);

// The checks of Backend::swap_blocks: InvalidArgument ("swap: ...") for a device block outside
// [0, num_blocks) or a host block outside [0, host_blocks).
Status validate_swap(std::span<const BlockCopy> to_host, std::span<const BlockCopy> to_device, std::int64_t num_blocks,
                     std::int64_t host_blocks);

// Rotary inverse frequencies (head_dim / 2 of them) as transformers computes them in float32,
// with linear or llama3 scaling. Every backend rotates with these same numbers.
std::vector<float> rope_inv_freq(const model::ModelConfig& config);

}  // namespace lmserve::backend
