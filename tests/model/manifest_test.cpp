// Model integrity (model/manifest.h): a manifest of the demo model verifies; a flipped byte, a
// changed size, a missing and an unlisted file are each named; versions switch atomically and a
// version that fails verification is not activated.
#include "model/manifest.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace lmserve::model {
namespace {

namespace fs = std::filesystem;

class ManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  // A copy of the demo model at root_/demo/VERSION with its manifest.
  fs::path version(const std::string& v) {
    const fs::path dir = root_ / "demo" / v;
    fs::create_directories(dir);
    fs::copy(lmserve::testing::source_dir() / "models/demo", dir, fs::copy_options::recursive);
    auto m = make_manifest(dir, "demo", v);
    EXPECT_TRUE(m) << m.error().message();
    EXPECT_TRUE(write_manifest(dir, *m).is_ok());
    return dir;
  }
  static void flip_byte(const fs::path& file, std::size_t at) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(at));
    f.put(static_cast<char>(c ^ 0x01));
  }
  fs::path root_ = fs::temp_directory_path() / ("lmserve_manifest_test_" + std::to_string(::getpid()));
};

TEST_F(ManifestTest, TheDemoModelVerifiesAndEveryChangeIsNamed) {
  const fs::path dir = version("v1");
  auto m = read_manifest(dir);
  ASSERT_TRUE(m) << m.error().message();
  EXPECT_EQ(m->name, "demo");
  EXPECT_EQ(m->version, "v1");
  EXPECT_GE(m->files.size(), 5u);
  auto v = verify_model(dir);
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_TRUE(v->ok());
  EXPECT_EQ(v->files, m->files.size());

  // One flipped bit deep in the weights.
  const auto weights = dir / "model.safetensors";
  flip_byte(weights, fs::file_size(weights) / 2);
  v = verify_model(dir);
  ASSERT_TRUE(v);
  ASSERT_EQ(v->problems.size(), 1u);
  EXPECT_EQ(describe(v->problems[0]), "model.safetensors: SHA-256 differs");
  flip_byte(weights, fs::file_size(weights) / 2);  // back
  EXPECT_TRUE(verify_model(dir)->ok());

  // A changed size, a missing file and an extra one, all named, in path order.
  { std::ofstream(dir / "config.json", std::ios::app) << " "; }
  fs::remove(dir / "tokenizer_config.json");
  fs::create_directories(dir / "extra");
  { std::ofstream(dir / "extra" / "model-00002.safetensors") << "x"; }
  v = verify_model(dir);
  ASSERT_TRUE(v);
  ASSERT_EQ(v->problems.size(), 3u);
  EXPECT_EQ(v->problems[0].path, "config.json");
  EXPECT_NE(v->problems[0].what.find("the manifest says"), std::string::npos);
  EXPECT_EQ(describe(v->problems[1]), "extra/model-00002.safetensors: not in the manifest");
  EXPECT_EQ(describe(v->problems[2]), "tokenizer_config.json: missing");
}

TEST_F(ManifestTest, AMissingOrMalformedManifestIsAnError) {
  const fs::path dir = root_ / "bare";
  fs::create_directories(dir);
  EXPECT_EQ(verify_model(dir).error().code(), StatusCode::kNotFound);
  for (const char* bad : {"{", R"({"format":"other","files":[]})", R"({"format":"lmserve-manifest/1","files":[{"path":"a","size":1}]})",
                          R"({"format":"lmserve-manifest/1","files":[{"path":"../etc/passwd","size":1,"sha256":"0000000000000000000000000000000000000000000000000000000000000000"}]})",
                          R"({"format":5,"files":[]})", R"({"format":"lmserve-manifest/1","name":["demo"],"files":[]})"}) {
    { std::ofstream(dir / kManifestFile, std::ios::trunc) << bad; }
    auto v = verify_model(dir);
    ASSERT_FALSE(v) << bad;
    EXPECT_EQ(v.error().code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST_F(ManifestTest, ActivateSwitchesVersionsAndRefusesOneThatFailsVerification) {
  version("v1");
  const fs::path v2 = version("v2");
  auto before = activate_version(root_, "demo", "v1");
  ASSERT_TRUE(before) << before.error().message();
  EXPECT_EQ(*before, "");
  before = activate_version(root_, "demo", "v2");
  ASSERT_TRUE(before);
  EXPECT_EQ(*before, "v1");
  EXPECT_EQ(fs::read_symlink(root_ / "demo" / "current"), "v2");
  EXPECT_TRUE(verify_model(root_ / "demo" / "current")->ok());
  // Rollback: the version before.
  before = activate_version(root_, "demo", "v1");
  ASSERT_TRUE(before);
  EXPECT_EQ(*before, "v2");
  // A corrupted version is not activated; current stays.
  flip_byte(v2 / "model.safetensors", 100);
  auto refused = activate_version(root_, "demo", "v2");
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.error().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.error().message().find("model.safetensors: SHA-256 differs"), std::string::npos) << refused.error().message();
  EXPECT_EQ(fs::read_symlink(root_ / "demo" / "current"), "v1");
  EXPECT_EQ(activate_version(root_, "demo", "v3").error().code(), StatusCode::kNotFound);
  EXPECT_EQ(activate_version(root_, "demo", "../v1").error().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(root_ / "demo" / ".current.tmp"));
}

}  // namespace
}  // namespace lmserve::model
