// The pieces of `lmserve bench serve` that do not touch the network: summary statistics,
// arrival processes and request-length datasets. Deterministic for a given seed.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"

namespace lmserve::bench {

// ---- statistics ------------------------------------------------------------------------
struct Summary {
  std::size_t count = 0;
  double mean = 0, median = 0, p90 = 0, p95 = 0, p99 = 0, max = 0;
};
// Percentile q in [0, 100] with linear interpolation between closest ranks (numpy's default).
double percentile(std::vector<double> values, double q);
Summary summarize(const std::vector<double>& values);

// ---- arrivals --------------------------------------------------------------------------
// Gaps between request starts: gamma-distributed with mean 1 / rate and shape `burstiness`
// (1 = Poisson; < 1 burstier; > 1 more regular). An infinite rate gives all-zero gaps.
class Arrivals {
 public:
  Arrivals(double rate, double burstiness, std::uint64_t seed);
  double next_gap();  // seconds

 private:
  double rate_;
  std::mt19937_64 rng_;
  std::gamma_distribution<double> gamma_;
};

// ---- datasets --------------------------------------------------------------------------
struct RequestSpec {
  std::string prompt;             // text, when the dataset gives one
  std::int64_t input_len = 0;     // tokens wanted (when prompt is empty) or measured
  std::int64_t output_len = 0;    // max_tokens
  std::optional<double> timestamp;  // seconds from the start (jsonl traces)
};

struct DatasetOptions {
  std::string name = "random";  // random | mixed | jsonl | sharegpt
  std::int64_t num_prompts = 100;
  // random: fixed lengths, or uniform in [len x (1 - range_ratio), len x (1 + range_ratio)].
  std::int64_t input_len = 1024, output_len = 128;
  double range_ratio = 0.0;
  // mixed: log-normal lengths with these medians and sigma (of the log), clipped.
  double input_median = 400, output_median = 200, input_sigma = 0.8, output_sigma = 0.8;
  std::int64_t min_len = 4, max_input_len = 4096, max_output_len = 4096;
  std::filesystem::path path;  // jsonl / sharegpt
  std::uint64_t seed = 0;
};

// InvalidArgument for bad options or a malformed file (naming the line).
Result<std::vector<RequestSpec>> make_dataset(const DatasetOptions& options);

// The mean input and output lengths of a dataset (of the specs' lengths).
std::pair<double, double> mean_lengths(const std::vector<RequestSpec>& specs);

}  // namespace lmserve::bench
