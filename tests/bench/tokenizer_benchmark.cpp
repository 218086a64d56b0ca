// Google Benchmark: tokenizer encoding throughput (MB/s of UTF-8 input, one thread) on English
// and Chinese text, for the Qwen2.5 and Llama 3 tokenizers from ../shared and models/demo;
// and BPE cost on one ever-longer word, which must grow close to linearly.
//   build/release/tests/bench/tokenizer_benchmark [--benchmark_filter=Encode]
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "test_paths.h"
#include "text/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using lmserve::text::Tokenizer;

std::shared_ptr<const Tokenizer> tokenizer(const std::string& name) {
  static std::map<std::string, std::shared_ptr<const Tokenizer>> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  fs::path dir = name == "demo" ? lmserve::testing::source_dir() / "models/demo"
                                : lmserve::testing::shared_dir() / "data/tokenizers" / name;
  auto t = Tokenizer::load(dir);
  cache[name] = t ? *t : nullptr;
  return cache[name];
}

// Held-out documents of the demo corpus, split by script, repeated up to ~1 MB.
const std::string& text(bool chinese) {
  static std::string texts[2];
  std::string& out = texts[chinese ? 1 : 0];
  if (!out.empty()) return out;
  std::ifstream in(lmserve::testing::source_dir() / "tests/fixtures/demo_heldout.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str(), picked;
  for (std::size_t pos = 0; pos < all.size();) {
    std::size_t end = all.find("\n\n", pos);
    if (end == std::string::npos) end = all.size();
    std::string doc = all.substr(pos, end - pos);
    std::size_t high = 0;
    for (unsigned char c : doc) high += c >= 0xE0;
    if ((high * 6 > doc.size()) == chinese) picked += doc + "\n\n";
    pos = end + 2;
  }
  while (out.size() < (1u << 20) && !picked.empty()) out += picked;
  return out;
}

void BM_Encode(benchmark::State& state, const std::string& name, bool chinese) {
  auto tok = tokenizer(name);
  if (!tok) {
    state.SkipWithError(("tokenizer not found: " + name).c_str());
    return;
  }
  const std::string& input = text(chinese);
  std::size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(input, {.add_special_tokens = false});
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * input.size()));
  state.counters["tokens"] = static_cast<double>(tokens);
  state.counters["bytes/token"] = static_cast<double>(input.size()) / static_cast<double>(tokens);
}

BENCHMARK_CAPTURE(BM_Encode, Llama3_English, std::string("Llama-3.2-3B-Instruct"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, Llama3_Chinese, std::string("Llama-3.2-3B-Instruct"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, Qwen25_English, std::string("Qwen2.5-7B-Instruct-json"), false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, Qwen25_Chinese, std::string("Qwen2.5-7B-Instruct-json"), true)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Encode, Demo_English, std::string("demo"), false)->Unit(benchmark::kMillisecond);

// One word of n letters that the vocabulary does not hold whole: merging must stay near
// n log n, not n^2 (words over 256 bytes bypass the cache).
void BM_LongWord(benchmark::State& state) {
  auto tok = tokenizer("Llama-3.2-3B-Instruct");
  if (!tok) {
    state.SkipWithError("Llama-3.2-3B-Instruct not found");
    return;
  }
  std::string word;
  const char* syllables[] = {"qua", "zor", "pli", "mek", "tav", "urn"};
  for (std::int64_t i = 0; static_cast<std::int64_t>(word.size()) < state.range(0); ++i) word += syllables[(i * 7 + i / 3) % 6];
  for (auto _ : state) benchmark::DoNotOptimize(tok->encode(word, {.add_special_tokens = false}).data());
  state.SetComplexityN(state.range(0));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * word.size()));
}
BENCHMARK(BM_LongWord)->RangeMultiplier(4)->Range(1 << 10, 1 << 18)->Complexity()->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
