#include "server/dashboard.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>

// Chart.js, from Debian's libjs-chart.js, in the binary (LMSERVE_CHART_JS: its path, set by CMake).
asm(".section .rodata\n"
    ".global lmserve_chart_js_begin\n"
    "lmserve_chart_js_begin:\n"
    ".incbin \"" LMSERVE_CHART_JS "\"\n"
    ".global lmserve_chart_js_end\n"
    "lmserve_chart_js_end:\n"
    ".byte 0\n"
    ".previous\n");
extern "C" const char lmserve_chart_js_begin[];
extern "C" const char lmserve_chart_js_end[];

namespace lmserve::server {

namespace {

using json = nlohmann::json;

// histogram_quantile over cumulative (le, count) pairs sorted by le, +Inf last.
json quantile(double q, const std::vector<std::pair<double, double>>& b) {
  if (b.empty() || b.back().second <= 0) return nullptr;
  const double rank = q * b.back().second;
  double prev_le = 0, prev_count = 0;
  for (const auto& [le, count] : b) {
    if (count >= rank) {
      if (std::isinf(le)) return prev_le;  // the highest finite bound, as Prometheus does
      if (count == prev_count) return le;
      return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count);
    }
    prev_le = le;
    prev_count = count;
  }
  return prev_le;
}

}  // namespace

std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::vector<MetricSample> parse_metrics_text(std::string_view text) {
  std::vector<MetricSample> out;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line.front() == '#') continue;
    MetricSample s;
    std::size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    s.name = std::string(line.substr(0, i));
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const std::size_t eq = line.find('=', i);
        if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') break;
        std::string key(line.substr(i, eq - i)), value;
        std::size_t j = eq + 2;
        for (; j < line.size() && line[j] != '"'; ++j) {
          if (line[j] == '\\' && j + 1 < line.size()) {
            ++j;
            value += line[j] == 'n' ? '\n' : line[j];
          } else {
            value += line[j];
          }
        }
        s.labels[std::move(key)] = std::move(value);
        i = j + 1;
        if (i < line.size() && line[i] == ',') ++i;
      }
      ++i;  // '}'
    }
    while (i < line.size() && line[i] == ' ') ++i;
    const std::string value(line.substr(i, line.find(' ', i) == std::string_view::npos ? std::string_view::npos : line.find(' ', i) - i));
    if (value == "+Inf") {
      s.value = INFINITY;
    } else if (value == "-Inf") {
      s.value = -INFINITY;
    } else {
      char* e = nullptr;
      s.value = std::strtod(value.c_str(), &e);
      if (e == value.c_str()) continue;
    }
    out.push_back(std::move(s));
  }
  return out;
}

Dashboard::Dashboard(std::function<std::string(std::int64_t)> take, std::chrono::milliseconds period, std::size_t keep)
    : take_(std::move(take)), period_(period), keep_(keep) {
  thread_ = std::thread([this] { loop(); });
}

Dashboard::~Dashboard() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Dashboard::loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    sample_now();
    lock.lock();
    cv_.wait_for(lock, period_, [this] { return stop_; });
  }
}

void Dashboard::sample_now() {
  const std::int64_t t = unix_ms();
  std::string s = take_(t);  // outside the lock: it reads the server's metrics
  std::lock_guard lock(mu_);
  samples_.push_back(std::move(s));
  times_.push_back(t);
  while (samples_.size() > keep_) {
    samples_.pop_front();
    times_.pop_front();
  }
}

std::string MetricsSampler::sample(std::string_view text, std::int64_t t, double device_memory_limit) {
  const auto samples = parse_metrics_text(text);
  json s{{"t", t}, {"device_memory_limit", device_memory_limit}};
  std::map<std::string, json> gpus;
  std::map<std::string, double> counters{{"prompt", 0}, {"output", 0}, {"refusals", 0}, {"episodes", 0}};
  std::map<std::string, std::vector<std::pair<double, double>>> buckets;  // "ttft|lane", "tpot|lane"
  json lanes = json::object();
  for (const auto& m : samples) {
    auto label = [&](const char* k) {
      auto it = m.labels.find(k);
      return it == m.labels.end() ? std::string() : it->second;
    };
    if (m.name == "lmserve:gpu_memory_used_bytes") {
      gpus[label("gpu")]["used"] = m.value;
    } else if (m.name == "lmserve:gpu_memory_total_bytes") {
      gpus[label("gpu")]["total"] = m.value;
    } else if (m.name == "lmserve:process_resident_memory_bytes") {
      s["resident_bytes"] = m.value;
    } else if (m.name == "vllm:kv_cache_usage_perc") {
      s["kv_usage"] = m.value;
    } else if (m.name == "lmserve:kv_watermark") {
      s["kv_watermark"] = m.value;
    } else if (m.name == "vllm:prompt_tokens_total") {
      counters["prompt"] += m.value;
    } else if (m.name == "vllm:generation_tokens_total") {
      counters["output"] += m.value;
    } else if (m.name == "lmserve:admission_rejections_total") {
      counters["refusals"] += m.value;
    } else if (m.name == "lmserve:admission_limit_episodes_total") {
      counters["episodes"] += m.value;
    } else if (m.name == "lmserve:num_requests_running_lane") {
      lanes[label("lane")]["running"] = m.value;
    } else if (m.name == "lmserve:num_requests_waiting_lane") {
      lanes[label("lane")]["waiting"] = m.value;
    } else if (m.name == "lmserve:lane_time_to_first_token_seconds_bucket" || m.name == "lmserve:lane_time_per_output_token_seconds_bucket") {
      const std::string le = label("le");
      const double bound = le == "+Inf" ? INFINITY : std::strtod(le.c_str(), nullptr);
      buckets[(m.name.find("first_token") != std::string::npos ? "ttft|" : "tpot|") + label("lane")].emplace_back(bound, m.value);
    }
  }
  json g = json::array();
  for (auto& [id, v] : gpus) {
    v["gpu"] = id;
    g.push_back(v);
  }
  s["gpus"] = g;
  s["prompt_tokens_total"] = counters["prompt"];
  s["output_tokens_total"] = counters["output"];
  s["refusals_total"] = counters["refusals"];
  s["limit_episodes_total"] = counters["episodes"];
  for (auto& [k, b] : buckets) std::sort(b.begin(), b.end());

  const double dt = last_ms_ > 0 ? static_cast<double>(t - last_ms_) / 1e3 : 0;
  auto rate = [&](const char* k) -> json {
    if (dt <= 0) return nullptr;
    return std::max(0.0, (counters[k] - last_counters_[k]) / dt);
  };
  s["prompt_tokens_per_s"] = rate("prompt");
  s["output_tokens_per_s"] = rate("output");
  s["refusals_per_s"] = rate("refusals");
  s["limit_episodes_per_s"] = rate("episodes");
  last_counters_ = counters;
  last_ms_ = t;
  // Percentiles over the last minute: the buckets now less those of a minute ago (or the oldest).
  buckets_.emplace_back(t, buckets);
  while (buckets_.size() > 1 && buckets_[1].first <= t - 60000) buckets_.pop_front();
  const auto& base = buckets_.front().second;
  for (const auto& [key, now] : buckets) {
    std::vector<std::pair<double, double>> window = now;
    if (auto it = base.find(key); it != base.end() && it->second.size() == now.size() && buckets_.size() > 1) {
      for (std::size_t i = 0; i < window.size(); ++i) window[i].second -= it->second[i].second;
    }
    const std::string kind = key.substr(0, 4), lane = key.substr(5);
    lanes[lane][kind + "_p50"] = quantile(0.5, window);
    lanes[lane][kind + "_p99"] = quantile(0.99, window);
  }
  s["lanes"] = lanes;
  return s.dump();
}


std::string Dashboard::data_json(std::int64_t since_ms) const {
  std::lock_guard lock(mu_);
  std::string out = "{\"period_ms\":" + std::to_string(period_.count()) + ",\"samples\":[";
  bool first = true;
  for (std::size_t i = 0; i < samples_.size(); ++i) {
    if (times_[i] <= since_ms) continue;
    if (!first) out += ',';
    out += samples_[i];
    first = false;
  }
  return out + "]}";
}

std::string_view Dashboard::chart_js() { return {lmserve_chart_js_begin, static_cast<std::size_t>(lmserve_chart_js_end - lmserve_chart_js_begin)}; }

}  // namespace lmserve::server
