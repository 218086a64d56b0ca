// Conformance with Hugging Face tokenizers: tests/fixtures/text/tokenizers/*.json hold, for
// every string of corpus.json, the ids `tokenizers` gives with and without special tokens
// and its decodings (tools/make_fixtures/make_text_fixtures.py). Every id and every string
// must be identical.
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


std::vector<std::string> fixture_names() { return lmserve::testing::stems_in(lmserve::testing::source_dir() / "tests/fixtures/text/tokenizers"); }

class TokenizerConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerConformance, IdsAndDecodingsMatchHuggingFace) {
  const fs::path root = lmserve::testing::source_dir() / "tests/fixtures/text";
  json fixture = read_json(root / "tokenizers" / (GetParam() + ".json"));
  auto corpus = read_json(root / "corpus.json").get<std::vector<std::string>>();
  fs::path folder = lmserve::testing::resolve_fixture_path(fixture.at("folder"));
  if (!fs::exists(folder)) GTEST_SKIP() << "tokenizer folder not present: " << folder;
  auto tok = Tokenizer::load(folder);
  ASSERT_TRUE(tok) << tok.error().to_string();
  const auto& cases = fixture.at("cases");
  ASSERT_EQ(cases.size(), corpus.size());

  int mismatches = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    const std::string& text = corpus[i];
    auto ids = (*tok)->encode(text);
    auto plain = (*tok)->encode(text, {.add_special_tokens = false});
    bool ok = true;
    ok &= ids == c.at("ids").get<std::vector<std::int32_t>>();
    ok &= plain == c.at("ids_no_special").get<std::vector<std::int32_t>>();
    auto expected_ids = c.at("ids").get<std::vector<std::int32_t>>();
    std::string decoded = (*tok)->decode(expected_ids);
    std::string decoded_skip = (*tok)->decode(expected_ids, true);
    ok &= decoded == c.at("decoded").get<std::string>();
    ok &= decoded_skip == c.at("decoded_skip_special").get<std::string>();
    if (c.at("roundtrip").get<bool>()) ok &= (*tok)->decode(plain) == text;
    if (!ok && ++mismatches <= 5) {
      ADD_FAILURE() << GetParam() << " string " << i << ": " << json(text).dump() << "\n ids      " << json(ids).dump()
                    << "\n expected " << c.at("ids").dump() << "\n decoded  " << json(decoded).dump()
                    << "\n expected " << c.at("decoded").dump() << "\n skip     " << json(decoded_skip).dump()
                    << "\n expected " << c.at("decoded_skip_special").dump();
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << cases.size() << " strings";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TokenizerConformance, ::testing::ValuesIn(fixture_names()),
                         lmserve::testing::ParamName());

}  // namespace
}  // namespace lmserve::text
