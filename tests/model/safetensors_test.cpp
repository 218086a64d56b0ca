// Malformed safetensors files are rejected with errors that name the file and tensor; a good
// file, a sharded model and --dtype conversion load.
#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/weights.h"
#include "test_paths.h"

namespace lmserve::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A safetensors file from a header object and a data section.
std::string make_file(const json& header, const std::string& data) {
  std::string h = header.dump();
  std::string out(8, '\0');
  std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + h + data;
}

json entry(const char* dtype, std::vector<int> shape, std::uint64_t b, std::uint64_t e) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {b, e}}};
}

Status parse(const std::string& bytes) {
  auto f = SafetensorsFile::from_memory(bytes, "test.safetensors");
  return f ? Status::ok() : f.error();
}

TEST(Safetensors, AcceptsAWellFormedFile) {
  std::string data(24, '\0');
  float one = 1.0f;
  std::memcpy(data.data(), &one, 4);
  std::string file = make_file({{"__metadata__", {{"format", "pt"}}}, {"a", entry("F32", {2, 2}, 0, 16)}, {"b", entry("BF16", {4}, 16, 24)}}, data);
  auto f = SafetensorsFile::from_memory(file, "ok.safetensors");
  ASSERT_TRUE(f) << f.error().to_string();
  ASSERT_EQ((*f)->tensors().size(), 2u);
  const auto& a = (*f)->tensors().at("a");
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 2}));
  float got;
  std::memcpy(&got, a.data, 4);
  EXPECT_EQ(got, 1.0f);
}

struct Bad {
  const char* what;
  std::string bytes;
  const char* message;
};

TEST(Safetensors, RejectsMalformedFilesWithClearErrors) {
  std::string d16(16, '\0');
  std::vector<Bad> cases = {
      {"shorter than 8 bytes", "abc", "shorter than the 8-byte"},
      {"header length past the end", make_file({{"a", entry("F32", {1}, 0, 4)}}, "").substr(0, 20), "runs past the end"},
      {"header not JSON", make_file(json("x"), "").replace(8, 3, "{x:"), "not a JSON object"},
      {"header is a list", make_file(json::array({1, 2}), ""), "not a JSON object"},
      {"unknown dtype", make_file({{"w", entry("F7", {1}, 0, 4)}}, d16), "tensor 'w': unknown dtype 'F7'"},
      {"negative dim", make_file({{"w", {{"dtype", "F32"}, {"shape", {-1}}, {"data_offsets", {0, 4}}}}}, d16), "tensor 'w': shape has a negative"},
      {"offsets out of range", make_file({{"w", entry("F32", {8}, 0, 32)}}, d16), "tensor 'w': data_offsets [0, 32] are outside"},
      {"offsets reversed", make_file({{"w", entry("F32", {0}, 8, 4)}}, d16), "tensor 'w': data_offsets [8, 4]"},
      {"size mismatch", make_file({{"w", entry("F32", {3}, 0, 16)}}, d16), "tensor 'w': data_offsets cover 16 bytes but shape x dtype needs 12"},
      {"overlap", make_file({{"a", entry("F32", {2}, 0, 8)}, {"b", entry("F32", {2}, 4, 12)}}, d16), "'a' and 'b' overlap"},
      {"missing field", make_file({{"w", {{"dtype", "F32"}, {"shape", {1}}}}}, d16), "tensor 'w': needs dtype, shape and data_offsets"},
      {"bad metadata", make_file({{"__metadata__", {{"k", 1}}}}, ""), "__metadata__ value 'k' is not a string"},
  };
  for (const auto& c : cases) {
    Status s = parse(c.bytes);
    ASSERT_FALSE(s.is_ok()) << c.what;
    EXPECT_NE(s.message().find(c.message), std::string::npos) << c.what << ": " << s.message();
    EXPECT_NE(s.message().find("test.safetensors"), std::string::npos) << c.what;
  }
}

fs::path temp_model(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("lmserve_model_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

TEST(Weights, WrongShapeOrDtypeOrExtraTensorsNameTheTensor) {
  fs::path src = lmserve::testing::source_dir() / "tests/fixtures/models/tiny-qwen2";
  auto files = WeightFiles::open(src);
  ASSERT_TRUE(files);
  auto config = load_config(src);
  ASSERT_TRUE(config);

  ModelConfig wrong = *config;
  wrong.intermediate_size += 1;
  auto w = ModelWeights::from_files(wrong, *files, "auto");
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message().find("'model.layers.0.mlp.gate_proj.weight' has shape [128, 64]"), std::string::npos)
      << w.error().message();

  ModelConfig no_bias = *config;
  no_bias.qkv_bias = false;
  w = ModelWeights::from_files(no_bias, *files, "auto");
  ASSERT_FALSE(w);
  EXPECT_NE(w.error().message().find("unexpected tensor 'model.layers.0.self_attn.k_proj.bias'"), std::string::npos)
      << w.error().message();

  // An integer tensor where a weight should be.
  fs::path dir = temp_model("dtype");
  fs::copy_file(src / "config.json", dir / "config.json");
  std::ofstream(dir / "model.safetensors", std::ios::binary)
      << make_file({{"model.embed_tokens.weight", entry("I32", {512, 64}, 0, 512 * 64 * 4)}}, std::string(512 * 64 * 4, '\0'));
  auto bad = ModelWeights::load(dir, {});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("'model.embed_tokens.weight'"), std::string::npos) << bad.error().message();
}

TEST(Weights, ShardedModelsLoadThroughTheIndex) {
  fs::path src = lmserve::testing::source_dir() / "tests/fixtures/models/tiny-llama3";
  auto one = SafetensorsFile::open(src / "model.safetensors");
  ASSERT_TRUE(one);
  // Split the tensors over two shards, rewriting each shard's header and data.
  fs::path dir = temp_model("sharded");
  fs::copy_file(src / "config.json", dir / "config.json");
  json index = {{"metadata", json::object()}, {"weight_map", json::object()}};
  json headers[2] = {json::object(), json::object()};
  std::string data[2];
  int i = 0;
  for (const auto& [name, t] : (*one)->tensors()) {
    int shard = (i++) % 2;
    std::string file = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
    headers[shard][name] = entry(t.dtype.c_str(), {}, data[shard].size(), data[shard].size() + t.nbytes);
    headers[shard][name]["shape"] = t.shape;
    data[shard].append(reinterpret_cast<const char*>(t.data), t.nbytes);
    index["weight_map"][name] = file;
  }
  for (int s = 0; s < 2; ++s) {
    std::ofstream(dir / ("model-0000" + std::to_string(s + 1) + "-of-00002.safetensors"), std::ios::binary)
        << make_file(headers[s], data[s]);
  }
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  auto w = ModelWeights::load(dir, {});
  ASSERT_TRUE(w) << w.error().to_string();
  EXPECT_EQ((*w)->layers().size(), 2u);

  index["weight_map"]["model.norm.weight"] = "../escape.safetensors";
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  auto escaped = ModelWeights::load(dir, {});
  ASSERT_FALSE(escaped);
  EXPECT_NE(escaped.error().message().find("leaves the model folder"), std::string::npos);
}

TEST(Weights, DtypeConversionAndDummyWeights) {
  fs::path src = lmserve::testing::source_dir() / "tests/fixtures/models/tiny-llama3";  // stored as bf16
  auto as_f32 = ModelWeights::load(src, {.dtype = "float32"});
  ASSERT_TRUE(as_f32) << as_f32.error().to_string();
  auto stored = ModelWeights::load(src, {});
  ASSERT_TRUE(stored);
  EXPECT_EQ((*stored)->dtype(), DType::kBF16);
  EXPECT_EQ((*as_f32)->dtype(), DType::kF32);
  const Tensor& a = (*stored)->layers()[1].down_proj;
  const Tensor& b = (*as_f32)->layers()[1].down_proj;
  for (std::int64_t i = 0; i < a.numel(); i += 97) ASSERT_EQ(a.at(i), b.at(i));  // bf16 -> f32 is exact

  auto dummy = ModelWeights::load(src, {.format = LoadOptions::Format::kDummy, .dtype = "float16", .dummy_seed = 3});
  ASSERT_TRUE(dummy) << dummy.error().to_string();
  EXPECT_EQ((*dummy)->dtype(), DType::kF16);
  EXPECT_EQ((*dummy)->final_norm().at(0), 1.0f);
  EXPECT_EQ((*dummy)->bytes(), static_cast<std::uint64_t>((*dummy)->config().num_parameters() * 2));
  EXPECT_FALSE(ModelWeights::load(src, {.dtype = "float64"}));
}

}  // namespace
}  // namespace lmserve::model
