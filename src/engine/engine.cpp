// Engine (engine.h) and the core's construction, submission, aborts, stats, loop and shutdown
// (engine_core.h says where the rest of the step is).
#include "engine/engine.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "engine/engine_core.h"

namespace lmserve::engine {

std::uint64_t mix64(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// ---- Engine: the contract (engine.h), forwarded to the core -----------------------------------

Engine::Engine(std::unique_ptr<EngineCore> core) : core_(std::move(core)) {}
Engine::~Engine() = default;  // the core shuts down
Expected<Submitted, SubmitError> Engine::submit(GenerateRequest request) { return core_->submit(std::move(request)); }
std::vector<Expected<Submitted, SubmitError>> Engine::submit_all(const std::vector<GenerateRequest>& requests) {
  return core_->submit_all(requests);
}
void Engine::abort(RequestId id) { core_->abort(id); }
EngineStats Engine::stats() const { return core_->stats(); }
bool Engine::alive() const { return core_->alive(); }
const model::ModelConfig& Engine::model_config() const { return core_->backend().config(); }
const backend::KvCacheConfig& Engine::kv_config() const { return core_->backend().kv_config(); }
backend::MemoryInfo Engine::memory_plan() const { return core_->backend().memory(); }
const EngineOptions& Engine::options() const { return core_->options(); }
void Engine::shutdown(std::chrono::milliseconds grace) { core_->shutdown(grace); }

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
  auto core = std::make_unique<EngineCore>(std::move(backend), std::move(tokenizer), std::move(options));
  core->set_host_blocks(host_blocks);
  return std::unique_ptr<Engine>(new Engine(std::move(core)));
}

// ---- EngineCore ---------------------------------------------------------------------------------

EngineCore::EngineCore(std::unique_ptr<backend::Backend> backend, std::shared_ptr<const text::Tokenizer> tokenizer, EngineOptions options)
    : backend_(std::move(backend)), tokenizer_(std::move(tokenizer)), options_(std::move(options)) {
  eos_ids_ = backend_->config().eos_token_ids;
  const auto& kvc = backend_->kv_config();
  kv_ = std::make_unique<KvCacheManager>(kvc.num_blocks, kvc.block_size, options_.enable_prefix_caching);
  scheduler_ = std::make_unique<Scheduler>(options_.scheduler, *kv_);
  rejections_.assign(static_cast<std::size_t>(Rejection::kExceedsKvCapacity) + 1, 0);
  limit_episodes_.assign(static_cast<std::size_t>(AdmissionBlock::kLatencyTarget) + 1, 0);
  tpot_unmet_steps_.assign(options_.scheduler.lanes.size(), 0);
  tpot_unmet_logged_.assign(options_.scheduler.lanes.size(), 0);
  // The cost model serves the lanes' TPOT targets; without one it only learns (and is exported).
  if (std::any_of(options_.scheduler.lanes.begin(), options_.scheduler.lanes.end(), [](const LaneOptions& l) { return l.tpot_target_s > 0; })) {
    calibrate_step_time();
  }
  scheduler_->set_step_time_model(&step_model_);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  sampler_pool_ = std::make_unique<ThreadPool>(options_.sampler_threads > 0 ? static_cast<std::size_t>(options_.sampler_threads)
                                                                            : std::min<std::size_t>(8, cores));
  thread_ = std::thread([this] { loop(); });
  if (options_.step_timeout_s > 0) watchdog_ = std::thread([this] { watch(); });
}

void EngineCore::fail_all(const std::string& why) {
  drain_outputs();
  dead_ = true;
  std::vector<Request*> all;
  for (auto& [id, L] : live_) all.push_back(L->req.get());
  for (Request* r : all) finish(r, FinishReason::kError, live_.at(r->id)->out->flush(), "", why);
  idle_cv_.notify_all();
}

void EngineCore::watch() {
  std::unique_lock lock(mu_);
  const auto limit = std::chrono::duration<double>(options_.step_timeout_s);
  const auto tick = std::chrono::duration_cast<std::chrono::milliseconds>(std::min<std::chrono::duration<double>>(limit / 4, std::chrono::seconds(1)));
  while (!stop_ && !dead_) {
    watch_cv_.wait_for(lock, std::max(tick, std::chrono::milliseconds(1)));
    if (stop_ || dead_ || backend_since_ == Clock::time_point{} || Clock::now() - backend_since_ <= limit) continue;
    const std::string why = fmt::format("the engine stopped: a step ran longer than its {:g} s limit (--step-timeout)", options_.step_timeout_s);
    spdlog::error("engine: {}; finishing all requests", why);
    fail_all(why);
  }
}

EngineCore::~EngineCore() { shutdown(std::chrono::milliseconds(0)); }

void EngineCore::set_host_blocks(std::int64_t blocks) {
  std::lock_guard lock(mu_);
  kv_->set_host_blocks(blocks);
}

namespace {
constexpr std::size_t kMaskCacheEntries = 16;  // per choice of a request with a grammar

Unexpected<SubmitError> invalid_request(const std::string& msg) {
  return Unexpected<SubmitError>(SubmitError{Status(StatusCode::kInvalidArgument, msg)});
}
}  // namespace

std::optional<Unexpected<SubmitError>> EngineCore::check(const GenerateRequest& g) const {
  const std::int64_t vocab = backend_->config().vocab_size;
  if (g.prompt.empty()) return invalid_request("prompt must contain at least one token");
  for (auto t : g.prompt) {
    if (t < 0 || t >= vocab) return invalid_request("prompt token id " + std::to_string(t) + " is outside the vocabulary");
  }
  if (Status s = g.params.validate(vocab, options_.max_n); !s.is_ok()) return invalid_request(s.message());
  if (g.params.grammar) {
    if (!tokenizer_) return invalid_request("constrained decoding needs the model's tokenizer");
    // Once, at the first request that needs it: the vocabulary's byte strings as a trie.
    std::call_once(trie_once_, [&] { trie_ = std::make_unique<const text::TokenTrie>(*tokenizer_); });
  }
  return std::nullopt;
}

Expected<Submitted, SubmitError> EngineCore::submit(GenerateRequest g) {
  if (auto bad = check(g)) return *bad;
  std::lock_guard lock(mu_);
  auto sub = submit_locked(g);
  if (sub) work_cv_.notify_one();
  return sub;
}

std::vector<Expected<Submitted, SubmitError>> EngineCore::submit_all(const std::vector<GenerateRequest>& requests) {
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

Expected<Submitted, SubmitError> EngineCore::submit_locked(const GenerateRequest& g) {
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
    if (g.params.grammar) {
      L->grammar.emplace(g.params.grammar);
      L->mask_cache = std::make_unique<text::MaskCache<text::GrammarState, text::GrammarKeyHash>>(*trie_, kMaskCacheEntries);
    }
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

void EngineCore::abort(RequestId id) {
  std::lock_guard lock(mu_);
  to_abort_.push_back(id);
  work_cv_.notify_one();
}

bool EngineCore::alive() const {
  std::lock_guard lock(mu_);
  return !dead_;
}

EngineStats EngineCore::stats() const {
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
  for (std::size_t lane = 0; lane < tpot_unmet_steps_.size(); ++lane) {
    if (options_.scheduler.lanes[lane].tpot_target_s > 0) s.tpot_unmet_steps.emplace_back(options_.scheduler.lanes[lane].name, tpot_unmet_steps_[lane]);
  }
  std::copy(step_model_.coefficients().begin(), step_model_.coefficients().end(), s.step_time_model.begin());
  for (std::size_t b = 1; b < static_cast<std::size_t>(AdmissionBlock::kLatencyTarget); ++b) {
    s.admission_limits.emplace_back(std::string(admission_block_name(static_cast<AdmissionBlock>(b))), limit_episodes_[b]);
  }
  s.requests_finished = finished_;
  s.nonfinite_rows_total = nonfinite_rows_;
  s.alive = !dead_;
  return s;
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

void EngineCore::loop() {
  std::unique_lock lock(mu_);
  auto fail = [&](const Status& st) {
    if (dead_) return;  // the watchdog ended everything already
    spdlog::error("engine: backend failed, finishing all requests: {}", st.to_string());
    fail_all(st.message());
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
      last_step_done_ = {};  // the next step's interval starts at its own launch
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

void EngineCore::shutdown(std::chrono::milliseconds grace) {
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
  watch_cv_.notify_all();
  thread_.join();
  if (watchdog_.joinable()) watchdog_.join();
}

}  // namespace lmserve::engine
