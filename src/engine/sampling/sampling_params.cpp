#include "engine/sampling/sampling_params.h"

#include <cmath>

namespace lmserve::engine {

Status SamplingParams::validate(std::int64_t vocab, std::int32_t max_n, std::int32_t max_logprobs) const {
  auto bad = [](const std::string& field, const std::string& why) {
    return Status(StatusCode::kInvalidArgument, field + " " + why);
  };
  auto finite = [](double v) { return std::isfinite(v); };
  if (!finite(temperature) || temperature < 0) return bad("temperature", "must be a finite number >= 0");
  if (!finite(top_p) || top_p <= 0 || top_p > 1) return bad("top_p", "must be in (0, 1]");
  if (top_k < -1) return bad("top_k", "must be -1 (off) or a positive integer");
  if (!finite(min_p) || min_p < 0 || min_p > 1) return bad("min_p", "must be in [0, 1]");
  if (!finite(repetition_penalty) || repetition_penalty <= 0) return bad("repetition_penalty", "must be > 0");
  if (!finite(presence_penalty) || presence_penalty < -2 || presence_penalty > 2) return bad("presence_penalty", "must be in [-2, 2]");
  if (!finite(frequency_penalty) || frequency_penalty < -2 || frequency_penalty > 2) return bad("frequency_penalty", "must be in [-2, 2]");
  for (const auto& [tok, b] : logit_bias) {
    if (tok < 0 || tok >= vocab) return bad("logit_bias", "names token " + std::to_string(tok) + " outside the vocabulary");
    if (!std::isfinite(b) || b < -100 || b > 100) return bad("logit_bias", "values must be in [-100, 100]");
  }
  for (auto t : stop_token_ids) {
    if (t < 0 || t >= vocab) return bad("stop_token_ids", "names token " + std::to_string(t) + " outside the vocabulary");
  }
  for (const auto& s : stop) {
    if (s.empty()) return bad("stop", "strings must not be empty");
  }
  if (stop.size() > 16) return bad("stop", "may hold at most 16 strings");
  if (max_tokens < 1) return bad("max_tokens", "must be at least 1");
  if (min_tokens < 0 || min_tokens > max_tokens) return bad("min_tokens", "must be in [0, max_tokens]");
  if (logprobs && (*logprobs < 0 || *logprobs > max_logprobs)) {
    return bad("logprobs", "must be in [0, " + std::to_string(max_logprobs) + "]");
  }
  if (n < 1 || n > max_n) return bad("n", "must be in [1, " + std::to_string(max_n) + "]");
  return Status::ok();
}

}  // namespace lmserve::engine
