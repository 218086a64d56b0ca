#include "engine/output/output_processor.h"

#include <algorithm>

namespace lmserve::engine {

OutputProcessor::OutputProcessor(std::shared_ptr<const text::Tokenizer> tokenizer, const SamplingParams& params,
                                 std::vector<std::int32_t> eos_ids)
    : detok_(std::move(tokenizer), params.skip_special_tokens), params_(params), eos_ids_(std::move(eos_ids)) {}

std::string OutputProcessor::take_emittable() {
  // Keep the longest suffix of held_ that is a proper prefix of a stop string.
  std::size_t hold = 0;
  for (const auto& s : params_.stop) {
    for (std::size_t len = std::min(s.size() - 1, held_.size()); len > hold; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

OutputProcessor::Update OutputProcessor::finish_with(FinishReason reason, std::string stop_reason) {
  Update u;
  held_ += detok_.finish();
  // A stop string completed by the final bytes still counts.
  std::size_t best = std::string::npos;
  const std::string* matched = nullptr;
  for (const auto& s : params_.stop) {
    std::size_t at = held_.find(s);
    if (at < best) {
      best = at;
      matched = &s;
    }
  }
  if (matched != nullptr) {
    u.text = held_.substr(0, best + (params_.include_stop_str_in_output ? matched->size() : 0));
    u.finish = FinishReason::kStop;
    u.stop_reason = *matched;
  } else {
    u.text = held_;
    u.finish = reason;
    u.stop_reason = std::move(stop_reason);
  }
  held_.clear();
  return u;
}

FinishReason OutputProcessor::finish_by_token(std::int32_t token, std::int64_t num_output, std::string* stop_reason) const {
  const bool eos = !params_.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
  const bool stop_token = std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) != params_.stop_token_ids.end();
  if ((eos || stop_token) && num_output > params_.min_tokens - 1) {
    // stop_reason names a stop token the request asked for; a plain end-of-sequence has none
    // (as in vLLM).
    *stop_reason = stop_token ? std::to_string(token) : "";
    return FinishReason::kStop;
  }
  stop_reason->clear();
  return num_output >= params_.max_tokens ? FinishReason::kLength : FinishReason::kNone;
}

OutputProcessor::Update OutputProcessor::add_token(std::int32_t token, std::int64_t num_output) {
  std::string reason;
  const FinishReason by_token = finish_by_token(token, num_output, &reason);
  // The stop token's own text is not part of the output.
  if (by_token == FinishReason::kStop) return finish_with(FinishReason::kStop, std::move(reason));
  held_ += detok_.push(token);
  for (const auto& s : params_.stop) {  // a stop string can only start inside held_ text
    if (held_.find(s) != std::string::npos) return finish_with(FinishReason::kStop, s);
  }
  if (by_token == FinishReason::kLength) return finish_with(FinishReason::kLength, "");
  Update u;
  u.text = take_emittable();
  return u;
}

std::string OutputProcessor::flush() {
  std::string out = held_ + detok_.finish();
  held_.clear();
  return out;
}

}  // namespace lmserve::engine
