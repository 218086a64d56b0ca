// The GPU's measured ceilings that `bench` reads its figures against: the device-to-device copy
// bandwidth (bytes/s, 1 GiB buffers) and the bf16 matrix-product rate (FLOP/s, 8192^3 on random
// values through the backend's GEMM path; seconds = 0: a ~15 ms burst at the top clock, > 0:
// sustained that long, the rate of the second half, at the clock the power limit allows).
// 0 when the build has no CUDA or no GPU can be used. Measurement code: it lives with bench, not
// in the backend (backend/cuda/measure/rates.h).
#pragma once

namespace lmserve::bench {

double measure_copy_bandwidth(int device);
double measure_matmul_rate(int device, double seconds = 0);

}  // namespace lmserve::bench
