// text/token_mask and Tokenizer::token_bytes on real vocabularies: a text's tokens' bytes are the
// text, and the trie's mask is what trying every token's bytes one by one gives.
#include "text/token_mask.h"

#include <gtest/gtest.h>

#include "fixture_paths.h"
#include "test_util.h"
#include "text/json_prefix.h"

namespace lmserve::text {
namespace {

std::shared_ptr<const Tokenizer> load(const std::string& rel) {
  auto t = Tokenizer::load(lmserve::testing::source_dir() / rel);
  EXPECT_TRUE(t) << rel;
  return t ? *t : nullptr;
}

class TokenMask : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Tokenizers, TokenMask,
                         ::testing::Values("../shared/data/tokenizers/Llama-3.2-3B-Instruct", "../shared/data/tokenizers/Qwen2.5-7B-Instruct-json",
                                           "../shared/data/tokenizers/Mistral-7B-Instruct-v0.2", "models/demo"),
                         lmserve::testing::ParamName());

TEST_P(TokenMask, ATextsTokensBytesAreTheText) {
  auto tok = load(GetParam());
  ASSERT_TRUE(tok);
  for (const std::string& text : {std::string("{\"city\": \"Paris\", \"n\": [1, 2.5e3]}"), std::string("中文 ok 😀 -- ünïcödé\n\ttabs"),
                                 std::string("  leading spaces and trailing  ")}) {
    const auto ids = tok->encode(text, {.add_special_tokens = false});
    std::string joined;
    for (auto id : ids) {
      auto b = tok->token_bytes(id);
      ASSERT_TRUE(b) << id;
      joined += *b;
    }
    // A tokenizer that puts a space before the text (SentencePiece's) shows it in the bytes.
    EXPECT_TRUE(joined == text || joined == " " + text) << GetParam() << ": [" << joined << "]";
  }
}

TEST_P(TokenMask, TheTriesMaskIsEveryTokenTriedAlone) {
  auto tok = load(GetParam());
  ASSERT_TRUE(tok);
  const TokenTrie trie(*tok);
  std::vector<std::string> bytes(tok->vocab_size());
  for (std::size_t id = 0; id < bytes.size(); ++id) bytes[id] = tok->token_bytes(static_cast<std::int32_t>(id)).value_or("");
  int states = 0;
  for (const char* prefix : {"", "{", "{\"na", "{\"name\": \"get_wea", "{\"a\": [1, 2", "{\"a\": tr", "{\"a\": \"\xE4\xB8", "{\"a\": {}}", "{\"a\": -0.5e"}) {
    JsonPrefix state;
    ASSERT_TRUE(state.advance(std::string_view(prefix))) << prefix;
    std::vector<std::uint64_t> mask;
    trie.allowed(state, mask);
    std::size_t allowed = 0;
    for (std::size_t id = 0; id < bytes.size(); ++id) {
      JsonPrefix s = state;
      const bool want = !bytes[id].empty() && s.advance(std::string_view(bytes[id]));
      const bool got = (mask[id >> 6] >> (id & 63)) & 1;
      ASSERT_EQ(got, want) << GetParam() << " after [" << prefix << "]: token " << id << " [" << bytes[id] << "]";
      allowed += got;
    }
    EXPECT_GT(allowed, 0u) << prefix;
    ++states;
  }
  EXPECT_EQ(states, 9);
}

// A document generated token by token: every token it is made of is allowed at its step, and
// the remembered masks are the masks made afresh.
TEST_P(TokenMask, AWrittenDocumentsTokensAreAllowedAndRememberedMasksHold) {
  auto tok = load(GetParam());
  ASSERT_TRUE(tok);
  const TokenTrie trie(*tok);
  const std::string doc = R"({"name": "get_weather", "arguments": {"city": "São Paulo", "days": [1, 2, 3], "units": "metric",)"
                          R"( "note": "a long value written as many tokens, with \"quotes\" and 中文 in it"}, "ok": true})";
  const auto ids = tok->encode(doc, {.add_special_tokens = false});
  MaskCache<JsonPrefix, JsonPrefixKeyHash> cache(trie, 8);
  JsonPrefix state;
  std::vector<std::uint64_t> fresh;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto& remembered = cache.allowed(state);
    trie.allowed(state, fresh);
    ASSERT_EQ(remembered, fresh) << "step " << i;
    const auto id = static_cast<std::size_t>(ids[i]);
    const std::optional<std::string> raw = tok->token_bytes(ids[i]);
    ASSERT_TRUE(raw.has_value());
    std::string bytes = raw.value();
    const bool spaced = i == 0 && bytes.starts_with(' ');  // SentencePiece's space before the text
    if (spaced) {
      bytes.erase(0, 1);
    } else {
      ASSERT_TRUE((fresh[id >> 6] >> (id & 63)) & 1) << "step " << i << " [" << bytes << "]";
    }
    ASSERT_TRUE(state.advance(std::string_view(bytes))) << "step " << i;
  }
  EXPECT_TRUE(state.complete());
  EXPECT_GT(cache.hits(), 0u);
}

}  // namespace
}  // namespace lmserve::text
