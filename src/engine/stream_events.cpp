// A done step's outputs (engine_core.h): tokens to text (incremental detokenization, stop
// strings), events on the request streams, the ends of requests; the rows whose outputs go out
// while the next step runs (EngineOptions::overlap_outputs) and the emitter that sends them.
// Every StreamEvent is made by row_event().
#include <algorithm>

#include "engine/engine_core.h"

namespace lmserve::engine {

StreamEvent EngineCore::row_event(const Request& r, std::int32_t index, SampleResult* token, std::string text,
                                  std::int64_t completion_tokens, Clock::time_point time) {
  StreamEvent e;
  e.index = index;
  if (token != nullptr) {
    e.token_ids = {token->token};
    if (r.params.logprobs) e.logprobs.push_back(std::move(*token));
  }
  e.text = std::move(text);
  e.prompt_tokens = static_cast<std::int64_t>(r.prompt.size());
  e.completion_tokens = completion_tokens;
  e.cached_prompt_tokens = r.num_cached_prompt;
  e.time = time;
  return e;
}

void EngineCore::finish(Request* r, FinishReason reason, const std::string& text, const std::string& stop_reason,
                    const std::string& err, const SampleResult* last) {
  auto it = live_.find(r->id);
  Live& L = *it->second;
  SampleResult token = last != nullptr ? *last : SampleResult{};
  StreamEvent e = row_event(*r, L.index, last != nullptr ? &token : nullptr, text, static_cast<std::int64_t>(r->output.size()),
                            Clock::now());
  e.finish = reason;
  e.stop_reason = stop_reason;
  e.error = err;
  retire(r, L.index);
  L.stream->set_times(L.times);
  L.stream->push(std::move(e), true);
  live_.erase(it);
}

void EngineCore::retire(Request* r, std::int32_t choice_index) {
  scheduler_->remove(r->id);
  // Siblings waiting on this choice's prompt may go now. Only the first choice of a group is
  // waited on, and its siblings have the ids after it: no scan of every live request (at
  // 10,000 queued requests that scan was most of a step's output time).
  if (choice_index == 0) {
    for (std::int32_t i = 1; i < r->params.n; ++i) {
      if (auto s = live_.find(r->id + static_cast<RequestId>(i)); s != live_.end() && s->second->req->wait_for == r) {
        s->second->req->wait_for = nullptr;
      }
    }
  }
  ++finished_;
}

void EngineCore::drain_outputs() {
  emitter_.wait();
  for (RequestId id : retired_) live_.erase(id);
  retired_.clear();
}

void EngineCore::emit(std::vector<DeferredRow>& rows) const {
  // Detokenization touches each row's own output processor only: in parallel for many rows.
  auto text = [&](std::size_t b, std::size_t e) {
    for (std::size_t i = b; i < e; ++i) {
      DeferredRow& d = rows[i];
      OutputProcessor::Update u = d.live->out->add_token(d.res.token, d.num_output);
      if (d.finish != FinishReason::kNone && u.finish == FinishReason::kNone) u.text += d.live->out->flush();  // max_model_len
      d.text = std::move(u.text);
    }
  };
  if (rows.size() >= std::max<std::size_t>(2, options_.parallel_output_rows)) {
    sampler_pool_->parallel_for(rows.size(), text);
  } else {
    text(0, rows.size());
  }
  const auto now = Clock::now();
  for (DeferredRow& d : rows) {
    StreamEvent e = row_event(*d.r, d.live->index, &d.res, std::move(d.text), d.num_output, now);
    if (d.finish == FinishReason::kNone) {
      d.live->stream->push(std::move(e), false);
    } else {
      e.finish = d.finish;
      e.stop_reason = std::move(d.stop_reason);
      d.live->stream->set_times(d.times);
      d.live->stream->push(std::move(e), true);
    }
  }
}

void EngineCore::complete(StepBuffers& sb, StepBuffers* ahead) {
  const auto t0 = Clock::now();
  staging_seconds_ = backend_->staging_seconds_total();
  const auto& sampled = sb.sampled;
  const auto& lives = sb.lives;
  const auto& dead = sb.dead;
  auto& results = sb.results;  // take_tokens()
  auto& sync_rows = sb.sync_rows;
  auto& updates = sb.updates;
  // A request that ends here may have a row in the step launched ahead: that row is dropped.
  auto drop_ahead = [&](const Request* r, const Live& L) {
    if (ahead == nullptr || L.ahead_row < 0) return;
    const auto k = static_cast<std::size_t>(L.ahead_row);
    if (k < ahead->sampled.size() && ahead->sampled[k] == r) ahead->dead[k] = 1;
  };
  // Each row's token. In a step of many rows, a row of a request without stop strings ends by
  // its token alone (overlap_outputs): decided here, with its text and event deferred to the
  // emitter. The other rows' output processing (detokenization, stop strings) touches their own
  // request only: in a step of many rows it runs on the sampler threads; their events then go
  // out here, in row order.
  const bool many = sampled.size() >= std::max<std::size_t>(2, options_.parallel_output_rows);
  deferred_.clear();
  sync_rows.clear();
  for (std::size_t i = 0; i < sampled.size(); ++i) {
    if (dead[i]) continue;
    Request* r = sampled[i];
    if (lives[i]->logits_broken) {  // no token: ends with an error below
      sync_rows.push_back(i);
      continue;
    }
    if (!sb.appended[i]) r->output.push_back(results[i].token);
    if (!many || !options_.overlap_outputs || !r->params.stop.empty() || lives[i]->grammar_broken) {
      sync_rows.push_back(i);
      continue;
    }
    DeferredRow& d = deferred_.emplace_back();
    d.r = r;
    d.live = lives[i];
    d.num_output = static_cast<std::int64_t>(r->output.size());
    d.cached_prompt = r->num_cached_prompt;
    d.finish = lives[i]->out->finish_by_token(results[i].token, d.num_output, &d.stop_reason);
    if (d.finish == FinishReason::kNone && r->num_tokens() >= options_.scheduler.max_model_len) d.finish = FinishReason::kLength;
    d.res = std::move(results[i]);  // the row's only reader from here on is the emitter
  }
  updates.resize(sampled.size());
  auto process = [&](std::size_t b, std::size_t e) {
    for (std::size_t k = b; k < e; ++k) {
      const std::size_t i = sync_rows[k];
      Request* r = sampled[i];
      OutputProcessor::Update& u = updates[i];
      if (lives[i]->logits_broken) {
        u = {};
        continue;
      }
      u = lives[i]->out->add_token(results[i].token, static_cast<std::int64_t>(r->output.size()));
      // Not even max_model_len may be passed.
      if (u.finish == FinishReason::kNone && r->num_tokens() >= options_.scheduler.max_model_len) {
        u.text += lives[i]->out->flush();
        u.finish = FinishReason::kLength;
      }
    }
  };
  if (sync_rows.size() >= std::max<std::size_t>(2, options_.parallel_output_rows)) {
    sampler_pool_->parallel_for(sync_rows.size(), process);
  } else {
    process(0, sync_rows.size());
  }
  const auto emitted = Clock::now();  // the time of every event of this step
  for (std::size_t i = 0; i < sampled.size(); ++i) {
    if (dead[i] || lives[i]->logits_broken) continue;
    Request* r = sampled[i];
    Live& L = *lives[i];
    if (!L.prompt_counted) {
      prompt_tokens_ += r->prompt.size();
      L.prompt_counted = true;
    }
    ++generation_tokens_;
    if (L.times.first_token == Clock::time_point{}) L.times.first_token = emitted;
  }
  for (std::size_t i : sync_rows) {
    Request* r = sampled[i];
    Live& L = *lives[i];
    SampleResult& res = results[i];
    OutputProcessor::Update& update = updates[i];
    if (L.logits_broken) {
      drop_ahead(r, L);
      ++nonfinite_rows_;
      finish(r, FinishReason::kError, L.out->flush(), "", "the model's logits for this request were not finite (NaN or infinity)", &res);
      continue;
    }
    if (L.grammar_broken && update.finish == FinishReason::kNone) {
      drop_ahead(r, L);
      finish(r, FinishReason::kError, update.text, "", "constrained decoding: the sampled token does not fit the grammar", &res);
      continue;
    }
    if (update.finish != FinishReason::kNone) {
      drop_ahead(r, L);
      finish(r, update.finish, update.text, update.stop_reason, "", &res);
      continue;
    }
    L.stream->push(row_event(*r, L.index, &res, std::move(update.text), static_cast<std::int64_t>(r->output.size()), emitted), false);
  }
  if (!deferred_.empty()) {
    // The ended requests leave the scheduler now, so the next step does not run them; their
    // Live stays until the emitter is done with it (drain_outputs).
    for (DeferredRow& d : deferred_) {
      if (d.finish == FinishReason::kNone) continue;
      d.times = d.live->times;  // first_token is set by now
      drop_ahead(d.r, *d.live);
      retire(d.r, d.live->index);
      retired_.push_back(d.r->id);
    }
    emitter_.start([this] { emit(deferred_); });
  }
  host_phases_.outputs += seconds(t0, Clock::now());
}

}  // namespace lmserve::engine
