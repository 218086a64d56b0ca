// The step scheduler. One rule (vLLM V1's): every request has num_computed catching up with
// num_tokens. Each step hands out a token budget: running decodes first (one token each),
// then unfinished prefills (a chunk each), each in lane order then priority then arrival; then
// waiting requests are admitted, lane by lane, while budget, sequence slots and KV blocks
// allow. Preemption frees a running request's blocks when another running request of higher
// rank cannot grow: its blocks move to the host swap space when that has room (KvCacheManager::
// swap_out; the request keeps its computed tokens and comes back by swap_in when admitted
// again), else they are dropped and its tokens are computed again when it resumes. A step that
// preempts admits nothing, so no step both swaps out and swaps in.
//
// Lanes: each lane has a bounded waiting queue and may reserve a share of the KV blocks that no
// other lane can take — not by admission, and not by growth: a request that needs a block only
// the reserve has left preempts the latest-ranked running request, which is of its own lane or
// a later one. A lane's share of the sequence slots is lent to later lanes while it does not use
// it (an idle slot reserve would cap everyone else's batch): a request of the lane that finds
// every slot taken while its lane runs fewer than its share preempts the latest-ranked request
// of a later lane and starts in the same step. Lanes are scheduled in the order given (the
// first is the most urgent), so a request of an earlier lane never waits on a later lane's
// request: its decodes, prefill chunks and admissions come first, it may use its reserve, and
// preemption victims come from the latest lane first.
//
// Step order: every running decode (one token each, rank order); then lane by lane, the lane's
// unfinished prefills (a chunk each) and its waiting requests' admissions. A step that preempts
// admits only lanes ranked before every lane it preempted from (so a lane that has to give up
// blocks does not take new ones in the same step), and brings nothing back from the host once
// something went there (nor sends anything there after something came back).
//
// Latency targets (LaneOptions): while a lane with a TPOT target has requests decoding in the
// step, the prefill chunks of every later lane are cut so that the step's time, predicted by a
// StepTimeModel (set_step_time_model), stays within the target; the lane's own and earlier
// lanes' prefills are not cut. A lane with a TTFT target cuts later lanes' prefills to a quarter
// of it at all times: a request of that lane arriving finds at most the step in flight and the
// one planned behind it before its own, none of them made long by lower lanes. When the step's decodes and uncut prefills alone are predicted
// over a decoding lane's target, SchedulerOutput::tpot_unmet_lane says so (later lanes' prefills
// then wait). A request of a lane with a TTFT target that finds no KV blocks or sequence slot
// preempts later lanes' running requests (latest-ranked first) to start at once.
//
// Admission watermark: a waiting request starts only if, once its whole prompt has blocks,
// KV usage — counting the blocks other lanes keep in reserve as used — stays <= kv_watermark (a
// lane with a reserve may go above by its reserved share), so that the head-room above the
// watermark is room for the lane's running requests to grow, not another lane's reserve;
// nothing new starts while the device-memory signal is over its hard limit. With a growth
// reserve (SchedulerOptions::kv_growth_reserve) the expected growth of the running requests
// and of the new one counts as used.
//
// Works on ids and counts only; not thread-safe (the engine thread owns it).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/request.h"
#include "engine/sched/step_time_model.h"

namespace lmserve::engine {

struct LaneOptions {
  std::string name;
  double kv_reserve = 0.0;    // share of KV blocks only this lane may use
  double seq_reserve = 0.0;   // share of max_num_seqs this lane gets at once (lent while idle)
  std::int64_t max_queued = 1024;
  // Latency targets in seconds (0: none): time to first token and time per output token.
  double ttft_target_s = 0.0;
  double tpot_target_s = 0.0;
};

struct SchedulerOptions {
  enum class Policy { kFcfs, kPriority };
  Policy policy = Policy::kFcfs;
  std::int64_t max_num_batched_tokens = 2048;
  std::int64_t max_num_seqs = 64;
  std::int64_t max_model_len = 2048;
  double kv_watermark = 0.85;
  // Admission also counts the KV that the requests already running will grow into: each one
  // reserves min(its remaining max_tokens, kv_growth_clip) x kv_growth_reserve tokens beyond
  // its prompt and output so far, and so does the request being admitted. 0 (the default,
  // vLLM's rule): only prompts count, and when the running requests outgrow the cache the
  // lowest-ranked is preempted and later recomputed. 1: no preemption among requests of at
  // most kv_growth_clip output tokens (TensorRT-LLM's guaranteed-no-evict policy, with the clip
  // SGLang puts on its estimate). The reserve never holds back a request when nothing runs.
  double kv_growth_reserve = 0.0;
  std::int64_t kv_growth_clip = 4096;
  std::vector<LaneOptions> lanes = {{"high", 0.2, 0.2, 1024}, {"low", 0.0, 0.0, 1024}};

  // InvalidArgument naming the field.
  Status validate() const;
};

// "high:0.2:ttft=300ms:tpot=50ms,low" (serve's --lanes): lanes in order, each NAME, then
// optionally its reserved share (KV blocks and sequence slots) and latency targets (a number
// with ms or s). InvalidArgument naming the part that is wrong; validate() still applies.
Result<std::vector<LaneOptions>> parse_lanes(std::string_view spec, std::int64_t max_queued);

// The most tokens one request of `lane` can hold in a pool of num_blocks x block_size: the pool
// less what the other lanes reserve. (Its last output token is never in the cache, so a request
// fits when prompt + max_tokens - 1 is at most this.)
std::int64_t lane_kv_capacity_tokens(const SchedulerOptions& options, std::int64_t num_blocks, int block_size, std::size_t lane);

// Why a request was refused at submit (the server maps these to HTTP 400/429/503).
// kExceedsKvCapacity: prompt + max_tokens need more KV blocks than the request's lane can ever
// have (the pool less the other lanes' reserves); admitted, it would wait forever.
enum class Rejection { kNone, kQueueFull, kPromptTooLong, kExceedsMaxModelLen, kKvWatermark, kShuttingDown, kExceedsKvCapacity };
inline constexpr Rejection kAllRejections[] = {Rejection::kQueueFull,   Rejection::kPromptTooLong, Rejection::kExceedsMaxModelLen,
                                                Rejection::kKvWatermark, Rejection::kShuttingDown,  Rejection::kExceedsKvCapacity};
std::string_view rejection_name(Rejection r);

// Why waiting requests were left waiting in a step.
// kLatencyTarget: the step's predicted time left no room under an earlier lane's TPOT target.
enum class AdmissionBlock { kNone, kKvWatermark, kDeviceMemory, kKvBlocks, kSeqSlots, kTokenBudget, kLatencyTarget };
std::string_view admission_block_name(AdmissionBlock b);

struct ScheduledRequest {
  Request* request;
  std::int64_t num_new_tokens;
};

struct SchedulerOutput {
  std::vector<ScheduledRequest> scheduled;  // in execution order
  std::vector<RequestId> preempted;
  // Block copies the backend must make before this step's forward pass (Backend::swap_blocks),
  // and the preempted requests whose blocks went to the host.
  std::vector<backend::BlockCopy> swap_out, swap_in;
  std::vector<RequestId> swapped_out;
  std::int64_t num_tokens = 0;
  std::int64_t kv_tokens = 0;  // the scheduled sequences' tokens after the step (StepShape)
  std::int64_t attention = 0;  // prefill chunks' n x context (StepShape)
  AdmissionBlock blocked = AdmissionBlock::kNone;  // why the first waiting request stayed
  std::size_t blocked_lane = 0;                     // its lane
  // Latency targets: the first lane decoding in this step whose TPOT target the step's decodes
  // and uncut prefills already miss (-1: none), and the predicted step time (0 without a model).
  int tpot_unmet_lane = -1;
  double predicted_seconds = 0.0;

  StepShape shape() const { return {num_tokens, static_cast<std::int64_t>(scheduled.size()), kv_tokens, attention}; }
};

struct SchedulerStats {
  std::int64_t running = 0;
  std::vector<std::int64_t> waiting_per_lane;
  std::vector<std::int64_t> running_per_lane;
  std::int64_t preemptions_total = 0;
  double kv_usage = 0.0;
  std::int64_t swapped = 0;  // requests whose blocks wait in host memory
  std::int64_t swap_outs_total = 0, swap_ins_total = 0;
  std::int64_t swap_blocks_out_total = 0, swap_blocks_in_total = 0;
  double host_kv_usage = 0.0;  // of the swap space's blocks, in [0, 1]; 0 without one
};

class Scheduler {
 public:
  Scheduler(SchedulerOptions options, KvCacheManager& kv);

  const SchedulerOptions& options() const { return options_; }
  // Index of a lane by name, or -1.
  int lane_index(std::string_view name) const;

  // Queues `r` (status waiting). A typed rejection leaves it untouched.
  Rejection add(Request* r);
  // lane_kv_capacity_tokens of this scheduler's pool.
  std::int64_t lane_capacity_tokens(std::size_t lane) const;
  // Removes `id` from wherever it is and frees its blocks. Returns the request or nullptr.
  Request* remove(RequestId id);

  // Plans one step. `device_memory_ok` is the backend's hard-limit signal.
  SchedulerOutput schedule(bool device_memory_ok = true);
  // The cost model for TPOT targets (nullptr or not ready(): targets are not enforced). Must
  // outlive the scheduler; the caller updates it between steps.
  void set_step_time_model(const StepTimeModel* model) { model_ = model; }
  // After the step ran: scheduled requests advance by what they were given, and their newly
  // full blocks enter the prefix cache.
  void commit_step(const SchedulerOutput& out);
  // The backend could not copy out.swap_out: those requests will compute their tokens again,
  // and no request is swapped out from now on.
  void swap_out_failed(const SchedulerOutput& out);

  bool has_work() const;
  SchedulerStats stats() const;
  std::int64_t num_running() const { return static_cast<std::int64_t>(running_.size()); }
  std::int64_t num_waiting(std::size_t lane) const { return static_cast<std::int64_t>(waiting_[lane].size()); }

 private:
  bool ranks_before(const Request* a, const Request* b) const;
  std::int64_t lane_blocks(std::size_t lane) const;
  std::int64_t lane_seqs(std::size_t lane) const;
  // Blocks / slots that lanes other than `lane` have reserved and not yet used.
  std::int64_t reserved_blocks_elsewhere(std::size_t lane) const;
  std::int64_t reserved_seqs(std::size_t lane) const;  // the lane's share of max_num_seqs, in slots
  bool can_allocate(const Request* r, std::int64_t num_tokens) const;
  // r's tokens so far plus its expected growth (kv_growth_reserve), and the blocks beyond its
  // table that it takes to hold them (0 without a growth reserve).
  std::int64_t expected_tokens(const Request* r) const;
  std::int64_t growth_blocks(const Request* r) const;
  void preempt(Request* r, SchedulerOutput& out);
  // Adds `n` tokens of `r` to the step.
  void schedule_tokens(Request* r, std::int64_t n, SchedulerOutput& out);
  // Of `n` prefill tokens of `r`, those that keep the step's predicted time within `limit`
  // seconds (n itself when limit is infinite or there is no model).
  std::int64_t within_target(const Request* r, std::int64_t n, double limit, const SchedulerOutput& out) const;

  SchedulerOptions options_;
  KvCacheManager& kv_;
  std::vector<std::deque<Request*>> waiting_;  // per lane
  std::vector<Request*> running_;
  std::vector<Request*> order_;  // schedule()'s pass over running_, kept to reuse its memory
  const StepTimeModel* model_ = nullptr;
  std::int64_t preemptions_ = 0;
  std::size_t preempted_from_ = 0;  // this step: the earliest lane it preempted from (lanes.size(): none)
  bool swap_ok_ = true;
  std::int64_t swap_outs_ = 0, swap_ins_ = 0, swap_blocks_out_ = 0, swap_blocks_in_ = 0;
};

}  // namespace lmserve::engine
