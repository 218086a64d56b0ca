// External check: llama.cpp's tokenizer test vectors (inputs and the ids Hugging Face gave
// for them with add_special_tokens=False) against lmserve's tokenizer on the same models'
// tokenizer.json files, from ../shared/data/tokenizers.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "test_paths.h"
#include "text/tokenizer.h"

namespace lmserve::text {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct VocabCase {
  const char* vectors;  // ggml-vocab-NAME.gguf.{inp,out}
  const char* folder;   // tokenizer folder with the same vocabulary
};

class GgmlVocab : public ::testing::TestWithParam<VocabCase> {};

TEST_P(GgmlVocab, MatchesReferenceIds) {
  const fs::path dir = lmserve::testing::shared_dir() / "data" / "tokenizers";
  const fs::path base = dir / "ggml-vocab-tests" / (std::string("ggml-vocab-") + GetParam().vectors + ".gguf");
  if (!fs::exists(base.string() + ".inp")) GTEST_SKIP() << "no ../shared test vectors at " << base;
  auto tok = Tokenizer::load(dir / GetParam().folder);
  ASSERT_TRUE(tok) << tok.error().to_string();

  const std::string sep = "\n__ggml_vocab_test__\n";
  std::string inp = read_all(base.string() + ".inp");
  std::vector<std::string> inputs;
  for (std::size_t pos = 0, next; (next = inp.find(sep, pos)) != std::string::npos; pos = next + sep.size()) {
    inputs.push_back(inp.substr(pos, next - pos));
  }
  std::ifstream out(base.string() + ".out");
  std::vector<std::vector<std::int32_t>> expected;
  for (std::string line; std::getline(out, line);) {
    std::istringstream ls(line);
    std::vector<std::int32_t> ids;
    for (std::int32_t id; ls >> id;) ids.push_back(id);
    expected.push_back(ids);
  }
  ASSERT_EQ(inputs.size(), expected.size());
  int failures = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    auto ids = (*tok)->encode(inputs[i], {.add_special_tokens = false});
    EXPECT_EQ(ids, expected[i]) << "input " << i << ": '" << inputs[i] << "'";
    failures += ids != expected[i];
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Shared, GgmlVocab,
                         ::testing::Values(VocabCase{"qwen2", "Qwen2.5-7B-Instruct-json"},
                                           VocabCase{"qwen2", "Qwen2.5-7B-Instruct"},
                                           VocabCase{"llama-bpe", "Llama-3.2-3B-Instruct"},
                                           VocabCase{"llama-spm", "Llama-2-7b-chat-hf"},
                                           VocabCase{"gpt-2", "gpt2"}),
                         [](const auto& param_info) {
                           std::string n = std::string(param_info.param.vectors) + "_" + param_info.param.folder;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

}  // namespace
}  // namespace lmserve::text
