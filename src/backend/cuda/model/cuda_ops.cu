#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/model/cuda_ops.h"
#include "backend/cuda/gemm/gemm.cuh"
#include "backend/cuda/common/kernels.cuh"

namespace lmserve::cuda::ops {
namespace {

// Device memory for one op run, freed on scope exit.
class Arena {
 public:
  ~Arena() {
    for (void* p : ptrs_) cudaFree(p);
  }
  void* alloc(std::size_t bytes, bool poison = true) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<std::size_t>(bytes, 16)) != cudaSuccess) {
      ok_ = false;
      return nullptr;
    }
    ptrs_.push_back(p);
    cudaMemset(p, poison ? 0xFF : 0, std::max<std::size_t>(bytes, 16));
    return p;
  }
  template <class T>
  T* upload(const std::vector<T>& v) {
    auto* p = static_cast<T*>(alloc(v.size() * sizeof(T), false));
    if (p && !v.empty()) cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
    return p;
  }
  // Floats rounded to act on the device.
  void* upload_act(const std::vector<float>& v, Act act) {
    if (v.empty()) return nullptr;
    float* f = upload(v);
    void* out = alloc(v.size() * static_cast<std::size_t>(act_bytes(act)));
    if (f && out) launch_float_to_act(f, out, act, static_cast<std::int64_t>(v.size()), nullptr);
    return out;
  }
  // Act values back as floats.
  std::vector<float> download_act(const void* p, Act act, std::size_t n) {
    std::vector<float> out(n);
    float* f = static_cast<float*>(alloc(n * 4));
    if (!f) return out;
    launch_act_to_float(p, act, f, static_cast<std::int64_t>(n), nullptr);
    cudaMemcpy(out.data(), f, n * 4, cudaMemcpyDeviceToHost);
    return out;
  }
  bool ok() const { return ok_; }

 private:
  std::vector<void*> ptrs_;
  bool ok_ = true;
};

std::string finish(const Arena& a) {
  if (!a.ok()) return "cudaMalloc failed";
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return cudaGetErrorString(e);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  return {};
}

std::string need_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return "no GPU";
  }
  return {};
}

// Rows quantized per token on the device (n e4m3 bytes, `rows` scales) into xq and xs.
void download_quantized(const void* qd, const float* sd, std::size_t n, int rows, std::vector<std::uint8_t>* xq, std::vector<float>* xs) {
  xq->resize(n);
  xs->resize(static_cast<std::size_t>(rows));
  cudaMemcpy(xq->data(), qd, n, cudaMemcpyDeviceToHost);
  cudaMemcpy(xs->data(), sd, xs->size() * 4, cudaMemcpyDeviceToHost);
}

// The KV pointer table kernels read: [K, V] for layer 0.
void* const* kv_table(Arena& a, void* k, void* v) {
  std::vector<void*> ptrs = {k, v};
  return a.upload(ptrs);
}

}  // namespace

std::string embed(backend::ActDtype act, const std::vector<float>& table, int hidden, const std::vector<std::int32_t>& tokens, std::vector<float>* x) {
  if (auto e = need_gpu(); !e.empty()) return e;
  Arena a;
  const Act A = static_cast<Act>(act);
  void* t = a.upload_act(table, A);
  auto* tok = a.upload(tokens);
  auto* out = static_cast<float*>(a.alloc(tokens.size() * static_cast<std::size_t>(hidden) * 4));
  launch_embed(t, A, tok, static_cast<int>(tokens.size()), hidden, out, nullptr);
  x->resize(tokens.size() * static_cast<std::size_t>(hidden));
  cudaMemcpy(x->data(), out, x->size() * 4, cudaMemcpyDeviceToHost);
  return finish(a);
}

std::string add_rmsnorm(backend::ActDtype act, std::vector<float>* x, const std::vector<float>* delta, const std::vector<std::int32_t>* rows, int R,
                        int hidden, const std::vector<float>& w, float eps, std::vector<float>* out, std::vector<std::uint8_t>* xq,
                        std::vector<float>* xs) {
  if (auto e = need_gpu(); !e.empty()) return e;
  Arena a;
  const Act A = static_cast<Act>(act);
  const Act P = A;
  float* xd = a.upload(*x);
  const void* dd = delta ? a.upload_act(*delta, P) : nullptr;
  const std::int32_t* rd = rows ? a.upload(*rows) : nullptr;
  void* wd = a.upload_act(w, A);
  const std::size_t n = static_cast<std::size_t>(R) * hidden;
  void* od = a.alloc(n * static_cast<std::size_t>(act_bytes(A)));
  void* qd = xq ? a.alloc(n) : nullptr;
  auto* sd = xq ? static_cast<float*>(a.alloc(static_cast<std::size_t>(R) * 4)) : nullptr;
  launch_add_rmsnorm(xd, dd, P, rd, R, hidden, wd, A, eps, od, nullptr, false, qd, sd);
  *out = a.download_act(od, A, n);
  if (xq) download_quantized(qd, sd, n, R, xq, xs);
  cudaMemcpy(x->data(), xd, x->size() * 4, cudaMemcpyDeviceToHost);
  return finish(a);
}

std::string gemm(backend::ActDtype act, const std::vector<float>& w, const std::vector<float>& x, int m, int n, int k, std::vector<float>* y, bool act_out) {
  if (auto e = need_gpu(); !e.empty()) return e;
  Arena a;
  const Act A = static_cast<Act>(act), out = act_out ? A : Act::kF32;
  void* wd = a.upload_act(w, A);
  void* xd = a.upload_act(x, A);
  void* yd = a.alloc(static_cast<std::size_t>(n) * m * 4);
  Gemm g;
  if (auto e = g.init(8u << 20); !e.empty()) return e;
  if (auto e = g.run(wd, xd, yd, out, m, n, k, A, nullptr); !e.empty()) return e;
  *y = a.download_act(yd, out, static_cast<std::size_t>(n) * m);
  return finish(a);
}

std::string gemm_add(backend::ActDtype act, const std::vector<float>& w, const std::vector<float>& x, int m, int n, int k, bool prepare, std::vector<float>* y) {
  if (auto e = need_gpu(); !e.empty()) return e;
  if (y->size() != static_cast<std::size_t>(n) * m) return "gemm_add: y is not n x m";
  Arena a;
  const Act A = static_cast<Act>(act);
  void* wd = a.upload_act(w, A);
  void* xd = a.upload_act(x, A);
  Gemm g;
  if (auto e = g.init(8u << 20); !e.empty()) return e;
  if (prepare) {
    const Gemm::Operands on{wd, xd, a.alloc(y->size() * 4), nullptr, true};
    if (auto e = g.prepare(m, k, A, n, &on); !e.empty()) return e;
  }
  float* yd = a.upload(*y);
  if (auto e = g.run_add(wd, xd, yd, m, n, k, A, nullptr); !e.empty()) return e;
  if (yd) cudaMemcpy(y->data(), yd, y->size() * 4, cudaMemcpyDeviceToHost);
  return finish(a);
}

std::string gemm_series(backend::ActDtype act, const std::vector<float>& w, const std::vector<float>& x, int m, int k, const std::vector<int>& ns, bool prepare,
                        std::vector<std::vector<float>>* ys, int* plans_prepared, int* plans_total) {
  if (auto e = need_gpu(); !e.empty()) return e;
  Arena a;
  const Act A = static_cast<Act>(act);
  const int max_n = static_cast<int>(x.size() / static_cast<std::size_t>(k));
  void* wd = a.upload_act(w, A);
  void* xd = a.upload_act(x, A);
  auto* yd = static_cast<float*>(a.alloc(static_cast<std::size_t>(max_n) * m * 4));
  Gemm g;
  if (auto e = g.init(8u << 20); !e.empty()) return e;
  if (prepare) {
    const Gemm::Operands on{wd, xd, yd, nullptr};
    if (auto e = g.prepare(m, k, A, *std::max_element(ns.begin(), ns.end()), &on); !e.empty()) return e;
  }
  *plans_prepared = g.plans_made();
  ys->clear();
  for (int n : ns) {
    if (n > max_n) return "gemm_series: n past x's rows";
    if (auto e = g.run(wd, xd, yd, m, n, k, A, nullptr); !e.empty()) return e;
    ys->emplace_back(static_cast<std::size_t>(n) * m);
    cudaMemcpy(ys->back().data(), yd, ys->back().size() * 4, cudaMemcpyDeviceToHost);
  }
  *plans_total = g.plans_made();
  return finish(a);
}

std::string quantize_rows_fp8(backend::ActDtype act, const std::vector<float>& x, int n, int k, std::vector<std::uint8_t>* xq, std::vector<float>* xs) {
  if (auto e = need_gpu(); !e.empty()) return e;
  Arena a;
  const Act A = static_cast<Act>(act);
  void* xd = a.upload_act(x, A);
  void* qd = a.alloc(static_cast<std::size_t>(n) * k);
  auto* sd = static_cast<float*>(a.alloc(static_cast<std::size_t>(n) * 4));
  launch_quantize_rows_fp8(xd, A, n, k, qd, sd, nullptr);
  download_quantized(qd, sd, static_cast<std::size_t>(n) * k, n, xq, xs);
  return finish(a);
}

std::string gemm_fp8(backend::ActDtype act, const std::vector<std::uint8_t>& w, const std::vector<float>& w_scales, const std::vector<float>& x, int m, int n,
                     int k, Fp8Product kind, bool prepare, std::vector<float>* y) {
  if (auto e = need_gpu(); !e.empty()) return e;
  if (w.size() != static_cast<std::size_t>(m) * k || w_scales.size() != static_cast<std::size_t>(m) || x.size() != static_cast<std::size_t>(n) * k) {
    return "gemm_fp8: operand sizes";
  }
  const std::size_t ny = static_cast<std::size_t>(n) * (kind == Fp8Product::kGateUpSilu ? m / 2 : m);
  if (kind == Fp8Product::kAdd && y->size() != ny) return "gemm_fp8: y is not n x m";
  Arena a;
  const Act A = static_cast<Act>(act);
  const Gemm::Fp8Weight wd{a.upload(w), a.upload(w_scales)};
  void* xd = a.upload_act(x, A);
  void* xq = a.alloc(static_cast<std::size_t>(n) * k, false);
  auto* xs = static_cast<float*>(a.alloc(static_cast<std::size_t>(n) * 4, false));
  void* scratch = a.alloc(static_cast<std::size_t>(n) * m * 4);
  const Act out = kind == Fp8Product::kF32 || kind == Fp8Product::kAdd ? Act::kF32 : A;
  void* yd = kind == Fp8Product::kAdd ? static_cast<void*>(a.upload(*y)) : a.alloc(ny * static_cast<std::size_t>(act_bytes(out)));
  Gemm g;
  if (auto e = g.init(8u << 20); !e.empty()) return e;
  g.set_fp8_scratch(xq, xs);
  if (prepare) {
    Gemm::Operands on{wd.w, xq, kind == Fp8Product::kGateUpSilu ? scratch : a.alloc(static_cast<std::size_t>(n) * m * 4), nullptr, kind == Fp8Product::kAdd};
    on.w_scales = wd.scales;
    on.x_scales = xs;
    if (auto e = g.prepare_fp8(m, k, n, &on, kind == Fp8Product::kF32 || kind == Fp8Product::kAdd ? Act::kF32 : A); !e.empty()) return e;
  }
  std::string e;
  switch (kind) {
    case Fp8Product::kF32:
    case Fp8Product::kAct: e = g.run_fp8(wd, xd, yd, out, m, n, k, A, nullptr); break;
    case Fp8Product::kAdd: e = g.run_add_fp8(wd, xd, static_cast<float*>(yd), m, n, k, A, nullptr); break;
    case Fp8Product::kGateUpSilu: e = g.run_gate_up_silu_fp8(wd, xd, scratch, yd, m / 2, n, k, A, nullptr); break;
  }
  if (!e.empty()) return e;
  *y = a.download_act(yd, out, ny);
  return finish(a);
}

std::string silu_mul(backend::ActDtype act, const std::vector<float>& gu, int T, int I, std::vector<float>* out, std::vector<std::uint8_t>* xq,
                     std::vector<float>* xs) {
  if (auto e = need_gpu(); !e.empty()) return e;
  Arena a;
  const Act A = static_cast<Act>(act);
  const Act G = A;
  void* g = a.upload_act(gu, G);
  const std::size_t n = static_cast<std::size_t>(T) * I;
  void* od = a.alloc(n * static_cast<std::size_t>(act_bytes(A)));
  void* qd = xq ? a.alloc(n) : nullptr;
  auto* sd = xq ? static_cast<float*>(a.alloc(static_cast<std::size_t>(T) * 4)) : nullptr;
  launch_silu_mul(g, G, T, I, od, A, nullptr, qd, sd);
  *out = a.download_act(od, A, n);
  if (xq) download_quantized(qd, sd, n, T, xq, xs);
  return finish(a);
}

std::string gate_up_silu(backend::ActDtype act, const std::vector<float>& w, const std::vector<float>& x, int I, int n, int k, std::vector<float>* out) {
  if (auto e = need_gpu(); !e.empty()) return e;
  Arena a;
  const Act A = static_cast<Act>(act);
  void* wd = a.upload_act(w, A);
  void* xd = a.upload_act(x, A);
  void* scratch = a.alloc(static_cast<std::size_t>(n) * 2 * I * 4);
  void* od = a.alloc(static_cast<std::size_t>(n) * I * static_cast<std::size_t>(act_bytes(A)));
  Gemm g;
  if (auto e = g.init(8u << 20); !e.empty()) return e;
  if (auto e = g.run_gate_up_silu(wd, xd, scratch, od, I, n, k, A, nullptr); !e.empty()) return e;
  *out = a.download_act(od, A, static_cast<std::size_t>(n) * I);
  return finish(a);
}

std::string norm_fold(backend::ActDtype act, std::vector<float>* x, const std::vector<float>& norm_w, const std::vector<float>& w1, const std::vector<float>& a1,
                      int k1, const std::vector<float>& w2, int m2, const std::vector<float>& wgu, int I, int n, int H, float eps,
                      std::vector<float>* y0, std::vector<float>* y1, std::vector<float>* gu) {
  if (auto e = need_gpu(); !e.empty()) return e;
  const Act A = static_cast<Act>(act);
  if (!Gemm::can_fold(n, H, A) || !Gemm::can_fold(n, k1, A)) return "norm_fold: needs one or two 16-bit rows and widths divisible by 8";
  if (x->size() != static_cast<std::size_t>(n) * H) return "norm_fold: x is not n x H";
  Arena a;
  float* xd = a.upload(*x);
  void* nw = a.upload_act(norm_w, A);
  void* w1d = a.upload_act(w1, A);
  void* a1d = a.upload_act(a1, A);
  void* w2d = a.upload_act(w2, A);
  void* wgud = a.upload_act(wgu, A);
  void* g = a.alloc(static_cast<std::size_t>(n) * H * static_cast<std::size_t>(act_bytes(A)));
  auto* partials = static_cast<float*>(a.alloc(static_cast<std::size_t>(n) * H * 4));
  auto* y0d = static_cast<float*>(a.alloc(static_cast<std::size_t>(n) * m2 * 4));
  auto* y1d = static_cast<float*>(a.alloc(static_cast<std::size_t>(n) * m2 * 4));
  void* gud = a.alloc(static_cast<std::size_t>(n) * I * static_cast<std::size_t>(act_bytes(A)));
  Gemm gm;
  if (auto e = gm.init(8u << 20); !e.empty()) return e;
  Gemm::NormFold f;
  f.H = H;
  f.eps = eps;
  f.g = g;
  f.norm_w = nw;
  f.in_partials = partials;
  f.out_partials = partials;
  launch_norm_fold_start(xd, n, H, nw, A, g, partials, nullptr);
  f.in_parts = 1;
  if (auto e = gm.run_folded(w2d, g, y0d, Act::kF32, m2, n, H, A, f, nullptr); !e.empty()) return e;
  if (auto e = gm.run_add_fold(w1d, a1d, xd, H, n, k1, A, f, &f.in_parts, nullptr); !e.empty()) return e;
  if (auto e = gm.run_folded(w2d, g, y1d, Act::kF32, m2, n, H, A, f, nullptr); !e.empty()) return e;
  if (auto e = gm.run_gate_up_silu_folded(wgud, g, gud, I, n, H, A, f, nullptr); !e.empty()) return e;
  y0->resize(static_cast<std::size_t>(n) * m2);
  y1->resize(y0->size());
  cudaMemcpy(y0->data(), y0d, y0->size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(y1->data(), y1d, y1->size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(x->data(), xd, x->size() * 4, cudaMemcpyDeviceToHost);
  *gu = a.download_act(gud, A, static_cast<std::size_t>(n) * I);
  return finish(a);
}

std::string qkv_rope(backend::ActDtype act, const QkvRopeInput& in, KvCacheHost* cache, std::vector<float>* q) {
  if (auto e = need_gpu(); !e.empty()) return e;
  if (in.nkv <= 0 || !attention_supports(in.D, in.nh / in.nkv)) return "unsupported head_dim / group";
  Arena a;
  const Act A = static_cast<Act>(act);
  const int T = static_cast<int>(in.positions.size());
  QkvRopeArgs r;
  r.qkv_act = A;
  r.qkv = a.upload_act(in.qkv, r.qkv_act);
  r.bias = a.upload_act(in.bias, A);
  r.q_norm = a.upload_act(in.q_norm, A);
  r.k_norm = a.upload_act(in.k_norm, A);
  r.act = A;
  r.inv_freq = a.upload(in.inv_freq);
  r.positions = a.upload(in.positions);
  r.slots = a.upload(in.slots);
  r.T = T;
  r.nh = in.nh;
  r.nkv = in.nkv;
  r.D = in.D;
  r.eps = in.eps;
  r.q_out = a.alloc(static_cast<std::size_t>(T) * in.nh * in.D * static_cast<std::size_t>(act_bytes(A)));
  void* k = a.upload(cache->k);
  void* v = a.upload(cache->v);
  r.kv_ptrs = kv_table(a, k, v);
  r.kv = static_cast<Kv>(cache->kv);
  if (!cache->k_scale.empty()) {
    r.k_scale = a.upload(cache->k_scale);
    r.v_scale = a.upload(cache->v_scale);
  }
  launch_qkv_rope(r, nullptr);
  *q = a.download_act(r.q_out, A, static_cast<std::size_t>(T) * in.nh * in.D);
  cudaMemcpy(cache->k.data(), k, cache->k.size(), cudaMemcpyDeviceToHost);
  cudaMemcpy(cache->v.data(), v, cache->v.size(), cudaMemcpyDeviceToHost);
  return finish(a);
}

std::string attention(backend::ActDtype act, const AttentionInput& in, const KvCacheHost& cache, std::vector<float>* out) {
  if (auto e = need_gpu(); !e.empty()) return e;
  if (!attention_supports(in.D, in.nh / in.nkv)) return "unsupported head_dim / group";
  configure_attention_kernels();
  Arena a;
  const Act A = static_cast<Act>(act);
  const int T = static_cast<int>(in.positions.size());
  const int group = in.nh / in.nkv, per_item = attention_item_tokens(in.D, group, A);
  // Items as the model stages them: one-token sequences first, then the others' runs.
  std::vector<std::int32_t> it_tok, it_cnt, it_seq;
  int num_single = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t s = 0; s < in.seq_start.size(); ++s) {
      if ((in.seq_len[s] == 1) != (pass == 0)) continue;
      for (int k = 0; k < in.seq_len[s]; k += per_item) {
        it_tok.push_back(in.seq_start[s] + k);
        it_cnt.push_back(std::min(per_item, in.seq_len[s] - k));
        it_seq.push_back(static_cast<std::int32_t>(s));
      }
    }
    if (pass == 0) num_single = static_cast<int>(it_tok.size());
  }
  std::int32_t stride = 1;
  for (const auto& t : in.tables) stride = std::max(stride, static_cast<std::int32_t>(t.size()));
  std::vector<std::int32_t> tables(in.tables.size() * static_cast<std::size_t>(stride), 0);
  for (std::size_t s = 0; s < in.tables.size(); ++s) std::copy(in.tables[s].begin(), in.tables[s].end(), tables.begin() + s * stride);
  AttnArgs at;
  at.q = a.upload_act(in.q, A);
  void* k = a.upload(cache.k);
  void* v = a.upload(cache.v);
  at.kv_ptrs = kv_table(a, k, v);
  at.kv = static_cast<Kv>(cache.kv);
  if (!cache.k_scale.empty()) {
    at.k_scale = a.upload(cache.k_scale);
    at.v_scale = a.upload(cache.v_scale);
  }
  at.positions = a.upload(in.positions);
  at.item_token = a.upload(it_tok);
  at.item_count = a.upload(it_cnt);
  at.item_seq = a.upload(it_seq);
  at.num_items = static_cast<int>(it_tok.size());
  at.block_tables = a.upload(tables);
  at.bt_stride = a.upload(std::vector<std::int32_t>{stride});
  at.block_size = cache.block_size;
  at.nh = in.nh;
  at.nkv = in.nkv;
  at.D = in.D;
  at.scale = 1.0f / std::sqrt(static_cast<float>(in.D));
  at.num_single = num_single;
  at.splits = num_single > 0 ? std::max(1, in.splits) : 1;
  at.warp_units = in.warp_units;
  at.wide_blocks = in.wide_blocks;
  at.cuda_core_decode = in.cuda_core_decode;
  at.partial = static_cast<float*>(a.alloc(static_cast<std::size_t>(std::max(1, at.num_items)) * in.nkv * at.splits * kAttnRows * (in.D + 2) * 4));
  at.out = a.alloc(static_cast<std::size_t>(T) * in.nh * in.D * static_cast<std::size_t>(act_bytes(A)));
  at.act = A;
  launch_attention(at, nullptr);
  *out = a.download_act(at.out, A, static_cast<std::size_t>(T) * in.nh * in.D);
  return finish(a);
}

std::string sample(const std::vector<float>& logits, int V, const std::vector<SampleSpec>& specs, std::vector<std::int32_t>* tokens) {
  if (auto e = need_gpu(); !e.empty()) return e;
  if (logits.size() != specs.size() * static_cast<std::size_t>(V)) return "logits are not rows x V";
  Arena a;
  const int R = static_cast<int>(specs.size());
  auto* out = static_cast<std::int32_t*>(a.alloc(specs.size() * 4));
  launch_sample(a.upload(logits), R, V, a.upload(specs), out, nullptr);
  tokens->assign(specs.size(), 0);
  cudaMemcpy(tokens->data(), out, specs.size() * 4, cudaMemcpyDeviceToHost);
  return finish(a);
}

}  // namespace lmserve::cuda::ops
