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

// The figures of one server's /metrics text as a dashboard sample (a JSON object): gpus (used,
// total), resident_bytes, kv_usage, kv_watermark, prompt/output tokens and their rates,
// refusals and [LIMIT] episodes and their rates, and per lane running, waiting and TTFT/TPOT
// p50/p99 over the last minute. Rates and percentiles come from the samples before, so keep one
// sampler per source and feed it in time order. Not thread-safe.
class MetricsSampler {
 public:
  // `device_memory_limit`: the share of a card above which admission stops (the memory chart's line).
  std::string sample(std::string_view metrics_text, std::int64_t t_ms, double device_memory_limit);

 private:
  std::map<std::string, double> last_counters_;
  std::int64_t last_ms_ = 0;
  // Each lane histogram's cumulative buckets over the last minute.
  std::deque<std::pair<std::int64_t, std::map<std::string, std::vector<std::pair<double, double>>>>> buckets_;
};

// The ring of samples behind a dashboard page: a thread calls `take(t_ms)` (a JSON object
// holding "t") every period and keeps the last `keep`.
class Dashboard {
 public:
  Dashboard(std::function<std::string(std::int64_t t_ms)> take, std::chrono::milliseconds period = std::chrono::seconds(1),
            std::size_t keep = 900);
  ~Dashboard();
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // The samples taken after `since_ms` (Unix milliseconds), oldest first, as
  // {"period_ms":..,"samples":[...]}.
  std::string data_json(std::int64_t since_ms) const;
  void sample_now();  // takes a sample at once (the thread does it every period)

  static std::string_view page();          // serve's page, text/html
  static std::string_view gateway_page();  // the gateway's, across its replicas
  static std::string_view chart_js();      // Chart.js, as packaged by Debian

 private:
  void loop();
  std::function<std::string(std::int64_t)> take_;
  std::chrono::milliseconds period_;
  std::size_t keep_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<std::string> samples_;  // JSON objects, oldest first
  std::deque<std::int64_t> times_;
  std::thread thread_;
};

// Unix time in milliseconds.
std::int64_t unix_ms();

}  // namespace lmserve::server
