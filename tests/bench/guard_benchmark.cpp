// The gateway's content guard (gateway/guard.h) with the default rules and one tenant regex, as
// scripts/gateway-overhead.sh runs it: one check of a short prompt ("hello"), of each ordinary
// question of tests/gateway/data/guard_benign.txt in turn, and of a 4 KB document made of them.
// Run: build/release/tests/bench/guard_benchmark
#include <benchmark/benchmark.h>

#include <fstream>
#include <string>
#include <vector>

#include "gateway/guard.h"
#include "test_paths.h"

namespace {

using lmserve::gateway::Guard;

const Guard& guard() {
  static const auto g = [] {
    auto built = Guard::build({.default_rules = true, .deny = {"(?i)password"}});
    if (!built) std::abort();
    return *built;
  }();
  return *g;
}

// The benign corpus, one question a line (its "#" lines skipped; escapes left as written).
const std::vector<std::string>& questions() {
  static const auto qs = [] {
    std::ifstream in(lmserve::testing::source_dir() / "tests" / "gateway" / "data" / "guard_benign.txt");
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line[0] != '#') out.push_back(line);
    }
    if (out.empty()) std::abort();
    return out;
  }();
  return qs;
}

void check_each(benchmark::State& state, const std::vector<std::string>& texts) {
  std::size_t i = 0, bytes = 0;
  std::vector<std::string> one(1);
  for (auto _ : state) {
    one[0] = texts[i];
    bytes += one[0].size();
    benchmark::DoNotOptimize(guard().check(one));
    i = (i + 1) % texts.size();
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
}

void BM_GuardShortPrompt(benchmark::State& state) { check_each(state, {"hello"}); }
BENCHMARK(BM_GuardShortPrompt);

void BM_GuardOrdinaryQuestions(benchmark::State& state) { check_each(state, questions()); }
BENCHMARK(BM_GuardOrdinaryQuestions);

void BM_GuardDocument4K(benchmark::State& state) {
  std::string doc;
  for (std::size_t i = 0; doc.size() < 4096; ++i) doc += questions()[i % questions().size()] + " ";
  check_each(state, {doc});
}
BENCHMARK(BM_GuardDocument4K);

}  // namespace

BENCHMARK_MAIN();
