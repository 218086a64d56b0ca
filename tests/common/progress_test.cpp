#include "common/progress.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lmserve {
namespace {

// A sink whose clock the test moves.
struct Fake {
  std::chrono::steady_clock::time_point t{};
  std::vector<std::string> terminal, log;
  ProgressSink sink(ProgressMode mode) {
    return {.mode = mode,
            .log_interval = std::chrono::seconds(10),
            .terminal = [this](std::string_view s) { terminal.emplace_back(s); },
            .log = [this](std::string_view s) { log.emplace_back(s); },
            .now = [this] { return t; }};
  }
  void advance(double s) { t += std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s)); }
};

TEST(Progress, TerminalRedrawsOneLineAtMostTenTimesASecondAndEndsIt) {
  Fake f;
  {
    Progress p("loading weights", 16.1e9, Progress::Unit::kBytes, "", f.sink(ProgressMode::kTerminal));
    f.advance(0.05);
    p.add(1e9);  // within the first 100 ms: not drawn
    EXPECT_TRUE(f.terminal.empty());
    f.advance(0.05);
    p.add(1e9);
    ASSERT_EQ(f.terminal.size(), 1u);
    EXPECT_EQ(f.terminal[0], "\rloading weights  [##..................]   12%  2.00 GB/16.1 GB  20.0 GB/s  ETA 1 s\x1b[K");
    for (int i = 0; i < 10; ++i) p.add(0.1e9);  // same instant: throttled
    EXPECT_EQ(f.terminal.size(), 1u);
    f.advance(1.9);
    p.add(2e9);
    ASSERT_EQ(f.terminal.size(), 2u);
    EXPECT_EQ(f.terminal[1], "\rloading weights  [######..............]   31%  5.00 GB/16.1 GB  2.50 GB/s  ETA 5 s\x1b[K");
    p.set_note("8 of 17 files");
    f.advance(3);
    p.set(16.1e9);
  }  // destroyed: the final line, once
  ASSERT_EQ(f.terminal.size(), 4u);
  EXPECT_EQ(f.terminal[2], "\rloading weights  [####################]  100%  16.1 GB/16.1 GB  3.22 GB/s  8 of 17 files\x1b[K");
  EXPECT_EQ(f.terminal[3], "\rloading weights  done: 16.1 GB in 5.00 s (3.22 GB/s)  8 of 17 files\x1b[K\n");
  EXPECT_TRUE(f.log.empty());
}

TEST(Progress, LogModeWritesALineEveryIntervalAndTheLast) {
  Fake f;
  Progress p("bench throughput", 1000, Progress::Unit::kCount, "requests", f.sink(ProgressMode::kLog));
  for (int i = 0; i < 25; ++i) {  // 25 s, 40 requests a second
    f.advance(1);
    p.add(40);
    p.set_note("output 1234 tok/s");
  }
  ASSERT_EQ(f.log.size(), 2u);  // at 10 s and 20 s
  EXPECT_EQ(f.log[0], "bench throughput  [########............]   40%  400/1000 requests  40.0/s  ETA 15 s  output 1234 tok/s");
  EXPECT_EQ(f.log[1], "bench throughput  [################....]   80%  800/1000 requests  40.0/s  ETA 5 s  output 1234 tok/s");
  p.done();
  p.done();
  ASSERT_EQ(f.log.size(), 3u);
  EXPECT_EQ(f.log[2], "bench throughput  done: 1000 requests in 25.0 s (40.0/s)  output 1234 tok/s");
  EXPECT_TRUE(f.terminal.empty());
}

TEST(Progress, ShortWorkLogsOnlyItsEndAndUnknownTotalsHaveNoBar) {
  Fake f;
  {
    Progress p("capturing CUDA graphs", 0, Progress::Unit::kCount, "graphs", f.sink(ProgressMode::kLog));
    f.advance(2);
    p.add(35);
    EXPECT_EQ(p.line(), "capturing CUDA graphs  35 graphs  17.5/s");
  }
  ASSERT_EQ(f.log.size(), 1u);
  EXPECT_EQ(f.log[0], "capturing CUDA graphs  done: 35 graphs in 2.00 s (17.5/s)");
}

TEST(Progress, OffDrawsNothing) {
  Fake f;
  {
    Progress p("x", 10, Progress::Unit::kCount, "", f.sink(ProgressMode::kOff));
    f.advance(100);
    p.add(5);
  }
  EXPECT_TRUE(f.terminal.empty());
  EXPECT_TRUE(f.log.empty());
}

TEST(Progress, BytesAreWrittenInDecimalUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(999), "999 B");
  EXPECT_EQ(format_bytes(1500), "1.50 kB");
  EXPECT_EQ(format_bytes(16.06e9), "16.1 GB");
  EXPECT_EQ(format_bytes(512e6), "512 MB");
  EXPECT_EQ(format_bytes(2.5e12), "2.50 TB");
}

}  // namespace
}  // namespace lmserve
