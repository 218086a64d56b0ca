// lmserve's engine: the contract between everything above (server, CLI, benchmarks) and the
// model on its device. Read this file to know the whole behaviour.
//
//   auto engine = Engine::create(backend, tokenizer, options);   // starts the loop thread
//   auto sub = engine->submit({.prompt = ids, .params = p, .lane = "high"});
//   if (!sub) -> sub.error(): InvalidArgument (bad params: 400), or a Rejection (429/400/503)
//   while (sub->stream->next(&event)) { ... event.text ... event.finish ... }
//   engine->abort(sub->id);                                       // client went away
//
// Threading: submit, submit_all, abort, stats and shutdown may be called from any thread at any time.
// The loop thread owns the scheduler, KV blocks and backend: schedule -> forward -> sample ->
// update -> emit; on an asynchronous backend the next step's schedule and inputs are made while
// the device runs this one (EngineOptions::async_scheduling). Each request's events arrive in
// order on its RequestStream; the last one has finish != kNone, after which next() returns false.
//
// Guarantees: an aborted request (or one whose stream was dropped) is finished with kAbort
// and its KV blocks are freed within one step. shutdown() stops admissions (new submits are
// rejected kShuttingDown), lets running requests finish until the deadline, aborts the rest
// and joins the loop. A backend failure finishes every in-flight request with kError and
// marks the engine dead (alive() == false).
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "common/status.h"
#include "common/thread_pool.h"
#include "engine/output/output_processor.h"
#include "engine/request.h"
#include "engine/sampling/sampler.h"
#include "engine/sched/scheduler.h"
#include "text/tokenizer.h"

namespace lmserve::engine {

using Clock = std::chrono::steady_clock;

struct StreamEvent {
  std::int32_t index = 0;                 // which of the request's n choices
  std::vector<std::int32_t> token_ids;    // tokens generated since the previous event
  std::string text;                       // text that became final since the previous event
  std::vector<SampleResult> logprobs;     // per token, when params.logprobs is set
  FinishReason finish = FinishReason::kNone;
  std::string stop_reason;                // matched stop string / token id
  std::string error;                      // for kError
  // Usage so far (final on the finishing event).
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::int64_t cached_prompt_tokens = 0;
  Clock::time_point time;                 // when the event was emitted
};

// Events of one request, in order. Thread-safe.
class RequestStream {
 public:
  // Waits for the next event; false once every choice has finished and all events were read,
  // or when the timeout passes (then *timed_out is set).
  bool next(StreamEvent* out, std::chrono::milliseconds timeout = std::chrono::milliseconds::max(), bool* timed_out = nullptr);
  // Called (from the engine thread) after each push; must not block. For async servers.
  void set_notify(std::function<void()> fn);

  // Engine side.
  void push(StreamEvent e, bool last_of_choice);
  explicit RequestStream(std::int32_t choices) : open_choices_(choices) {}

  struct Times {
    Clock::time_point arrival, first_scheduled, first_token;
  };
  Times times() const;
  void set_times(const Times& t);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  std::int32_t open_choices_;
  std::function<void()> notify_;
  Times times_;
};

struct EngineOptions {
  SchedulerOptions scheduler;
  bool enable_prefix_caching = true;
  std::int32_t max_n = 16;
  std::uint64_t seed = 0;  // for requests without a seed
  // The device-memory hard limit (e.g. a DeviceMemoryMonitor): false stops admissions. Called
  // on the engine thread once per step; must be cheap. Empty: always true.
  std::function<bool()> device_memory_ok;
  int sampler_threads = 0;  // 0: up to 8 cores sample a step's rows in parallel
  // Steps with at least this many rows process their outputs (detokenization, stop strings)
  // on the sampler threads too; below it waking them costs more than it saves (docs/perf.md,
  // "parallel output processing").
  std::size_t parallel_output_rows = 128;
  // In a step of at least parallel_output_rows rows, the rows of requests without stop strings
  // end by their tokens alone (OutputProcessor::finish_by_token): the step ends them at once,
  // and their text and events go out on other threads while the next step runs on the device,
  // which would otherwise wait for that host work (docs/perf.md, "outputs overlapped").
  // false: all of it in the step.
  bool overlap_outputs = true;
  // Asynchronous scheduling: on a backend that is asynchronous() (Backend::launch returns
  // before the device is done), the engine plans step N+1 (schedules it, builds and stages its
  // inputs) while the device runs step N, and launches it as soon as N is done, with the tokens
  // N sampled written into it; N's outputs follow. A request that N ended (end-of-sequence, a
  // stop token or string) then has one row of N+1 computed for nothing, its result dropped. Rows the backend leaves to the
  // host (penalties, logit_bias, logprobs, unmet min_tokens) are sampled between N's end and
  // N+1's start, where their tokens are needed. false (--no-async-scheduling): one step at a time.
  bool async_scheduling = true;
  // Host memory that preempted requests' KV may wait in (Backend::set_host_blocks), so they
  // resume where they stopped instead of computing their tokens again; taken only as it is
  // used. 0: none (vLLM V1's rule: preemption recomputes). The CLI's --swap-space sets it.
  std::uint64_t swap_space_bytes = 0;
};

struct GenerateRequest {
  std::vector<std::int32_t> prompt;
  SamplingParams params;
  std::string lane;           // empty: the last lane
  std::int32_t priority = 0;
  std::string cache_salt;
};

struct Submitted {
  RequestId id;  // of the first choice; abort(id) aborts all choices
  std::shared_ptr<RequestStream> stream;
};

struct SubmitError {
  Status status;                           // InvalidArgument for bad input, ResourceExhausted/Unavailable for rejections
  Rejection rejection = Rejection::kNone;
  AdmissionBlock cause = AdmissionBlock::kNone;  // for kQueueFull: what keeps the queue from draining
};

struct EngineStats {
  std::int64_t running = 0;
  std::vector<std::pair<std::string, std::int64_t>> waiting_per_lane;
  std::vector<std::pair<std::string, std::int64_t>> running_per_lane;
  double kv_usage = 0.0;
  std::int64_t kv_blocks_total = 0;
  std::int64_t preemptions_total = 0;
  // The swap space: requests waiting there now, preemptions that went there and resumptions
  // from there with the bytes each way, the share of its blocks in use, its size in blocks and
  // the host memory it has taken so far.
  std::int64_t swapped = 0;
  std::int64_t swap_outs_total = 0, swap_ins_total = 0;
  std::uint64_t swap_bytes_out_total = 0, swap_bytes_in_total = 0;
  double host_kv_usage = 0.0;
  std::int64_t host_kv_blocks_total = 0;
  std::uint64_t host_swap_bytes = 0;
  std::uint64_t prefix_queries = 0, prefix_hits = 0;
  std::uint64_t prompt_tokens_total = 0, generation_tokens_total = 0;
  std::uint64_t steps_total = 0;
  // Tokens run through the model (every scheduled prompt chunk and decode token): prompt tokens
  // not found in the prefix cache, one per generated token after the first, and the tokens a
  // preempted request computes again when it resumes.
  std::uint64_t computed_tokens_total = 0;
  // Where step time goes: the device's forward vs the host (scheduling, input preparation,
  // sampling, output processing). forward is the engine thread's time in the backend's launch
  // and wait; with asynchronous scheduling the host work of the next step overlaps the wait, so
  // forward is then less than the device's time.
  double forward_seconds_total = 0, host_seconds_total = 0;
  std::uint64_t steps_planned_ahead_total = 0;  // asynchronous scheduling: steps planned while the one before ran
  // The host time by phase (the five sum to host_seconds_total): planning the step, building its
  // inputs (and the backend's prepare), taking the engine lock back after the forward pass,
  // sampling (with the scheduler's commit and, with asynchronous scheduling, the placeholders
  // and patches), and turning tokens into text and stream events.
  struct HostPhases {
    double schedule = 0, inputs = 0, relock = 0, sample = 0, outputs = 0;
    HostPhases& operator-=(const HostPhases& o) {
      schedule -= o.schedule, inputs -= o.inputs, relock -= o.relock, sample -= o.sample, outputs -= o.outputs;
      return *this;
    }
  } host_phases;
  // Steps and their forward time by the sequences they ran (decode rows and prefill chunks):
  // where a run's time goes, e.g. a mixed-length run's tail of small steps after the bulk.
  struct StepSizes {
    // Bucket i holds steps of more than kUpper[i - 1] and at most kUpper[i] sequences.
    static constexpr std::array<std::int64_t, 7> kUpper = {1, 4, 16, 64, 256, 1024, std::int64_t{1} << 62};
    std::array<std::uint64_t, kUpper.size()> steps{};
    std::array<double, kUpper.size()> forward_seconds{};
    void add(std::int64_t sequences, double seconds);
    StepSizes& operator-=(const StepSizes& o);
  } step_sizes;
  // Of forward_seconds_total, what the backend spent on the host (Backend::staging_seconds_total).
  double forward_staging_seconds_total = 0;
  std::vector<std::pair<std::string, std::uint64_t>> rejections;  // by reason
  // Admission-limit episodes (consecutive steps blocked for the same reason count once).
  std::vector<std::pair<std::string, std::uint64_t>> admission_limits;
  std::uint64_t requests_finished = 0;
  bool alive = true;
};

class Engine {
 public:
  ~Engine();  // shutdown(0)

  static Result<std::unique_ptr<Engine>> create(std::unique_ptr<backend::Backend> backend,
                                                std::shared_ptr<const text::Tokenizer> tokenizer, EngineOptions options);

  Expected<Submitted, SubmitError> submit(GenerateRequest request);
  // Submits the requests in order, all under one hold of the engine's lock: the loop's next
  // step sees every one accepted, as an offline batch starts (bench throughput's run, vLLM's
  // LLM.generate). Each gets the result submit() would give it at that point in the order.
  std::vector<Expected<Submitted, SubmitError>> submit_all(const std::vector<GenerateRequest>& requests);
  void abort(RequestId id);
  EngineStats stats() const;
  bool alive() const;
  const model::ModelConfig& model_config() const { return backend_->config(); }
  const backend::KvCacheConfig& kv_config() const { return backend_->kv_config(); }
  // The backend's start-up memory plan (fixed once created).
  backend::MemoryInfo memory_plan() const { return backend_->memory(); }
  const EngineOptions& options() const { return options_; }

  // Stops admissions, waits up to `grace` for running work, aborts the rest, joins the loop.
  void shutdown(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

 private:
  Engine(std::unique_ptr<backend::Backend> backend, std::shared_ptr<const text::Tokenizer> tokenizer, EngineOptions options);
  void loop();
  // submit()'s checks that need no lock (the prompt's tokens, the sampling parameters).
  std::optional<Unexpected<SubmitError>> check(const GenerateRequest& g) const;
  Expected<Submitted, SubmitError> submit_locked(const GenerateRequest& g);  // mu_ held
  struct StepBuffers;
  // One step of the loop: completes the step in flight (launching one first when none is),
  // with the next planned and launched ahead of the completion where it may be. settle: only
  // complete the step in flight, if any. *progressed: a step was launched or completed.
  Status step(bool settle, bool* progressed);
  // Schedules a step into `sb`, builds its inputs and has the backend prepare them. With
  // `before` (the step in flight), decode rows whose token `before` samples are listed in
  // sb.pending. *any: something was scheduled.
  Status plan(StepBuffers& sb, const StepBuffers* before, bool* any);
  // Starts a planned step (sb.patches written) and advances the scheduler past it.
  Status launch(StepBuffers& sb);
  // A done step's tokens in sb.results: the backend's, and the rows left to the host sampled.
  Status take_tokens(StepBuffers& sb);
  // A done step's outputs and ends (after take_tokens). Rows of `ahead` (launched already) whose
  // request ends here are marked dead there.
  void complete(StepBuffers& sb, StepBuffers* ahead);
  // Whether the next step may be planned while this one runs.
  bool may_plan_ahead() const;
  // Ends `r`: its last event carries `text` and, when given, the token that ended it.
  void finish(Request* r, FinishReason reason, const std::string& text, const std::string& stop_reason,
              const std::string& err = "", const SampleResult* last = nullptr);
  // The scheduler side of an end: out of the queues (its KV blocks freed), waiting siblings
  // released, counted. finish() does this and the last event; a deferred row's event follows.
  void retire(Request* r, std::int32_t choice_index);
  // Waits for the deferred outputs in flight (step(), overlap_outputs) and drops the requests
  // they ended. Every path that touches a request's output processor or stream, or scans live_,
  // calls it first.
  void drain_outputs();

  struct Live;  // per-request engine state (stream, output processor, rng)

  std::unique_ptr<backend::Backend> backend_;
  std::shared_ptr<const text::Tokenizer> tokenizer_;
  EngineOptions options_;
  std::vector<std::int32_t> eos_ids_;

  mutable std::mutex mu_;  // guards everything below; the loop drops it around forward()
  std::condition_variable work_cv_, idle_cv_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<RequestId, std::unique_ptr<Live>> live_;
  std::vector<RequestId> to_abort_;
  RequestId next_id_ = 1;
  std::uint64_t arrivals_ = 0;
  bool accepting_ = true, stop_ = false, dead_ = false;
  std::uint64_t prompt_tokens_ = 0, generation_tokens_ = 0, steps_ = 0, finished_ = 0, computed_tokens_ = 0;
  double forward_seconds_ = 0, host_seconds_ = 0, staging_seconds_ = 0;
  EngineStats::StepSizes step_sizes_;
  EngineStats::HostPhases host_phases_;
  // A step's plan, inputs and per-row state, reused step to step so that a step of a thousand
  // sequences does not allocate a thousand times. Two: the step in flight and the one planned
  // ahead of it (step_[cur_] is the one in flight or next to run).
  struct StepBuffers {
    SchedulerOutput out;
    std::vector<std::int32_t> tokens, positions, logits_rows, tables, sampled_tokens;
    std::vector<std::int64_t> slots;
    std::vector<std::size_t> table_start, host_rows, sync_rows;
    std::vector<backend::SeqBatch> seqs;
    std::vector<Request*> sampled;
    std::vector<Live*> lives;
    std::vector<backend::RowSampling> sample_rows;
    std::vector<SampleResult> results;
    std::vector<OutputProcessor::Update> updates;
    // Planned ahead: (token index, row of the step before) for each token the step before
    // samples, and the same written as patches at launch.
    std::vector<std::pair<std::size_t, std::size_t>> pending;
    std::vector<backend::TokenPatch> patches;
    // Per sampled row: its token is in its request's output already (a placeholder until the
    // step is done); its request ended while the step was in flight (the row is dropped).
    std::vector<char> appended, dead;
    // Logits rows, never value-initialised: at 1,024 rows of a 128k vocabulary a zero-filled
    // std::vector spent ~0.3-0.8 s of a run writing 525 MB that a backend sampling on the device
    // never reads (the `inputs` phase, 2 ms per step on the H200). Untouched pages cost nothing.
    std::unique_ptr<float[]> logits;
    std::size_t logits_capacity = 0;
    bool launched = false;
    double backend_seconds = 0;  // the engine thread's time in launch() and wait()
  } step_[2];
  int cur_ = 0;
  std::uint64_t planned_ahead_ = 0;
  std::unique_ptr<ThreadPool> sampler_pool_;
  // Rows whose text and events go out while the next step runs (overlap_outputs): a step fills
  // deferred_ after draining the previous one's, then hands it to emitter_; requests it ended
  // are out of the scheduler already and leave live_ at the drain (retired_).
  struct DeferredRow {
    Request* r = nullptr;
    Live* live = nullptr;
    SampleResult res;
    std::int64_t num_output = 0;
    std::int64_t cached_prompt = 0;
    FinishReason finish = FinishReason::kNone;
    std::string stop_reason, text;
    RequestStream::Times times;  // an ended row's, for its last event
  };
  void emit(std::vector<DeferredRow>& rows) const;  // on the emitter thread: no engine state
  std::vector<DeferredRow> deferred_;
  std::vector<RequestId> retired_;
  BackgroundTask emitter_;
  std::vector<std::uint64_t> rejections_;
  std::vector<std::uint64_t> limit_episodes_;
  AdmissionBlock last_block_ = AdmissionBlock::kNone;
  std::thread thread_;
};

}  // namespace lmserve::engine
