#include "backend/cuda/measure/step_report.cuh"

#include <cstdio>

#include "backend/cuda/common/device_util.cuh"

namespace lmserve::cuda {

StepReport::~StepReport() {
  for (cudaEvent_t e : events_) {
    if (e) cudaEventDestroy(e);
  }
}

std::string StepReport::mark(int i, cudaStream_t s) {
  cudaEvent_t& e = events_[static_cast<std::size_t>(i)];
  cudaError_t err = e ? cudaSuccess : cudaEventCreate(&e);
  if (err == cudaSuccess) err = cudaEventRecord(e, s);
  return err == cudaSuccess ? std::string() : std::string("step report: ") + cudaGetErrorString(err);
}

std::string StepReport::add(bool graph, double stage_s, double launch_s, double wait_s, int tokens) {
  float gpu_ms = 0;
  if (cudaError_t err = cudaEventElapsedTime(&gpu_ms, events_[0], events_[1]); err != cudaSuccess) {
    return std::string("step report: ") + cudaGetErrorString(err);
  }
  Row& r = rows_[graph ? 0 : 1];
  r.steps += 1;
  r.tokens += tokens;
  r.stage += stage_s;
  r.launch += launch_s;
  r.wait += wait_s;
  r.gpu += gpu_ms / 1e3;
  return {};
}

void StepReport::print(const Gemm& gemm) const {
  std::fprintf(stderr,
               "cuda step report: kind, steps, per step ms: stage, launch, wait, device span (metadata copy to last layer); tokens per step, "
               "device span per token us\n");
  const char* names[] = {"graph", "eager"};
  for (std::size_t k = 0; k < rows_.size(); ++k) {
    const Row& r = rows_[k];
    if (r.steps == 0) continue;
    const double n = static_cast<double>(r.steps) / 1e3;
    const double tokens = static_cast<double>(r.tokens);
    std::fprintf(stderr, "cuda step report: %s %lld %.3f %.3f %.3f %.3f; %.1f %.3f\n", names[k], static_cast<long long>(r.steps), r.stage / n,
                 r.launch / n, r.wait / n, r.gpu / n, tokens / static_cast<double>(r.steps), tokens > 0 ? r.gpu * 1e6 / tokens : 0.0);
  }
  std::fprintf(stderr, "cuda step report: cuBLASLt plans %d (%d timed, %d of them not the heuristic's first), %.3f s making them\n",
               gemm.plans_made(), gemm.plans_tuned(), gemm.plans_retuned(), gemm.plan_seconds());
}

}  // namespace lmserve::cuda
