// A step completed, and the next one planned and launched while it runs (asynchronous
// scheduling, engine.h): each row that may go on holds a placeholder token in its request's
// output until the step in flight samples it (Live::placeholder_row), the step planned ahead
// lists where those tokens go (StepBuffers::pending) and gets them as patches at launch.
// take_tokens() fills a done step's tokens: the backend's, and those the host samples.
#include <cmath>

#include "engine/engine_core.h"

namespace lmserve::engine {

bool EngineCore::may_plan_ahead() const {
  return options_.async_scheduling && backend_->asynchronous() && !stop_ && to_abort_.empty();
}

Status EngineCore::take_tokens(StepBuffers& sb) {
  // Rows the backend sampled have their token; the others are sampled here, in parallel when
  // there are several (each request has its own generator). A step the backend sampled whole
  // does not wake the pool: that costs a futex round trip per worker. Dead rows (their request
  // ended while this step ran) are dropped.
  const auto vocab = static_cast<std::size_t>(backend_->config().vocab_size);
  sb.results.assign(sb.sampled.size(), SampleResult{});
  sb.host_rows.clear();
  for (std::size_t i = 0; i < sb.sampled.size(); ++i) {
    if (sb.dead[i]) continue;
    if (sb.sampled_tokens[i] >= 0) {
      sb.results[i].token = sb.sampled_tokens[i];
    } else if (sb.sample_rows[i].mode != backend::RowSampling::Mode::kHost && backend_->asynchronous()) {
      // Its logits may not have been copied back: nothing to sample from.
      return Status(StatusCode::kInternal, "backend: an asynchronous step left a device-sampled row without its token");
    } else {
      sb.host_rows.push_back(i);
    }
  }
  sampler_pool_->parallel_for(sb.host_rows.size(), [&](std::size_t b, std::size_t e) {
    for (std::size_t k = b; k < e; ++k) {
      const std::size_t i = sb.host_rows[k];
      std::span<float> row(sb.logits.get() + i * vocab, vocab);
      if (!sb.mask_of.empty() && sb.mask_of[i] >= 0) {  // constrained: tokens outside the mask cannot come
        const std::uint64_t* m = sb.masks.data() + static_cast<std::size_t>(sb.mask_of[i]) * backend::mask_words(static_cast<std::int64_t>(vocab));
        for (std::size_t t = 0; t < vocab; ++t) {
          if (!((m[t >> 6] >> (t & 63)) & 1)) row[t] = -INFINITY;
        }
      }
      // NaN or +infinity anywhere in the row (a fault of the model or the device): no token can
      // be drawn from it; the request ends with an error (complete()).
      bool broken = false;
      for (const float v : row) broken |= !(v < INFINITY);
      if (broken) {
        sb.lives[i]->logits_broken = true;
        continue;
      }
      Request* r = sb.sampled[i];
      // A placeholder for this very token may end the output: the request's tokens before it.
      std::span<const std::int32_t> output(r->output.data(), r->output.size() - (sb.appended[i] ? 1 : 0));
      sb.results[i] = sample_token(row, r->params, r->prompt, output, eos_ids_, sb.lives[i]->rng);
    }
  });
  advance_grammars(sb);
  return Status::ok();
}

Status EngineCore::step(bool settle, bool* progressed) {
  // Called with mu_ held (through the unique_lock in loop()).
  *progressed = false;
  StepBuffers& cur = step_[cur_];
  // The engine thread's time in this call less its time in the backend is host time; the phases
  // measured inside (plan, complete, relock) take their share, the rest (placeholders, patches,
  // this function's own work) counts as sampling, so that the phases always add up.
  double backend_s = 0;
  struct Account {
    EngineCore& e;
    double& backend_s;
    const Clock::time_point start = Clock::now();
    const double phases_before = sum(e.host_phases_);
    static double sum(const EngineStats::HostPhases& h) { return h.schedule + h.inputs + h.relock + h.sample + h.outputs; }
    ~Account() {
      const double host = seconds(start, Clock::now()) - backend_s;
      e.host_seconds_ += host;
      e.host_phases_.sample += host - (sum(e.host_phases_) - phases_before);
    }
  } account{*this, backend_s};
  if (!cur.launched) {
    if (settle) return Status::ok();
    bool any = false;
    LMSERVE_RETURN_IF_ERROR(plan(cur, nullptr, &any));
    if (!any) return Status::ok();
    LMSERVE_RETURN_IF_ERROR(launch(cur));
    backend_s += cur.backend_seconds;
    *progressed = true;
  }
  // While the device runs `cur`, the next step is planned where it may be: each row of cur
  // that may go on gets a placeholder for the token cur samples (not one whose next token ends
  // it for sure, by max_tokens or max_model_len), and the scheduler sees it as a decode.
  StepBuffers& next = step_[1 - cur_];
  bool ahead = false;
  Status planned;
  if (!settle && may_plan_ahead()) {
    for (std::size_t i = 0; i < cur.sampled.size(); ++i) {
      if (cur.dead[i]) continue;
      Request* r = cur.sampled[i];
      if (static_cast<std::int64_t>(r->output.size()) + 1 >= r->params.max_tokens ||
          r->num_tokens() + 1 >= options_.scheduler.max_model_len) {
        continue;
      }
      r->output.push_back(0);
      cur.appended[i] = 1;
      cur.lives[i]->placeholder_row = static_cast<std::int32_t>(i);
    }
    planned = plan(next, &cur, &ahead);
  }
  backend_since_ = Clock::now();
  mu_.unlock();
  const auto wait_start = Clock::now();
  Status st = backend_->wait();
  const auto wait_end = Clock::now();
  mu_.lock();
  backend_since_ = {};
  if (dead_) return Status(StatusCode::kUnavailable, "the engine was stopped by its watchdog");
  drain_outputs();  // the previous step's deferred rows went out while this one ran
  host_phases_.relock += seconds(wait_end, Clock::now());
  cur.launched = false;
  *progressed = true;
  backend_s += seconds(wait_start, wait_end);
  cur.backend_seconds += seconds(wait_start, wait_end);
  if (!st.is_ok()) return st;
  // What a decoding request sees between two tokens: from the end of the step before (the host's
  // work between steps included) when this one followed it without a pause, else from its launch.
  const bool follows = last_step_done_ != Clock::time_point{} && cur.launched_at - last_step_done_ <= kStepsFollow;
  step_model_.observe(cur.out.shape(), seconds(follows ? last_step_done_ : cur.launched_at, wait_end));
  last_step_done_ = wait_end;
  if (!planned.is_ok()) return planned;
  // Every row's token (the host samples the rows left to it now, before the step planned ahead
  // needs them); the placeholders get theirs, and so does the step planned ahead, which starts.
  LMSERVE_RETURN_IF_ERROR(take_tokens(cur));
  for (std::size_t i = 0; i < cur.sampled.size(); ++i) {
    if (!cur.appended[i]) continue;
    cur.sampled[i]->output.back() = cur.results[i].token;
    cur.lives[i]->placeholder_row = -1;
  }
  if (ahead) {
    for (const auto& [index, row] : next.pending) {
      const std::int32_t token = cur.results[row].token;
      next.tokens[index] = token;
      next.patches.push_back({static_cast<std::int32_t>(index), token});
    }
    LMSERVE_RETURN_IF_ERROR(launch(next));
    backend_s += next.backend_seconds;
    ++planned_ahead_;
  }
  complete(cur, ahead ? &next : nullptr);
  forward_seconds_ += cur.backend_seconds;
  step_sizes_.add(static_cast<std::int64_t>(cur.out.scheduled.size()), cur.backend_seconds);
  if (ahead) cur_ = 1 - cur_;
  return Status::ok();
}

}  // namespace lmserve::engine
