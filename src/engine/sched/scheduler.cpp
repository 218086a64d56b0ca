#include "engine/sched/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

namespace lmserve::engine {

// A request that arrives while a step runs waits for it, for the step planned behind it
// (asynchronous scheduling), and then for its own: a lane's TTFT target holds if no step that
// later lanes' prefills make long is longer than a quarter of it (the rest is the request's own
// prefill and the way out).
constexpr double kTtftShare = 0.25;
// Steps are planned to a TPOT target with a margin: the model predicts a mean, and a step's
// interval scatters around it by a few per cent (host work, clocks).
constexpr double kTpotShare = 0.95;

std::string_view rejection_name(Rejection r) {
  switch (r) {
    case Rejection::kNone: return "none";
    case Rejection::kQueueFull: return "queue_full";
    case Rejection::kPromptTooLong: return "prompt_too_long";
    case Rejection::kExceedsMaxModelLen: return "exceeds_max_model_len";
    case Rejection::kKvWatermark: return "kv_watermark";
    case Rejection::kShuttingDown: return "shutting_down";
    case Rejection::kExceedsKvCapacity: return "exceeds_kv_capacity";
  }
  return "?";
}

std::string_view admission_block_name(AdmissionBlock b) {
  switch (b) {
    case AdmissionBlock::kNone: return "none";
    case AdmissionBlock::kKvWatermark: return "kv_watermark";
    case AdmissionBlock::kDeviceMemory: return "device_memory";
    case AdmissionBlock::kKvBlocks: return "kv_blocks";
    case AdmissionBlock::kSeqSlots: return "seq_slots";
    case AdmissionBlock::kTokenBudget: return "token_budget";
    case AdmissionBlock::kLatencyTarget: return "latency_target";
  }
  return "?";
}

Status SchedulerOptions::validate() const {
  auto bad = [](const std::string& m) { return Status(StatusCode::kInvalidArgument, m); };
  if (max_num_batched_tokens < 1) return bad("max_num_batched_tokens must be at least 1");
  if (max_num_seqs < 1) return bad("max_num_seqs must be at least 1");
  if (max_model_len < 2) return bad("max_model_len must be at least 2");
  if (!(kv_watermark > 0 && kv_watermark <= 1)) return bad("kv_watermark must be in (0, 1]");
  if (!(kv_growth_reserve >= 0 && kv_growth_reserve <= 1)) return bad("kv_growth_reserve must be in [0, 1]");
  if (kv_growth_clip < 1) return bad("kv_growth_clip must be at least 1");
  if (lanes.empty()) return bad("at least one lane is needed");
  double kv = 0, seq = 0;
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    const auto& l = lanes[i];
    if (l.name.empty()) return bad("lane names must not be empty");
    for (std::size_t j = 0; j < i; ++j) {
      if (lanes[j].name == l.name) return bad("lane '" + l.name + "' is listed twice");
    }
    if (!(l.kv_reserve >= 0 && l.kv_reserve < 1) || !(l.seq_reserve >= 0 && l.seq_reserve < 1)) {
      return bad("lane '" + l.name + "' reserves must be in [0, 1)");
    }
    if (l.max_queued < 0) return bad("lane '" + l.name + "' max_queued must be >= 0");
    if (!(l.ttft_target_s >= 0 && std::isfinite(l.ttft_target_s)) || !(l.tpot_target_s >= 0 && std::isfinite(l.tpot_target_s))) {
      return bad("lane '" + l.name + "' latency targets must be finite and >= 0");
    }
    kv += l.kv_reserve;
    seq += l.seq_reserve;
  }
  if (kv >= 1 || seq >= 1) return bad("lane reserves must add up to less than 1");
  return Status::ok();
}

namespace {

// "300ms" / "0.3s" -> seconds; nullopt for anything else.
std::optional<double> parse_duration(std::string_view text) {
  double unit = 0;
  if (text.ends_with("ms")) {
    unit = 1e-3;
    text.remove_suffix(2);
  } else if (text.ends_with("s")) {
    unit = 1;
    text.remove_suffix(1);
  } else {
    return std::nullopt;
  }
  const std::string number(text);
  char* end = nullptr;
  const double v = std::strtod(number.c_str(), &end);
  if (number.empty() || *end != '\0' || !(v > 0) || !std::isfinite(v)) return std::nullopt;
  return v * unit;
}

}  // namespace

Result<std::vector<LaneOptions>> parse_lanes(std::string_view spec, std::int64_t max_queued) {
  std::vector<LaneOptions> lanes;
  auto bad = [](std::string_view item, const std::string& why) {
    return error(StatusCode::kInvalidArgument, "--lanes: '" + std::string(item) + "' " + why);
  };
  std::size_t pos = 0;
  while (pos <= spec.size()) {
    const std::size_t comma = spec.find(',', pos);
    const std::string_view item = spec.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    LaneOptions l;
    l.max_queued = max_queued;
    std::size_t start = 0;
    for (int part = 0; start <= item.size(); ++part) {
      const std::size_t colon = item.find(':', start);
      const std::string_view field = item.substr(start, colon == std::string_view::npos ? std::string_view::npos : colon - start);
      if (part == 0) {
        if (field.empty()) return bad(item, "has no lane name");
        l.name = std::string(field);
      } else if (field.starts_with("ttft=") || field.starts_with("tpot=")) {
        auto d = parse_duration(field.substr(5));
        if (!d) return bad(item, "has '" + std::string(field) + "': a target is a duration such as 300ms or 0.3s");
        (field[1] == 't' ? l.ttft_target_s : l.tpot_target_s) = *d;
      } else if (part == 1) {
        const std::string share(field);
        char* end = nullptr;
        l.kv_reserve = l.seq_reserve = std::strtod(share.c_str(), &end);
        if (share.empty() || *end != '\0') return bad(item, "is not NAME[:SHARE][:ttft=DURATION][:tpot=DURATION]");
      } else {
        return bad(item, "is not NAME[:SHARE][:ttft=DURATION][:tpot=DURATION]");
      }
      if (colon == std::string_view::npos) break;
      start = colon + 1;
    }
    lanes.push_back(std::move(l));
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  return lanes;
}

Scheduler::Scheduler(SchedulerOptions options, KvCacheManager& kv)
    : options_(std::move(options)), kv_(kv), waiting_(options_.lanes.size()) {}

int Scheduler::lane_index(std::string_view name) const {
  for (std::size_t i = 0; i < options_.lanes.size(); ++i) {
    if (options_.lanes[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

bool Scheduler::ranks_before(const Request* a, const Request* b) const {
  if (a->lane != b->lane) return a->lane < b->lane;
  if (options_.policy == SchedulerOptions::Policy::kPriority && a->priority != b->priority) return a->priority < b->priority;
  return a->arrival < b->arrival;
}

Rejection Scheduler::add(Request* r) {
  const auto prompt = static_cast<std::int64_t>(r->prompt.size());
  const std::int64_t total_blocks = kv_.pool().num_blocks();
  const std::int64_t prompt_blocks = (r->num_tokens() + kv_.block_size() - 1) / kv_.block_size();
  if (prompt >= options_.max_model_len) return Rejection::kPromptTooLong;
  if (prompt + r->params.max_tokens > options_.max_model_len) return Rejection::kExceedsMaxModelLen;
  if (prompt + r->params.max_tokens - 1 > lane_capacity_tokens(r->lane)) return Rejection::kExceedsKvCapacity;
  const double limit = std::min(1.0, options_.kv_watermark + options_.lanes[r->lane].kv_reserve);
  if (prompt_blocks > total_blocks) return Rejection::kPromptTooLong;
  if (static_cast<double>(prompt_blocks) > limit * static_cast<double>(total_blocks)) return Rejection::kKvWatermark;
  auto& q = waiting_[r->lane];
  if (static_cast<std::int64_t>(q.size()) >= options_.lanes[r->lane].max_queued) return Rejection::kQueueFull;
  r->status = RequestStatus::kWaiting;
  auto pos = std::upper_bound(q.begin(), q.end(), r, [&](const Request* a, const Request* b) { return ranks_before(a, b); });
  q.insert(pos, r);
  return Rejection::kNone;
}

std::int64_t lane_kv_capacity_tokens(const SchedulerOptions& options, std::int64_t num_blocks, int block_size, std::size_t lane) {
  std::int64_t reserved = 0;
  for (std::size_t l = 0; l < options.lanes.size(); ++l) {
    if (l != lane) reserved += static_cast<std::int64_t>(std::floor(options.lanes[l].kv_reserve * static_cast<double>(num_blocks)));
  }
  return std::max<std::int64_t>(0, num_blocks - reserved) * block_size;
}

std::int64_t Scheduler::lane_capacity_tokens(std::size_t lane) const {
  return lane_kv_capacity_tokens(options_, kv_.pool().num_blocks(), kv_.block_size(), lane);
}

Request* Scheduler::remove(RequestId id) {
  Request* found = nullptr;
  if (auto it = std::find_if(running_.begin(), running_.end(), [&](Request* r) { return r->id == id; }); it != running_.end()) {
    found = *it;
    running_.erase(it);
  }
  // A running request is in no queue: a finish does not scan thousands of waiting ones.
  for (std::size_t l = 0; found == nullptr && l < waiting_.size(); ++l) {
    auto& q = waiting_[l];
    if (auto it = std::find_if(q.begin(), q.end(), [&](Request* r) { return r->id == id; }); it != q.end()) {
      found = *it;
      q.erase(it);
    }
  }
  kv_.free(id);
  return found;
}

std::int64_t Scheduler::lane_blocks(std::size_t lane) const {
  std::int64_t n = 0;
  for (const Request* r : running_) {
    if (r->lane == lane) n += static_cast<std::int64_t>(kv_.block_table(r->id).size());
  }
  return n;
}

std::int64_t Scheduler::lane_seqs(std::size_t lane) const {
  return std::count_if(running_.begin(), running_.end(), [&](const Request* r) { return r->lane == lane; });
}

std::int64_t Scheduler::reserved_blocks_elsewhere(std::size_t lane) const {
  std::int64_t n = 0;
  const auto total = static_cast<double>(kv_.pool().num_blocks());
  for (std::size_t l = 0; l < options_.lanes.size(); ++l) {
    if (l == lane || options_.lanes[l].kv_reserve == 0) continue;
    auto reserve = static_cast<std::int64_t>(std::floor(options_.lanes[l].kv_reserve * total));
    n += std::max<std::int64_t>(0, reserve - lane_blocks(l));
  }
  return n;
}

std::int64_t Scheduler::reserved_seqs(std::size_t lane) const {
  return static_cast<std::int64_t>(std::floor(options_.lanes[lane].seq_reserve * static_cast<double>(options_.max_num_seqs)));
}

std::int64_t Scheduler::expected_tokens(const Request* r) const {
  if (options_.kv_growth_reserve <= 0) return r->num_tokens();
  const std::int64_t remaining = std::max<std::int64_t>(0, r->params.max_tokens - static_cast<std::int64_t>(r->output.size()));
  const double grow = std::ceil(static_cast<double>(std::min(remaining, options_.kv_growth_clip)) * options_.kv_growth_reserve);
  return r->num_tokens() + static_cast<std::int64_t>(grow);
}

std::int64_t Scheduler::growth_blocks(const Request* r) const {
  return options_.kv_growth_reserve <= 0 ? 0 : kv_.blocks_needed(r->id, expected_tokens(r));
}

bool Scheduler::can_allocate(const Request* r, std::int64_t num_tokens) const {
  const std::int64_t need = kv_.blocks_needed(r->id, num_tokens);
  return kv_.pool().num_free() - need >= reserved_blocks_elsewhere(r->lane);
}

void Scheduler::preempt(Request* r, SchedulerOutput& out) {
  if (auto it = std::find_if(out.scheduled.begin(), out.scheduled.end(), [&](const ScheduledRequest& s) { return s.request == r; });
      it != out.scheduled.end()) {
    out.num_tokens -= it->num_new_tokens;
    out.kv_tokens -= r->num_computed + it->num_new_tokens;
    if (it->num_new_tokens > 1) out.attention -= it->num_new_tokens * (r->num_computed + it->num_new_tokens);
    out.scheduled.erase(it);
  }
  const std::size_t copies = out.swap_out.size();
  // Not to the host once something came back from it in this step: a host block a swap-in
  // reads may be the one a swap-out would take, and the backend copies out first.
  if (swap_ok_ && out.swap_in.empty() && kv_.swap_out(r->id, r->num_computed, &out.swap_out)) {
    out.swapped_out.push_back(r->id);
    ++swap_outs_;
    swap_blocks_out_ += static_cast<std::int64_t>(out.swap_out.size() - copies);
  } else {
    kv_.free(r->id);
    r->num_computed = 0;
  }
  r->num_preemptions++;
  ++preemptions_;
  preempted_from_ = std::min(preempted_from_, r->lane);
  running_.erase(std::find(running_.begin(), running_.end(), r));
  auto& q = waiting_[r->lane];
  r->status = RequestStatus::kWaiting;
  q.insert(std::upper_bound(q.begin(), q.end(), r, [&](const Request* a, const Request* b) { return ranks_before(a, b); }), r);
  out.preempted.push_back(r->id);
}

void Scheduler::schedule_tokens(Request* r, std::int64_t n, SchedulerOutput& out) {
  out.scheduled.push_back({r, n});
  out.num_tokens += n;
  out.kv_tokens += r->num_computed + n;
  if (n > 1) out.attention += n * (r->num_computed + n);
}

std::int64_t Scheduler::within_target(const Request* r, std::int64_t n, double limit, const SchedulerOutput& out) const {
  if (!std::isfinite(limit) || model_ == nullptr || !model_->ready()) return n;
  return std::min(n, model_->max_tokens_within(limit - model_->predict(out.shape()), r->num_computed));
}

SchedulerOutput Scheduler::schedule(bool device_memory_ok) {
  SchedulerOutput out;
  const std::size_t num_lanes = options_.lanes.size();
  preempted_from_ = num_lanes;
  // Rank order; most steps find it kept (admissions append in rank order), and a check is
  // cheaper than a merge sort's buffer at 1,024 sequences.
  auto by_rank = [&](const Request* a, const Request* b) { return ranks_before(a, b); };
  if (!std::is_sorted(running_.begin(), running_.end(), by_rank)) std::stable_sort(running_.begin(), running_.end(), by_rank);
  // Decodes (one token) first, then unfinished prefills, each group in rank order (so the
  // prefills are in lane order).
  auto decoding = [](const Request* r) { return r->num_tokens() - r->num_computed <= 1; };
  order_.assign(running_.begin(), running_.end());
  if (!std::is_partitioned(order_.begin(), order_.end(), decoding)) std::stable_partition(order_.begin(), order_.end(), decoding);
  // Blocks for r's next n tokens, preempting the latest-ranked running requests while they are
  // short; false when r itself had to go.
  auto grow = [&](Request* r, std::int64_t n) {
    while (!(can_allocate(r, r->num_computed + n) && kv_.allocate(r->id, r->num_computed + n))) {
      Request* victim = *std::max_element(running_.begin(), running_.end(), by_rank);
      preempt(victim, out);
      if (victim == r) return false;
    }
    return true;
  };
  auto budget = [&] { return options_.max_num_batched_tokens - out.num_tokens; };

  std::size_t k = 0;
  for (; k < order_.size() && decoding(order_[k]); ++k) {
    Request* r = order_[k];
    if (r->status != RequestStatus::kRunning) continue;  // preempted earlier in this step
    const std::int64_t n = std::min(r->num_tokens() - r->num_computed, budget());
    if (n <= 0 || !grow(r, n)) continue;
    schedule_tokens(r, n, out);
  }

  // The time limit on each lane's prefill: the tightest TPOT target of an earlier lane that
  // has decodes in this step (less kTpotShare's margin), and a quarter of every earlier lane's
  // TTFT target (kTtftShare).
  std::vector<char> decodes(num_lanes, 0);
  for (const auto& s : out.scheduled) decodes[s.request->lane] = 1;
  std::vector<double> limit(num_lanes, std::numeric_limits<double>::infinity());
  if (model_ != nullptr && model_->ready()) {
    double tightest = std::numeric_limits<double>::infinity();
    for (std::size_t lane = 0; lane < num_lanes; ++lane) {
      limit[lane] = tightest;
      if (decodes[lane] && options_.lanes[lane].tpot_target_s > 0) tightest = std::min(tightest, options_.lanes[lane].tpot_target_s * kTpotShare);
      if (options_.lanes[lane].ttft_target_s > 0) tightest = std::min(tightest, options_.lanes[lane].ttft_target_s * kTtftShare);
    }
  }

  const auto total = static_cast<double>(kv_.pool().num_blocks());
  bool admitting = true;  // false once a lane's first waiting request stayed: no later lane overtakes it
  auto block = [&](AdmissionBlock why, std::size_t lane) {
    if (out.blocked == AdmissionBlock::kNone) {
      out.blocked = why;
      out.blocked_lane = lane;
    }
    admitting = false;
  };
  for (std::size_t lane = 0; lane < num_lanes; ++lane) {
    // The lane's unfinished prefills, a chunk each.
    for (; k < order_.size() && order_[k]->lane == lane; ++k) {
      Request* r = order_[k];
      if (r->status != RequestStatus::kRunning) continue;
      const std::int64_t n = within_target(r, std::min(r->num_tokens() - r->num_computed, budget()), limit[lane], out);
      if (n <= 0 || !grow(r, n)) continue;
      schedule_tokens(r, n, out);
    }
    auto& q = waiting_[lane];
    if (!admitting || q.empty()) continue;
    if (lane >= preempted_from_) {  // this lane, or an earlier one, just had to give up blocks
      block(AdmissionBlock::kKvBlocks, lane);
      continue;
    }
    // Blocks the running requests of this lane and earlier ones are expected to grow into (none
    // without a growth reserve): later lanes' growth cannot take this lane's blocks, they would
    // be preempted first.
    std::int64_t growth = 0;
    if (options_.kv_growth_reserve > 0) {
      for (const Request* r : running_) {
        if (r->lane <= lane) growth += growth_blocks(r);
      }
    }
    const double watermark = std::min(1.0, options_.kv_watermark + options_.lanes[lane].kv_reserve);
    const bool may_preempt = options_.lanes[lane].ttft_target_s > 0;
    std::size_t i = 0;
    while (admitting && i < q.size()) {
      Request* r = q[i];
      if (const Request* w = r->wait_for;
          w != nullptr && !(w->status == RequestStatus::kRunning && w->num_computed >= static_cast<std::int64_t>(w->prompt.size()))) {
        ++i;  // its sibling has not computed the shared prompt yet
        continue;
      }
      // A swapped-out request keeps what it computed; its blocks come back from the host (not
      // in a step that sent blocks there: see preempt()).
      const bool swapped = kv_.swapped(r->id);
      AdmissionBlock why = AdmissionBlock::kNone;
      std::int64_t n = 0;
      for (;;) {
        why = AdmissionBlock::kNone;
        n = 0;
        if (!device_memory_ok) {
          why = AdmissionBlock::kDeviceMemory;
        } else if (budget() <= 0) {
          why = AdmissionBlock::kTokenBudget;
        } else if (num_running() >= options_.max_num_seqs) {
          why = AdmissionBlock::kSeqSlots;
        } else if (swapped && !out.swap_out.empty()) {
          why = AdmissionBlock::kKvBlocks;
        }
        if (why != AdmissionBlock::kNone && why != AdmissionBlock::kSeqSlots) break;
        if (why == AdmissionBlock::kNone) {
          const std::int64_t cached = swapped ? r->num_computed : kv_.adopt_prefix(r->id, r->all_tokens(), r->cache_salt);
          r->num_computed = cached;
          // Next to running requests, their expected growth and the blocks other lanes keep in
          // reserve count as used: the head-room above the watermark is then room to grow within
          // what this lane may use, not the other lanes' reserve. A lone request always may start.
          const std::int64_t after =
              kv_.pool().num_used() + (running_.empty() ? kv_.blocks_needed(r->id, r->num_tokens())
                                                        : growth + reserved_blocks_elsewhere(lane) + kv_.blocks_needed(r->id, expected_tokens(r)));
          n = within_target(r, std::min(r->num_tokens() - r->num_computed, budget()), limit[lane], out);
          const std::size_t swap_copies = out.swap_in.size();
          if (n <= 0) {
            why = AdmissionBlock::kLatencyTarget;
          } else if (static_cast<double>(after) > total) {
            why = AdmissionBlock::kKvBlocks;
          } else if (static_cast<double>(after) > watermark * total) {
            why = AdmissionBlock::kKvWatermark;
          } else if (!can_allocate(r, r->num_computed + n)) {
            why = AdmissionBlock::kKvBlocks;
          } else if (swapped ? !kv_.swap_in(r->id, r->num_computed + n, &out.swap_in) : !kv_.allocate(r->id, r->num_computed + n)) {
            why = AdmissionBlock::kKvBlocks;
          } else if (swapped) {
            ++swap_ins_;
            swap_blocks_in_ += static_cast<std::int64_t>(out.swap_in.size() - swap_copies);
          }
          if (why != AdmissionBlock::kNone && !swapped) {  // a swapped-out request keeps its host blocks and tokens
            kv_.free(r->id);
            r->num_computed = 0;
          }
          if (why == AdmissionBlock::kNone || why == AdmissionBlock::kLatencyTarget) break;
        }
        // No room: a lane with a TTFT target makes it by preempting later lanes' work, and so
        // does a lane that finds its reserved sequence slots lent to later lanes.
        const bool reclaim = why == AdmissionBlock::kSeqSlots && lane_seqs(lane) < reserved_seqs(lane);
        if (!(may_preempt || reclaim) || running_.empty()) break;
        Request* victim = *std::max_element(running_.begin(), running_.end(), by_rank);
        if (victim->lane <= lane) break;
        preempt(victim, out);  // of a later lane: its growth was not counted above
      }
      if (why != AdmissionBlock::kNone) {
        block(why, lane);
        break;
      }
      if (r->num_preemptions == 0) {
        r->num_cached_prompt = r->num_computed;
        kv_.count_prefix_query(static_cast<std::int64_t>(r->prompt.size()), r->num_computed);
      }
      q.erase(q.begin() + static_cast<std::ptrdiff_t>(i));
      r->status = RequestStatus::kRunning;
      running_.push_back(r);
      growth += growth_blocks(r);
      schedule_tokens(r, n, out);
    }
  }
  if (model_ != nullptr && model_->ready()) {
    out.predicted_seconds = model_->predict(out.shape());
    for (std::size_t lane = 0; lane < num_lanes && out.tpot_unmet_lane < 0; ++lane) {
      const double t = options_.lanes[lane].tpot_target_s;
      if (decodes[lane] && t > 0 && out.predicted_seconds > t) out.tpot_unmet_lane = static_cast<int>(lane);
    }
  }
  return out;
}

void Scheduler::commit_step(const SchedulerOutput& out) {
  for (const auto& s : out.scheduled) {
    Request* r = s.request;
    const std::int64_t before = r->num_computed;
    r->num_computed += s.num_new_tokens;
    // Only a step that fills a block has anything to hash; most decode steps do not, and
    // they should not copy the sequence.
    const bool filled_block = r->num_computed / kv_.block_size() > before / kv_.block_size();
    if (kv_.pool().prefix_caching() && filled_block) kv_.commit(r->id, r->all_tokens(), r->num_computed, r->cache_salt);
  }
}

void Scheduler::swap_out_failed(const SchedulerOutput& out) {
  swap_ok_ = false;
  swap_outs_ -= static_cast<std::int64_t>(out.swapped_out.size());
  swap_blocks_out_ -= static_cast<std::int64_t>(out.swap_out.size());
  for (RequestId id : out.swapped_out) {
    kv_.drop_host(id);
    for (auto& q : waiting_) {
      for (Request* r : q) {
        if (r->id == id) r->num_computed = 0;
      }
    }
  }
}

bool Scheduler::has_work() const {
  if (!running_.empty()) return true;
  return std::any_of(waiting_.begin(), waiting_.end(), [](const auto& q) { return !q.empty(); });
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.running = num_running();
  for (std::size_t lane = 0; lane < waiting_.size(); ++lane) {
    s.waiting_per_lane.push_back(static_cast<std::int64_t>(waiting_[lane].size()));
    s.running_per_lane.push_back(lane_seqs(lane));
  }
  s.preemptions_total = preemptions_;
  s.kv_usage = kv_.pool().usage();
  s.swapped = static_cast<std::int64_t>(kv_.num_swapped());
  s.swap_outs_total = swap_outs_;
  s.swap_ins_total = swap_ins_;
  s.swap_blocks_out_total = swap_blocks_out_;
  s.swap_blocks_in_total = swap_blocks_in_;
  const std::int64_t host = kv_.num_host_blocks();
  s.host_kv_usage = host == 0 ? 0.0 : static_cast<double>(host - kv_.num_host_free()) / static_cast<double>(host);
  return s;
}

}  // namespace lmserve::engine
