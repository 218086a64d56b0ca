#include "common/progress.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>

namespace lmserve {

namespace {

std::atomic<ProgressMode> g_mode{ProgressMode::kAuto};
std::atomic<std::int64_t> g_interval_ms{10000};
constexpr auto kRedraw = std::chrono::milliseconds(100);  // a terminal's redraws at most this often

double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string fixed3(double v) {  // three significant figures
  char buf[32];
  std::snprintf(buf, sizeof buf, v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : "%.2f", v);
  return buf;
}

std::string duration_text(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0f s", std::ceil(s));
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%d min %02d s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else std::snprintf(buf, sizeof buf, "%d h %02d min", static_cast<int>(s) / 3600, static_cast<int>(s) / 60 % 60);
  return buf;
}

}  // namespace

void configure_progress(ProgressMode mode, std::chrono::milliseconds log_interval) {
  g_mode = mode;
  g_interval_ms = std::max<std::int64_t>(1, log_interval.count());
}

std::string format_bytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  return (u == 0 ? std::to_string(static_cast<long long>(bytes)) : fixed3(bytes)) + " " + kUnits[u];
}

Progress::Progress(std::string what, double total, Unit unit, std::string count_name, ProgressSink sink)
    : what_(std::move(what)), count_name_(std::move(count_name)), unit_(unit), sink_(std::move(sink)), total_(total) {
  if (sink_.mode == ProgressMode::kAuto) sink_.mode = g_mode.load();
  if (sink_.mode == ProgressMode::kAuto) sink_.mode = ::isatty(::fileno(stderr)) ? ProgressMode::kTerminal : ProgressMode::kLog;
  if (sink_.log_interval.count() == 0) sink_.log_interval = std::chrono::milliseconds(g_interval_ms.load());
  if (!sink_.terminal) {
    sink_.terminal = [](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stderr);
      std::fflush(stderr);
    };
  }
  if (!sink_.log) sink_.log = [](std::string_view s) { spdlog::info("{}", s); };
  if (!sink_.now) sink_.now = [] { return std::chrono::steady_clock::now(); };
  start_ = last_draw_ = sink_.now();
}

Progress::~Progress() { done(); }

void Progress::add(double amount) {
  {
    std::lock_guard lock(mu_);
    value_ += amount;
  }
  maybe_draw(false);
}

void Progress::set(double value) {
  {
    std::lock_guard lock(mu_);
    value_ = value;
  }
  maybe_draw(false);
}

void Progress::set_total(double total) {
  std::lock_guard lock(mu_);
  total_ = total;
}

void Progress::set_note(std::string note) {
  std::lock_guard lock(mu_);
  note_ = std::move(note);
}

void Progress::done() { maybe_draw(true); }

std::string Progress::line() const {
  std::lock_guard lock(mu_);
  return line_locked(sink_.now());
}

void Progress::maybe_draw(bool final) {
  if (sink_.mode == ProgressMode::kOff) return;
  std::string out;
  {
    std::lock_guard lock(mu_);
    if (done_) return;
    const auto now = sink_.now();
    if (!final) {
      const auto gap = sink_.mode == ProgressMode::kTerminal ? std::chrono::steady_clock::duration(kRedraw)
                                                             : std::chrono::steady_clock::duration(sink_.log_interval);
      if (now - last_draw_ < gap) return;
    }
    done_ = final;
    last_draw_ = now;
    if (sink_.mode == ProgressMode::kTerminal) {  // back to the line's start, then clear what is left of the last
      out.assign("\r").append(line_locked(now)).append("\x1b[K");
      if (final) out.push_back('\n');
    } else {
      out = line_locked(now);
    }
  }
  if (sink_.mode == ProgressMode::kTerminal) sink_.terminal(out);
  else sink_.log(out);
}

std::string Progress::line_locked(std::chrono::steady_clock::time_point now) const {
  const double elapsed = std::max(1e-9, seconds(now - start_));
  const double rate = value_ / elapsed;
  auto amount = [&](double v) { return unit_ == Unit::kBytes ? format_bytes(v) : std::to_string(static_cast<long long>(std::llround(v))); };
  auto per_second = [&] { return unit_ == Unit::kBytes ? format_bytes(rate) + "/s" : fixed3(rate) + "/s"; };
  const std::string name = count_name_.empty() ? "" : " " + count_name_;
  std::string s = what_ + "  ";
  if (done_) {
    s += "done: " + amount(value_) + name + " in " + fixed3(elapsed) + " s (" + per_second() + ")";
  } else {
    if (total_ > 0) {
      const double frac = std::clamp(value_ / total_, 0.0, 1.0);
      constexpr int kWidth = 20;
      const int filled = static_cast<int>(frac * kWidth);
      char pct[16];
      std::snprintf(pct, sizeof pct, "%3.0f%%", std::floor(frac * 100));
      s += "[" + std::string(static_cast<std::size_t>(filled), '#') + std::string(static_cast<std::size_t>(kWidth - filled), '.') + "]  " + pct + "  ";
      s += (unit_ == Unit::kBytes ? format_bytes(value_) + "/" + format_bytes(total_) : amount(value_) + "/" + amount(total_) + name);
    } else {
      s += amount(value_) + name;
    }
    s += "  " + per_second();
    if (total_ > 0 && rate > 0 && value_ < total_) s += "  ETA " + duration_text((total_ - value_) / rate);
  }
  if (!note_.empty()) s += "  " + note_;
  return s;
}

}  // namespace lmserve
