#include "bench/device_rates.h"

#if LMSERVE_WITH_CUDA
#include "backend/cuda/measure/rates.h"
#endif

namespace lmserve::bench {

#if LMSERVE_WITH_CUDA
double measure_copy_bandwidth(int device) { return cuda::copy_bandwidth(device); }
double measure_matmul_rate(int device, double seconds) { return cuda::matmul_rate(device, seconds); }
#else
double measure_copy_bandwidth(int) { return 0; }
double measure_matmul_rate(int, double) { return 0; }
#endif

}  // namespace lmserve::bench
