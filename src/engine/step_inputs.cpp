// A step planned (engine_core.h): the scheduler's choice, the rows' tokens, positions, KV slots
// and block tables, which rows are sampled and how (on the device where the backend may), the
// backend's prepare; and its launch.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "engine/engine_core.h"

namespace lmserve::engine {

Status EngineCore::plan(StepBuffers& sb, const StepBuffers* before, bool* any) {
  // Called with mu_ held.
  const auto t0 = Clock::now();
  *any = false;
  sb.out = scheduler_->schedule(!options_.device_memory_ok || options_.device_memory_ok());
  const SchedulerOutput& out = sb.out;
  // Memory limits are logged once per episode, not every step.
  if (out.blocked != last_block_) {
    if (out.blocked == AdmissionBlock::kKvWatermark || out.blocked == AdmissionBlock::kDeviceMemory ||
        out.blocked == AdmissionBlock::kKvBlocks) {
      ++limit_episodes_[static_cast<std::size_t>(out.blocked)];
      spdlog::warn("[LIMIT] {} kv={:.2f} watermark={:.2f} queue_depth={} lane={}", admission_block_name(out.blocked),
                   kv_->pool().usage(), options_.scheduler.kv_watermark, scheduler_->num_waiting(out.blocked_lane),
                   options_.scheduler.lanes[out.blocked_lane].name);
    }
    last_block_ = out.blocked;
  }
  if (out.tpot_unmet_lane >= 0) {
    const auto lane = static_cast<std::size_t>(out.tpot_unmet_lane);
    ++tpot_unmet_steps_[lane];
    if (!tpot_unmet_logged_[lane]) {  // once: a target is a configuration, not an event
      tpot_unmet_logged_[lane] = 1;
      spdlog::warn("[TARGET] lane={} tpot={:.0f}ms cannot be met: a step of its decodes and the prefills it may not cut is predicted at "
                   "{:.1f}ms ({} sequences, {} tokens); counted in lmserve:lane_tpot_target_unmet_steps_total",
                   options_.scheduler.lanes[lane].name, options_.scheduler.lanes[lane].tpot_target_s * 1e3, out.predicted_seconds * 1e3,
                   out.scheduled.size(), out.num_tokens);
    }
  }
  // Preempted requests' blocks go to the host, resumed ones' come back, before this step's
  // forward pass writes into the blocks given up (Backend::swap_blocks orders the copies so,
  // after a step in flight too).
  if (!out.swap_out.empty() || !out.swap_in.empty()) {
    if (Status st = backend_->swap_blocks(out.swap_out, out.swap_in); !st.is_ok()) {
      // Nothing was copied. Host memory running out is survivable: those requests compute their
      // tokens again, as without a swap space. Anything else is a backend failure.
      if (st.code() != StatusCode::kResourceExhausted || !out.swap_in.empty()) return st;
      spdlog::warn("[SWAP] {}; preempted requests compute their tokens again from now on", st.message());
      scheduler_->swap_out_failed(out);
    }
  }
  const auto scheduled_at = Clock::now();
  host_phases_.schedule += seconds(t0, scheduled_at);
  if (out.scheduled.empty()) return Status::ok();
  *any = true;

  const int bs = backend_->kv_config().block_size;
  sb.tokens.clear();
  sb.positions.clear();
  sb.logits_rows.clear();
  sb.tables.clear();
  sb.slots.clear();
  sb.table_start.clear();
  sb.seqs.clear();
  sb.sampled.clear();
  sb.lives.clear();
  sb.pending.clear();
  sb.patches.clear();
  const auto now = Clock::now();
  for (const auto& s : out.scheduled) {
    Request* r = s.request;
    Live& L = *live_.at(r->id);
    if (L.times.first_scheduled == Clock::time_point{}) L.times.first_scheduled = now;
    const auto start = static_cast<std::int32_t>(sb.tokens.size());
    // A copy: the lock is dropped around the backend's calls, and an abort may free the
    // request's blocks.
    auto table = kv_->block_table(r->id);
    sb.table_start.push_back(sb.tables.size());
    sb.tables.insert(sb.tables.end(), table.begin(), table.end());
    for (std::int64_t p = r->num_computed; p < r->num_computed + s.num_new_tokens; ++p) {
      sb.tokens.push_back(p < static_cast<std::int64_t>(r->prompt.size()) ? r->prompt[static_cast<std::size_t>(p)]
                                                                          : r->output[static_cast<std::size_t>(p) - r->prompt.size()]);
      sb.positions.push_back(static_cast<std::int32_t>(p));
      sb.slots.push_back(static_cast<std::int64_t>(table[static_cast<std::size_t>(p / bs)]) * bs + p % bs);
      // The last token of a request with a placeholder is the one the step in flight samples.
      if (before != nullptr && L.placeholder_row >= 0 && p == r->num_tokens() - 1) {
        sb.pending.emplace_back(sb.tokens.size() - 1, static_cast<std::size_t>(L.placeholder_row));
      }
    }
    const auto ctx = static_cast<std::int32_t>(r->num_computed + s.num_new_tokens);
    sb.seqs.push_back({start, static_cast<std::int32_t>(s.num_new_tokens), ctx, {}});
    if (ctx == r->num_tokens()) {
      sb.logits_rows.push_back(start + static_cast<std::int32_t>(s.num_new_tokens) - 1);
      L.ahead_row = static_cast<std::int32_t>(sb.sampled.size());
      sb.sampled.push_back(r);
      sb.lives.push_back(&L);
    }
  }
  for (std::size_t i = 0; i < sb.seqs.size(); ++i) {  // `tables` has stopped growing
    const std::size_t end = i + 1 < sb.seqs.size() ? sb.table_start[i + 1] : sb.tables.size();
    sb.seqs[i].block_table = std::span<const std::int32_t>(sb.tables.data() + sb.table_start[i], end - sb.table_start[i]);
  }
  const auto vocab = static_cast<std::size_t>(backend_->config().vocab_size);
  if (sb.logits_capacity < sb.logits_rows.size() * vocab) {  // a step's logits never outlive it: no copy
    sb.logits_capacity = sb.logits_rows.size() * vocab;
    sb.logits = std::make_unique_for_overwrite<float[]>(sb.logits_capacity);
  }
  // Rows that need nothing but the logits (no penalties, bias, log-probabilities or min_tokens
  // masking) may be sampled by the backend itself (backend.h, RowSampling).
  sb.sample_rows.assign(sb.sampled.size(), backend::RowSampling{});
  sb.sampled_tokens.assign(sb.sampled.size(), -1);
  sb.appended.assign(sb.sampled.size(), 0);
  sb.dead.assign(sb.sampled.size(), 0);
  for (std::size_t i = 0; i < sb.sampled.size(); ++i) {
    const Request& r = *sb.sampled[i];
    const auto& p = r.params;
    const bool plain = !p.logprobs && p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 &&
                       p.logit_bias.empty() && static_cast<std::int64_t>(r.output.size()) >= p.min_tokens;
    if (!plain) continue;
    auto& rs = sb.sample_rows[i];
    rs.mode = p.greedy() ? backend::RowSampling::Mode::kGreedy : backend::RowSampling::Mode::kRandom;
    rs.temperature = static_cast<float>(p.temperature);
    rs.top_p = static_cast<float>(p.top_p);
    rs.min_p = static_cast<float>(p.min_p);
    rs.top_k = p.top_k;
    rs.key = sb.lives[i]->device_key;
    rs.counter = static_cast<std::uint32_t>(r.output.size());
    if (sb.lives[i]->grammar) {
      if (!backend_->supports_masks()) {
        rs = backend::RowSampling{};  // the host samples it, under its mask
      } else {
        rs.masked = true;
      }
    }
  }
  backend::Batch batch{sb.tokens, sb.positions, sb.slots, sb.seqs, sb.logits_rows, sb.sample_rows, sb.sampled_tokens};
  Status st = backend_->prepare(batch, std::span<float>(sb.logits.get(), sb.logits_rows.size() * vocab));
  host_phases_.inputs += seconds(scheduled_at, Clock::now());
  return st;
}

Status EngineCore::launch(StepBuffers& sb) {
  // Called with mu_ held; the backend works without it (submit and abort stay responsive, and
  // a backend that is not asynchronous runs the whole step here).
  backend_since_ = Clock::now();
  mu_.unlock();
  const auto t0 = Clock::now();
  sb.launched_at = t0;
  Status st = backend_->launch(sb.patches);
  const auto t1 = Clock::now();
  mu_.lock();
  backend_since_ = {};
  if (dead_) return Status(StatusCode::kUnavailable, "the engine was stopped by its watchdog");
  sb.backend_seconds = seconds(t0, t1);
  if (!st.is_ok()) return st;
  sb.launched = true;
  LMSERVE_RETURN_IF_ERROR(make_masks(sb));
  // The step's tokens are known (the patched ones too), so the blocks it fills may be hashed
  // now; the cache's contents follow in stream order.
  scheduler_->commit_step(sb.out);
  ++steps_;
  computed_tokens_ += sb.tokens.size();
  return Status::ok();
}

}  // namespace lmserve::engine
