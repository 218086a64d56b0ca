// Constrained decoding in the engine (issue #33) on the demo model: every output of a request
// with a grammar is a whole text of it, ended by the model's end token once it is whole, for
// greedy and sampled rows, n > 1, beside unconstrained requests (which it leaves unchanged);
// the same greedy outputs with preemption and prefix hits, and with asynchronous scheduling
// (masks made after the step planned ahead is launched, from the grammar after the token of
// the step before).
#include <gtest/gtest.h>

#include "engine_test_util.h"
#include "text/json_schema.h"

namespace lmserve::engine {
namespace {

std::shared_ptr<const text::Grammar> schema() {
  static const auto g = *text::compile_json_schema(nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"name":{"enum":["ada","bob","cy"]},"n":{"type":"integer","minimum":0,"maximum":999},
          "ok":{"type":"array","items":{"type":"boolean"},"maxItems":3},"note":{"type":"string","maxLength":12}},"required":["name","n","ok"]})"));
  return g;
}

bool whole(const std::shared_ptr<const text::Grammar>& g, const std::string& text) {
  text::GrammarState s(g);
  return s.advance(std::string_view(text)) && s.complete();
}

SamplingParams constrained(double temperature, std::uint64_t seed, std::int32_t n = 1, std::int64_t max_tokens = 400) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  p.n = n;
  p.max_tokens = max_tokens;
  p.grammar = schema();
  return p;
}

std::vector<std::int32_t> prompt(int i) {
  return demo().tokenizer->encode("Record " + std::to_string(i) + " as JSON: name, n and flags.", {.add_special_tokens = false});
}

// A request's choices, collected from one stream (choice index in each event).
std::vector<Result> collect_choices(const std::shared_ptr<RequestStream>& s, int n) {
  std::vector<Result> out(static_cast<std::size_t>(n));
  StreamEvent e;
  while (s->next(&e)) add_event(&out[static_cast<std::size_t>(e.index)], e);
  return out;
}

TEST(EngineConstraints, EveryOutputIsAWholeTextOfItsGrammar) {
  auto engine = make_engine(demo(), 512);
  // Unconstrained requests alone first: what they write beside constrained ones must not change.
  std::vector<std::vector<std::int32_t>> plain_alone;
  for (int i = 0; i < 3; ++i) {
    auto sub = engine->submit({.prompt = prompt(100 + i), .params = greedy(24)});
    ASSERT_TRUE(sub);
    plain_alone.push_back(collect(sub->stream).tokens);
  }
  std::vector<std::shared_ptr<RequestStream>> streams, plain;
  std::vector<int> ns;
  for (int i = 0; i < 8; ++i) {
    const int n = i % 2 == 0 ? 3 : 1;
    auto sub = engine->submit({.prompt = prompt(i), .params = constrained(i % 4 == 3 ? 0.0 : 1.0, 17 + static_cast<std::uint64_t>(i), n)});
    ASSERT_TRUE(sub) << sub.error().status.to_string();
    streams.push_back(sub->stream);
    ns.push_back(n);
  }
  for (int i = 0; i < 3; ++i) {
    auto sub = engine->submit({.prompt = prompt(100 + i), .params = greedy(24)});
    ASSERT_TRUE(sub);
    plain.push_back(sub->stream);
  }
  for (std::size_t i = 0; i < streams.size(); ++i) {
    for (const Result& r : collect_choices(streams[i], ns[i])) {
      EXPECT_EQ(r.finish, FinishReason::kStop) << r.text;
      EXPECT_EQ(r.finish_events, 1);
      EXPECT_TRUE(whole(schema(), r.text)) << "request " << i << ": " << r.text;
      EXPECT_TRUE(nlohmann::json::parse(r.text, nullptr, false).is_object()) << r.text;
    }
  }
  for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_EQ(collect(plain[i]).tokens, plain_alone[i]) << "unconstrained request " << i;
  EXPECT_DOUBLE_EQ(engine->stats().kv_usage, 0.0);
}

TEST(EngineConstraints, GreedyOutputsHoldUnderPreemptionPrefixHitsAndAsynchronousScheduling) {
  // Greedy constrained outputs, each request alone in a roomy pool...
  std::vector<std::vector<std::int32_t>> alone;
  {
    auto engine = make_engine(demo(), 512);
    for (int i = 0; i < 12; ++i) {
      auto sub = engine->submit({.prompt = prompt(i % 4), .params = constrained(0.0, 1, 1, 200)});
      ASSERT_TRUE(sub);
      auto r = collect(sub->stream);
      EXPECT_TRUE(whole(schema(), r.text)) << r.text;
      EXPECT_EQ(r.finish, FinishReason::kStop);
      alone.push_back(r.tokens);
    }
  }
  // ...then all at once in a pool too small for them (preemption; shared prompts hit the prefix
  // cache), synchronous and asynchronous.
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "asynchronous" : "synchronous");
    EngineOptions o;
    o.scheduler.max_num_batched_tokens = 48;
    o.scheduler.max_num_seqs = 12;
    o.scheduler.kv_watermark = 1.0;
    o.scheduler.lanes = {{"only", 0, 0, 100}};
    const Asynchronous* wrapper = nullptr;
    auto engine = async ? make_async_engine(demo(), 48, o, 8, &wrapper) : make_engine(demo(), 48, o, 8);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (int i = 0; i < 12; ++i) {
      auto sub = engine->submit({.prompt = prompt(i % 4), .params = constrained(0.0, 1, 1, 200)});
      ASSERT_TRUE(sub) << sub.error().status.to_string();
      streams.push_back(sub->stream);
    }
    for (std::size_t i = 0; i < streams.size(); ++i) EXPECT_EQ(collect(streams[i]).tokens, alone[i]) << "request " << i;
    const auto s = engine->stats();
    EXPECT_GT(s.preemptions_total, 0) << "the pool was meant to force preemption";
    EXPECT_GT(s.prefix_hits, 0u);
    if (async) {
      EXPECT_GT(wrapper->masked_steps(), 0) << "masked rows were meant to be sampled by the backend";
    }
    EXPECT_DOUBLE_EQ(s.kv_usage, 0.0);
  }
}

TEST(EngineConstraints, ChoicesRegexesAndLengthLimits) {
  auto engine = make_engine(demo(), 256);
  auto choice = *text::Grammar::choice({"yes", "no", "not sure"});
  for (std::uint64_t seed = 0; seed < 6; ++seed) {
    SamplingParams p;
    p.temperature = 1.0;
    p.seed = seed;
    p.max_tokens = 20;
    p.n = 4;
    p.grammar = choice;
    auto sub = engine->submit({.prompt = prompt(1), .params = p});
    ASSERT_TRUE(sub);
    for (const Result& r : collect_choices(sub->stream, 4)) {
      EXPECT_TRUE(r.text == "yes" || r.text == "no" || r.text == "not sure") << r.text;
      EXPECT_EQ(r.finish, FinishReason::kStop);
    }
  }
  // Cut by max_tokens: a prefix of a text of the grammar, finish "length".
  auto regex = *text::Grammar::regex("[A-Z]{4}-[0-9]{6}");
  SamplingParams p;
  p.temperature = 1.0;
  p.seed = 3;
  p.max_tokens = 2;
  p.grammar = regex;
  auto sub = engine->submit({.prompt = prompt(2), .params = p});
  ASSERT_TRUE(sub);
  const auto r = collect(sub->stream);
  EXPECT_EQ(r.finish, FinishReason::kLength);
  text::GrammarState s(regex);
  EXPECT_TRUE(s.advance(std::string_view(r.text))) << r.text;
  EXPECT_FALSE(s.complete()) << r.text;
}

}  // namespace
}  // namespace lmserve::engine
