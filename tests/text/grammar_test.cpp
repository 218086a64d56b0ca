// text/byte_dfa, text/grammar and text/json_schema: the automaton against the texts it should
// and should not take; the json_object grammar against JsonPrefix byte by byte; schemas'
// grammars walked at random to whole documents (never a dead end on the way), each checked by
// an independent validator (Python's jsonschema); refused keywords named; token masks of a
// schema grammar against every token tried alone.
#include "text/grammar.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>

#include "fixture_paths.h"
#include "test_util.h"
#include "text/json_prefix.h"
#include "text/json_schema.h"
#include "text/token_mask.h"

namespace lmserve::text {
namespace {

using ojson = nlohmann::ordered_json;

TEST(ByteDfa, MatchesWholeTexts) {
  struct Case {
    const char* pattern;
    std::vector<const char*> yes, no;
  };
  const std::vector<Case> cases = {
      {"abc", {"abc"}, {"ab", "abcd", ""}},
      {"a|bc|", {"a", "bc", ""}, {"b", "abc"}},
      {"[a-c]+x?", {"a", "cabx", "bbbb"}, {"x", "", "ad"}},
      {"\\d{2,3}-[^0-9\\n]", {"12-a", "123-é", "99-中"}, {"1-a", "1234-a", "12-5", "12-\n"}},
      {"(?:ab){2}|c*", {"abab", "", "ccc"}, {"ab", "ababab", "abc"}},
      {"(?<year>\\d{4})-\\w+\\s?", {"2024-ok", "2024-a_1 "}, {"2024-", "24-ok"}},
      {"[\\u4e00-\\u9fff]{1,2}\\.", {"中.", "中文."}, {"a.", "中文字.", "."}},
      {"^.{3}$", {"abc", "中文字", "a\tb"}, {"ab", "a\nb"}},
      {"[-a]\\x41\\u00e9", {"-Aé", "aAé"}, {"bAé"}},
  };
  for (const auto& c : cases) {
    auto dfa = ByteDfa::compile(c.pattern);
    ASSERT_TRUE(dfa.has_value()) << c.pattern << ": " << dfa.error().message();
    for (const char* t : c.yes) EXPECT_TRUE(dfa->matches(t)) << c.pattern << " should take '" << t << "'";
    for (const char* t : c.no) EXPECT_FALSE(dfa->matches(t)) << c.pattern << " should refuse '" << t << "'";
  }
}

TEST(ByteDfa, SearchesUnlessAnchored) {
  auto dfa = ByteDfa::compile("ab+c", {.anchored = false});
  ASSERT_TRUE(dfa.has_value());
  EXPECT_TRUE(dfa->matches("xxabbcyy"));
  EXPECT_FALSE(dfa->matches("xxacyy"));
  auto start = ByteDfa::compile("^ab", {.anchored = false});
  ASSERT_TRUE(start.has_value());
  EXPECT_TRUE(start->matches("abzzz"));
  EXPECT_FALSE(start->matches("zab"));
  auto end = ByteDfa::compile("ab$", {.anchored = false});
  ASSERT_TRUE(end.has_value());
  EXPECT_TRUE(end->matches("zzab"));
  EXPECT_FALSE(end->matches("abz"));
}

TEST(ByteDfa, EveryStateCanStillMatch) {
  // No state of the automaton is a dead end: from each one an accepting state is reachable.
  auto dfa = ByteDfa::compile("a(b|c)*d|e[0-9]{3}");
  ASSERT_TRUE(dfa.has_value());
  for (std::size_t s = 0; s < dfa->states(); ++s) {
    std::vector<char> seen(dfa->states(), 0);
    std::vector<std::int32_t> todo{static_cast<std::int32_t>(s)};
    bool reach = false;
    while (!todo.empty() && !reach) {
      auto x = todo.back();
      todo.pop_back();
      if (seen[static_cast<std::size_t>(x)]) continue;
      seen[static_cast<std::size_t>(x)] = 1;
      reach = dfa->accepting(x);
      for (int b = 0; b < 256; ++b) {
        auto t = dfa->next(x, static_cast<unsigned char>(b));
        if (t != ByteDfa::kDead) todo.push_back(t);
      }
    }
    EXPECT_TRUE(reach) << "state " << s;
  }
}

TEST(ByteDfa, PatternsTooLargeToBuildAreRefused) {
  for (const char* p : {"(?:[a-z]{1000}){1000}", "(?:(?:a|b)*c{0,999}){40}"}) {
    auto dfa = ByteDfa::compile(p);
    ASSERT_FALSE(dfa.has_value()) << p;
    EXPECT_NE(dfa.error().message().find("too complex"), std::string::npos) << dfa.error().message();
  }
}

TEST(ByteDfa, RefusesWhatItCannotFollow) {
  for (const char* p : {"(?=a)b", "a\\1", "\\bword", "a{2,1}", "(ab", "ab)", "[z-a]", "a^b", "a$b", "*a", "a**+", "[ab"}) {
    auto dfa = ByteDfa::compile(p);
    EXPECT_FALSE(dfa.has_value()) << p;
    if (!dfa.has_value()) {
      EXPECT_EQ(dfa.error().code(), StatusCode::kInvalidArgument);
    }
  }
}

// The bytes a state takes (each tried alone).
std::vector<unsigned char> takes(const GrammarState& s) {
  std::vector<unsigned char> out;
  GrammarState next = s;
  for (int b = 0; b < 256; ++b) {
    if (s.advance_into(static_cast<unsigned char>(b), next)) out.push_back(static_cast<unsigned char>(b));
  }
  return out;
}

TEST(Grammar, JsonObjectTakesWhatJsonPrefixTakes) {
  auto g = std::make_shared<Grammar>();
  g->root = g->add(GrammarNode{.kind = GrammarNode::Kind::kAny, .object_only = true});
  g->limits = {.max_depth = 64, .max_space_run = 8};
  ASSERT_TRUE(g->finish().is_ok());
  std::mt19937_64 rng(7);
  for (int walk = 0; walk < 300; ++walk) {
    GrammarState s(g);
    JsonPrefix j(JsonPrefix::Options{.object_only = true, .max_depth = 40, .max_space_run = 8});
    ASSERT_TRUE(s.advance('{'));
    ASSERT_TRUE(j.advance('{'));
    int depth = 1, digits = 0;
    std::string text = "{";
    for (int step = 0; step < 300 && !s.complete(); ++step) {
      const auto mine = takes(s);
      std::vector<unsigned char> theirs;
      for (int b = 0; b < 256; ++b) {
        JsonPrefix c = j;
        if (c.advance(static_cast<unsigned char>(b))) theirs.push_back(static_cast<unsigned char>(b));
      }
      ASSERT_EQ(mine, theirs) << "after [" << text << "]";
      ASSERT_EQ(s.complete(), j.complete()) << text;
      std::vector<unsigned char> pick;
      const bool after_u = text.size() >= 2 && text.compare(text.size() - 2, 2, "\\u") == 0;
      for (auto b : mine) {
        if ((b == '{' || b == '[') && depth >= 12) continue;
        if (after_u && (b == 'd' || b == 'D')) continue;  // surrogate halves are refused here, taken there
        pick.push_back(b);
      }
      ASSERT_FALSE(pick.empty()) << text;
      const auto b = pick[rng() % pick.size()];
      digits = (b >= '0' && b <= '9') ? digits + 1 : 0;
      if (digits >= 14) break;  // numbers: 16 digits here, any number there
      if (digits >= 3) {        // exponents: 3 digits here
        const std::size_t k = text.size() - static_cast<std::size_t>(digits - 1);
        const char before = k >= 1 ? text[k - 1] : 0, before2 = k >= 2 ? text[k - 2] : 0;
        if (before == 'e' || before == 'E' || ((before == '+' || before == '-') && (before2 == 'e' || before2 == 'E'))) break;
      }
      depth += (b == '{' || b == '[') ? 1 : 0;
      ASSERT_TRUE(s.advance(b));
      ASSERT_TRUE(j.advance(b));
      text += static_cast<char>(b);
    }
  }
}

// A whole document of the grammar, written a byte at a time at random (closing bytes favoured
// as it grows); fails the test at a dead end (no byte taken, not complete).
std::string walk(const std::shared_ptr<const Grammar>& g, std::mt19937_64& rng) {
  GrammarState s(g);
  std::string text;
  while (text.size() < 4000) {
    if (s.complete() && (rng() % 4 == 0 || text.size() > 200)) return text;
    auto bytes = takes(s);
    if (bytes.empty()) {
      EXPECT_TRUE(s.complete()) << "dead end after [" << text << "]";
      return text;
    }
    std::vector<unsigned char> closing;
    for (auto b : bytes) {
      if (b == '"' || b == '}' || b == ']' || b == ',') closing.push_back(b);
    }
    if (!closing.empty() && text.size() > 30 && rng() % 10 < 7) bytes = closing;
    // Printable ASCII and a few multi-byte leads most of the time; any byte the grammar takes now and then.
    std::vector<unsigned char> tame;
    for (auto b : bytes) {
      if ((b >= 0x20 && b < 0x7F) || b >= 0x80) tame.push_back(b);
    }
    if (!tame.empty() && rng() % 10 < 8) bytes = tame;
    const auto b = bytes[rng() % bytes.size()];
    EXPECT_TRUE(s.advance(b));
    text += static_cast<char>(b);
  }
  ADD_FAILURE() << "no end in 4000 bytes: " << text.substr(0, 200);
  return text;
}

const std::vector<std::string>& schemas() {
  static const std::vector<std::string> s = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":130},"email":{"type":"string","format":"email","maxLength":12}},"required":["name","age"]})",
      R"({"type":"array","items":{"type":"number","exclusiveMinimum":-2.5,"maximum":1000},"minItems":2,"maxItems":5})",
      R"({"type":"object","properties":{"kind":{"enum":["cat","dog",3,null,{"a":[1]}]},"tags":{"type":"array","items":{"type":"string","pattern":"^[a-z]{2,5}$"},"maxItems":3},"when":{"type":"string","format":"date-time"}},"required":["kind","tags","when"],"additionalProperties":false})",
      R"({"anyOf":[{"type":"string","minLength":3},{"type":"null"},{"type":"object","properties":{"x":{"const":"fixed"}},"required":["x"]}]})",
      R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer","exclusiveMaximum":10},"kids":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["v"]}},"$ref":"#/$defs/node"})",
      R"({"type":"object","additionalProperties":{"type":"boolean"}})",
      R"({"type":["integer","string"],"minimum":-5,"maximum":5,"maxLength":4})",
      R"({"type":"object","properties":{"id":{"type":"string","format":"uuid"},"ip":{"type":"string","format":"ipv4"},"d":{"type":"string","format":"date"},"n":{"type":"number","minimum":0.5,"maximum":0.75},"opt":{"type":"boolean"}},"required":["id","ip","d","n"]})",
      R"({"type":"object"})",
      R"({"type":"object","properties":{"a":{"type":["string","null"]},"b":{"allOf":[{"type":"integer","maximum":-3}]},"c":{}},"required":["a","b","c"]})",
  };
  return s;
}

TEST(JsonSchema, RandomDocumentsValidate) {
  // Python's jsonschema is the independent judge (python3-jsonschema, scripts/install-deps.sh).
  const auto dir = ::testing::TempDir();
  const std::string cases = dir + "/schema_cases.jsonl", script = dir + "/validate.py";
  {
    std::ofstream out(cases);
    std::mt19937_64 rng(11);
    for (const auto& text : schemas()) {
      const auto schema = ojson::parse(text);
      auto g = compile_json_schema(schema);
      ASSERT_TRUE(g.has_value()) << text << ": " << g.error().message();
      for (int i = 0; i < 40; ++i) {
        const auto doc = walk(*g, rng);
        out << ojson{{"schema", schema}, {"doc", doc}}.dump(-1, ' ', false, ojson::error_handler_t::replace) << "\n";
      }
    }
    std::ofstream py(script);
    py << "import json, sys, jsonschema\n"
          "bad = 0; n = 0\n"
          "for line in open(sys.argv[1]):\n"
          "    c = json.loads(line); n += 1\n"
          "    try:\n"
          "        doc = json.loads(c['doc'])\n"
          "        cls = jsonschema.validators.validator_for(c['schema'])\n"
          "        cls(c['schema'], format_checker=jsonschema.FormatChecker()).validate(doc)\n"
          "    except Exception as e:\n"
          "        bad += 1; print('FAIL', c['doc'][:300], '|', str(e).splitlines()[0][:200])\n"
          "print('checked', n, 'bad', bad)\n";
  }
  FILE* p = popen(("/usr/bin/python3 " + script + " " + cases + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) output += buf;
  ASSERT_EQ(pclose(p), 0) << output;
  EXPECT_NE(output.find("checked 400 bad 0"), std::string::npos) << output;
}

TEST(JsonSchema, PropertiesComeInTheSchemasOrder) {
  auto g = compile_json_schema(ojson::parse(R"({"type":"object","properties":{"zeta":{"type":"integer"},"alpha":{"type":"integer"}},"required":["zeta","alpha"]})"));
  ASSERT_TRUE(g.has_value());
  GrammarState s(*g);
  EXPECT_TRUE(s.advance(std::string_view(R"({"zeta": 1, "alpha": 2})")));
  EXPECT_TRUE(s.complete());
  GrammarState t(*g);
  EXPECT_FALSE(t.advance(std::string_view(R"({"alpha")")));
  // Required ones cannot be left out; an object closes only once they are written.
  GrammarState u(*g);
  EXPECT_TRUE(u.advance(std::string_view(R"({"zeta": 1)")));
  EXPECT_FALSE(u.advance('}'));
}

TEST(JsonSchema, NumbersKeepTheirBounds) {
  auto g = compile_json_schema(ojson::parse(R"({"type":"integer","minimum":10,"maximum":25})"));
  ASSERT_TRUE(g.has_value());
  for (const char* ok : {"10", "17", "25"}) {
    GrammarState s(*g);
    EXPECT_TRUE(s.advance(std::string_view(ok)) && s.complete()) << ok;
  }
  for (const char* no : {"-", "0", "3", "26", "100", "1.5"}) {
    GrammarState s(*g);
    EXPECT_FALSE(s.advance(std::string_view(no)) && s.complete()) << no;
  }
  GrammarState s(*g);
  ASSERT_TRUE(s.advance('2'));
  EXPECT_FALSE(s.complete());
  EXPECT_FALSE(s.advance('6'));  // 26 is out, and no longer number starting 26 is in
  EXPECT_TRUE(s.advance('5'));
  EXPECT_TRUE(s.finished());
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"object","properties":{"a":{"not":{"type":"string"}}}})", "'not' (at /properties/a)"},
      {R"({"type":"array","uniqueItems":true})", "'uniqueItems'"},
      {R"({"type":"number","multipleOf":3})", "'multipleOf'"},
      {R"({"type":"string","format":"ipv6"})", "'format ipv6'"},
      {R"({"patternProperties":{"^a":{}}})", "'patternProperties'"},
      {R"({"type":"array","items":[{"type":"string"}]})", "'items (as an array)'"},
      {R"({"$ref":"#/$defs/missing"})", "points at nothing"},
      {R"({"$ref":"http://example.com/s.json"})", "another document"},
      {R"({"type":"strin"})", "unknown type 'strin'"},
      {R"x({"type":"string","pattern":"(?=x)"})x", "lookaround"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "no number"},
      {R"(false)", "matches nothing"},
      {R"({"$ref":"#"})", "$ref cycle"},
      {R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"null"}]}},"$ref":"#/$defs/a"})", "$ref cycle"},
  };
  for (const auto& [schema, want] : cases) {
    auto g = compile_json_schema(ojson::parse(schema));
    ASSERT_FALSE(g.has_value()) << schema;
    EXPECT_EQ(g.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.error().message().find(want), std::string::npos) << g.error().message();
    EXPECT_EQ(g.error().message().rfind("json_schema: ", 0), 0u) << g.error().message();
  }
}

TEST(Grammar, ChoicesAndRegexes) {
  auto c = Grammar::choice({"yes", "no", "not sure"});
  ASSERT_TRUE(c.has_value());
  GrammarState s(*c);
  ASSERT_TRUE(s.advance(std::string_view("no")));
  EXPECT_TRUE(s.complete());
  EXPECT_FALSE(s.finished());  // "not sure" goes on
  EXPECT_TRUE(s.advance(std::string_view("t sure")));
  EXPECT_TRUE(s.finished());
  EXPECT_FALSE(Grammar::choice({}).has_value());
  EXPECT_FALSE(Grammar::choice({std::string(70000, 'x')}).has_value()) << "a literal longer than a frame can count";
  EXPECT_FALSE(Grammar::choice({"a", ""}).has_value());

  auto r = Grammar::regex("[A-Z]{2}-\\d+");
  ASSERT_TRUE(r.has_value());
  GrammarState t(*r);
  EXPECT_FALSE(t.advance('a'));
  ASSERT_TRUE(t.advance(std::string_view("AB-1")));
  EXPECT_TRUE(t.complete());
  EXPECT_FALSE(t.finished());
  EXPECT_FALSE(Grammar::regex("(unclosed").has_value());
}

TEST(Grammar, AlternativesThatReadAlikeStayOpenTogether) {
  // Two object branches share their first bytes; the grammar keeps both until they part.
  auto g = compile_json_schema(ojson::parse(
      R"({"anyOf":[{"type":"object","properties":{"k":{"type":"integer"}},"required":["k"]},{"type":"object","properties":{"k":{"type":"string"}},"required":["k"]}]})"));
  ASSERT_TRUE(g.has_value());
  for (const char* doc : {R"({"k": 5})", R"({"k": "five"})"}) {
    GrammarState s(*g);
    EXPECT_TRUE(s.advance(std::string_view(doc)) && s.complete()) << doc;
  }
  GrammarState s(*g);
  EXPECT_FALSE(s.advance(std::string_view(R"({"k": true})")));
}

class SchemaMask : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Tokenizers, SchemaMask,
                         ::testing::Values("../shared/data/tokenizers/Qwen2.5-7B-Instruct-json", "models/demo"),
                         lmserve::testing::ParamName());

TEST_P(SchemaMask, TrieMaskIsEveryTokenTriedAlone) {
  auto tok = Tokenizer::load(lmserve::testing::source_dir() / GetParam());
  ASSERT_TRUE(tok);
  const TokenTrie trie(**tok);
  // Patterns, enums and formats; then free text (the table of plain tokens inside a string,
  // at every UTF-8 position) and a long limit, with multi-byte characters and escapes.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {schemas()[2], R"({"kind": "dog", "tags": ["ab", "xyz"], "when": "2024-05-06T10:11:12Z"})"},
      {R"({"type":"object","properties":{"text":{"type":"string"},"short":{"type":"string","maxLength":300},"tiny":{"type":"string","maxLength":6},"n":{"type":"integer"}},"required":["text","short","tiny","n"]})",
       R"({"text": "héllo wörld 中文字 \"q\" \\ \u00e9 end😀", "short": "ab中c", "tiny": "x中yz", "n": 5})"},
  };
  for (const auto& [schema_text, doc] : cases) {
  auto g = compile_json_schema(ojson::parse(schema_text));
  ASSERT_TRUE(g.has_value());
  std::vector<std::uint64_t> mask;
  for (std::size_t i = 0; i <= doc.size(); i += 3) {
    GrammarState at(*g);
    ASSERT_TRUE(at.advance(std::string_view(doc).substr(0, i))) << doc.substr(0, i);
    trie.allowed(at, mask);
    std::size_t allowed = 0;
    for (std::size_t id = 0; id < trie.vocab_size(); ++id) {
      auto bytes = (*tok)->token_bytes(static_cast<std::int32_t>(id));
      GrammarState c = at;
      const bool want = bytes && !bytes->empty() && bytes->size() < 65536 && c.advance(*bytes);
      const bool got = (mask[id >> 6] >> (id & 63)) & 1;
      ASSERT_EQ(got, want) << "token " << id << " after [" << doc.substr(0, i) << "]";
      allowed += got;
    }
    EXPECT_EQ(allowed > 0, !at.finished()) << doc.substr(0, i);
  }
  }
}

}  // namespace
}  // namespace lmserve::text
