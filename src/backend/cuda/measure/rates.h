// The device's measured ceilings and kernel timings, for `bench` and the benchmarks only
// (library lmserve_cuda_measure, not linked into the backend): the copy bandwidth and the bf16
// matrix-product rate that `bench` divides its figures by, and the time of one layer product and
// of one layer's decode attention (tests/bench/cuda_benchmark.cpp). Plain C++; 0 on failure.
#pragma once

#include "backend/dtypes.h"

namespace lmserve::cuda {

// Device-to-device copy bandwidth in bytes/s (1 GiB buffers, bytes read plus written).
double copy_bandwidth(int device);
// bf16 matrix-product rate in FLOP/s of this backend's GEMM path (cuBLASLt, float32
// accumulation and output) on 8192 x 8192 x 8192 products of random values; 0 on failure.
// seconds = 0: ten products (~15 ms on an H200), the burst an idle GPU runs at its top clock.
// seconds > 0: products for that long, the rate of the second half (the clock the board's
// power limit holds under sustained load).
double matmul_rate(int device, double seconds = 0);
// Seconds one bf16 layer product takes on `device` as a step runs it: Y[n, m] = X[n, k] W^T for
// W [m, k], output in bf16 (Gemm::run), or with `gate_up` W [2m, k] and Y = silu(X W_gate^T) *
// (X W_up^T) [n, m] (Gemm::run_gate_up_silu). The mean of `reps` products launched back to back,
// cycling through copies of W that together exceed the L2 many times over, so that each product
// reads its weights from memory as a decode step does. 0 on failure.
double product_seconds(int device, int m, int n, int k, bool gate_up, int reps);
// Seconds one layer's decode attention takes on `device` (launch_attention, as a step runs it) at
// Llama-3.1-8B's shape (32 query heads, 8 KV heads of 128, bf16 Q and output, KV blocks of 16):
// `items` one-token sequences of `context` keys each, the cache in `kv`,
// the splits and warp units by the model's rules, blocks of 8 warps by the rule (wide < 0) or
// never / always (0 / 1). The mean of `reps` launches back to back, cycling through caches of
// layers that together exceed the L2 many times over. The kernel alone: in a step part of its
// start hides behind the kernel before it (programmatic dependent launch). 0 on failure.
double decode_attention_seconds(int device, int items, int context, backend::KvDtype kv, int wide, int reps);

}  // namespace lmserve::cuda
