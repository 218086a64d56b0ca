#include "backend/fault/fault_injection.h"

#include <charconv>
#include <cmath>
#include <string>
#include <thread>

namespace lmserve::backend {
namespace {

class FaultInjectingBackend final : public Backend {
 public:
  FaultInjectingBackend(std::unique_ptr<Backend> inner, FaultPlan plan) : inner_(std::move(inner)), plan_(plan) {}

  std::string_view name() const override { return inner_->name(); }
  const model::ModelConfig& config() const override { return inner_->config(); }
  const KvCacheConfig& kv_config() const override { return inner_->kv_config(); }
  std::uint64_t kv_block_bytes() const override { return inner_->kv_block_bytes(); }
  MemoryInfo memory() const override { return inner_->memory(); }
  bool asynchronous() const override { return inner_->asynchronous(); }
  bool supports_masks() const override { return inner_->supports_masks(); }
  Status supply_masks(std::span<const std::uint64_t> masks) override { return inner_->supply_masks(masks); }
  Status set_host_blocks(std::int64_t n) override { return inner_->set_host_blocks(n); }
  Status swap_blocks(std::span<const BlockCopy> to_host, std::span<const BlockCopy> to_device) override {
    return inner_->swap_blocks(to_host, to_device);
  }
  std::uint64_t host_swap_bytes() const override { return inner_->host_swap_bytes(); }
  double staging_seconds_total() const override { return inner_->staging_seconds_total(); }

  Status forward(const Batch& batch, std::span<float> logits) override {
    LMSERVE_RETURN_IF_ERROR(begin(batch, logits));
    LMSERVE_RETURN_IF_ERROR(inner_->forward(batch, logits));
    return end();
  }
  Status prepare(const Batch& batch, std::span<float> logits) override {
    LMSERVE_RETURN_IF_ERROR(begin(batch, logits));
    return inner_->prepare(batch, logits);
  }
  Status launch(std::span<const TokenPatch> patches) override { return inner_->launch(patches); }
  Status wait() override {
    LMSERVE_RETURN_IF_ERROR(inner_->wait());
    return end();
  }

 private:
  // A step begins (its faults before the device runs it) ...
  Status begin(const Batch& batch, std::span<float> logits) {
    const std::int64_t step = ++steps_;
    pending_ = {step, batch.logits_indices.size(), logits, batch.sampled_tokens};
    if (step == plan_.fail_step) return Status(StatusCode::kInternal, "fault injection: step " + std::to_string(step) + " failed");
    if (step == plan_.oom_step) return Status(StatusCode::kResourceExhausted, "fault injection: out of device memory in step " + std::to_string(step));
    return Status::ok();
  }
  // ... and ends (its faults on the results).
  Status end() {
    const Pending p = pending_;
    if (p.step == plan_.stall_step) std::this_thread::sleep_for(plan_.stall);
    if (p.step == plan_.nan_step && plan_.nan_row >= 0 && static_cast<std::size_t>(plan_.nan_row) < p.rows) {
      const auto vocab = static_cast<std::size_t>(config().vocab_size), row = static_cast<std::size_t>(plan_.nan_row);
      if (row < p.sampled_tokens.size() && p.sampled_tokens[row] >= 0) return Status::ok();  // device-sampled: no host logits
      for (std::size_t t = 0; t < vocab && (row + 1) * vocab <= p.logits.size(); ++t) p.logits[row * vocab + t] = NAN;
    }
    return Status::ok();
  }

  struct Pending {
    std::int64_t step = 0;
    std::size_t rows = 0;
    std::span<float> logits;
    std::span<std::int32_t> sampled_tokens;
  };
  std::unique_ptr<Backend> inner_;
  FaultPlan plan_;
  std::int64_t steps_ = 0;
  Pending pending_;
};

// A whole decimal number of at least `min`.
bool read_int(std::string_view s, std::int64_t* out, std::int64_t min = 1) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && *out >= min;
}

}  // namespace

Result<FaultPlan> parse_fault_plan(std::string_view spec) {
  FaultPlan p;
  auto bad = [](std::string_view part) {
    return error(StatusCode::kInvalidArgument, "--fault-injection: cannot read '" + std::string(part) +
                                                   "' (fail=STEP, oom=STEP, nan=STEP:ROW, stall=STEP:MILLISECONDS; steps from 1)");
  };
  while (!spec.empty()) {
    const std::size_t comma = spec.find(',');
    const std::string_view part = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    const std::size_t eq = part.find('=');
    if (eq == std::string_view::npos) return bad(part);
    const std::string_view key = part.substr(0, eq), value = part.substr(eq + 1);
    const std::size_t colon = value.find(':');
    const std::string_view first = value.substr(0, colon), second = colon == std::string_view::npos ? std::string_view() : value.substr(colon + 1);
    std::int64_t a = 0, b = 0;
    if (key == "fail" || key == "oom") {
      std::int64_t& step = key == "fail" ? p.fail_step : p.oom_step;
      if (colon != std::string_view::npos || !read_int(first, &a) || step != 0) return bad(part);
      step = a;
    } else if (key == "nan" || key == "stall") {
      std::int64_t& step = key == "nan" ? p.nan_step : p.stall_step;
      // nan's row counts from 0; stall's milliseconds from 1.
      if (!read_int(first, &a) || colon == std::string_view::npos || !read_int(second, &b, key == "nan" ? 0 : 1) || step != 0) return bad(part);
      step = a;
      if (key == "nan") {
        p.nan_row = b;
      } else {
        p.stall = std::chrono::milliseconds(b);
      }
    } else {
      return bad(part);
    }
  }
  return p;
}

std::unique_ptr<Backend> inject_faults(std::unique_ptr<Backend> inner, const FaultPlan& plan) {
  if (!plan.any()) return inner;
  return std::make_unique<FaultInjectingBackend>(std::move(inner), plan);
}

}  // namespace lmserve::backend
