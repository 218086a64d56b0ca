// The device's measured ceilings (rates.h): the copy bandwidth and the bf16 matrix-product
// rate, burst or sustained, that `bench` divides its figures by; and the time of one layer product
// and of one layer's decode attention (tests/bench/cuda_benchmark.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/measure/rates.h"

#include "backend/cuda/common/device_buffer.cuh"
#include "backend/cuda/model/device_model.h"
#include "backend/cuda/gemm/gemm.cuh"
#include "backend/cuda/common/kernels.cuh"

namespace lmserve::cuda {

namespace {

// Milliseconds that `reps` runs of work() take on stream s (the default stream unless given),
// after one untimed run; 0 if a CUDA call failed.
template <typename Work>
float elapsed_ms(int reps, Work&& work, cudaStream_t s = nullptr) {
  work();
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  cudaEventRecord(e0, s);
  for (int i = 0; i < reps; ++i) work();
  cudaEventRecord(e1, s);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return cudaGetLastError() == cudaSuccess ? ms : 0.0f;
}

}  // namespace

double copy_bandwidth(int device) {
  if (cudaSetDevice(device) != cudaSuccess) return 0;
  constexpr std::size_t kBytes = 1ull << 30;
  constexpr int kReps = 10;
  DeviceBuffer a, b;
  if (!a.alloc(kBytes).empty() || !b.alloc(kBytes).empty()) return 0;
  const float ms = elapsed_ms(kReps, [&] { cudaMemcpy(b.p, a.p, kBytes, cudaMemcpyDeviceToDevice); });
  // A copy reads and writes every byte.
  return ms > 0 ? 2.0 * static_cast<double>(kBytes) * kReps / (ms / 1000.0) : 0;
}

namespace {

// Values in [-1, 1) from a hash of the index, as bf16.
__global__ void fill_random_bf16_kernel(std::uint16_t* p, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float v = static_cast<float>(h >> 8) / 8388608.0f - 1.0f;
    p[i] = static_cast<std::uint16_t>(__float_as_uint(v) >> 16);
  }
}

}  // namespace

double matmul_rate(int device, double seconds) {
  if (cudaSetDevice(device) != cudaSuccess) return 0;
  constexpr int kN = 8192, kReps = 10;
  const std::size_t elems = static_cast<std::size_t>(kN) * kN;
  DeviceBuffer a, b, c;
  Gemm gemm;
  if (!a.alloc(elems * 2).empty() || !b.alloc(elems * 2).empty() || !c.alloc(elems * 4).empty() || !gemm.init(64ull << 20).empty()) return 0;
  fill_random_bf16_kernel<<<1024, 256>>>(a.as<std::uint16_t>(), static_cast<std::int64_t>(elems), 1u);
  fill_random_bf16_kernel<<<1024, 256>>>(b.as<std::uint16_t>(), static_cast<std::int64_t>(elems), 2u);
  if (!gemm.run(a.p, b.p, c.as<float>(), kN, kN, kN, Act::kBF16, nullptr).empty()) return 0;  // the plan, checked once
  auto product = [&] { gemm.run(a.p, b.p, c.as<float>(), kN, kN, kN, Act::kBF16, nullptr); };
  const double flop = 2.0 * kN * static_cast<double>(kN) * kN * kReps;
  if (seconds <= 0) {
    const float ms = elapsed_ms(kReps, product);
    return ms > 0 ? flop / (ms / 1000.0) : 0;
  }
  // Sustained: batches of kReps products for `seconds`, counting the second half only, once
  // the clock has settled where the power limit holds it.
  const auto t0 = std::chrono::steady_clock::now();
  double late_flop = 0, late_ms = 0;
  for (double elapsed = 0; elapsed < seconds;) {
    const float ms = elapsed_ms(kReps, product);
    if (ms <= 0) return 0;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (elapsed >= seconds / 2) late_flop += flop, late_ms += ms;
  }
  return late_ms > 0 ? late_flop / (late_ms / 1000.0) : 0;
}

double product_seconds(int device, int m, int n, int k, bool gate_up, int reps) {
  if (cudaSetDevice(device) != cudaSuccess || m <= 0 || n <= 0 || k <= 0 || reps <= 0) return 0;
  const std::size_t w_elems = static_cast<std::size_t>(gate_up ? 2 * m : m) * k;
  // Copies of W for at least 512 MB in all (ten times an H200's L2), one for a larger W.
  const int copies = static_cast<int>(std::max<std::size_t>(1, (512ull << 20) / (w_elems * 2) + 1));
  std::vector<DeviceBuffer> ws(static_cast<std::size_t>(copies));
  DeviceBuffer x, y, scratch;
  Gemm gemm;
  for (DeviceBuffer& w : ws) {
    if (!w.alloc(w_elems * 2).empty()) return 0;
    fill_random_bf16_kernel<<<1024, 256>>>(w.as<std::uint16_t>(), static_cast<std::int64_t>(w_elems), 3u);
  }
  const std::size_t out_elems = static_cast<std::size_t>(n) * m;
  if (!x.alloc(static_cast<std::size_t>(n) * k * 2).empty() || !y.alloc(out_elems * 2).empty() ||
      !scratch.alloc(out_elems * 2 * 4).empty() || !gemm.init(64ull << 20).empty()) {
    return 0;
  }
  fill_random_bf16_kernel<<<1024, 256>>>(x.as<std::uint16_t>(), static_cast<std::int64_t>(n) * k, 4u);
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 0;
  cudaDeviceSynchronize();
  int i = 0;
  std::string error;
  auto product = [&] {
    const void* w = ws[static_cast<std::size_t>(i++ % copies)].p;
    std::string e = gate_up ? gemm.run_gate_up_silu(w, x.p, scratch.p, y.p, m, n, k, Act::kBF16, s)
                            : gemm.run(w, x.p, y.p, Act::kBF16, m, n, k, Act::kBF16, s);
    if (error.empty()) error = std::move(e);
  };
  for (int c = 0; c < copies; ++c) product();  // plans made, every copy touched once
  const float ms = elapsed_ms(reps, product, s);
  cudaStreamDestroy(s);
  if (!error.empty() || ms <= 0) return 0;
  return ms / 1000.0 / reps;
}

namespace {

// Bytes of a KV cache: finite values of every cache dtype in about [-1, 1] (an fp8 byte's
// exponent kept below its all-ones codes, a 16-bit pair's high byte likewise), from a hash.
__global__ void fill_cache_bytes_kernel(unsigned char* p, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = static_cast<unsigned char>((h & 0x80u) | ((h >> 8) & 0x3Bu));
  }
}

}  // namespace

double decode_attention_seconds(int device, int items, int context, backend::KvDtype kv, int wide, int reps) {
  constexpr int kNh = 32, kNkv = 8, kD = 128, kBlock = 16;  // Llama-3.1-8B's attention, blocks of 16
  if (cudaSetDevice(device) != cudaSuccess || items <= 0 || context <= 0 || reps <= 0) return 0;
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) return 0;
  configure_attention_kernels();
  const Kv K = static_cast<Kv>(kv);
  const std::size_t elem = K == Kv::kF32 ? 4 : (K == Kv::kE5M2 || K == Kv::kE4M3 ? 1 : 2);
  const int per_item = (context + kBlock - 1) / kBlock;  // cache blocks of an item
  const std::size_t cache_bytes = static_cast<std::size_t>(items) * per_item * kBlock * kNkv * kD * elem;  // K (or V) of a layer
  // Layers for at least 512 MB of K and V in all (ten times an H200's L2), as a step reads them.
  const int layers = static_cast<int>(std::max<std::size_t>(1, (512ull << 20) / (2 * cache_bytes) + 1));
  std::vector<DeviceBuffer> caches(2 * static_cast<std::size_t>(layers));
  std::vector<void*> ptrs;
  for (DeviceBuffer& c : caches) {
    if (!c.alloc(cache_bytes).empty()) return 0;
    fill_cache_bytes_kernel<<<1024, 256>>>(c.as<unsigned char>(), static_cast<std::int64_t>(cache_bytes), static_cast<std::uint32_t>(ptrs.size()) + 5u);
    ptrs.push_back(c.p);
  }
  // Item i: one token at position context - 1 of sequence i, whose blocks are i * per_item, ...
  std::vector<std::int32_t> positions(static_cast<std::size_t>(items), context - 1), index(static_cast<std::size_t>(items)), ones(index.size(), 1),
      tables(static_cast<std::size_t>(items) * per_item);
  for (int i = 0; i < items; ++i) index[static_cast<std::size_t>(i)] = i;
  for (std::size_t b = 0; b < tables.size(); ++b) tables[b] = static_cast<std::int32_t>(b);
  const std::int64_t units = static_cast<std::int64_t>(items) * kNkv;
  const int splits = decode_splits(units, sms);
  const std::size_t act_bytes_all = static_cast<std::size_t>(items) * kNh * kD * 2;
  DeviceBuffer kv_ptrs, pos, idx, cnt, bt, stride, q, out, partial;
  auto upload = [](DeviceBuffer& b, const void* host, std::size_t bytes) {
    return b.alloc(bytes).empty() && cudaMemcpy(b.p, host, bytes, cudaMemcpyHostToDevice) == cudaSuccess;
  };
  const std::int32_t stride_value = per_item;
  if (!upload(kv_ptrs, ptrs.data(), ptrs.size() * sizeof(void*)) || !upload(pos, positions.data(), positions.size() * 4) ||
      !upload(idx, index.data(), index.size() * 4) || !upload(cnt, ones.data(), ones.size() * 4) || !upload(bt, tables.data(), tables.size() * 4) ||
      !upload(stride, &stride_value, 4) || !q.alloc(act_bytes_all).empty() || !out.alloc(act_bytes_all).empty() ||
      !partial.alloc(static_cast<std::size_t>(units) * splits * kAttnRows * (kD + 2) * 4).empty()) {
    return 0;
  }
  fill_random_bf16_kernel<<<1024, 256>>>(q.as<std::uint16_t>(), static_cast<std::int64_t>(act_bytes_all / 2), 6u);
  AttnArgs a;
  a.q = q.p;
  a.kv_ptrs = kv_ptrs.as<void*>();
  a.kv = K;
  a.positions = pos.as<std::int32_t>();
  a.item_token = idx.as<std::int32_t>();
  a.item_count = cnt.as<std::int32_t>();
  a.item_seq = idx.as<std::int32_t>();
  a.num_items = items;
  a.block_tables = bt.as<std::int32_t>();
  a.bt_stride = stride.as<std::int32_t>();
  a.block_size = kBlock;
  a.nh = kNh;
  a.nkv = kNkv;
  a.D = kD;
  a.scale = 1.0f / std::sqrt(static_cast<float>(kD));
  a.num_single = items;
  a.splits = splits;
  a.warp_units = decode_warp_units(units, sms);
  a.wide_blocks = wide < 0 ? decode_wide_blocks(units, sms) : wide == 1;
  a.partial = partial.as<float>();
  a.out = out.p;
  a.act = Act::kBF16;
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) return 0;
  cudaDeviceSynchronize();
  int layer = 0;
  auto attend = [&] {
    a.layer = layer++ % layers;
    launch_attention(a, s);
  };
  for (int l = 0; l < layers; ++l) attend();  // every layer's cache touched once
  const float ms = elapsed_ms(reps, attend, s);
  cudaStreamDestroy(s);
  if (ms <= 0) return 0;
  return ms / 1000.0 / reps;
}

}  // namespace lmserve::cuda
