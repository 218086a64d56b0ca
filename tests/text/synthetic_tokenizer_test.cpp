// Components the shipped models do not use (Metaspace pre-tokenizer and decoder, Digits,
// every Split behaviour and invert, NFKC/Lowercase/Strip/regex Replace, added-token
// lstrip/rstrip/single_word/normalized, TemplateProcessing with BOS and EOS), checked against
// Hugging Face tokenizers on variants of real tokenizer.json files
// (tools/make_fixtures/make_synthetic_tokenizers.py). Also: unsupported parts fail loudly.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "fixture_paths.h"
#include "test_util.h"
#include "text/tokenizer.h"

namespace lmserve::text {
namespace {

namespace fs = std::filesystem;
using lmserve::testing::read_json;
using nlohmann::json;


std::vector<std::string> fixture_names() { return lmserve::testing::stems_in(lmserve::testing::source_dir() / "tests/fixtures/text/synthetic"); }

class SyntheticTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(SyntheticTokenizer, MatchesHuggingFace) {
  json fixture = read_json(lmserve::testing::source_dir() / "tests/fixtures/text/synthetic" / (GetParam() + ".json"));
  fs::path base = lmserve::testing::resolve_fixture_path(fixture.at("base"));
  if (!fs::exists(base)) GTEST_SKIP() << "base tokenizer not present: " << base;
  json tj = read_json(base);
  for (auto& [k, v] : fixture.at("override").items()) tj[k] = v;
  auto tok = Tokenizer::from_json(tj.dump());
  ASSERT_TRUE(tok) << tok.error().to_string();
  int mismatches = 0;
  for (const auto& c : fixture.at("cases")) {
    const std::string text = c.at("text");
    auto ids = (*tok)->encode(text);
    auto plain = (*tok)->encode(text, {.add_special_tokens = false});
    auto expected_ids = c.at("ids").get<std::vector<std::int32_t>>();
    std::string decoded = (*tok)->decode(expected_ids), skip = (*tok)->decode(expected_ids, true);
    bool ok = ids == expected_ids && plain == c.at("ids_no_special").get<std::vector<std::int32_t>>() &&
              decoded == c.at("decoded").get<std::string>() && skip == c.at("decoded_skip_special").get<std::string>();
    if (!ok && ++mismatches <= 5) {
      ADD_FAILURE() << GetParam() << ": " << json(text).dump() << "\n ids      " << json(ids).dump() << "\n expected "
                    << c.at("ids").dump() << "\n decoded  " << json(decoded).dump() << "\n expected "
                    << c.at("decoded").dump() << "\n skip     " << json(skip).dump() << "\n expected "
                    << c.at("decoded_skip_special").dump();
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SyntheticTokenizer, ::testing::ValuesIn(fixture_names()),
                         lmserve::testing::ParamName());

TEST(TokenizerLoad, UnsupportedPartsAreNamedErrors) {
  json base = read_json(lmserve::testing::source_dir() / "models/demo/tokenizer.json");
  struct Case {
    const char* key;
    json value;
    const char* expected;
  };
  std::vector<Case> cases = {
      {"normalizer", {{"type", "Precompiled"}, {"precompiled_charsmap", ""}}, "unsupported normalizer 'Precompiled'"},
      {"pre_tokenizer", {{"type", "BertPreTokenizer"}}, "unsupported pre_tokenizer 'BertPreTokenizer'"},
      {"decoder", {{"type", "WordPiece"}}, "unsupported decoder 'WordPiece'"},
      {"post_processor", {{"type", "RobertaProcessing"}}, "unsupported post_processor 'RobertaProcessing'"},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}}, "does not compile"},
      {"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}}, "split behavior 'Sideways'"},
  };
  for (const auto& c : cases) {
    json tj = base;
    tj[c.key] = c.value;
    auto tok = Tokenizer::from_json(tj.dump());
    ASSERT_FALSE(tok) << c.expected;
    EXPECT_NE(tok.error().message().find(c.expected), std::string::npos) << tok.error().message();
  }
  json wordpiece = base;
  wordpiece["model"]["type"] = "WordPiece";
  auto tok = Tokenizer::from_json(wordpiece.dump());
  ASSERT_FALSE(tok);
  EXPECT_NE(tok.error().message().find("unsupported model 'WordPiece'"), std::string::npos);
  json bad_merge = base;
  bad_merge["model"]["merges"].push_back("notatoken alsonot");
  EXPECT_FALSE(Tokenizer::from_json(bad_merge.dump()));
  EXPECT_FALSE(Tokenizer::from_json("{\"model\": 3}"));
  EXPECT_FALSE(Tokenizer::from_json("not json"));
}

}  // namespace
}  // namespace lmserve::text
