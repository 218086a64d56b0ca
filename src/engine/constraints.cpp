// Constrained decoding (engine_core.h): each request with a grammar (SamplingParams::grammar)
// keeps a GrammarState per choice; a step's rows get a token mask computed from it once the
// step is launched (the device runs meanwhile), and the grammar takes each sampled token's
// bytes once the step is done. The end tokens are allowed exactly when the text is whole.
//
// With asynchronous scheduling the step planned ahead is launched after the step before it is
// done and its tokens taken by the grammars, so its masks see every token before its own.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "engine/engine_core.h"

namespace lmserve::engine {
void EngineCore::advance_grammars(StepBuffers& sb) {
  for (std::size_t i = 0; i < sb.sampled.size(); ++i) {
    Live& L = *sb.lives[i];
    if (sb.dead[i] || !L.grammar || L.grammar_broken || L.logits_broken) continue;
    const std::int32_t token = sb.results[i].token;
    // An end token ends the request; the output processor decides (the mask allowed it only
    // where the text is whole).
    if (std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) continue;
    const auto bytes = tokenizer_->token_bytes(token);
    if (!bytes || !L.grammar->advance(*bytes)) {
      L.grammar_broken = true;
      spdlog::warn("[GRAMMAR] request {}: sampled token {} does not fit its grammar", sb.sampled[i]->id, token);
    }
  }
}

Status EngineCore::make_masks(StepBuffers& sb) {
  // Called with mu_ held; the masks are computed without it (only this thread touches the
  // rows' grammar states and caches, and a Live outlives the steps that name it).
  sb.mask_of.assign(sb.sampled.size(), -1);
  sb.num_masks = 0;
  std::size_t device_rows = 0;
  for (std::size_t i = 0; i < sb.sampled.size(); ++i) {
    if (!sb.lives[i]->grammar) continue;
    sb.mask_of[i] = static_cast<std::int32_t>(sb.num_masks++);
    device_rows += sb.sample_rows[i].masked ? 1 : 0;
  }
  if (sb.num_masks == 0) return Status::ok();
  const std::int64_t vocab = backend_->config().vocab_size;
  const std::size_t words = backend::mask_words(vocab);
  sb.masks.resize(sb.num_masks * words);
  std::vector<std::size_t> rows;
  rows.reserve(sb.num_masks);
  for (std::size_t i = 0; i < sb.sampled.size(); ++i) {
    if (sb.mask_of[i] >= 0) rows.push_back(i);
  }
  mu_.unlock();
  sampler_pool_->parallel_for(rows.size(), [&](std::size_t b, std::size_t e) {
    for (std::size_t k = b; k < e; ++k) {
      const std::size_t i = rows[k];
      Live& L = *sb.lives[i];
      std::uint64_t* out = sb.masks.data() + static_cast<std::size_t>(sb.mask_of[i]) * words;
      std::fill(out, out + words, 0);
      bool any = false;
      if (!sb.dead[i] && !L.grammar_broken) {
        const auto& allowed = L.mask_cache->allowed(*L.grammar);
        const std::size_t n = std::min(words, allowed.size());
        for (std::size_t w = 0; w < n; ++w) {
          out[w] = allowed[w];
          any |= allowed[w] != 0;
        }
        if (n == words && vocab % 64 != 0) out[words - 1] &= (std::uint64_t{1} << (vocab % 64)) - 1;
      }
      // The end tokens where the text is whole, and where nothing else may come (a broken or
      // ended row: its token is not used, but it must be drawn from something).
      if (!any || L.grammar->complete()) {
        for (auto t : eos_ids_) {
          if (t >= 0 && t < vocab) out[static_cast<std::size_t>(t) >> 6] |= std::uint64_t{1} << (t & 63);
        }
      }
    }
  });
  Status st = Status::ok();
  if (device_rows > 0) {
    // The device-sampled rows' masks, in row order (a copy only when host rows are mixed in).
    if (device_rows == sb.num_masks) {
      st = backend_->supply_masks(sb.masks);
    } else {
      std::vector<std::uint64_t> dev;
      dev.reserve(device_rows * words);
      for (std::size_t i : rows) {
        if (!sb.sample_rows[i].masked) continue;
        const auto* m = sb.masks.data() + static_cast<std::size_t>(sb.mask_of[i]) * words;
        dev.insert(dev.end(), m, m + words);
      }
      st = backend_->supply_masks(dev);
    }
  }
  mu_.lock();
  return st;
}

}  // namespace lmserve::engine
