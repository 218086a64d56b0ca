// `bench --step-report` (PlanOptions::step_report): where the CUDA backend's forward() spends its time, as a table on
// stderr at exit, for decode graphs and eager steps: staging the metadata, launching (the rest
// of the host's time in forward()), waiting for the device, and the device's own span from the
// metadata copy to the end of the last layer (two CUDA events per step) — a span longer than
// staging + launching means the host kept ahead — and the tokens a step ran, with the span per
// token; then the cuBLASLt plans made and their time.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <string>

#include "backend/cuda/gemm/gemm.cuh"

namespace lmserve::cuda {

class StepReport {
 public:
  StepReport() = default;
  StepReport(const StepReport&) = delete;
  StepReport& operator=(const StepReport&) = delete;
  ~StepReport();

  // Records event `i` (0: before the metadata copy, 1: after the last layer's launch) on `s`.
  std::string mark(int i, cudaStream_t s);
  // After the step's device work is complete: adds the step (its host times in seconds, the
  // tokens it ran).
  std::string add(bool graph, double stage_s, double launch_s, double wait_s, int tokens);
  void print(const Gemm& gemm) const;

 private:
  struct Row {
    std::int64_t steps = 0, tokens = 0;
    double stage = 0, launch = 0, wait = 0, gpu = 0;
  };
  std::array<Row, 2> rows_{};  // graph, eager
  std::array<cudaEvent_t, 2> events_{};
};

}  // namespace lmserve::cuda
