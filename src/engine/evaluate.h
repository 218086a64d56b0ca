// Perplexity of a model on a token sequence, through a backend and its paged KV cache, as
// the fp8-KV accuracy checks and `lmserve perplexity` use it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "common/status.h"

namespace lmserve::engine {

struct PerplexityResult {
  double perplexity = 0;
  double mean_nll = 0;       // nats per predicted token
  std::int64_t predicted = 0;  // tokens scored
  std::int64_t windows = 0;
};

// Splits `tokens` into consecutive windows of `context` tokens; within each window every
// token after the first is scored given the ones before it. Each window is fed in chunks of
// `chunk` tokens (chunked prefill over the paged cache). The backend needs at least
// ceil(context / block_size) KV blocks.
Result<PerplexityResult> perplexity(backend::Backend& backend, std::span<const std::int32_t> tokens, std::int64_t context,
                                    std::int64_t chunk = 128);

// The same over documents each scored on its own (windows never cross a document), pooled
// over every predicted token; documents of fewer than two tokens are skipped.
Result<PerplexityResult> perplexity(backend::Backend& backend, std::span<const std::vector<std::int32_t>> documents, std::int64_t context,
                                    std::int64_t chunk = 128);

}  // namespace lmserve::engine
