// API keys (gateway/keys.h): made once, stored as HMAC only, listed masked, revoked, rotated with
// a grace period, refused under another secret.
#include "gateway/keys.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <unistd.h>

namespace lmserve::gateway {
namespace {

class KeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_);
    std::ofstream(secret_path_) << std::string(40, 's') << "\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::unique_ptr<KeyStore> open(const std::string& secret = std::string(40, 's')) {
    auto ks = KeyStore::open(db_, secret);
    EXPECT_TRUE(ks) << ks.error().message();
    return ks ? std::move(*ks) : nullptr;
  }
  std::string file_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  std::filesystem::path dir_ = std::filesystem::temp_directory_path() / ("lmserve_keys_test_" + std::to_string(::getpid()));
  std::string db_ = (dir_ / "keys.sqlite").string();
  std::string secret_path_ = (dir_ / "secret").string();
  static constexpr std::int64_t kNow = 1'800'000'000;
};

TEST_F(KeysTest, AKeyIsShownOnceAndStoredOnlyAsItsHmac) {
  auto ks = open();
  auto made = ks->add({.tenant = "compliance", .models = {"qwen-7b"}, .lane = "high", .limits = {.rpm = 60, .tpm = 1000}}, kNow);
  ASSERT_TRUE(made) << made.error().message();
  const auto& [key, rec] = *made;
  EXPECT_TRUE(std::regex_match(key, std::regex("sk-lms-[0-9A-Za-z]{43}"))) << key;
  EXPECT_TRUE(std::regex_match(rec.id, std::regex("key_[0-9a-f]{12}"))) << rec.id;
  EXPECT_EQ(rec.masked, key.substr(0, 11) + "..." + key.substr(key.size() - 4));
  auto other = ks->add({.tenant = "compliance"}, kNow);
  ASSERT_TRUE(other);
  EXPECT_NE(other->first, key);
  const auto listed = ks->list();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0].tenant, "compliance");
  EXPECT_EQ(listed[0].lane, "high");
  EXPECT_EQ(listed[0].limits.rpm, 60);
  EXPECT_EQ(listed[0].models, std::vector<std::string>{"qwen-7b"});
  EXPECT_TRUE(listed[0].may_use("qwen-7b"));
  EXPECT_FALSE(listed[0].may_use("llama"));
  EXPECT_TRUE(listed[1].may_use("anything"));  // no list: every model
  ks.reset();
  // Neither the key nor its random part is in the database file; its HMAC is.
  const auto bytes = file_bytes(db_);
  EXPECT_EQ(bytes.find(key), std::string::npos);
  EXPECT_EQ(bytes.find(key.substr(7)), std::string::npos);
  EXPECT_NE(bytes.find(key_digest(std::string(40, 's'), key)), std::string::npos);
}

TEST_F(KeysTest, TheIndexFindsValidKeysAndSeesRevocationsOnRefresh) {
  auto ks = open();
  auto a = ks->add({.tenant = "t"}, kNow);
  ASSERT_TRUE(a);
  auto ix = KeyIndex::open(db_, secret_path_);
  ASSERT_TRUE(ix) << ix.error().message();
  auto found = (*ix)->find(a->first);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->id, a->second.id);
  EXPECT_FALSE((*ix)->find(a->first.substr(0, a->first.size() - 1) + (a->first.back() == 'x' ? "y" : "x")));
  EXPECT_FALSE((*ix)->find("sk-other"));
  EXPECT_FALSE((*ix)->find(""));
  ASSERT_TRUE(ks->revoke(a->second.id, kNow + 5));  // by id, from another connection
  EXPECT_EQ((*ix)->find(a->first)->revoked_at, 0);  // not refreshed yet
  ASSERT_TRUE((*ix)->refresh().is_ok());
  EXPECT_EQ((*ix)->find(a->first)->revoked_at, kNow + 5);
  EXPECT_FALSE((*ix)->find(a->first)->valid_at(kNow + 6));
  // Revoking by the key itself; an unknown one is NotFound.
  auto b = ks->add({.tenant = "t"}, kNow);
  ASSERT_TRUE(ks->revoke(b->first, kNow));
  EXPECT_EQ(ks->revoke("key_000000000000", kNow).error().code(), StatusCode::kNotFound);
  EXPECT_EQ(ks->revoke("sk-lms-nope", kNow).error().code(), StatusCode::kNotFound);
}

TEST_F(KeysTest, RotationKeepsTheOldKeyForItsGraceOnly) {
  auto ks = open();
  auto old = ks->add({.tenant = "t", .models = {"m"}, .lane = "low", .limits = {.tpm = 5}}, kNow);
  ASSERT_TRUE(old);
  auto fresh = ks->rotate(old->first, std::chrono::seconds(60), kNow + 10);
  ASSERT_TRUE(fresh) << fresh.error().message();
  EXPECT_NE(fresh->first, old->first);
  EXPECT_EQ(fresh->second.lane, "low");
  EXPECT_EQ(fresh->second.limits.tpm, 5);
  EXPECT_EQ(fresh->second.models, std::vector<std::string>{"m"});
  auto ix = KeyIndex::open(db_, secret_path_);
  ASSERT_TRUE(ix);
  const auto o = (*ix)->find(old->first);
  ASSERT_TRUE(o);
  EXPECT_EQ(o->replaced_by, fresh->second.id);
  EXPECT_TRUE(o->valid_at(kNow + 69));
  EXPECT_FALSE(o->valid_at(kNow + 70));
  EXPECT_TRUE((*ix)->find(fresh->first)->valid_at(kNow + 1000));
  // A revoked key is not rotated.
  ASSERT_TRUE(ks->revoke(fresh->second.id, kNow + 20));
  EXPECT_FALSE(ks->rotate(fresh->first, std::chrono::seconds(60), kNow + 30));
}

TEST_F(KeysTest, BadSecretsAndInputsAreRefused) {
  EXPECT_EQ(KeyStore::open(db_, "short").error().code(), StatusCode::kInvalidArgument);
  { open(); }
  EXPECT_EQ(KeyStore::open(db_, std::string(40, 'x')).error().code(), StatusCode::kInvalidArgument);  // not its secret
  std::ofstream(secret_path_) << "too short\n";
  EXPECT_FALSE(read_key_secret(secret_path_));
  EXPECT_FALSE(read_key_secret((dir_ / "missing").string()));
  auto ks = open();
  EXPECT_FALSE(ks->add({.tenant = ""}, kNow));
  EXPECT_FALSE(ks->add({.tenant = "t", .lane = "urgent"}, kNow));
  EXPECT_FALSE(ks->add({.tenant = "t", .limits = {.rpm = -1}}, kNow));
  std::ofstream(dir_ / "not.sqlite") << "this is not a database, just some text long enough to be read as a header";
  EXPECT_FALSE(KeyStore::open((dir_ / "not.sqlite").string(), std::string(40, 's')));
  EXPECT_EQ(*parse_expiry("2030-01-01"), 1893456000);
  EXPECT_EQ(*parse_expiry("2030-01-01T00:00:10Z"), 1893456010);
  EXPECT_FALSE(parse_expiry("2030-13-01"));
  EXPECT_FALSE(parse_expiry("tomorrow"));
  EXPECT_FALSE(parse_expiry("2030-01-01T00:00:10"));
}

}  // namespace
}  // namespace lmserve::gateway
