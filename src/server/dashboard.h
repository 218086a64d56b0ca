// server/dashboard: the live dashboard of `serve` at GET /dashboard (issue #32). A sampler thread
// reads the server's own /metrics text once a period and keeps the last 15 minutes of samples in
// a ring: per-GPU memory used and total with the admission limit (the process's resident memory
// on the CPU backend), KV usage and the watermark,
// prompt and output tokens/s, running and waiting requests per lane, TTFT and TPOT p50/p99 per
// lane (over the last minute's observations, as histogram_quantile over rate[1m] would give),
// admission refusals and [LIMIT] episodes per second. /dashboard/data?since=MS gives the samples
// after MS as JSON; /dashboard is one HTML page that draws them with Chart.js, which is built into
// the binary from Debian's libjs-chart.js and served at /dashboard/chart.js: the page asks nothing
// of another origin. Because every figure is read from the /metrics text, the page shows what
// /metrics says at the sample's moment. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace lmserve::server {

// One Prometheus text sample line, parsed.
struct MetricSample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};
std::vector<MetricSample> parse_metrics_text(std::string_view text);

class Dashboard {
 public:
  // `metrics_text` is called on the sampler thread; `device_memory_limit` is the share of a card
  // above which admission stops (the limit line of the memory chart).
  Dashboard(std::function<std::string()> metrics_text, double device_memory_limit,
            std::chrono::milliseconds period = std::chrono::seconds(1), std::size_t keep = 900);
  ~Dashboard();
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // The samples taken after `since_ms` (Unix milliseconds), oldest first, as
  // {"period_ms":..,"samples":[...]}.
  std::string data_json(std::int64_t since_ms) const;
  void sample_now();  // takes a sample at once (the sampler thread does it every period)

  static std::string_view page();      // text/html
  static std::string_view chart_js();  // Chart.js, as packaged by Debian

 private:
  void loop();
  std::function<std::string()> metrics_text_;
  double limit_;
  std::chrono::milliseconds period_;
  std::size_t keep_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<std::string> samples_;  // JSON objects, oldest first
  std::deque<std::int64_t> times_;
  // The previous sample's counters (rates) and each lane histogram's cumulative buckets over the
  // last minute (percentiles).
  std::map<std::string, double> last_counters_;
  std::int64_t last_ms_ = 0;
  std::deque<std::pair<std::int64_t, std::map<std::string, std::vector<std::pair<double, double>>>>> buckets_;
  std::thread thread_;
};

}  // namespace lmserve::server
