// Turns one row of logits into a token, as vLLM's sampler does: penalties (repetition over
// prompt and output; presence and frequency over the output), min_tokens masking of EOS and
// stop tokens, logit_bias, then greedy argmax or temperature, top_k, top_p, min_p and a draw
// from the request's own random generator — so a request with a seed gets the same tokens
// whatever else is in the batch. Log-probabilities are of the model's raw distribution.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/sampling/sampling_params.h"

namespace lmserve::engine {

struct TokenLogprob {
  std::int32_t token;
  float logprob;
};

struct SampleResult {
  std::int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top;  // params.logprobs entries, most likely first
};

// `logits` is modified in place. `eos_ids`: the model's end tokens (masked while
// output.size() < min_tokens, as are stop_token_ids).
SampleResult sample_token(std::span<float> logits, const SamplingParams& params, std::span<const std::int32_t> prompt,
                          std::span<const std::int32_t> output, std::span<const std::int32_t> eos_ids, std::mt19937_64& rng);

}  // namespace lmserve::engine
