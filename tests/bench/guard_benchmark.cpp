// The gateway's content guard (gateway/guard.h) with the default rules and one tenant regex, as
// scripts/gateway-overhead.sh runs it: one check of a short prompt ("hello"), of each ordinary
// question of the benign corpus (src/gateway/data/benign.txt) in turn, and of a 4 KB document
// made of them; each with the injection model (argument 1) and without it (0).
// Run: build/release/tests/bench/guard_benchmark
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "gateway/guard.h"
#include "gateway/injection_model.h"

namespace {

using lmserve::gateway::Guard;

const Guard& guard(bool model) {
  static const auto make = [](bool with_model) {
    auto built = Guard::build({.default_rules = true, .injection_model = with_model, .deny = {"(?i)password"}});
    if (!built) std::abort();
    return *built;
  };
  static const auto with = make(true), without = make(false);
  return model ? *with : *without;
}

const std::vector<std::string>& questions() {
  static const auto qs = [] {
    const auto c = lmserve::gateway::benign_corpus();
    return std::vector<std::string>(c.begin(), c.end());
  }();
  return qs;
}

void check_each(benchmark::State& state, const std::vector<std::string>& texts) {
  const Guard& g = guard(state.range(0) != 0);
  std::size_t i = 0, bytes = 0;
  std::vector<std::string> one(1);
  for (auto _ : state) {
    one[0] = texts[i];
    bytes += one[0].size();
    benchmark::DoNotOptimize(g.check(one));
    i = (i + 1) % texts.size();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
}

void BM_GuardShortPrompt(benchmark::State& state) { check_each(state, {"hello"}); }
BENCHMARK(BM_GuardShortPrompt)->Arg(0)->Arg(1);

void BM_GuardOrdinaryQuestions(benchmark::State& state) { check_each(state, questions()); }
BENCHMARK(BM_GuardOrdinaryQuestions)->Arg(0)->Arg(1);

void BM_GuardDocument4K(benchmark::State& state) {
  std::string doc;
  for (std::size_t i = 0; doc.size() < 4096; ++i) doc += questions()[i % questions().size()] + " ";
  check_each(state, {doc});
}
BENCHMARK(BM_GuardDocument4K)->Arg(0)->Arg(1);

}  // namespace

BENCHMARK_MAIN();
