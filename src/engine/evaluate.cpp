#include "engine/evaluate.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace lmserve::engine {

namespace {

// Adds one sequence's windows to *r and *nll.
Status score(backend::Backend& b, std::span<const std::int32_t> tokens, std::int64_t context, std::int64_t chunk,
             const std::vector<std::int32_t>& table, PerplexityResult* r, double* nll) {
  const int bs = b.kv_config().block_size;
  const std::int64_t vocab = b.config().vocab_size;
  for (std::size_t w = 0; w + 1 < tokens.size(); w += static_cast<std::size_t>(context)) {
    const auto len = static_cast<std::int64_t>(std::min<std::size_t>(static_cast<std::size_t>(context), tokens.size() - w));
    if (len < 2) break;
    ++r->windows;
    for (std::int64_t c = 0; c < len; c += chunk) {
      const std::int64_t n = std::min(chunk, len - c);
      std::vector<std::int32_t> toks(static_cast<std::size_t>(n)), pos(static_cast<std::size_t>(n)), rows;
      std::vector<std::int64_t> slots(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) {
        toks[static_cast<std::size_t>(i)] = tokens[w + static_cast<std::size_t>(c + i)];
        pos[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(c + i);
        slots[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(table[static_cast<std::size_t>((c + i) / bs)]) * bs + (c + i) % bs;
        if (c + i + 1 < len) rows.push_back(static_cast<std::int32_t>(i));  // predicts the next token
      }
      backend::SeqBatch seq{0, static_cast<std::int32_t>(n), static_cast<std::int32_t>(c + n), table};
      std::vector<float> logits(rows.size() * static_cast<std::size_t>(vocab));
      backend::Batch batch{toks, pos, slots, std::span<const backend::SeqBatch>(&seq, 1), rows};
      LMSERVE_RETURN_IF_ERROR(b.forward(batch, logits));
      for (std::size_t k = 0; k < rows.size(); ++k) {
        const float* row = &logits[k * static_cast<std::size_t>(vocab)];
        const float mx = *std::max_element(row, row + vocab);
        double sum = 0;
        for (std::int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
        const std::int32_t target = tokens[w + static_cast<std::size_t>(c + rows[k] + 1)];
        *nll += std::log(sum) + mx - row[target];
        ++r->predicted;
      }
    }
  }
  return Status::ok();
}

}  // namespace

Result<PerplexityResult> perplexity(backend::Backend& b, std::span<const std::vector<std::int32_t>> documents, std::int64_t context,
                                    std::int64_t chunk) {
  const int bs = b.kv_config().block_size;
  if (context < 2 || chunk < 1) return error(StatusCode::kInvalidArgument, "perplexity: context must be >= 2 and chunk >= 1");
  if ((context + bs - 1) / bs > b.kv_config().num_blocks) {
    return error(StatusCode::kInvalidArgument, "perplexity: the KV cache holds fewer than " + std::to_string(context) + " tokens");
  }
  std::vector<std::int32_t> table(static_cast<std::size_t>((context + bs - 1) / bs));
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<std::int32_t>(i);
  PerplexityResult r;
  double nll = 0;
  for (const auto& d : documents) LMSERVE_RETURN_IF_ERROR(score(b, d, context, chunk, table, &r, &nll));
  if (r.predicted == 0) return error(StatusCode::kInvalidArgument, "perplexity: need at least two tokens");
  r.mean_nll = nll / static_cast<double>(r.predicted);
  r.perplexity = std::exp(r.mean_nll);
  return r;
}

Result<PerplexityResult> perplexity(backend::Backend& b, std::span<const std::int32_t> tokens, std::int64_t context, std::int64_t chunk) {
  const std::vector<std::int32_t> all(tokens.begin(), tokens.end());
  return perplexity(b, std::span<const std::vector<std::int32_t>>(&all, 1), context, chunk);
}

}  // namespace lmserve::engine
