// Fault injection (issue #35; backend/fault/fault_injection.h) into the backend under the
// engine: a row of NaN logits ends only its own request with an error; a failed step, a device
// out of memory mid-run and a step stalled past the watchdog's limit fail the engine — every
// request in flight ends exactly once with an error, alive() turns false, new requests are
// refused — and nothing hangs. CPU backend (the NaN row is written into host logits).
#include <gtest/gtest.h>

#include <chrono>

#include "backend/cpu/cpu_backend.h"
#include "backend/fault/fault_injection.h"
#include "engine_test_util.h"

namespace lmserve::engine {
namespace {

struct Outcome {
  Result result;
  std::string error;  // the final event's error
};

Outcome collect_with_error(const std::shared_ptr<RequestStream>& s) {
  Outcome o;
  StreamEvent e;
  while (s->next(&e)) {
    add_event(&o.result, e);
    if (e.finish == FinishReason::kError) o.error = e.error;
  }
  return o;
}

std::unique_ptr<Engine> engine_with_faults(const std::string& spec, EngineOptions o = {}) {
  auto plan = backend::parse_fault_plan(spec);
  EXPECT_TRUE(plan) << plan.error().to_string();
  auto b = backend::make_cpu_backend(demo().weights, {.kv = {backend::KvDtype::kFloat32, 16, 64}, .threads = 2});
  EXPECT_TRUE(b) << b.error().to_string();
  auto e = Engine::create(backend::inject_faults(std::move(*b), *plan), demo().tokenizer, o);
  EXPECT_TRUE(e) << e.error().to_string();
  return std::move(*e);
}

// Three requests decode together; at step 4 row 1's logits become NaN: that request ends with
// an error (and no token from the bad row), the other two run to their length, the engine
// stays alive and holds no KV block afterwards.
TEST(Faults, NanLogitsEndOnlyTheirOwnRequest) {
  auto engine = engine_with_faults("nan=4:1");
  std::vector<Submitted> subs;
  for (const char* p : {"The cat", "A bank", "River"}) {
    auto s = engine->submit({.prompt = demo().tokenizer->encode(p, {.add_special_tokens = false}), .params = greedy(8)});
    ASSERT_TRUE(s);
    subs.push_back(*s);
  }
  int errors = 0, whole = 0;
  for (auto& s : subs) {
    const Outcome o = collect_with_error(s.stream);
    EXPECT_EQ(o.result.finish_events, 1);
    if (o.result.finish == FinishReason::kError) {
      ++errors;
      EXPECT_NE(o.error.find("not finite"), std::string::npos) << o.error;
      EXPECT_LT(o.result.tokens.size(), 8u);
    } else {
      EXPECT_EQ(o.result.finish, FinishReason::kLength);
      EXPECT_EQ(o.result.tokens.size(), 8u);
      ++whole;
    }
  }
  EXPECT_EQ(errors, 1);
  EXPECT_EQ(whole, 2);
  EXPECT_TRUE(engine->alive());
  const EngineStats st = engine->stats();
  EXPECT_EQ(st.nonfinite_rows_total, 1u);
  EXPECT_EQ(st.running, 0);
  EXPECT_EQ(st.kv_usage, 0.0);
  // It goes on serving.
  auto again = engine->submit({.prompt = {5, 6, 7}, .params = greedy(4)});
  ASSERT_TRUE(again);
  EXPECT_EQ(collect(again->stream).finish, FinishReason::kLength);
}

// A failed step and a device out of memory mid-run: every request in flight ends once with the
// step's error, the engine is dead and refuses new requests.
TEST(Faults, AFailedStepEndsEveryRequestOnceAndFailsTheEngine) {
  for (const auto& [spec, words] : {std::pair<std::string, std::string>{"fail=3", "step 3 failed"}, {"oom=5", "out of device memory"}}) {
    SCOPED_TRACE(spec);
    auto engine = engine_with_faults(spec);
    std::vector<Submitted> subs;
    for (int i = 0; i < 4; ++i) {
      auto s = engine->submit({.prompt = {5, 6, static_cast<std::int32_t>(7 + i)}, .params = greedy(50)});
      ASSERT_TRUE(s);
      subs.push_back(*s);
    }
    for (auto& s : subs) {
      const Outcome o = collect_with_error(s.stream);
      EXPECT_EQ(o.result.finish, FinishReason::kError);
      EXPECT_EQ(o.result.finish_events, 1);
      EXPECT_NE(o.error.find(words), std::string::npos) << o.error;
    }
    EXPECT_FALSE(engine->alive());
    auto late = engine->submit({.prompt = {1, 2}, .params = greedy(2)});
    ASSERT_FALSE(late);
    EXPECT_EQ(late.error().status.code(), StatusCode::kUnavailable);
  }
}

// A step that does not come back: with a 0.3 s watchdog, the requests end with its error while
// the step is still stalled (1.5 s), and the engine is dead; the engine still shuts down once
// the step returns.
TEST(Faults, AStalledStepTripsTheWatchdog) {
  EngineOptions o;
  o.step_timeout_s = 0.3;
  auto engine = engine_with_faults("stall=3:1500", o);
  const auto t0 = std::chrono::steady_clock::now();
  auto s = engine->submit({.prompt = {5, 6, 7}, .params = greedy(50)});
  ASSERT_TRUE(s);
  const Outcome out = collect_with_error(s->stream);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(out.result.finish, FinishReason::kError);
  EXPECT_EQ(out.result.finish_events, 1);
  EXPECT_NE(out.error.find("longer than"), std::string::npos) << out.error;
  EXPECT_LT(waited, 1.4) << "the watchdog, not the step's return, ended the request";
  EXPECT_FALSE(engine->alive());
}

TEST(Faults, PlansAreReadOrRefusedWithTheReason) {
  auto p = backend::parse_fault_plan("nan=4:0,stall=2:250,fail=9,oom=12");
  ASSERT_TRUE(p) << p.error().to_string();
  EXPECT_EQ(p->nan_step, 4);
  EXPECT_EQ(p->nan_row, 0);
  EXPECT_EQ(p->stall_step, 2);
  EXPECT_EQ(p->stall, std::chrono::milliseconds(250));
  EXPECT_EQ(p->fail_step, 9);
  EXPECT_EQ(p->oom_step, 12);
  EXPECT_FALSE(backend::parse_fault_plan("")->any());
  for (const char* bad : {"fail", "fail=0", "fail=-1", "fail=x", "nan=3", "nan=3:", "stall=2", "boom=1", "fail=1,fail=2", "fail=1:2", "nan=1:-1"}) {
    auto b = backend::parse_fault_plan(bad);
    ASSERT_FALSE(b) << bad;
    EXPECT_NE(b.error().message().find("--fault-injection"), std::string::npos);
  }
}

}  // namespace
}  // namespace lmserve::engine
