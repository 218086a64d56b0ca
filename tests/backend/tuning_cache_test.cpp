// The GEMM tuning cache (backend/device/tuning_cache.h): kept between runs for exactly one
// identity; a file of another GPU or library version, or a damaged one, is ignored, not
// trusted; replicas sharing the directory merge their entries and never tear the file.
#include "backend/device/tuning_cache.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>
#include <vector>

namespace lmserve::backend {
namespace {

namespace fs = std::filesystem;

TuningIdentity h200() { return {"NVIDIA H200", 132, 90, 13000, 13000, 130000, "lmserve 0.1.0 abc"}; }
AlgoCache::Algo algo(std::uint64_t seed) { return {seed, seed + 1, 0, ~seed, 7, 0, 0, seed << 32}; }

class TuningCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / "lmserve_tuning" / std::to_string(::getpid()) / ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(TuningCacheTest, EntriesComeBackForTheSameIdentity) {
  auto c = TuningCache::open(dir_ / "sub", h200());  // the directory is made
  EXPECT_EQ(c->note(), "no file yet");
  EXPECT_FALSE(c->find("bf16 m=4096 n=64 k=4096"));
  c->put("bf16 m=4096 n=64 k=4096", algo(1));
  c->put("fp8 m=14336 n=128 k=4096", algo(2));
  ASSERT_TRUE(c->save().is_ok());
  auto again = TuningCache::open(dir_ / "sub", h200());
  EXPECT_EQ(again->note(), "");
  EXPECT_EQ(again->size(), 2u);
  EXPECT_EQ(again->find("bf16 m=4096 n=64 k=4096"), algo(1));
  EXPECT_EQ(again->find("fp8 m=14336 n=128 k=4096"), algo(2));
  EXPECT_FALSE(again->find("bf16 m=1 n=1 k=1"));
  EXPECT_EQ(again->hits(), 2u);
  EXPECT_EQ(again->misses(), 1u);
}

TEST_F(TuningCacheTest, AnotherGpuDriverLibraryOrBuildIsNotTrusted) {
  auto c = TuningCache::open(dir_, h200());
  c->put("bf16 m=4096 n=64 k=4096", algo(1));
  ASSERT_TRUE(c->save().is_ok());
  // Each field of the identity on its own: another file, so nothing found.
  std::vector<TuningIdentity> others(7, h200());
  others[0].gpu = "NVIDIA H100 80GB HBM3";
  others[1].multiprocessors = 114;
  others[2].compute_capability = 89;
  others[3].driver = 12080;
  others[4].cuda_runtime = 12040;
  others[5].cublaslt = 120400;
  others[6].build = "lmserve 0.1.0 def";
  for (const auto& id : others) {
    auto o = TuningCache::open(dir_, id);
    EXPECT_EQ(o->size(), 0u) << id.gpu << " " << id.cublaslt;
    EXPECT_FALSE(o->find("bf16 m=4096 n=64 k=4096"));
  }
  // This identity's file replaced by another identity's (copied, or renamed): ignored, saying why.
  auto other = TuningCache::open(dir_, others[5]);
  other->put("bf16 m=4096 n=64 k=4096", algo(9));
  ASSERT_TRUE(other->save().is_ok());
  fs::copy_file(other->file(), c->file(), fs::copy_options::overwrite_existing);
  auto fooled = TuningCache::open(dir_, h200());
  EXPECT_EQ(fooled->size(), 0u);
  EXPECT_NE(fooled->note().find("made for another GPU, driver, library or build"), std::string::npos) << fooled->note();
  // A damaged file: ignored; the next save writes a good one over it.
  std::ofstream(c->file(), std::ios::trunc) << "{\"format\":1,\"identity\":";
  auto damaged = TuningCache::open(dir_, h200());
  EXPECT_EQ(damaged->size(), 0u);
  EXPECT_EQ(damaged->note(), "not a tuning cache file; ignored");
  damaged->put("x", algo(3));
  ASSERT_TRUE(damaged->save().is_ok());
  EXPECT_EQ(TuningCache::open(dir_, h200())->find("x"), algo(3));
  // A malformed algorithm in an otherwise good file: the file is not used.
  {
    std::ifstream in(c->file());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto at = text.find("\"x\": \"");
    ASSERT_NE(at, std::string::npos) << text;
    text.replace(at + 6, 4, "zzzz");
    std::ofstream(c->file(), std::ios::trunc) << text;
  }
  EXPECT_EQ(TuningCache::open(dir_, h200())->size(), 0u);
}

TEST_F(TuningCacheTest, ReplicasSharingTheDirectoryMergeAndNeverTearTheFile) {
  constexpr int kReplicas = 8, kEach = 50;
  std::vector<std::thread> ts;
  for (int r = 0; r < kReplicas; ++r) {
    ts.emplace_back([&, r] {
      auto c = TuningCache::open(dir_, h200());
      for (int i = 0; i < kEach; ++i) {
        char shape[32];
        std::snprintf(shape, sizeof shape, "r%d shape %d", r, i);
        c->put(shape, algo(static_cast<std::uint64_t>(r * 1000 + i)));
      }
      EXPECT_TRUE(c->save().is_ok());
    });
  }
  for (auto& t : ts) t.join();
  auto c = TuningCache::open(dir_, h200());
  EXPECT_EQ(c->note(), "");  // whole and of this identity, whichever rename came last
  EXPECT_GE(c->size(), static_cast<std::size_t>(kEach));
  // Saved one after another, every replica's entries are kept.
  for (int r = 0; r < 3; ++r) {
    auto s = TuningCache::open(dir_, h200());
    s->put("serial " + std::to_string(r), algo(static_cast<std::uint64_t>(r)));
    ASSERT_TRUE(s->save().is_ok());
  }
  auto all = TuningCache::open(dir_, h200());
  for (int r = 0; r < 3; ++r) EXPECT_EQ(all->find("serial " + std::to_string(r)), algo(static_cast<std::uint64_t>(r)));
  std::size_t leftovers = 0;
  for (const auto& e : fs::directory_iterator(dir_)) leftovers += e.path().string().find(".tmp.") != std::string::npos;
  EXPECT_EQ(leftovers, 0u);
}

}  // namespace
}  // namespace lmserve::backend
