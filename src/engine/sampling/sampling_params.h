// What a request asks of the sampler and of the output processor, with the validation that
// runs at submit (invalid values never reach the sampler).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace lmserve::text {
class Grammar;
}

namespace lmserve::engine {

struct SamplingParams {
  double temperature = 1.0;       // 0: greedy
  double top_p = 1.0;             // (0, 1]
  std::int32_t top_k = -1;        // -1 or 0: off
  double min_p = 0.0;             // [0, 1]
  double repetition_penalty = 1.0;  // > 0; 1 = off
  double presence_penalty = 0.0;    // [-2, 2]
  double frequency_penalty = 0.0;   // [-2, 2]
  std::vector<std::pair<std::int32_t, float>> logit_bias;  // token -> bias in [-100, 100]
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<std::int32_t> stop_token_ids;
  bool ignore_eos = false;
  std::int64_t max_tokens = 16;
  std::int64_t min_tokens = 0;
  std::optional<std::int32_t> logprobs;  // top_logprobs count, 0..20
  std::int32_t n = 1;
  bool skip_special_tokens = true;
  bool include_stop_str_in_output = false;
  // Constrained decoding (text/grammar.h): every token is drawn among those that keep the
  // output a prefix of a text of the grammar, and an end token only once it is a whole one.
  // Shared by every choice of the request (each keeps its own state).
  std::shared_ptr<const text::Grammar> grammar;

  // InvalidArgument naming the first bad field (NaN anywhere, negative temperature, top_p
  // outside (0, 1], top_k < -1, n outside [1, max_n], logprobs outside [0, max_logprobs],
  // token ids outside the vocabulary, ...).
  Status validate(std::int64_t vocab_size, std::int32_t max_n = 16, std::int32_t max_logprobs = 20) const;
  bool greedy() const { return temperature == 0.0; }
};

}  // namespace lmserve::engine
