// Fault injection (issue #35): a Backend that passes every call to another and, at the steps a
// FaultPlan names, fails the step, reports the device out of memory, stalls it, or turns one
// row's logits into NaN — so that tests (and `serve --fault-injection`, a debug flag that is off
// unless given) can show what the engine and the server do then: a NaN row ends only its own
// request with an error; a failed step fails the engine (every request in flight ends once with
// an error, /health answers 503, serve exits non-zero). Steps count from 1, every forward() or
// prepare()/launch()/wait() triple being one. NaN is written into the host logits of the row,
// which is what the engine samples from when the row is sampled on the host (the CPU backend,
// or the CUDA backend with --host-sampling); a device-sampled row keeps its token.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>

#include "backend/backend.h"
#include "common/status.h"

namespace lmserve::backend {

struct FaultPlan {
  std::int64_t fail_step = 0;   // this step returns an internal error (0: never)
  std::int64_t oom_step = 0;    // this step returns ResourceExhausted "out of device memory"
  std::int64_t nan_step = 0;    // this step's logits row nan_row becomes NaN
  std::int64_t nan_row = 0;
  std::int64_t stall_step = 0;  // this step's wait sleeps stall first
  std::chrono::milliseconds stall{0};
  bool any() const { return fail_step > 0 || oom_step > 0 || nan_step > 0 || stall_step > 0; }
};

// "fail=N,oom=N,nan=STEP:ROW,stall=STEP:MILLISECONDS" in any order, each at most once; "" is
// no fault. InvalidArgument naming the part it cannot read.
Result<FaultPlan> parse_fault_plan(std::string_view spec);

// `inner` wrapped so that `plan`'s faults happen; `inner` itself when the plan has none.
std::unique_ptr<Backend> inject_faults(std::unique_ptr<Backend> inner, const FaultPlan& plan);

}  // namespace lmserve::backend
