// Per-request output: token ids become text deltas (incremental detokenizer), and stop
// conditions end the request. Text that might be the start of a stop string is held back
// until it is known not to be one, so nothing is streamed and then retracted; the stop string
// itself is left out unless include_stop_str_in_output.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/request.h"
#include "text/detokenizer.h"

namespace lmserve::engine {

class OutputProcessor {
 public:
  OutputProcessor(std::shared_ptr<const text::Tokenizer> tokenizer, const SamplingParams& params,
                  std::vector<std::int32_t> eos_ids);

  struct Update {
    std::string text;  // to emit now (may be empty)
    FinishReason finish = FinishReason::kNone;
    std::string stop_reason;  // the stop string or token id that matched, if any
  };

  // `token` was just generated; `num_output` counts it.
  Update add_token(std::int32_t token, std::int64_t num_output);
  // The end `token` decides without its text, as add_token decides it: kStop for an
  // end-of-sequence (unless ignore_eos) or stop token once min_tokens are out (`stop_reason`: the
  // stop token's id, empty for end-of-sequence), else kLength at max_tokens, else kNone. Only
  // stop strings end a request on text besides, so for a request without any this is its end.
  FinishReason finish_by_token(std::int32_t token, std::int64_t num_output, std::string* stop_reason) const;
  // Ends the request for another reason (abort, error): returns what is held back.
  std::string flush();

 private:
  Update finish_with(FinishReason reason, std::string stop_reason);
  std::string take_emittable();

  text::IncrementalDetokenizer detok_;
  const SamplingParams& params_;
  std::vector<std::int32_t> eos_ids_;
  std::string held_;
};

}  // namespace lmserve::engine
