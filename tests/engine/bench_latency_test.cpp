// `lmserve bench latency` (bench/engine_bench.h, run_latency) on the backend under test: on an
// asynchronous backend each decode step is prepared while the one before runs and launched with
// its tokens patched in, as the engine's asynchronous scheduling does; the tokens the run ends
// with are those of one step at a time.
#include <gtest/gtest.h>

#include <memory>
#include <utility>

#include "bench/engine_bench.h"
#include "engine_test_util.h"

namespace lmserve::engine {
namespace {

TEST(BenchLatency, OverlappedDecodeStepsEndWithTheTokensOfOneStepAtATime) {
  SchedulerOptions so;
  so.max_num_seqs = 4;
  so.max_num_batched_tokens = 256;
  so.max_model_len = 64;
  bench::LatencyOptions o;
  o.batch_size = 3;
  o.input_len = 9;
  o.output_len = 14;
  o.max_tokens_per_step = 256;
  o.seed = 11;
  auto run = [&](bool wrap, bool overlap, bool* asynchronous) {
    auto b = make_backend(demo(), 16, so, 16, backend::KvDtype::kFloat32);
    EXPECT_TRUE(b) << b.error().to_string();
    std::unique_ptr<backend::Backend> backend = std::move(*b);
    if (wrap) backend = std::make_unique<Asynchronous>(std::move(backend));
    *asynchronous = backend->asynchronous();
    o.overlap = overlap;
    auto r = bench::run_latency(*backend, o);
    EXPECT_TRUE(r) << r.error().to_string();
    return r ? *r : bench::LatencyResult{};
  };
  bool asynchronous = false;
  const bench::LatencyResult serial = run(false, false, &asynchronous);
  EXPECT_FALSE(serial.overlapped);
  ASSERT_EQ(serial.step_seconds.size(), 13u);
  ASSERT_EQ(serial.last_tokens.size(), 3u);
  for (bool wrap : {true, false}) {
    SCOPED_TRACE(wrap ? "the backend made asynchronous" : "the backend as it is");
    const bench::LatencyResult r = run(wrap, true, &asynchronous);
    EXPECT_EQ(r.overlapped, asynchronous);
    EXPECT_EQ(r.step_seconds.size(), 13u);
    EXPECT_EQ(r.last_tokens, serial.last_tokens);
  }
}

}  // namespace
}  // namespace lmserve::engine
