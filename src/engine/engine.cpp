#include "engine/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "engine/output/output_processor.h"

namespace lmserve::engine {

namespace {

// SplitMix64's finaliser: a request seed spread over all 64 bits of a device random stream key.
std::uint64_t mix64(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace


struct Engine::Live {
  std::unique_ptr<Request> req;
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<OutputProcessor> out;
  std::mt19937_64 rng;
  std::uint64_t device_key = 0;  // the request's random stream when the backend samples it
  std::int32_t index = 0;
  RequestId group = 0;
  RequestStream::Times times;
  bool prompt_counted = false;
  // Asynchronous scheduling: the request's row in the step planned ahead, and its row in the
  // step in flight whose token its output holds a placeholder for (-1: none). ahead_row may be
  // stale; it counts only where that step's row is this request.
  std::int32_t ahead_row = -1, placeholder_row = -1;
};

Engine::Engine(std::unique_ptr<backend::Backend> backend, std::shared_ptr<const text::Tokenizer> tokenizer, EngineOptions options)
    : backend_(std::move(backend)), tokenizer_(std::move(tokenizer)), options_(std::move(options)) {
  eos_ids_ = backend_->config().eos_token_ids;
  const auto& kvc = backend_->kv_config();
  kv_ = std::make_unique<KvCacheManager>(kvc.num_blocks, kvc.block_size, options_.enable_prefix_caching);
  scheduler_ = std::make_unique<Scheduler>(options_.scheduler, *kv_);
  rejections_.assign(static_cast<std::size_t>(Rejection::kExceedsKvCapacity) + 1, 0);
  limit_episodes_.assign(6, 0);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  sampler_pool_ = std::make_unique<ThreadPool>(options_.sampler_threads > 0 ? static_cast<std::size_t>(options_.sampler_threads)
                                                                            : std::min<std::size_t>(8, cores));
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(std::chrono::milliseconds(0)); }

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<backend::Backend> backend,
                                               std::shared_ptr<const text::Tokenizer> tokenizer, EngineOptions options) {
  if (!backend) return error(StatusCode::kInvalidArgument, "engine: no backend");
  LMSERVE_RETURN_IF_ERROR(options.scheduler.validate());
  const auto& c = backend->config();
  if (options.scheduler.max_model_len > c.max_position_embeddings) {
    return error(StatusCode::kInvalidArgument, "max_model_len " + std::to_string(options.scheduler.max_model_len) +
                                                   " exceeds the model's max_position_embeddings " +
                                                   std::to_string(c.max_position_embeddings));
  }
  // The swap space in whole blocks; a backend without one gets none (preemption recomputes).
  std::int64_t host_blocks = static_cast<std::int64_t>(options.swap_space_bytes / std::max<std::uint64_t>(1, backend->kv_block_bytes()));
  if (Status st = backend->set_host_blocks(host_blocks); !st.is_ok()) {
    if (st.code() != StatusCode::kUnimplemented) return Unexpected<Status>(st);
    spdlog::warn("no swap space: {}; preempted requests compute their tokens again", st.message());
    host_blocks = 0;
  }
  auto engine = std::unique_ptr<Engine>(new Engine(std::move(backend), std::move(tokenizer), std::move(options)));
  {
    std::lock_guard lock(engine->mu_);
    engine->kv_->set_host_blocks(host_blocks);
  }
  return engine;
}

namespace {
Unexpected<SubmitError> invalid_request(const std::string& msg) {
  return Unexpected<SubmitError>(SubmitError{Status(StatusCode::kInvalidArgument, msg)});
}
}  // namespace

std::optional<Unexpected<SubmitError>> Engine::check(const GenerateRequest& g) const {
  const std::int64_t vocab = backend_->config().vocab_size;
  if (g.prompt.empty()) return invalid_request("prompt must contain at least one token");
  for (auto t : g.prompt) {
    if (t < 0 || t >= vocab) return invalid_request("prompt token id " + std::to_string(t) + " is outside the vocabulary");
  }
  if (Status s = g.params.validate(vocab, options_.max_n); !s.is_ok()) return invalid_request(s.message());
  return std::nullopt;
}

Expected<Submitted, SubmitError> Engine::submit(GenerateRequest g) {
  if (auto bad = check(g)) return *bad;
  std::lock_guard lock(mu_);
  auto sub = submit_locked(g);
  if (sub) work_cv_.notify_one();
  return sub;
}

std::vector<Expected<Submitted, SubmitError>> Engine::submit_all(const std::vector<GenerateRequest>& requests) {
  std::vector<std::optional<Unexpected<SubmitError>>> bad;
  for (const auto& g : requests) bad.push_back(check(g));
  std::vector<Expected<Submitted, SubmitError>> out;
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (bad[i]) {
      out.emplace_back(*bad[i]);
    } else {
      out.push_back(submit_locked(requests[i]));
    }
  }
  work_cv_.notify_one();
  return out;
}

Expected<Submitted, SubmitError> Engine::submit_locked(const GenerateRequest& g) {
  auto reject = [&](Rejection r, StatusCode code, const std::string& msg, AdmissionBlock cause = AdmissionBlock::kNone) {
    ++rejections_[static_cast<std::size_t>(r)];
    return Unexpected<SubmitError>(SubmitError{Status(code, msg), r, cause});
  };
  if (!accepting_ || dead_) return reject(Rejection::kShuttingDown, StatusCode::kUnavailable, "the engine is shutting down");
  int lane = g.lane.empty() ? static_cast<int>(options_.scheduler.lanes.size()) - 1 : scheduler_->lane_index(g.lane);
  if (lane < 0) return invalid_request("unknown lane '" + g.lane + "'");

  const RequestId first = next_id_;
  auto stream = std::make_shared<RequestStream>(g.params.n);
  std::vector<std::unique_ptr<Live>> lives;
  for (std::int32_t i = 0; i < g.params.n; ++i) {
    auto L = std::make_unique<Live>();
    L->req = std::make_unique<Request>();
    Request& r = *L->req;
    r.id = first + static_cast<RequestId>(i);
    r.prompt = g.prompt;
    r.params = g.params;
    r.lane = static_cast<std::size_t>(lane);
    r.priority = g.priority;
    r.arrival = arrivals_++;
    r.cache_salt = g.cache_salt;
    if (i > 0 && options_.enable_prefix_caching) r.wait_for = lives.front()->req.get();
    L->stream = stream;
    L->out = std::make_unique<OutputProcessor>(tokenizer_, r.params, eos_ids_);
    std::uint64_t seed = g.params.seed ? *g.params.seed + static_cast<std::uint64_t>(i) : options_.seed ^ (r.id * 0x9E3779B97F4A7C15ull);
    L->rng.seed(seed);
    L->device_key = mix64(seed);
    L->index = i;
    L->group = first;
    L->times.arrival = Clock::now();
    lives.push_back(std::move(L));
  }
  for (std::size_t i = 0; i < lives.size(); ++i) {
    Rejection rej = scheduler_->add(lives[i]->req.get());
    if (rej != Rejection::kNone) {
      for (std::size_t j = 0; j < i; ++j) scheduler_->remove(lives[j]->req->id);
      switch (rej) {
        case Rejection::kQueueFull: {
          return reject(rej, StatusCode::kResourceExhausted,
                        "the '" + options_.scheduler.lanes[static_cast<std::size_t>(lane)].name + "' queue is full",
                        kv_->pool().usage() > options_.scheduler.kv_watermark ? AdmissionBlock::kKvWatermark : AdmissionBlock::kNone);
        }
        case Rejection::kPromptTooLong:
          return reject(rej, StatusCode::kInvalidArgument, "the prompt (" + std::to_string(g.prompt.size()) +
                                                               " tokens) is longer than this server can hold");
        case Rejection::kExceedsMaxModelLen:
          return reject(rej, StatusCode::kInvalidArgument,
                        "This model's maximum context length is " + std::to_string(options_.scheduler.max_model_len) +
                            " tokens; the request asks for " + std::to_string(g.prompt.size() + static_cast<std::size_t>(g.params.max_tokens)) +
                            " (" + std::to_string(g.prompt.size()) + " in the prompt, " + std::to_string(g.params.max_tokens) +
                            " for the completion). Shorten the prompt or lower max_tokens.");
        case Rejection::kExceedsKvCapacity:
          return reject(rej, StatusCode::kInvalidArgument,
                        "the request asks for " + std::to_string(g.prompt.size()) + " prompt + " + std::to_string(g.params.max_tokens) +
                            " completion tokens, more than the KV cache can hold for one request (" +
                            std::to_string(scheduler_->lane_capacity_tokens(static_cast<std::size_t>(lane))) + " tokens)");
        case Rejection::kKvWatermark:
          return reject(rej, StatusCode::kInvalidArgument, "the prompt needs more KV cache than the admission watermark allows");
        default:
          return reject(rej, StatusCode::kResourceExhausted, std::string(rejection_name(rej)));
      }
    }
  }
  for (auto& L : lives) live_.emplace(L->req->id, std::move(L));
  next_id_ += static_cast<RequestId>(g.params.n);
  return Submitted{first, stream};
}

void Engine::abort(RequestId id) {
  std::lock_guard lock(mu_);
  to_abort_.push_back(id);
  work_cv_.notify_one();
}

bool Engine::alive() const {
  std::lock_guard lock(mu_);
  return !dead_;
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mu_);
  EngineStats s;
  auto ss = scheduler_->stats();
  s.running = ss.running;
  for (std::size_t i = 0; i < ss.waiting_per_lane.size(); ++i) {
    s.waiting_per_lane.emplace_back(options_.scheduler.lanes[i].name, ss.waiting_per_lane[i]);
    s.running_per_lane.emplace_back(options_.scheduler.lanes[i].name, ss.running_per_lane[i]);
  }
  s.kv_usage = ss.kv_usage;
  s.kv_blocks_total = kv_->pool().num_blocks();
  s.preemptions_total = ss.preemptions_total;
  s.swapped = ss.swapped;
  s.swap_outs_total = ss.swap_outs_total;
  s.swap_ins_total = ss.swap_ins_total;
  s.swap_bytes_out_total = static_cast<std::uint64_t>(ss.swap_blocks_out_total) * backend_->kv_block_bytes();
  s.swap_bytes_in_total = static_cast<std::uint64_t>(ss.swap_blocks_in_total) * backend_->kv_block_bytes();
  s.host_kv_usage = ss.host_kv_usage;
  s.host_kv_blocks_total = kv_->num_host_blocks();
  s.host_swap_bytes = backend_->host_swap_bytes();
  s.prefix_queries = kv_->prefix_stats().queries;
  s.prefix_hits = kv_->prefix_stats().hits;
  s.prompt_tokens_total = prompt_tokens_;
  s.generation_tokens_total = generation_tokens_;
  s.steps_total = steps_;
  s.computed_tokens_total = computed_tokens_;
  s.forward_seconds_total = forward_seconds_;
  s.steps_planned_ahead_total = planned_ahead_;
  s.step_sizes = step_sizes_;
  s.host_seconds_total = host_seconds_;
  s.host_phases = host_phases_;
  s.forward_staging_seconds_total = staging_seconds_;
  for (std::size_t r = 1; r < rejections_.size(); ++r) {
    s.rejections.emplace_back(std::string(rejection_name(static_cast<Rejection>(r))), rejections_[r]);
  }
  for (std::size_t b = 1; b < limit_episodes_.size(); ++b) {
    s.admission_limits.emplace_back(std::string(admission_block_name(static_cast<AdmissionBlock>(b))), limit_episodes_[b]);
  }
  s.requests_finished = finished_;
  s.alive = !dead_;
  return s;
}

void Engine::finish(Request* r, FinishReason reason, const std::string& text, const std::string& stop_reason,
                    const std::string& err, const SampleResult* last) {
  auto it = live_.find(r->id);
  Live& L = *it->second;
  StreamEvent e;
  e.index = L.index;
  if (last != nullptr) {
    e.token_ids = {last->token};
    if (r->params.logprobs) e.logprobs.push_back(*last);
  }
  e.text = text;
  e.finish = reason;
  e.stop_reason = stop_reason;
  e.error = err;
  e.prompt_tokens = static_cast<std::int64_t>(r->prompt.size());
  e.completion_tokens = static_cast<std::int64_t>(r->output.size());
  e.cached_prompt_tokens = r->num_cached_prompt;
  e.time = Clock::now();
  retire(r, L.index);
  L.stream->set_times(L.times);
  L.stream->push(std::move(e), true);
  live_.erase(it);
}

void Engine::retire(Request* r, std::int32_t choice_index) {
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

void Engine::drain_outputs() {
  emitter_.wait();
  for (RequestId id : retired_) live_.erase(id);
  retired_.clear();
}

void Engine::emit(std::vector<DeferredRow>& rows) const {
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
    StreamEvent e;
    e.index = d.live->index;
    e.token_ids = {d.res.token};
    e.text = std::move(d.text);
    if (d.r->params.logprobs) e.logprobs.push_back(std::move(d.res));
    e.prompt_tokens = static_cast<std::int64_t>(d.r->prompt.size());
    e.completion_tokens = d.num_output;
    e.cached_prompt_tokens = d.cached_prompt;
    e.time = now;
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

void EngineStats::StepSizes::add(std::int64_t sequences, double seconds) {
  std::size_t i = 0;
  while (i + 1 < kUpper.size() && sequences > kUpper[i]) ++i;
  ++steps[i];
  forward_seconds[i] += seconds;
}

EngineStats::StepSizes& EngineStats::StepSizes::operator-=(const StepSizes& o) {
  for (std::size_t i = 0; i < kUpper.size(); ++i) steps[i] -= o.steps[i], forward_seconds[i] -= o.forward_seconds[i];
  return *this;
}

namespace {

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

Status Engine::plan(StepBuffers& sb, const StepBuffers* before, bool* any) {
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
  }
  backend::Batch batch{sb.tokens, sb.positions, sb.slots, sb.seqs, sb.logits_rows, sb.sample_rows, sb.sampled_tokens};
  Status st = backend_->prepare(batch, std::span<float>(sb.logits.get(), sb.logits_rows.size() * vocab));
  host_phases_.inputs += seconds(scheduled_at, Clock::now());
  return st;
}

Status Engine::launch(StepBuffers& sb) {
  // Called with mu_ held; the backend works without it (submit and abort stay responsive, and
  // a backend that is not asynchronous runs the whole step here).
  mu_.unlock();
  const auto t0 = Clock::now();
  Status st = backend_->launch(sb.patches);
  const auto t1 = Clock::now();
  mu_.lock();
  sb.backend_seconds = seconds(t0, t1);
  if (!st.is_ok()) return st;
  sb.launched = true;
  // The step's tokens are known (the patched ones too), so the blocks it fills may be hashed
  // now; the cache's contents follow in stream order.
  scheduler_->commit_step(sb.out);
  ++steps_;
  computed_tokens_ += sb.tokens.size();
  return Status::ok();
}

bool Engine::may_plan_ahead() const {
  return options_.async_scheduling && backend_->asynchronous() && !stop_ && to_abort_.empty();
}

Status Engine::take_tokens(StepBuffers& sb) {
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
      Request* r = sb.sampled[i];
      // A placeholder for this very token may end the output: the request's tokens before it.
      std::span<const std::int32_t> output(r->output.data(), r->output.size() - (sb.appended[i] ? 1 : 0));
      sb.results[i] = sample_token(row, r->params, r->prompt, output, eos_ids_, sb.lives[i]->rng);
    }
  });
  return Status::ok();
}

Status Engine::step(bool settle, bool* progressed) {
  // Called with mu_ held (through the unique_lock in loop()).
  *progressed = false;
  StepBuffers& cur = step_[cur_];
  // The engine thread's time in this call less its time in the backend is host time; the phases
  // measured inside (plan, complete, relock) take their share, the rest (placeholders, patches,
  // this function's own work) counts as sampling, so that the phases always add up.
  double backend_s = 0;
  struct Account {
    Engine& e;
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
  mu_.unlock();
  const auto wait_start = Clock::now();
  Status st = backend_->wait();
  const auto wait_end = Clock::now();
  mu_.lock();
  drain_outputs();  // the previous step's deferred rows went out while this one ran
  host_phases_.relock += seconds(wait_end, Clock::now());
  cur.launched = false;
  *progressed = true;
  backend_s += seconds(wait_start, wait_end);
  cur.backend_seconds += seconds(wait_start, wait_end);
  if (!st.is_ok()) return st;
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

void Engine::complete(StepBuffers& sb, StepBuffers* ahead) {
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
    if (!sb.appended[i]) r->output.push_back(results[i].token);
    if (!many || !options_.overlap_outputs || !r->params.stop.empty()) {
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
    if (dead[i]) continue;
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
    if (update.finish != FinishReason::kNone) {
      drop_ahead(r, L);
      finish(r, update.finish, update.text, update.stop_reason, "", &res);
      continue;
    }
    StreamEvent e;
    e.index = L.index;
    e.token_ids = {res.token};
    e.text = std::move(update.text);
    if (r->params.logprobs) e.logprobs.push_back(std::move(res));
    e.prompt_tokens = static_cast<std::int64_t>(r->prompt.size());
    e.completion_tokens = static_cast<std::int64_t>(r->output.size());
    e.cached_prompt_tokens = r->num_cached_prompt;
    e.time = emitted;
    L.stream->push(std::move(e), false);
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

void Engine::loop() {
  std::unique_lock lock(mu_);
  auto fail = [&](const Status& st) {
    drain_outputs();
    spdlog::error("engine: backend failed, finishing all requests: {}", st.to_string());
    dead_ = true;
    std::vector<Request*> all;
    for (auto& [id, L] : live_) all.push_back(L->req.get());
    for (Request* r : all) finish(r, FinishReason::kError, live_.at(r->id)->out->flush(), "", st.message());
  };
  auto in_flight = [&] { return step_[cur_].launched; };
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || !to_abort_.empty() || scheduler_->has_work() || in_flight(); });
    if (stop_ || !to_abort_.empty()) {
      // The step in flight is completed first: aborts and the shutdown then find no request on
      // the device and no row of theirs planned ahead.
      bool progressed = false;
      if (Status st = step(/*settle=*/true, &progressed); !st.is_ok()) {
        fail(st);
        break;
      }
      drain_outputs();  // before live_ is scanned
    }
    for (RequestId id : std::exchange(to_abort_, {})) {
      std::vector<Request*> group;
      for (auto& [rid, L] : live_) {
        if (L->group == id) group.push_back(L->req.get());
      }
      for (Request* r : group) finish(r, FinishReason::kAbort, live_.at(r->id)->out->flush(), "");
    }
    if (stop_) break;
    if (!scheduler_->has_work() && !in_flight()) {
      drain_outputs();  // idle means every event is out
      idle_cv_.notify_all();
      continue;
    }
    bool progressed = false;
    if (Status st = step(/*settle=*/false, &progressed); !st.is_ok()) {
      fail(st);
      break;
    }
    if (!progressed) {
      // Nothing could be scheduled (e.g. a device-memory stop): wait briefly, not spin.
      work_cv_.wait_for(lock, std::chrono::milliseconds(5));
    }

    if (!scheduler_->has_work() && !in_flight()) {
      drain_outputs();
      idle_cv_.notify_all();
    }
  }
  drain_outputs();
  idle_cv_.notify_all();
}

void Engine::shutdown(std::chrono::milliseconds grace) {
  std::unique_lock lock(mu_);
  if (!thread_.joinable()) return;
  accepting_ = false;
  idle_cv_.wait_for(lock, grace, [&] { return dead_ || !scheduler_->has_work(); });
  for (auto& [id, L] : live_) to_abort_.push_back(L->group);
  lock.unlock();
  work_cv_.notify_one();
  // Let the loop process the aborts, then stop it.
  lock.lock();
  idle_cv_.wait_for(lock, std::chrono::seconds(30), [&] { return dead_ || live_.empty(); });
  stop_ = true;
  lock.unlock();
  work_cv_.notify_one();
  thread_.join();
}

}  // namespace lmserve::engine
