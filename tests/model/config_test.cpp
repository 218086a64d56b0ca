#include "model/config.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace lmserve::model {
namespace {

using nlohmann::json;

json base() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"vocab_size", 100}, {"hidden_size", 64}, {"intermediate_size", 128},
          {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-5},
          {"max_position_embeddings", 256}, {"torch_dtype", "bfloat16"}, {"eos_token_id", 2}};
}

TEST(Config, ReadsEveryFixtureArchitecture) {
  auto root = lmserve::testing::source_dir();
  auto demo = load_config(root / "models/demo");
  ASSERT_TRUE(demo) << demo.error().to_string();
  EXPECT_EQ(demo->architecture, Architecture::kLlama);
  EXPECT_EQ(demo->num_kv_heads, 2);
  EXPECT_TRUE(demo->tie_word_embeddings);
  EXPECT_EQ(demo->eos_token_ids.size(), 2u);  // <|endoftext|> (config) and <|im_end|> (generation_config)

  auto l3 = load_config(root / "tests/fixtures/models/tiny-llama3");
  ASSERT_TRUE(l3);
  EXPECT_EQ(l3->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(l3->rope_scaling.original_max_position_embeddings, 64);
  auto q2 = load_config(root / "tests/fixtures/models/tiny-qwen2");
  ASSERT_TRUE(q2);
  EXPECT_TRUE(q2->qkv_bias);
  EXPECT_EQ(q2->dtype, DType::kF32);
  auto q3 = load_config(root / "tests/fixtures/models/tiny-qwen3");
  ASSERT_TRUE(q3);
  EXPECT_TRUE(q3->qk_norm);
  EXPECT_EQ(q3->head_dim, 32);
  auto m = load_config(root / "tests/fixtures/models/tiny-mistral");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->architecture, Architecture::kMistral);
}

TEST(Config, TransformersFiveRopeParametersAreRead) {
  json j = base();
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 500000.0}};
  auto c = parse_config(j.dump());
  ASSERT_TRUE(c) << c.error().to_string();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_theta, 500000.0);
}

TEST(Config, BadConfigsNameTheField) {
  struct Case {
    const char* field;
    json value;
    const char* message;
  };
  std::vector<Case> cases = {
      {"architectures", {"GPT2LMHeadModel"}, "architecture 'GPT2LMHeadModel' is not supported"},
      {"hidden_size", -5, "hidden_size must be positive"},
      {"num_key_value_heads", 3, "num_key_value_heads must divide"},
      {"hidden_act", "gelu", "hidden_act 'gelu' is not supported"},
      {"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4}}, "rope_scaling type 'yarn' is not supported"},
      {"torch_dtype", "int8", "torch_dtype 'int8' is not supported"},
      {"vocab_size", "many", "vocab_size must be an integer"},
  };
  for (const auto& c : cases) {
    json j = base();
    j[c.field] = c.value;
    auto r = parse_config(j.dump());
    ASSERT_FALSE(r) << c.field;
    EXPECT_NE(r.error().message().find(c.message), std::string::npos) << r.error().message();
  }
  EXPECT_FALSE(parse_config("not json"));
  EXPECT_FALSE(load_config("/nonexistent"));
}

}  // namespace
}  // namespace lmserve::model

namespace lmserve::model {
namespace {

// The benchmark shapes (tests/fixtures/configs) parse to their published sizes.
TEST(BenchmarkConfigs, LlamaAndQwenShapes) {
  auto root = lmserve::testing::source_dir() / "tests/fixtures/configs";
  auto llama = load_config(root / "llama-3.1-8b");
  ASSERT_TRUE(llama) << llama.error().to_string();
  EXPECT_EQ(llama->head_dim, 128);
  EXPECT_EQ(llama->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_NEAR(static_cast<double>(llama->num_parameters()), 8.03e9, 0.01e9);
  auto qwen = load_config(root / "qwen2.5-7b");
  ASSERT_TRUE(qwen) << qwen.error().to_string();
  EXPECT_TRUE(qwen->qkv_bias);
  EXPECT_EQ(qwen->num_heads / qwen->num_kv_heads, 7);
  EXPECT_NEAR(static_cast<double>(qwen->num_parameters()), 7.62e9, 0.01e9);
}

}  // namespace
}  // namespace lmserve::model
