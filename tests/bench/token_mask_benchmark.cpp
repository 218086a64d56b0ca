// Token masks of constrained decoding on real vocabularies: json_object's (text/token_mask.h over
// text/json_prefix.h), one mask per state, single-threaded; and a step of a batch of 64 rows
// under a nested JSON Schema (text/grammar.h), each row with its own mask cache, as the engine
// makes them (on a thread pool of 1..16 threads). Run: build/release/tests/bench/token_mask_benchmark
#include <benchmark/benchmark.h>

#include <map>
#include <memory>

#include "common/thread_pool.h"
#include "test_paths.h"
#include "text/grammar.h"
#include "text/json_prefix.h"
#include "text/json_schema.h"
#include "text/token_mask.h"

namespace {

using lmserve::text::JsonPrefix;
using lmserve::text::Tokenizer;
using lmserve::text::TokenTrie;

const TokenTrie& trie(const std::string& rel) {
  static std::map<std::string, std::unique_ptr<TokenTrie>> tries;
  auto& t = tries[rel];
  if (!t) {
    auto tok = Tokenizer::load(lmserve::testing::source_dir() / rel);
    if (!tok) std::abort();
    t = std::make_unique<TokenTrie>(**tok);
  }
  return *t;
}

// The bytes of each token of a customer-service JSON document (122-138 tokens), as `vocab`
// tokenizes it: what a constrained request writes in the document benchmarks.
std::vector<std::string> document_tokens(const std::string& vocab) {
  auto tok = Tokenizer::load(lmserve::testing::source_dir() / vocab);
  if (!tok) std::abort();
  const std::string doc = R"({"customer": {"name": "Anna Schmidt", "account": "DE89 3704 0044 0532 0130 00", "segment": "retail"},)"
                          R"( "request": "The customer asks why the transfer of 1,250.00 EUR on 3 March was returned and whether the fee)"
                          R"( will be refunded; she also wants the statement for February sent to her new address.", "priority": 2,)"
                          R"( "tags": ["transfer", "fee", "statement"], "amounts": [1250.0, 12.5], "escalate": false})";
  std::vector<std::string> bytes;
  for (auto id : (*tok)->encode(doc, {.add_special_tokens = false})) bytes.push_back(*(*tok)->token_bytes(id));
  return bytes;
}

// State: the text generated so far (a string's inside lets most of the vocabulary through; after
// a comma only a key's quote and space).
void BM_JsonMask(benchmark::State& st, std::string vocab, std::string prefix) {
  const TokenTrie& t = trie(vocab);
  JsonPrefix p;
  if (!p.advance(std::string_view(prefix))) std::abort();
  std::vector<std::uint64_t> mask;
  for (auto _ : st) {
    t.allowed(p, mask);
    benchmark::DoNotOptimize(mask.data());
  }
  std::size_t n = 0;
  for (auto w : mask) n += static_cast<std::size_t>(__builtin_popcountll(w));
  st.counters["allowed"] = static_cast<double>(n);
  st.counters["vocab"] = static_cast<double>(t.vocab_size());
  st.counters["trie_nodes"] = static_cast<double>(t.nodes());
}

const char* kLlama = "../shared/data/tokenizers/Llama-3.2-3B-Instruct";
const char* kQwen = "../shared/data/tokenizers/Qwen2.5-7B-Instruct-json";
BENCHMARK_CAPTURE(BM_JsonMask, llama3_in_string, kLlama, R"({"name": "get_weather", "arguments": {"city": "Pa)")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_JsonMask, llama3_after_comma, kLlama, R"({"name": "get_weather", )")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_JsonMask, llama3_in_number, kLlama, R"({"a": [1, 2.5)")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_JsonMask, qwen25_in_string, kQwen, R"({"name": "get_weather", "arguments": {"city": "Pa)")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_JsonMask, qwen25_after_comma, kQwen, R"({"name": "get_weather", )")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_JsonMask, qwen25_in_number, kQwen, R"({"a": [1, 2.5)")->Unit(benchmark::kMicrosecond);

// A document written token by token with a request's mask cache: the mean cost of a token's
// mask over the document (strings, numbers, keys), the cache starting empty.
void BM_JsonMaskPerTokenOfADocument(benchmark::State& st, std::string vocab) {
  const TokenTrie& t = trie(vocab);
  const std::vector<std::string> bytes = document_tokens(vocab);
  std::uint64_t hits = 0, misses = 0;
  for (auto _ : st) {
    lmserve::text::MaskCache<JsonPrefix, lmserve::text::JsonPrefixKeyHash> cache(t);
    JsonPrefix p;
    for (const auto& b : bytes) {
      benchmark::DoNotOptimize(cache.allowed(p).data());
      if (!p.advance(std::string_view(b))) std::abort();
    }
    hits += cache.hits();
    misses += cache.misses();
  }
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations() * bytes.size()));
  st.counters["tokens"] = static_cast<double>(bytes.size());
  st.counters["hit_rate"] = static_cast<double>(hits) / static_cast<double>(hits + misses);
}
BENCHMARK_CAPTURE(BM_JsonMaskPerTokenOfADocument, llama3, kLlama)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_JsonMaskPerTokenOfADocument, qwen25, kQwen)->Unit(benchmark::kMillisecond);

// A step of 64 rows under a nested schema: each row writes the document below from its own
// starting token (so that the rows' states differ, as in a served batch), its mask taken from
// its own cache, then its next token fed to its grammar. Time per step; per token = / 64.
void BM_SchemaMaskBatch64(benchmark::State& st, std::string vocab) {
  using lmserve::text::GrammarState;
  const TokenTrie& t = trie(vocab);
  auto grammar = lmserve::text::compile_json_schema(nlohmann::ordered_json::parse(R"({"type":"object","properties":{
      "customer":{"type":"object","properties":{"name":{"type":"string","maxLength":64},
        "account":{"type":"string","pattern":"^[A-Z]{2}[0-9]{2}( [0-9]{4}){4} [0-9]{2}$"},"segment":{"enum":["retail","business","private"]}},
        "required":["name","account","segment"]},
      "request":{"type":"string","maxLength":400},"priority":{"type":"integer","minimum":1,"maximum":5},
      "tags":{"type":"array","items":{"type":"string","maxLength":20},"maxItems":8},"amounts":{"type":"array","items":{"type":"number","minimum":0}},
      "escalate":{"type":"boolean"}},"required":["customer","request","priority","tags","amounts","escalate"]})"));
  if (!grammar) std::abort();
  const std::vector<std::string> bytes = document_tokens(vocab);
  constexpr std::size_t kRows = 64;
  struct Row {
    GrammarState state;
    std::unique_ptr<lmserve::text::MaskCache<GrammarState, lmserve::text::GrammarKeyHash>> cache;
    std::size_t at = 0;
  };
  std::vector<Row> rows;
  for (std::size_t r = 0; r < kRows; ++r) {
    Row row{GrammarState(*grammar), std::make_unique<lmserve::text::MaskCache<GrammarState, lmserve::text::GrammarKeyHash>>(t, 16), 0};
    const std::size_t start = (r * bytes.size()) / kRows;
    for (; row.at < start; ++row.at) {
      if (!row.state.advance(std::string_view(bytes[row.at]))) std::abort();
    }
    rows.push_back(std::move(row));
  }
  lmserve::ThreadPool pool(static_cast<std::size_t>(st.range(0)));
  std::uint64_t hits = 0, misses = 0;
  for (auto _ : st) {
    pool.parallel_for(kRows, [&](std::size_t b, std::size_t e) {
      for (std::size_t r = b; r < e; ++r) {
        Row& row = rows[r];
        benchmark::DoNotOptimize(row.cache->allowed(row.state).data());
        if (!row.state.advance(std::string_view(bytes[row.at]))) std::abort();
        if (++row.at == bytes.size()) {  // the document is whole: the row starts another
          row.state = GrammarState(*grammar);
          row.at = 0;
        }
      }
    });
  }
  for (const auto& row : rows) hits += row.cache->hits(), misses += row.cache->misses();
  st.SetItemsProcessed(static_cast<std::int64_t>(st.iterations() * kRows));
  st.counters["threads"] = static_cast<double>(st.range(0));
  st.counters["hit_rate"] = static_cast<double>(hits) / static_cast<double>(hits + misses);
  st.counters["per_token"] = benchmark::Counter(static_cast<double>(kRows), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK_CAPTURE(BM_SchemaMaskBatch64, llama3, kLlama)->Arg(1)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_SchemaMaskBatch64, qwen25, kQwen)->Arg(1)->Arg(4)->Arg(8)->Arg(16)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
