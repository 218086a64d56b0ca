// Launchers for lmserve's CUDA kernels (kernels.cu, attention.cu, sample.cu). CUDA-side header: included only by files
// in backend/cuda. Conventions: the residual stream and every GEMM output are float32; GEMM
// inputs (normalised activations, attention output, SiLU output) are in the model's dtype
// (`Act`); K/V live in the paged cache in `Kv` with the layout of backend/cpu/cpu_ops.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/model/device_model.h"

namespace lmserve::cuda {

enum class Act { kF32, kBF16, kF16 };
enum class Kv { kF32, kBF16, kF16, kE5M2, kE4M3 };
// The boundary's enums (backend/dtypes.h) convert to these by static_cast: the same order.
static_assert(static_cast<int>(Act::kF16) == static_cast<int>(backend::ActDtype::kFloat16) &&
              static_cast<int>(Act::kBF16) == static_cast<int>(backend::ActDtype::kBFloat16));
static_assert(static_cast<int>(Kv::kE4M3) == static_cast<int>(backend::KvDtype::kFp8E4M3) &&
              static_cast<int>(Kv::kE5M2) == static_cast<int>(backend::KvDtype::kFp8E5M2) &&
              static_cast<int>(Kv::kF16) == static_cast<int>(backend::KvDtype::kFloat16) &&
              static_cast<int>(Kv::kBF16) == static_cast<int>(backend::KvDtype::kBFloat16));

int act_bytes(Act a);

// Rows of query x heads one attention block handles (a GQA group of up to 16 heads).
inline constexpr int kAttnRows = 16;
// A context split covers at least this many keys by default: short contexts use fewer of the
// planned splits (the blocks of the others return at once), and a context that fits one split
// is written by that split directly (the combine leaves it alone).
inline constexpr int kMinSplitKeys = 64;
// The tensor-core prefill kernel's rows per item (bf16/f16 models, head dim 64 or 128).
inline constexpr int kMmaRows = 128;

// x[t, :] = float(table[tokens[t], :]).
void launch_embed(const void* table, Act act, const std::int32_t* tokens, int T, int H, float* x, cudaStream_t s);
// A tensor-parallel rank's share (model/shard.h): table holds the rows of tokens begin ..
// begin + rows - 1; x[t, :] = float(table[tokens[t] - begin, :]) for those tokens, zeros for the rest.
void launch_embed_rows(const void* table, Act act, const std::int32_t* tokens, int T, int H, std::int64_t begin, std::int64_t rows, float* x,
                       cudaStream_t s);

// x[t, :] += delta[t, :] for t < T.
// x[i] += delta[i], delta in delta_act (the act, or float32 for a float32 delta).
void launch_add(float* x, const void* delta, Act delta_act, std::int64_t n, cudaStream_t s);

// For r < R (src = rows ? rows[r] : r): if delta, x[src] += delta[src] (delta in delta_act:
// act or float32); then out[r, :] = w * (x[src] / sqrt(mean(x[src]^2) +
// eps)) in `act`. x_settled: the kernel before this one in the stream does not write x (only
// earlier ones do), so the kernel may read x before it waits for that kernel (launch_pdl).
// With xq (R x H bytes) and xs (R floats), each out row is also quantized per token for an FP8
// product, exactly as launch_quantize_rows_fp8 would (H % 4 == 0; else xq is left alone).
void launch_add_rmsnorm(float* x, const void* delta, Act delta_act, const std::int32_t* rows, int R, int H, const void* w, Act act, float eps,
                        void* out, cudaStream_t s, bool x_settled = false, void* xq = nullptr, float* xs = nullptr);

struct QkvRopeArgs {
  const void* qkv = nullptr;  // [T, (nh + 2 nkv) * D] in qkv_act, q heads, then k heads, then v heads
  Act qkv_act = Act::kF32;     // the act
  const void* bias = nullptr;  // [(nh + 2 nkv) * D] in act, or null
  const void* q_norm = nullptr;  // [D] in act (Qwen3), or null
  const void* k_norm = nullptr;
  Act act = Act::kF32;
  const float* inv_freq = nullptr;  // [D / 2]
  const std::int32_t* positions = nullptr;
  const std::int64_t* slots = nullptr;  // < 0: padding, K/V not written
  int T = 0, nh = 0, nkv = 0, D = 0;
  float eps = 1e-6f;
  void* q_out = nullptr;  // [T, nh * D] in act (rounded once, as vLLM keeps q)
  void* const* kv_ptrs = nullptr;  // device table: [2 * layer] = K, [2 * layer + 1] = V
  int layer = 0;
  Kv kv = Kv::kF32;
  const float* k_scale = nullptr;  // [nkv] for this layer (fp8_e4m3), else null
  const float* v_scale = nullptr;
  float* k_amax = nullptr;  // [nkv] per-head |max| recording (calibration), or null
  float* v_amax = nullptr;
};
// Head dims up to 128 (attention_supports, which the model checks at creation). From
// kRopeTokensPerBlock tokens on, one block takes all of a token's heads (kernels.cu,
// qkv_rope_kernel).
constexpr int kRopeTokensPerBlock = 512;
void launch_qkv_rope(const QkvRopeArgs& a, cudaStream_t s);
// g[t] = act(x[t] * w) and partials[t] = sum of x[t]^2 for T rows of H: the start of a folded
// norm's chain (Gemm::NormFold), one partial per row.
void launch_norm_fold_start(const float* x, int T, int H, const void* w, Act act, void* g, float* partials, cudaStream_t s);

// Work items: item i covers tokens item_token[i] .. + item_count[i] - 1 of sequence
// item_seq[i] (consecutive positions), item_count[i] = at most attention_item_tokens(). The
// first num_single items have one token each (decode rows, also inside a mixed step): they go
// to the streaming decode kernel (groups <= 8), split along the context when splits > 1; the
// other items go to the prefill kernel, unsplit.
struct AttnArgs {
  const void* q = nullptr;  // [T, nh * D] in act
  void* const* kv_ptrs = nullptr;
  int layer = 0;
  Kv kv = Kv::kF32;
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  const std::int32_t* positions = nullptr;
  const std::int32_t* item_token = nullptr;
  const std::int32_t* item_count = nullptr;
  const std::int32_t* item_seq = nullptr;
  int num_items = 0;
  const std::int32_t* block_tables = nullptr;  // [seq][stride]
  const std::int32_t* bt_stride = nullptr;     // device scalar, so graphs stay valid
  int block_size = 16, nh = 0, nkv = 0, D = 0;
  float scale = 1.0f;
  int num_single = 0;         // items [0, num_single) are one token each
  int splits = 1;             // > 1: the one-token items' contexts are split and partials combined
  int min_split_keys = kMinSplitKeys;  // keys of a split at least (launch_attention sets it per kernel)
  float* partial = nullptr;   // [num_single, nkv, splits, kAttnRows, D + 2]
  void* out = nullptr;        // [T, nh * D] in act
  Act act = Act::kF32;
  // The tensor-core decode kernel's grid is (nkv, items, splits): the blocks of one item's KV
  // heads run side by side and read its cache rows (all heads of a slot) together. false: (items,
  // nkv, splits). Set by launch_decode_mma.
  bool heads_first = false;
  // The tensor-core decode kernel only: one warp per (item, KV head, split) instead of one block
  // (decode_mma.cu says when each pays; the model decides with decode_warp_units). Other kernels
  // ignore it.
  bool warp_units = false;
  // The tensor-core decode kernel's block units only: blocks of 8 warps instead of 4 (decode_mma.cu,
  // kWideWarps; the model decides with decode_wide_blocks).
  bool wide_blocks = false;
  // The CUDA-core decode kernel even where the tensor-core one applies (tests compare the two);
  // the model leaves it false.
  bool cuda_core_decode = false;
};
// AttnArgs::warp_units for a step of `units` one-token (item, KV head) pairs on a device of
// `sms` SMs: at kDecodeWarpUnitsPerSm units per SM and more (12 warps run per SM, so two waves
// of them and more; fewer would leave the last wave part-empty; docs/perf.md, "warp units").
constexpr int kDecodeWarpUnitsPerSm = 24;
// AttnArgs::splits for a step of `units` one-token (item, KV head) pairs on `sms` SMs: enough
// splits of each context for ~4 blocks per SM, at most 16; one from 4 x SMs units on.
int decode_splits(std::int64_t units, int sms);
bool decode_warp_units(std::int64_t units, int sms);
// AttnArgs::wide_blocks for a step of `units` one-token (item, KV head) pairs on `sms` SMs: at
// most one unit per kDecodeWideUnitsPerSm SMs (b1 to b4 of an 8-KV-head model on 132 SMs), where
// few blocks run and each must stream its keys faster; slower at more units (docs/perf.md,
// "decode attention at b1 in blocks of 8 warps").
constexpr int kDecodeWideUnitsPerSm = 4;
bool decode_wide_blocks(std::int64_t units, int sms);
bool attention_supports(int head_dim, int group);
// Raises the attention kernels' shared-memory limits on the current device: once per device
// before the first launch_attention (not inside a CUDA graph capture).
void configure_attention_kernels();
// Query tokens per attention item for a model: kMmaRows / group where the tensor-core prefill
// kernel runs (16-bit acts, head dim 64 or 128), else kAttnRows / group; at least 1.
int attention_item_tokens(int head_dim, int group, Act act);
void launch_attention(const AttnArgs& a, cudaStream_t s);

// out[t, i] = silu(gu[t, i]) * gu[t, I + i]; gu in gu_act (act or float32), out in act. With xq
// (I % 16 == 0, rows 16-byte aligned), out's rows are also quantized per token into xq (e4m3,
// [T, I]) and xs (T scales), as launch_quantize_rows_fp8 would quantize them: the same bytes.
void launch_silu_mul(const void* gu, Act gu_act, int T, int I, void* out, Act act, cudaStream_t s, void* xq = nullptr, float* xs = nullptr);

// tokens[r] for r < R as specs[r] says (device_model.h, SampleSpec): -1 for mode 0, the
// argmax of logits[r, 0..V) for mode 1, a draw for mode 2.
// With `rows`: R rows of those indices (logits, specs and tokens at rows[k]).
void launch_sample(const float* logits, int R, int V, const SampleSpec* specs, std::int32_t* tokens, cudaStream_t s,
                   const std::int32_t* rows = nullptr);
// logits[rows[k], t] = -infinity for every t whose bit in masks[k] ((V + 63) / 64 words) is clear.
void launch_mask_rows(float* logits, int V, const std::int32_t* rows, int R, const std::uint64_t* masks, int words, cudaStream_t s);

void launch_float_to_act(const float* in, void* out, Act act, std::int64_t n, cudaStream_t s);
void launch_act_to_float(const void* in, Act act, float* out, std::int64_t n, cudaStream_t s);
void launch_fill(float* p, float value, std::int64_t n, cudaStream_t s);

// The swap space's copies (Backend::swap_blocks): for i < n, region r < regions of KV block
// blocks[i] (kv_ptrs[r] + blocks[i] * chunk, `chunk` bytes) to or from host[i] + r * chunk, host
// memory that is pinned and mapped (the kernel reads and writes it across the bus itself, so a
// block needs no copy call per region).
void launch_swap_blocks(void* const* kv_ptrs, int regions, const std::int32_t* blocks, char* const* host, int n, std::size_t chunk, bool to_host,
                        cudaStream_t s);

}  // namespace lmserve::cuda
