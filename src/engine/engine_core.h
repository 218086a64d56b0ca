// The engine's inside (engine.h is the contract; Engine forwards to one EngineCore). Internal to
// engine/: the loop and its state, in files by concern —
//   engine.cpp         construction, submission, aborts, stats, the loop, shutdown
//   step_inputs.cpp    a step planned: scheduled, its inputs built, the backend prepared; launch
//   async_step.cpp     a step completed, with the next planned ahead while it runs: the
//                      placeholders for tokens still on the device, and the tokens taken
//   stream_events.cpp  tokens to text and events on the request streams; ends of requests
// Threading (engine.h): mu_ guards everything below it; the loop thread drops it around the
// backend's launch and wait, and the emitter thread reads only the rows handed to it.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/thread_pool.h"
#include "engine/engine.h"
#include "engine/output/output_processor.h"
#include "engine/sampling/sampler.h"
#include "text/grammar.h"
#include "text/token_mask.h"

namespace lmserve::engine {

class EngineCore {
 public:
  EngineCore(std::unique_ptr<backend::Backend> backend, std::shared_ptr<const text::Tokenizer> tokenizer, EngineOptions options);
  ~EngineCore();  // shutdown(0)
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  // Engine's calls (engine.h says what each does).
  Expected<Submitted, SubmitError> submit(GenerateRequest request);
  std::vector<Expected<Submitted, SubmitError>> submit_all(const std::vector<GenerateRequest>& requests);
  void abort(RequestId id);
  EngineStats stats() const;
  bool alive() const;
  void shutdown(std::chrono::milliseconds grace);
  // The swap space in blocks, given to the KV manager once before the first request.
  void set_host_blocks(std::int64_t blocks);

  backend::Backend& backend() const { return *backend_; }
  const EngineOptions& options() const { return options_; }

 private:
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
  // Constrained decoding (constraints.cpp). A done step's tokens taken by the grammars of their
  // requests (take_tokens() ends with it, before the step planned ahead computes its masks); a
  // token a grammar refuses marks its request broken (it ends with an error).
  void advance_grammars(StepBuffers& sb);
  // A launched step's masks, one per row of a request with a grammar, computed on the sampler
  // threads while the device runs the step; the device-sampled ones go to the backend, the
  // others wait in sb for take_tokens().
  Status make_masks(StepBuffers& sb);
  // Whether the next step may be planned while this one runs.
  bool may_plan_ahead() const;
  // Fits step_model_ to a few steps of known shape run before the first request
  // (step_calibration.cpp); a backend failure leaves it to learn from served steps.
  void calibrate_step_time();
  // The event of one of `r`'s rows: its token (moved from, when given) and text, the usage so
  // far. The one place a StreamEvent is made; ends add finish, stop_reason and error.
  static StreamEvent row_event(const Request& r, std::int32_t index, SampleResult* token, std::string text,
                               std::int64_t completion_tokens, Clock::time_point time);
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
  // The vocabulary as a trie of byte strings, built at the first request with a grammar.
  mutable std::once_flag trie_once_;
  mutable std::unique_ptr<const text::TokenTrie> trie_;

  mutable std::mutex mu_;  // guards everything below; the loop drops it around forward()
  std::condition_variable work_cv_, idle_cv_;
  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unordered_map<RequestId, std::unique_ptr<Live>> live_;
  std::vector<RequestId> to_abort_;
  RequestId next_id_ = 1;
  std::uint64_t arrivals_ = 0;
  bool accepting_ = true, stop_ = false, dead_ = false;
  std::uint64_t prompt_tokens_ = 0, generation_tokens_ = 0, steps_ = 0, finished_ = 0, computed_tokens_ = 0, nonfinite_rows_ = 0;
  // The watchdog (EngineOptions::step_timeout_s): when the backend call under way began (zero:
  // none), set and cleared by the loop with mu_ held around the calls it makes without it.
  Clock::time_point backend_since_{};
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
    // Constrained decoding: per sampled row the index of its mask in `masks` (-1: none), and the
    // masks (backend::mask_words(vocab) words each).
    std::vector<std::int32_t> mask_of;
    std::vector<std::uint64_t> masks;
    std::size_t num_masks = 0;
    // Logits rows, never value-initialised: at 1,024 rows of a 128k vocabulary a zero-filled
    // std::vector writes 525 MB a step that a backend sampling on the device never reads
    // (docs/perf.md, "host time"). Untouched pages cost nothing.
    std::unique_ptr<float[]> logits;
    std::size_t logits_capacity = 0;
    bool launched = false;
    double backend_seconds = 0;  // the engine thread's time in launch() and wait()
    Clock::time_point launched_at;  // when launch() began
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
  // The scheduler's cost model for TPOT targets: each step's interval by its shape, from the end
  // of the step before it (when the loop went on without a pause of more than kStepsFollow) or
  // from its own launch, to the end of its wait. last_step_done_ is reset when the loop idles.
  static constexpr std::chrono::milliseconds kStepsFollow{10};
  StepTimeModel step_model_;
  Clock::time_point last_step_done_;
  std::vector<std::uint64_t> tpot_unmet_steps_;  // per lane: steps whose decodes alone miss its target
  std::vector<char> tpot_unmet_logged_;
  std::thread thread_;
  // The watchdog's thread (step_timeout_s > 0) and its wake-up.
  void watch();
  std::condition_variable watch_cv_;
  std::thread watchdog_;
  // Ends every request in flight with an error saying `why` and marks the engine dead.
  void fail_all(const std::string& why);
};

// SplitMix64's finaliser: a request seed spread over all 64 bits of a device random stream key.
std::uint64_t mix64(std::uint64_t x);
double seconds(Clock::time_point a, Clock::time_point b);

// Per-request engine state beside the scheduler's Request: its stream, output processor and
// random generators.
struct EngineCore::Live {
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
  // Constrained decoding: the grammar's state after the output so far, the masks of the states
  // it has been in (a string's text or a number stays in one state for many tokens), and
  // whether a token it refused was sampled.
  std::optional<text::GrammarState> grammar;
  std::unique_ptr<text::MaskCache<text::GrammarState, text::GrammarKeyHash>> mask_cache;
  bool grammar_broken = false;
  // Its row's logits held NaN or +infinity (take_tokens): the request ends with an error.
  bool logits_broken = false;
};

}  // namespace lmserve::engine
