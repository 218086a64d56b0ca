// common: progress of a long piece of work (loading weights, tuning, graph capture, a
// benchmark), shown as a bar on a terminal or as periodic log lines elsewhere (systemd,
// Kubernetes). One component for every such place; `--no-progress` turns them all off.
//
//   Progress p("loading weights", total_bytes, Progress::Unit::kBytes);
//   p.add(n);            // from any thread, as often as convenient: drawing is throttled
//   p.done();            // the final line (also on destruction)
//
// Terminal mode redraws one line on stderr at most ten times a second ("\r..."), and ends it
// with a newline at done(). Log mode writes an info log line at most every `log_interval`
// (10 s by default) and one at done(); work that ends within the first interval logs only
// that last line. Off: nothing. The process-wide mode is set once by the CLI
// (configure_progress); kAuto picks the terminal when stderr is one.
//
// A line: "loading weights  [#######.............]   35%  5.63 GB/16.1 GB  1.52 GB/s  ETA 7 s" (a
// total of 0 means unknown: no bar, percentage or ETA) plus the caller's note (set_note(), for
// a benchmark's live tok/s).
#pragma once

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>

namespace lmserve {

enum class ProgressMode { kAuto, kTerminal, kLog, kOff };

// Sets the mode of every Progress made afterwards (kAuto: by isatty(stderr)).
void configure_progress(ProgressMode mode, std::chrono::milliseconds log_interval = std::chrono::seconds(10));

// Where a Progress writes and what time it is: the process's stderr, log and clock unless a
// test gives its own.
struct ProgressSink {
  ProgressMode mode = ProgressMode::kAuto;  // kAuto: the configured mode
  std::chrono::milliseconds log_interval{0};  // 0: the configured interval
  std::function<void(std::string_view)> terminal;  // a redraw ("\r..." or the final "...\n")
  std::function<void(std::string_view)> log;       // one log line
  std::function<std::chrono::steady_clock::time_point()> now;
};

class Progress {
 public:
  enum class Unit { kCount, kBytes };
  // `what` names the work; `total` in `unit`s (0: unknown); `count_name` names a count
  // ("requests", "graphs").
  Progress(std::string what, double total, Unit unit = Unit::kCount, std::string count_name = "", ProgressSink sink = ProgressSink());
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(double amount);
  void set(double value);
  void set_total(double total);
  // Shown after the figures, e.g. "output 12,345 tok/s".
  void set_note(std::string note);
  // Draws the final state once; later calls do nothing.
  void done();

  // The line as it would be drawn now (without "\r"): for tests.
  std::string line() const;

 private:
  void maybe_draw(bool final);
  std::string line_locked(std::chrono::steady_clock::time_point now) const;

  const std::string what_, count_name_;
  const Unit unit_;
  ProgressSink sink_;
  mutable std::mutex mu_;
  double total_, value_ = 0;
  std::string note_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool done_ = false;
};

// "16.1 GB", "512 MB", "3.00 kB": bytes in decimal units, three significant figures.
std::string format_bytes(double bytes);

}  // namespace lmserve
