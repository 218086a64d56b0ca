// The audit trail (gateway/audit.h): a hash chain over segment files that verify_audit() checks,
// finding a flipped byte, a deleted record, a reordered pair and a missing segment.
#include "gateway/audit.h"
#include "gateway/access_log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/statfs.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <regex>
#include <filesystem>
#include <thread>
#include <fstream>
#include <future>
#include <iterator>
#include <unistd.h>
#include <vector>

namespace lmserve::gateway {
namespace {

namespace fs = std::filesystem;

// The records' time: ISO 8601 in UTC with milliseconds, the clock's own second (the formatted
// second is kept per thread and must follow the clock across seconds).
TEST(UtcNow, IsTheClocksTimeInIso8601) {
  const std::regex shape(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)");
  std::string last;
  for (int i = 0; i < 3; ++i) {
    const auto before = std::chrono::system_clock::now();
    const std::string s = utc_now();
    const auto after = std::chrono::system_clock::now();
    ASSERT_TRUE(std::regex_match(s, shape)) << s;
    std::tm tm{};
    ASSERT_NE(strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm), nullptr) << s;
    const auto at = std::chrono::system_clock::from_time_t(timegm(&tm)) + std::chrono::milliseconds(std::stoi(s.substr(20, 3)));
    EXPECT_GE(at, std::chrono::floor<std::chrono::milliseconds>(before)) << s;
    EXPECT_LE(at, after) << s;
    EXPECT_GE(s, last);
    last = s;
    std::this_thread::sleep_for(std::chrono::milliseconds(600));  // into the next second at least once
  }
}

class AuditTest : public ::testing::Test {
 protected:
  void SetUp() override { fs::remove_all(dir_); }
  void TearDown() override { fs::remove_all(dir_); }
  void write_records(int n, std::size_t segment_bytes = 2048, int from = 0) {
    auto log = AuditLog::open(dir_, {.segment_bytes = segment_bytes});
    ASSERT_TRUE(log) << log.error().message();
    for (int i = from; i < from + n; ++i) {
      ASSERT_TRUE((*log)->append({{"id", i}, {"tenant", "compliance"}, {"status", 200}, {"latency_s", 0.125 * i}, {"note", "中文 ok"}}).is_ok());
    }
  }
  fs::path segment(int n) {
    char name[32];
    std::snprintf(name, sizeof name, "audit-%06d.jsonl", n);
    return fs::path(dir_) / name;
  }
  std::vector<std::string> lines(const fs::path& p) {
    std::ifstream in(p);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
  void put_lines(const fs::path& p, const std::vector<std::string>& ls) {
    std::ofstream out(p, std::ios::trunc);
    for (const auto& l : ls) out << l << "\n";
  }
  std::string dir_ = (fs::temp_directory_path() / ("lmserve_audit_test_" + std::to_string(::getpid()))).string();
};

TEST_F(AuditTest, AChainAcrossSegmentsVerifiesAndGoesOnAfterAReopen) {
  write_records(40);
  auto v = verify_audit(dir_);
  EXPECT_TRUE(v.ok) << v.broken;
  EXPECT_EQ(v.records, 40u);
  EXPECT_GT(v.segments, 2u);  // small segments: sealed and continued
  write_records(10, 2048, 40);  // another process later
  v = verify_audit(dir_);
  EXPECT_TRUE(v.ok) << v.broken;
  EXPECT_EQ(v.records, 50u);
  // Each sealed segment ends with its seal.
  const auto first = lines(segment(1));
  ASSERT_FALSE(first.empty());
  EXPECT_NE(first.back().find("\"seal\""), std::string::npos);
}

TEST_F(AuditTest, AFlippedByteIsFoundAtItsRecord) {
  write_records(30);
  auto ls = lines(segment(2));
  ASSERT_GT(ls.size(), 3u);
  auto& l = ls[2];
  const auto at = l.find("compliance");
  ASSERT_NE(at, std::string::npos);
  l[at] = 'C';  // one byte
  put_lines(segment(2), ls);
  const auto v = verify_audit(dir_);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.broken.rfind("audit-000002.jsonl:3: its hash does not match", 0), 0u) << v.broken;
}

TEST_F(AuditTest, ADeletedRecordAndAReorderedPairAreFound) {
  write_records(30);
  auto ls = lines(segment(1));
  ASSERT_GT(ls.size(), 4u);
  auto deleted = ls;
  deleted.erase(deleted.begin() + 2);
  put_lines(segment(1), deleted);
  auto v = verify_audit(dir_);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.broken.rfind("audit-000001.jsonl:3: the previous hash does not match", 0), 0u) << v.broken;
  auto swapped = ls;
  std::swap(swapped[1], swapped[2]);
  put_lines(segment(1), swapped);
  v = verify_audit(dir_);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.broken.rfind("audit-000001.jsonl:2:", 0), 0u) << v.broken;
  put_lines(segment(1), ls);  // as it was
  EXPECT_TRUE(verify_audit(dir_).ok);
  fs::remove(segment(2));
  v = verify_audit(dir_);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.broken.rfind("audit-000002.jsonl: missing", 0), 0u) << v.broken;
}

// Group commit: threads appending at once share writes, and the chain, the seals and the count
// stay exact.
TEST_F(AuditTest, ThreadsAppendingAtOnceKeepOneWholeChain) {
  constexpr int kThreads = 8, kEach = 400;
  {
    auto log = AuditLog::open(dir_, {.segment_bytes = 16 << 10});
    ASSERT_TRUE(log) << log.error().message();
    std::vector<std::thread> threads;
    std::atomic<int> failed{0};
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          if (!(*log)->append({{"thread", t}, {"i", i}, {"tenant", "compliance"}}).is_ok()) ++failed;
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(failed.load(), 0);
    EXPECT_EQ((*log)->records(), static_cast<std::uint64_t>(kThreads * kEach));
  }
  const auto v = verify_audit(dir_);
  EXPECT_TRUE(v.ok) << v.broken;
  EXPECT_EQ(v.records, static_cast<std::uint64_t>(kThreads * kEach));
  EXPECT_GT(v.segments, 3u);
  // Each thread's records are all there, in its own order.
  std::vector<int> next(kThreads, 0);
  for (int seg = 1; fs::exists(segment(seg)); ++seg) {
    for (const auto& l : lines(segment(seg))) {
      const auto j = nlohmann::json::parse(l);
      if (j.contains("seal")) continue;
      const int t = j["rec"]["thread"];
      EXPECT_EQ(j["rec"]["i"], next[static_cast<std::size_t>(t)]++);
    }
  }
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(next[static_cast<std::size_t>(t)], kEach);
}

// The asynchronous form: groups are written in order, their callbacks run in that order, and
// closing the trail writes what is still queued (with `sync`, the trail's own thread writes).
class AuditSyncTest : public AuditTest, public ::testing::WithParamInterface<bool> {};
INSTANTIATE_TEST_SUITE_P(Both, AuditSyncTest, ::testing::Values(false, true));

TEST_P(AuditSyncTest, QueuedGroupsAreWrittenAndAnsweredInOrderAndClosingWritesTheRest) {
  constexpr int kGroups = 500;
  std::vector<int> answered;  // by one writing thread at a time
  {
    auto log = AuditLog::open(dir_, {.segment_bytes = 8 << 10, .sync = GetParam()});
    ASSERT_TRUE(log) << log.error().message();
    for (int g = 0; g < kGroups; ++g) {
      std::vector<std::string> recs{R"({"group":)" + std::to_string(g) + R"(,"part":0})", R"({"group":)" + std::to_string(g) + R"(,"part":1})"};
      (*log)->append(std::move(recs), [&answered, g](const Status& st) {
        EXPECT_TRUE(st.is_ok()) << st.message();
        answered.push_back(g);
      });
    }
  }  // closed at once: nothing may be lost
  ASSERT_EQ(answered.size(), static_cast<std::size_t>(kGroups));
  for (int g = 0; g < kGroups; ++g) EXPECT_EQ(answered[static_cast<std::size_t>(g)], g);
  const auto v = verify_audit(dir_);
  EXPECT_TRUE(v.ok) << v.broken;
  EXPECT_EQ(v.records, 2u * kGroups);
  int expect = 0;
  for (int seg = 1; fs::exists(segment(seg)); ++seg) {
    for (const auto& l : lines(segment(seg))) {
      const auto j = nlohmann::json::parse(l);
      if (j.contains("seal")) continue;
      EXPECT_EQ(j["rec"]["group"], expect / 2);
      EXPECT_EQ(j["rec"]["part"], expect % 2);
      ++expect;
    }
  }
  EXPECT_EQ(expect, 2 * kGroups);
}

// Sealed segments are closed (flushed by the trail's own thread without `sync`, with their seal
// with it): once the trail is closed, this process holds no more files than before, and every
// segment verifies.
TEST_P(AuditSyncTest, SealedSegmentsAreClosedWithTheTrail) {
  const auto open_files = [] {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  const std::size_t before = open_files();
  {
    auto log = AuditLog::open(dir_, {.segment_bytes = 1024, .sync = GetParam()});
    ASSERT_TRUE(log) << log.error().message();
    for (int i = 0; i < 200; ++i) ASSERT_TRUE((*log)->append({{"id", i}, {"note", std::string(100, 'x')}}).is_ok());
    EXPECT_LE(open_files(), before + 200 / 2) << "segments kept open";  // a few held for their flush at most
  }
  EXPECT_EQ(open_files(), before);
  const auto v = verify_audit(dir_);
  EXPECT_TRUE(v.ok) << v.broken;
  EXPECT_EQ(v.records, 200u);
  EXPECT_GT(v.segments, 20u);
}

// A sealed segment, flushed, leaves the page cache: a long run's trail does not grow the cache by
// its own size (on a tmpfs, whose pages are the files, there is nothing to drop).
TEST_P(AuditSyncTest, SealedSegmentsLeaveThePageCache) {
  fs::create_directories(dir_);
  struct statfs sfs {};
  ASSERT_EQ(::statfs(dir_.c_str(), &sfs), 0);
  if (sfs.f_type == TMPFS_MAGIC) GTEST_SKIP() << "the audit directory is on a tmpfs";
  {
    auto log = AuditLog::open(dir_, {.segment_bytes = 64 << 10, .sync = GetParam()});
    ASSERT_TRUE(log) << log.error().message();
    for (int i = 0; i < 2000; ++i) ASSERT_TRUE((*log)->append({{"id", i}, {"note", std::string(100, 'x')}}).is_ok());
  }  // the sealed segments' flushes are done when the trail is closed
  const auto resident = [](const fs::path& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0) << path;
    const auto size = static_cast<std::size_t>(fs::file_size(path));
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    EXPECT_NE(map, MAP_FAILED);
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> in((size + page - 1) / page);
    EXPECT_EQ(::mincore(map, size, in.data()), 0);
    ::munmap(map, size);
    ::close(fd);
    return static_cast<std::size_t>(std::count_if(in.begin(), in.end(), [](unsigned char c) { return c & 1; }));
  };
  int sealed = 0;
  for (int n = 1; fs::exists(segment(n + 1)); ++n, ++sealed) EXPECT_EQ(resident(segment(n)), 0u) << "segment " << n << " still cached";
  EXPECT_GE(sealed, 3);
  EXPECT_GT(resident(segment(sealed + 1)), 0u);  // the open segment's pages stay: it is being written
}

// The hash covers a record's text byte for byte: a record as its writer laid it out (keys in its
// order, its spacing) verifies, and the same object laid out otherwise does not.
TEST_F(AuditTest, TheHashIsOverTheRecordsTextAsWritten) {
  {
    auto log = AuditLog::open(dir_, {});
    ASSERT_TRUE(log) << log.error().message();
    for (const char* rec : {R"({"z":1,"a":"x"})", R"({"event":"admitted", "id":2})", R"({"path":"/v1/é"})"}) {
      std::promise<Status> done;
      (*log)->append({rec}, [&done](const Status& st) { done.set_value(st); });
      ASSERT_TRUE(done.get_future().get().is_ok());
    }
  }
  auto v = verify_audit(dir_);
  ASSERT_TRUE(v.ok) << v.broken;
  EXPECT_EQ(v.records, 3u);
  auto ls = lines(segment(1));
  ASSERT_EQ(ls.size(), 3u);
  const auto at = ls[1].find(R"("admitted", )");
  ASSERT_NE(at, std::string::npos);
  ls[1].erase(at + 11, 1);  // the same object without the space
  put_lines(segment(1), ls);
  v = verify_audit(dir_);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.broken.rfind("audit-000001.jsonl:2: its hash does not match", 0), 0u) << v.broken;
}

TEST_F(AuditTest, ARecordThatCannotBeWrittenIsAnErrorAndLeavesTheChainWhole) {
  fs::create_directories(dir_);
  fs::create_symlink("/dev/full", segment(1));  // every write fails with ENOSPC
  auto log = AuditLog::open(dir_, {});
  ASSERT_TRUE(log) << log.error().message();
  const auto st = (*log)->append({{"id", 1}});
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.message();
  EXPECT_EQ((*log)->records(), 0u);
  EXPECT_FALSE(AuditLog::open("/proc/no/such/dir", {}));
}

TEST_F(AuditTest, OpeningOnABrokenChainIsRefused) {
  write_records(5, 1 << 20);
  auto ls = lines(segment(1));
  ls[1][ls[1].find("compliance")] = 'X';
  put_lines(segment(1), ls);
  auto log = AuditLog::open(dir_, {});
  ASSERT_FALSE(log);
  EXPECT_EQ(log.error().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace lmserve::gateway
