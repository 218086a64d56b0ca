// The checkpoint writer (model/checkpoint_writer.h): a dummy model written as sharded
// safetensors loads back with exactly the dummy model's values, through the index, each
// shard within its size.
#include "model/checkpoint_writer.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace lmserve::model {
namespace {

namespace fs = std::filesystem;

std::vector<const Tensor*> all(const ModelWeights& w) {
  std::vector<const Tensor*> out{&w.embed_tokens(), &w.final_norm(), &w.lm_head()};
  for (const auto& L : w.layers()) {
    for (const Tensor* t : {&L.input_norm, &L.post_attention_norm, &L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj}) out.push_back(t);
  }
  return out;
}

// The dummy weights are a function of (config, dtype, seed) alone, the same on every machine and
// in every version (figures measured on them stay comparable): their bytes' digest, pinned.
TEST(DummyWeights, AreTheSameBytesEverywhere) {
  auto config = load_config(lmserve::testing::source_dir() / "models/demo");
  ASSERT_TRUE(config);
  for (auto [dtype, seed, want] : {std::tuple{"bfloat16", 0ull, 8621770500614703570ull}, {"float16", 3ull, 7691996419434650435ull}, {"float32", 1ull, 11379643120541796560ull}}) {
    auto w = ModelWeights::dummy(*config, dtype, seed);
    ASSERT_TRUE(w);
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (const Tensor* t : all(**w)) {
      const auto* p = static_cast<const unsigned char*>(t->data);
      for (std::uint64_t i = 0; i < t->bytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    }
    EXPECT_EQ(h, want) << dtype << " seed " << seed;
  }
}

TEST(CheckpointWriter, ADummyModelWrittenInShardsLoadsBackExactly) {
  const fs::path demo = lmserve::testing::source_dir() / "models/demo";
  const fs::path out = fs::temp_directory_path() / ("lmserve_checkpoint_" + std::to_string(::getpid()));
  auto config = load_config(demo);
  ASSERT_TRUE(config);
  auto dummy = ModelWeights::dummy(*config, "auto", 7);
  ASSERT_TRUE(dummy);
  constexpr std::uint64_t kShard = 3 << 20;
  auto written = write_checkpoint(**dummy, demo, out, kShard);
  ASSERT_TRUE(written) << written.error().message();
  EXPECT_GE(written->shards, 3);
  EXPECT_EQ(written->bytes, (*dummy)->bytes());
  // The index names every tensor once, its total the data's size; each shard within the size
  // unless it holds one larger tensor alone.
  nlohmann::json index = nlohmann::json::parse(std::ifstream(out / "model.safetensors.index.json"));
  EXPECT_EQ(index["metadata"]["total_size"], written->bytes);
  EXPECT_EQ(static_cast<int>(index["weight_map"].size()), written->tensors);
  std::map<std::string, int> per_shard;
  for (const auto& [tensor, file] : index["weight_map"].items()) ++per_shard[file.get<std::string>()];
  EXPECT_EQ(static_cast<int>(per_shard.size()), written->shards);
  for (const auto& [file, n] : per_shard) {
    char expected_suffix[32];
    std::snprintf(expected_suffix, sizeof expected_suffix, "-of-%05d.safetensors", written->shards);
    EXPECT_TRUE(file.ends_with(expected_suffix)) << file;
    EXPECT_TRUE(n == 1 || fs::file_size(out / file) <= kShard + 64 * 1024) << file << " " << fs::file_size(out / file);
  }
  EXPECT_TRUE(fs::exists(out / "config.json"));
  auto loaded = ModelWeights::load(out, {});
  ASSERT_TRUE(loaded) << loaded.error().message();
  const auto a = all(**dummy), b = all(**loaded);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i]->name, b[i]->name);
    EXPECT_EQ(a[i]->dtype, b[i]->dtype) << a[i]->name;
    ASSERT_EQ(a[i]->shape, b[i]->shape) << a[i]->name;
    EXPECT_EQ(std::memcmp(a[i]->data, b[i]->data, a[i]->bytes()), 0) << a[i]->name;
  }
  EXPECT_FALSE(write_checkpoint(**dummy, demo, out, 0));
  fs::remove_all(out);
}

}  // namespace
}  // namespace lmserve::model
