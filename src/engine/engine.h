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
  // The watchdog: a backend call (a step's launch or wait) still running after this many
  // seconds fails the engine as a failed step does (every request in flight ends once with an
  // error, alive() turns false, submit() refuses); the stuck call is left to the process's end.
  // 0: no watchdog.
  double step_timeout_s = 0;
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

class EngineCore;

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
  // Per lane with a TPOT target: steps predicted over it by work that cannot be cut (the
  // lane's decodes, its own and earlier lanes' prefills). The step-time model's coefficients:
  // seconds per step, per token, per sequence, per KV token read, per prefill query-key pair
  // (StepTimeModel).
  std::vector<std::pair<std::string, std::uint64_t>> tpot_unmet_steps;
  std::array<double, StepTimeModel::kTerms> step_time_model{};
  std::uint64_t requests_finished = 0;
  // Rows whose logits held NaN or +infinity: each ended its request with an error.
  std::uint64_t nonfinite_rows_total = 0;
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
  const model::ModelConfig& model_config() const;
  const backend::KvCacheConfig& kv_config() const;
  // The backend's start-up memory plan (fixed once created).
  backend::MemoryInfo memory_plan() const;
  const EngineOptions& options() const;

  // Stops admissions, waits up to `grace` for running work, aborts the rest, joins the loop.
  void shutdown(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

 private:
  explicit Engine(std::unique_ptr<EngineCore> core);
  std::unique_ptr<EngineCore> core_;  // engine_core.h: the loop, the scheduler, the requests' state
};

}  // namespace lmserve::engine
