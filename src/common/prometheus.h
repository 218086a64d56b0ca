// Prometheus text exposition (format 0.0.4) pieces shared by `serve`'s and the gateway's
// /metrics: number and label formatting, HELP/TYPE headers, and a histogram. Not thread-safe:
// the metrics registries that use them hold their own lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lmserve::prometheus {

// A sample value: shortest exact form ("0.25", "1e-05", "12").
std::string num(double v);
// A label value with \, " and newlines escaped.
std::string escape(const std::string& v);
// "# HELP name help\n# TYPE name type\n".
void header(std::string& out, const std::string& name, const char* type, const char* help);

// Seconds, 1 ms to 80 s (vLLM's latency buckets).
std::vector<double> latency_buckets();
// Token counts, 1 to 20,000.
std::vector<double> token_buckets();

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Adds another histogram's observations (the same bounds).
  void merge(const Histogram& other);
  // Lines of the _bucket/_sum/_count series; `labels` without braces, may be empty.
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  std::uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<std::uint64_t> counts_;
  double sum_ = 0;
  std::uint64_t count_ = 0;
};

}  // namespace lmserve::prometheus
