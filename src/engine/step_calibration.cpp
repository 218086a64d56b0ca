// The start-up calibration of the step-time model (engine_core.h): a few steps of known shape run
// on the backend before the first request, over KV blocks nobody holds yet, their contents
// never read back. Only when a lane has a TPOT target; the model then follows measured steps.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <memory>

#include "engine/engine_core.h"

namespace lmserve::engine {
namespace {

struct Shape {
  std::int64_t seqs;     // sequences: the first may prefill `chunk` tokens, the rest decode
  std::int64_t chunk;    // the first sequence's new tokens (1: all decode)
  std::int64_t context;  // every sequence's tokens after the step
};

}  // namespace

void EngineCore::calibrate_step_time() {
  const auto& kvc = backend_->kv_config();
  const int bs = kvc.block_size;
  const std::int64_t budget = options_.scheduler.max_num_batched_tokens;
  const std::int64_t max_len = options_.scheduler.max_model_len;
  const std::int64_t max_seqs = std::min<std::int64_t>(options_.scheduler.max_num_seqs, 128);
  // The longest context each of `seqs` sequences may have: within max_model_len and the pool,
  // and 32k at most (a prefill chunk at 128k context would take seconds, and the model is linear
  // in context past that).
  auto longest = [&](std::int64_t seqs) {
    return std::min({max_len - 1, std::int64_t{32768}, kvc.num_blocks / std::max<std::int64_t>(1, seqs) * bs - bs});
  };
  std::vector<Shape> shapes;
  for (std::int64_t seqs : {std::int64_t{1}, std::int64_t{8}, std::int64_t{32}, max_seqs}) {
    seqs = std::min(seqs, max_seqs);
    const std::int64_t top = longest(seqs);
    for (std::int64_t context : {std::min<std::int64_t>(128, top), top / 2, top}) shapes.push_back({seqs, 1, context});
  }
  for (std::int64_t chunk : {std::int64_t{256}, budget / 2, budget}) {
    chunk = std::min(chunk, budget);
    shapes.push_back({1, chunk, std::min(chunk, longest(1))});              // a prompt's first chunk
    shapes.push_back({1, chunk, longest(1)});                               // its last, at a long context
    const std::int64_t seqs = std::min<std::int64_t>(32, max_seqs);         // with decodes beside it
    shapes.push_back({seqs, std::min(chunk, budget - seqs + 1), longest(seqs)});
  }
  const auto vocab = static_cast<std::size_t>(backend_->config().vocab_size);
  auto logits = std::make_unique_for_overwrite<float[]>(static_cast<std::size_t>(max_seqs) * vocab);
  std::vector<StepShape> measured;
  std::vector<double> secs;
  const auto started = Clock::now();
  for (const Shape& sh : shapes) {
    if (sh.chunk < 1 || sh.context < sh.chunk || sh.context >= max_len) continue;
    const std::int64_t blocks_per_seq = (sh.context + bs - 1) / bs;
    if (blocks_per_seq * sh.seqs > kvc.num_blocks) continue;
    std::vector<std::int32_t> tokens, positions, tables, rows, sampled;
    std::vector<std::int64_t> slots;
    std::vector<backend::SeqBatch> seqs;
    std::vector<backend::RowSampling> modes;
    for (std::int64_t s = 0; s < sh.seqs; ++s) {
      for (std::int64_t b = 0; b < blocks_per_seq; ++b) tables.push_back(static_cast<std::int32_t>(s * blocks_per_seq + b));
    }
    StepShape shape{0, sh.seqs, 0};
    for (std::int64_t s = 0; s < sh.seqs; ++s) {
      const std::int64_t n = s == 0 ? sh.chunk : 1;
      const auto start = static_cast<std::int32_t>(tokens.size());
      for (std::int64_t p = sh.context - n; p < sh.context; ++p) {
        tokens.push_back(static_cast<std::int32_t>(p % std::max<std::int64_t>(1, static_cast<std::int64_t>(vocab))));
        positions.push_back(static_cast<std::int32_t>(p));
        slots.push_back((s * blocks_per_seq + p / bs) * bs + p % bs);
      }
      seqs.push_back({start, static_cast<std::int32_t>(n), static_cast<std::int32_t>(sh.context),
                      std::span<const std::int32_t>(tables.data() + s * blocks_per_seq, static_cast<std::size_t>(blocks_per_seq))});
      rows.push_back(static_cast<std::int32_t>(tokens.size()) - 1);
      shape.tokens += n;
      shape.kv_tokens += sh.context;
      if (n > 1) shape.attention += n * sh.context;
    }
    modes.assign(rows.size(), backend::RowSampling{backend::RowSampling::Mode::kGreedy});
    sampled.assign(rows.size(), -1);
    backend::Batch batch{tokens, positions, slots, seqs, rows, modes, sampled};
    // Three runs, the fastest of the last two kept: the first pays for first-touch work.
    double best = -1;
    for (int run = 0; run < 3; ++run) {
      const auto t0 = Clock::now();
      Status st = backend_->prepare(batch, std::span<float>(logits.get(), rows.size() * vocab));
      if (st.is_ok()) st = backend_->launch({});
      if (st.is_ok()) st = backend_->wait();
      if (!st.is_ok()) {
        spdlog::warn("step-time calibration: {}; the model learns from served steps only", st.message());
        return;
      }
      const double t = seconds(t0, Clock::now());
      if (run > 0 && (best < 0 || t < best)) best = t;
    }
    measured.push_back(shape);
    secs.push_back(best);
  }
  if (measured.empty()) return;
  step_model_.calibrate(measured, secs);
  const auto& w = step_model_.coefficients();
  spdlog::info("step-time model calibrated in {:.2f} s over {} shapes: {:.3f} ms + {:.2f} us/token + {:.2f} us/sequence + {:.3f} us/1k KV "
               "tokens + {:.3f} us/M prefill query-key pairs",
               seconds(started, Clock::now()), measured.size(), w[0] * 1e3, w[1] * 1e6, w[2] * 1e6, w[3] * 1e9, w[4] * 1e12);
}

}  // namespace lmserve::engine
