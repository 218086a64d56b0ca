#include "bench/load.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>

namespace lmserve::bench {

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(q, 0.0, 100.0) / 100.0 * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

Summary summarize(const std::vector<double>& v) {
  Summary s;
  s.count = v.size();
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.median = percentile(v, 50);
  s.p90 = percentile(v, 90);
  s.p95 = percentile(v, 95);
  s.p99 = percentile(v, 99);
  s.max = *std::max_element(v.begin(), v.end());
  return s;
}

Arrivals::Arrivals(double rate, double burstiness, std::uint64_t seed)
    : rate_(rate), rng_(seed), gamma_(burstiness > 0 ? burstiness : 1.0, burstiness > 0 ? 1.0 / (rate * burstiness) : 1.0 / rate) {}

double Arrivals::next_gap() {
  if (!std::isfinite(rate_) || rate_ <= 0) return 0;
  return gamma_(rng_);
}

namespace {

Status bad(const std::string& m) { return Status(StatusCode::kInvalidArgument, "dataset: " + m); }

Result<std::vector<RequestSpec>> read_jsonl(const DatasetOptions& o) {
  std::ifstream in(o.path);
  if (!in) return error(StatusCode::kNotFound, "dataset: cannot read " + o.path.string());
  std::vector<RequestSpec> out;
  std::string line;
  for (int n = 1; std::getline(in, line) && static_cast<std::int64_t>(out.size()) < o.num_prompts; ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    const std::string where = o.path.filename().string() + ":" + std::to_string(n);
    if (j.is_discarded() || !j.is_object()) return error(bad(where + ": not a JSON object"));
    RequestSpec r;
    if (j.contains("prompt")) {
      if (!j["prompt"].is_string() || j["prompt"].get_ref<const std::string&>().empty()) return error(bad(where + ": prompt must be a non-empty string"));
      r.prompt = j["prompt"].get<std::string>();
    } else if (j.contains("input_len") && j["input_len"].is_number_integer() && j["input_len"].get<std::int64_t>() > 0) {
      r.input_len = j["input_len"].get<std::int64_t>();
    } else {
      return error(bad(where + ": needs \"prompt\" or a positive \"input_len\""));
    }
    if (!j.contains("output_len") || !j["output_len"].is_number_integer() || j["output_len"].get<std::int64_t>() < 1) {
      return error(bad(where + ": needs a positive integer \"output_len\""));
    }
    r.output_len = j["output_len"].get<std::int64_t>();
    if (j.contains("timestamp")) {
      if (!j["timestamp"].is_number() || j["timestamp"].get<double>() < 0) return error(bad(where + ": timestamp must be seconds >= 0"));
      r.timestamp = j["timestamp"].get<double>();
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) return error(bad(o.path.string() + " has no requests"));
  return out;
}

// ShareGPT: [{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}].
// The first human turn is the prompt; the reply's length in characters / 4 approximates its
// tokens (the server's usage gives the real count).
Result<std::vector<RequestSpec>> read_sharegpt(const DatasetOptions& o) {
  std::ifstream in(o.path);
  if (!in) return error(StatusCode::kNotFound, "dataset: cannot read " + o.path.string());
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_array()) return error(bad(o.path.string() + " is not a ShareGPT JSON array"));
  std::vector<RequestSpec> out;
  for (const auto& conv : j) {
    if (static_cast<std::int64_t>(out.size()) >= o.num_prompts) break;
    if (!conv.is_object() || !conv.contains("conversations") || !conv["conversations"].is_array()) continue;
    const auto& turns = conv["conversations"];
    if (turns.size() < 2 || !turns[0].is_object() || !turns[1].is_object()) continue;
    if (!turns[0].contains("value") || !turns[0]["value"].is_string() || !turns[1].contains("value") || !turns[1]["value"].is_string()) continue;
    RequestSpec r;
    r.prompt = turns[0]["value"].get<std::string>();
    r.output_len = std::max<std::int64_t>(1, static_cast<std::int64_t>(turns[1]["value"].get_ref<const std::string&>().size() / 4));
    if (r.prompt.empty()) continue;
    out.push_back(std::move(r));
  }
  if (out.empty()) return error(bad(o.path.string() + " has no usable conversations"));
  return out;
}

}  // namespace

Result<std::vector<RequestSpec>> make_dataset(const DatasetOptions& o) {
  if (o.num_prompts < 1) return error(bad("--num-prompts must be positive"));
  if (o.name == "jsonl") return read_jsonl(o);
  if (o.name == "sharegpt") return read_sharegpt(o);
  std::mt19937_64 rng(o.seed);
  std::vector<RequestSpec> out(static_cast<std::size_t>(o.num_prompts));
  if (o.name == "random") {
    if (o.input_len < 1 || o.output_len < 1 || o.range_ratio < 0 || o.range_ratio >= 1) {
      return error(bad("random needs lengths >= 1 and a range ratio in [0, 1)"));
    }
    auto draw = [&](std::int64_t len) {
      if (o.range_ratio == 0) return len;
      const auto lo = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(static_cast<double>(len) * (1 - o.range_ratio))));
      const auto hi = std::max<std::int64_t>(lo, static_cast<std::int64_t>(std::ceil(static_cast<double>(len) * (1 + o.range_ratio))));
      return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    for (auto& r : out) {
      r.input_len = draw(o.input_len);
      r.output_len = draw(o.output_len);
    }
    return out;
  }
  if (o.name == "mixed") {
    if (o.input_median <= 0 || o.output_median <= 0 || o.input_sigma < 0 || o.output_sigma < 0 || o.min_len < 1 ||
        o.max_input_len < o.min_len || o.max_output_len < o.min_len) {
      return error(bad("mixed needs positive medians, sigmas >= 0 and min <= max lengths"));
    }
    std::lognormal_distribution<double> in_d(std::log(o.input_median), o.input_sigma), out_d(std::log(o.output_median), o.output_sigma);
    for (auto& r : out) {
      r.input_len = std::clamp<std::int64_t>(std::llround(in_d(rng)), o.min_len, o.max_input_len);
      r.output_len = std::clamp<std::int64_t>(std::llround(out_d(rng)), o.min_len, o.max_output_len);
    }
    return out;
  }
  return error(bad("unknown dataset '" + o.name + "' (random, mixed, jsonl, sharegpt)"));
}

std::pair<double, double> mean_lengths(const std::vector<RequestSpec>& specs) {
  double in = 0, out = 0;
  for (const auto& s : specs) {
    in += static_cast<double>(s.input_len);
    out += static_cast<double>(s.output_len);
  }
  const double n = std::max<double>(1, static_cast<double>(specs.size()));
  return {in / n, out / n};
}

}  // namespace lmserve::bench
