// The scheduler's exact behaviour: token budget split, admission under the watermark, lane
// reservation, preemption victim order, queue bound and the typed rejections.
#include "engine/sched/scheduler.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <set>

namespace lmserve::engine {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void make(std::int64_t blocks, int block_size, SchedulerOptions o, bool caching = false) {
    ASSERT_TRUE(o.validate().is_ok()) << o.validate().to_string();
    kv_ = std::make_unique<KvCacheManager>(blocks, block_size, caching);
    sched_ = std::make_unique<Scheduler>(std::move(o), *kv_);
  }

  Request* req(int prompt_len, std::size_t lane = 0, int priority = 0, std::int64_t max_tokens = 8) {
    auto r = std::make_unique<Request>();
    r->id = next_id_++;
    r->arrival = r->id;
    r->lane = lane;
    r->priority = priority;
    r->params.max_tokens = max_tokens;
    for (int i = 0; i < prompt_len; ++i) r->prompt.push_back(static_cast<std::int32_t>(r->id * 1000 + i));
    reqs_.push_back(std::move(r));
    return reqs_.back().get();
  }

  // One step: schedule, commit, and "sample" a token for every request that caught up.
  SchedulerOutput step(bool device_ok = true) {
    SchedulerOutput out = sched_->schedule(device_ok);
    sched_->commit_step(out);
    for (auto& s : out.scheduled) {
      if (s.request->num_computed == s.request->num_tokens()) s.request->output.push_back(7);
    }
    return out;
  }

  static std::vector<std::pair<RequestId, std::int64_t>> plan(const SchedulerOutput& out) {
    std::vector<std::pair<RequestId, std::int64_t>> p;
    for (const auto& s : out.scheduled) p.emplace_back(s.request->id, s.num_new_tokens);
    return p;
  }

  std::unique_ptr<KvCacheManager> kv_;
  std::unique_ptr<Scheduler> sched_;
  std::vector<std::unique_ptr<Request>> reqs_;
  RequestId next_id_ = 1;
};

using Plan = std::vector<std::pair<RequestId, std::int64_t>>;

TEST_F(SchedulerTest, DecodesFirstThenPrefillChunksUnderTheTokenBudget) {
  SchedulerOptions o;
  o.max_num_batched_tokens = 10;
  o.lanes = {{"only", 0, 0, 100}};
  make(100, 4, o);
  Request* a = req(2);
  Request* b = req(3);
  ASSERT_EQ(sched_->add(a), Rejection::kNone);
  ASSERT_EQ(sched_->add(b), Rejection::kNone);
  EXPECT_EQ(plan(step()), (Plan{{1, 2}, {2, 3}}));  // both prefills fit
  Request* c = req(20);
  ASSERT_EQ(sched_->add(c), Rejection::kNone);
  // a and b decode (1 each), c gets the remaining 8 as a chunk.
  EXPECT_EQ(plan(step()), (Plan{{1, 1}, {2, 1}, {3, 8}}));
  EXPECT_EQ(plan(step()), (Plan{{1, 1}, {2, 1}, {3, 8}}));
  EXPECT_EQ(plan(step()), (Plan{{1, 1}, {2, 1}, {3, 4}}));  // c's prefill completes
  EXPECT_EQ(plan(step()), (Plan{{1, 1}, {2, 1}, {3, 1}}));
}

TEST_F(SchedulerTest, AdmissionStopsAtTheWatermark) {
  SchedulerOptions o;
  o.kv_watermark = 0.5;
  o.lanes = {{"only", 0, 0, 100}};
  make(10, 4, o);
  Request* a = req(12);  // 3 blocks
  Request* b = req(12);
  sched_->add(a);
  sched_->add(b);
  SchedulerOutput out = step();
  EXPECT_EQ(plan(out), (Plan{{1, 12}}));
  EXPECT_EQ(out.blocked, AdmissionBlock::kKvWatermark);  // 3 + 3 blocks > 0.5 x 10
  EXPECT_EQ(sched_->num_waiting(0), 1);
  EXPECT_EQ(kv_->pool().num_used(), 3);  // a's 12 prompt tokens
  sched_->remove(a->id);
  EXPECT_EQ(plan(step()), (Plan{{2, 12}}));
}

TEST_F(SchedulerTest, LaneReserveIsNeverUsedByOtherLanes) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.max_num_seqs = 10;
  o.lanes = {{"high", 0.2, 0.2, 100}, {"low", 0, 0, 100}};
  make(10, 4, o);
  // Low takes 7 of 10 blocks; 3 are free but 2 of them are the high lane's reserve.
  Request* l1 = req(14, 1);  // 4 blocks, room to decode
  Request* l2 = req(10, 1);  // 3 blocks, room to decode
  Request* l3 = req(8, 1);   // 2 blocks: would eat into the reserve
  for (auto* r : {l1, l2, l3}) sched_->add(r);
  SchedulerOutput out = step();
  EXPECT_EQ(plan(out), (Plan{{1, 14}, {2, 10}}));
  EXPECT_EQ(out.blocked, AdmissionBlock::kKvBlocks);
  EXPECT_EQ(kv_->pool().num_free(), 3);
  // A high request takes reserved blocks at once.
  Request* h = req(7, 0);
  sched_->add(h);
  out = step();
  EXPECT_EQ(out.scheduled.back().request, h);
  EXPECT_TRUE(h->status == RequestStatus::kRunning);
  EXPECT_EQ(l3->status, RequestStatus::kWaiting);
}

TEST_F(SchedulerTest, ALaterLaneNeverOvertakesABlockedEarlierLane) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.lanes = {{"high", 0, 0, 100}, {"low", 0, 0, 100}};
  make(6, 4, o);
  Request* filler = req(12, 1);  // 3 blocks
  sched_->add(filler);
  step();
  Request* big_high = req(16, 0);  // 4 blocks: does not fit in the 3 free
  Request* small_low = req(4, 1);  // 1 block: would fit
  sched_->add(big_high);
  sched_->add(small_low);
  SchedulerOutput out = step();
  EXPECT_EQ(plan(out), (Plan{{filler->id, 1}}));
  EXPECT_EQ(out.blocked, AdmissionBlock::kKvBlocks);
  EXPECT_EQ(small_low->status, RequestStatus::kWaiting);
  sched_->remove(filler->id);
  EXPECT_EQ(plan(step()), (Plan{{big_high->id, 16}, {small_low->id, 4}}));
}

TEST_F(SchedulerTest, PreemptsLowestLaneThenLatestArrival) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.lanes = {{"high", 0, 0, 100}, {"low", 0, 0, 100}};
  make(6, 4, o);
  Request* low_old = req(8, 1, 0, 16);   // 2 full blocks
  Request* low_new = req(8, 1, 0, 16);
  Request* high = req(8, 0, 0, 16);
  for (auto* r : {low_old, low_new, high}) sched_->add(r);
  step();  // all three prefill: 6 blocks used
  EXPECT_EQ(kv_->pool().num_free(), 0);
  // Each now holds 9 tokens: the next decode needs a third block. high ranks first and
  // preempts the lowest-ranked: low_new (low lane, latest arrival), then low_old needs one.
  SchedulerOutput out = step();
  EXPECT_EQ(out.preempted, (std::vector<RequestId>{low_new->id}));
  EXPECT_EQ(plan(out), (Plan{{high->id, 1}, {low_old->id, 1}}));
  EXPECT_EQ(low_new->status, RequestStatus::kWaiting);
  EXPECT_EQ(low_new->num_computed, 0);
  EXPECT_EQ(sched_->stats().preemptions_total, 1);
}

TEST_F(SchedulerTest, PriorityPolicyRunsLowerNumbersFirst) {
  SchedulerOptions o;
  o.policy = SchedulerOptions::Policy::kPriority;
  o.max_num_seqs = 1;
  o.lanes = {{"only", 0, 0, 100}};
  make(100, 4, o);
  Request* a = req(4, 0, 5);
  Request* b = req(4, 0, -1);
  Request* c = req(4, 0, 5);
  for (auto* r : {a, b, c}) sched_->add(r);
  EXPECT_EQ(plan(step()), (Plan{{b->id, 4}}));
  sched_->remove(b->id);
  EXPECT_EQ(plan(step()), (Plan{{a->id, 4}}));  // same priority: earlier arrival
}

TEST_F(SchedulerTest, TypedRejections) {
  SchedulerOptions o;
  o.max_model_len = 64;
  o.kv_watermark = 0.5;
  o.lanes = {{"high", 0.1, 0, 1}, {"low", 0, 0, 2}};
  make(8, 4, o);
  EXPECT_EQ(sched_->add(req(64, 1)), Rejection::kPromptTooLong);
  EXPECT_EQ(sched_->add(req(60, 1, 0, 8)), Rejection::kExceedsMaxModelLen);
  // The low lane holds at most 8 - floor(0.1 x 8) = 8 blocks = 32 tokens; the last output token
  // is never cached, so 4 + 29 fits and 4 + 30 would wait forever.
  EXPECT_EQ(sched_->lane_capacity_tokens(1), 32);
  EXPECT_EQ(sched_->add(req(4, 1, 0, 30)), Rejection::kExceedsKvCapacity);
  EXPECT_EQ(sched_->add(req(20, 1, 0, 4)), Rejection::kKvWatermark);  // 5 blocks > 0.5 x 8, ever
  EXPECT_EQ(sched_->add(req(4, 1)), Rejection::kNone);
  EXPECT_EQ(sched_->add(req(4, 1)), Rejection::kNone);
  EXPECT_EQ(sched_->add(req(4, 1)), Rejection::kQueueFull);  // low holds 2
  EXPECT_EQ(sched_->add(req(4, 0)), Rejection::kNone);       // high has its own queue
  EXPECT_EQ(sched_->add(req(4, 0)), Rejection::kQueueFull);
}

TEST_F(SchedulerTest, DeviceMemorySignalStopsAdmissions) {
  SchedulerOptions o;
  o.lanes = {{"only", 0, 0, 10}};
  make(10, 4, o);
  sched_->add(req(4));
  SchedulerOutput out = step(false);
  EXPECT_TRUE(out.scheduled.empty());
  EXPECT_EQ(out.blocked, AdmissionBlock::kDeviceMemory);
  EXPECT_EQ(plan(step(true)).size(), 1u);
}

TEST_F(SchedulerTest, PreemptedRequestsResumeFromTheirCachedPrefix) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.lanes = {{"only", 0, 0, 10}};
  make(4, 4, o, /*caching=*/true);
  Request* a = req(8, 0, 0, 9);
  Request* b = req(8, 0, 0, 9);
  sched_->add(a);
  sched_->add(b);
  step();
  step();  // a needs a third block: b (later arrival) is preempted
  ASSERT_EQ(b->status, RequestStatus::kWaiting);
  sched_->remove(a->id);
  const std::int64_t tokens = b->num_tokens();  // 8 prompt + 1 output
  SchedulerOutput out = step();
  // b's first block comes from the prefix cache (its second was evicted when a grew); the
  // rest, including its output token, is recomputed.
  ASSERT_EQ(plan(out).size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, tokens - 4);
}

// With a swap space the preempted request keeps its 8 computed tokens: its two blocks go to
// the host in the preempting step, come back into new device blocks when it is admitted again,
// and only its output token is computed.
TEST_F(SchedulerTest, PreemptedRequestsSwapOutAndResumeWithoutRecompute) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.lanes = {{"high", 0, 0, 100}, {"low", 0, 0, 100}};
  make(6, 4, o);
  kv_->set_host_blocks(8);
  Request* low_old = req(8, 1, 0, 16);
  Request* low_new = req(8, 1, 0, 16);
  Request* high = req(8, 0, 0, 16);
  for (auto* r : {low_old, low_new, high}) sched_->add(r);
  step();
  const std::vector<BlockId> table(kv_->block_table(low_new->id).begin(), kv_->block_table(low_new->id).end());
  SchedulerOutput out = step();
  EXPECT_EQ(out.preempted, (std::vector<RequestId>{low_new->id}));
  EXPECT_EQ(out.swapped_out, (std::vector<RequestId>{low_new->id}));
  ASSERT_EQ(out.swap_out.size(), 2u);
  EXPECT_EQ(out.swap_out[0].device, table[0]);
  EXPECT_EQ(out.swap_out[1].device, table[1]);
  EXPECT_TRUE(out.swap_in.empty());
  EXPECT_EQ(low_new->status, RequestStatus::kWaiting);
  EXPECT_EQ(low_new->num_computed, 8);
  EXPECT_EQ(sched_->stats().swapped, 1);
  EXPECT_DOUBLE_EQ(sched_->stats().host_kv_usage, 0.25);

  sched_->remove(high->id);
  out = step();  // room again: low_new comes back from the host
  EXPECT_TRUE(out.swap_out.empty());
  ASSERT_EQ(out.swap_in.size(), 2u);
  EXPECT_EQ(out.swap_in[0].host, 0);
  EXPECT_EQ(out.swap_in[1].host, 1);
  EXPECT_EQ(out.swap_in[0].device, kv_->block_table(low_new->id)[0]);
  EXPECT_EQ(plan(out), (Plan{{low_old->id, 1}, {low_new->id, 1}}));  // only its output token
  const SchedulerStats st = sched_->stats();
  EXPECT_EQ(st.swapped, 0);
  EXPECT_EQ(st.swap_outs_total, 1);
  EXPECT_EQ(st.swap_ins_total, 1);
  EXPECT_EQ(st.swap_blocks_out_total, 2);
  EXPECT_EQ(st.swap_blocks_in_total, 2);
  EXPECT_EQ(st.host_kv_usage, 0.0);
}

// Without room in the swap space, or once a swap-out has failed, preemption recomputes.
TEST_F(SchedulerTest, PreemptionRecomputesWhenTheSwapSpaceIsFullOrFailed) {
  for (bool fail : {false, true}) {
    SCOPED_TRACE(fail ? "after a failed swap-out" : "swap space too small");
    SchedulerOptions o;
    o.kv_watermark = 1.0;
    o.lanes = {{"only", 0, 0, 100}};
    make(6, 4, o);
    kv_->set_host_blocks(fail ? 8 : 1);
    std::vector<Request*> rs;
    for (int i = 0; i < 3; ++i) {
      rs.push_back(req(8, 0, 0, 16));
      sched_->add(rs.back());
    }
    step();
    SchedulerOutput out = step();
    ASSERT_EQ(out.preempted, (std::vector<RequestId>{rs[2]->id}));
    if (fail) {
      ASSERT_EQ(out.swapped_out, (std::vector<RequestId>{rs[2]->id}));
      sched_->swap_out_failed(out);
    } else {
      EXPECT_TRUE(out.swapped_out.empty());
      EXPECT_TRUE(out.swap_out.empty());
    }
    EXPECT_EQ(rs[2]->num_computed, 0);
    EXPECT_FALSE(kv_->swapped(rs[2]->id));
    EXPECT_EQ(kv_->num_host_free(), fail ? 8 : 1);
    // The next preemption (rs[1], now the lowest-ranked running) is not swapped either.
    for (int s = 0; s < 10 && sched_->stats().preemptions_total < 2; ++s) out = step();
    EXPECT_EQ(sched_->stats().preemptions_total, 2);
    EXPECT_EQ(sched_->stats().swap_outs_total, 0);
    EXPECT_EQ(kv_->num_swapped(), 0u);
    rs.clear();
  }
}

// Five requests that start together and each grow to 6 blocks, in a pool of 24. By the prompt
// alone (vLLM's rule) all five start, outgrow the pool and one is preempted and recomputed;
// with the whole remaining output reserved, the fifth waits for the first to finish, and
// nothing is preempted. Both finish all five.
TEST_F(SchedulerTest, AGrowthReserveKeepsRequestsThatStartTogetherFromPreemptingEachOther) {
  for (double reserve : {0.0, 1.0}) {
    SchedulerOptions o;
    o.kv_watermark = 1.0;
    o.kv_growth_reserve = reserve;
    o.lanes = {{"only", 0, 0, 10}};
    make(24, 4, o);
    std::vector<Request*> rs;
    for (int i = 0; i < 5; ++i) {
      rs.push_back(req(8, 0, 0, 16));  // 8 + 16 tokens = 6 blocks
      ASSERT_EQ(sched_->add(rs.back()), Rejection::kNone);
    }
    SchedulerOutput first = step();
    EXPECT_EQ(plan(first).size(), reserve == 0 ? 5u : 4u) << reserve;
    if (reserve > 0) {
      EXPECT_EQ(first.blocked, AdmissionBlock::kKvBlocks);
    }
    int finished = 0;
    std::set<RequestId> done;
    for (int s = 0; s < 200 && finished < 5; ++s) {
      step();
      for (Request* r : rs) {
        if (r->status == RequestStatus::kRunning && static_cast<std::int64_t>(r->output.size()) == r->params.max_tokens &&
            done.insert(r->id).second) {
          sched_->remove(r->id);
          ++finished;
        }
      }
    }
    EXPECT_EQ(finished, 5) << reserve;
    if (reserve == 0) {
      EXPECT_GT(sched_->stats().preemptions_total, 0);
    } else {
      EXPECT_EQ(sched_->stats().preemptions_total, 0);
    }
    EXPECT_EQ(kv_->pool().num_used(), 0) << reserve;
    rs.clear();
  }
}

// The estimate is clipped (kv_growth_clip) and scaled (kv_growth_reserve), and it never holds
// back a request when nothing runs, however long its output may be.
TEST_F(SchedulerTest, TheGrowthReserveIsClippedScaledAndNeverBlocksALoneRequest) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.kv_growth_reserve = 0.5;
  o.kv_growth_clip = 16;
  o.lanes = {{"only", 0, 0, 10}};
  make(10, 4, o);
  Request* lone = req(8, 0, 0, 33);  // 8 + min(33, 16) x 0.5 = 16 tokens expected: 4 blocks
  Request* b = req(8, 0, 0, 33);     // the same: 2 blocks now, 4 expected
  Request* c = req(4, 0, 0, 33);     // 4 + 8 = 12 tokens: 3 blocks expected
  for (Request* r : {lone, b, c}) ASSERT_EQ(sched_->add(r), Rejection::kNone);
  SchedulerOutput out = step();
  // lone (2 blocks used, 2 more expected) and b (2 + 2) fit the 10 blocks; c's 3 do not.
  EXPECT_EQ(plan(out), (Plan{{lone->id, 8}, {b->id, 8}}));
  EXPECT_EQ(out.blocked, AdmissionBlock::kKvBlocks);
  sched_->remove(lone->id);
  sched_->remove(b->id);
  sched_->remove(c->id);

  // Alone, a request whose expected growth exceeds the pool still starts: 8 + 9 tokens
  // expected, 5 blocks of the 4 (it fits, as its last token is never cached).
  o.kv_growth_reserve = 1.0;
  o.kv_growth_clip = 4096;
  make(4, 4, o);
  Request* big = req(8, 0, 0, 9);
  ASSERT_EQ(sched_->add(big), Rejection::kNone);
  EXPECT_EQ(plan(step()), (Plan{{big->id, 8}}));
}

// Issue #31: the high lane's reserve held only against admissions. Two low requests fill the
// unreserved 8 of 10 blocks; when they grow, the later one is preempted (the reserve is not
// theirs), and in that same step a waiting high request starts in the reserve. (Before, a step
// that preempted admitted nothing, in any lane, and said so as a kv_blocks limit of lane 0.)
TEST_F(SchedulerTest, TheReserveHoldsWhileOtherLanesGrowAndTheHighLaneStartsInTheSameStep) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.max_num_seqs = 10;
  o.lanes = {{"high", 0.2, 0.2, 100}, {"low", 0, 0, 100}};
  make(10, 4, o);
  Request* l1 = req(16, 1, 0, 16);
  Request* l2 = req(16, 1, 0, 16);
  for (auto* r : {l1, l2}) ASSERT_EQ(sched_->add(r), Rejection::kNone);
  EXPECT_EQ(plan(step()), (Plan{{l1->id, 16}, {l2->id, 16}}));
  EXPECT_EQ(kv_->pool().num_free(), 2);  // the reserve
  Request* h = req(4, 0, 0, 4);
  ASSERT_EQ(sched_->add(h), Rejection::kNone);
  SchedulerOutput out = step();  // both low requests need a fifth block: only the reserve is left
  EXPECT_EQ(out.preempted, (std::vector<RequestId>{l2->id}));
  EXPECT_EQ(plan(out), (Plan{{l1->id, 1}, {h->id, 4}}));
  EXPECT_EQ(h->status, RequestStatus::kRunning);
  // The low lane admits nothing in a step where it gave up blocks: l2 waits, and that is the
  // limit reported, for its lane.
  EXPECT_EQ(out.blocked, AdmissionBlock::kKvBlocks);
  EXPECT_EQ(out.blocked_lane, 1u);
  // From here on low never takes the high lane's last reserved block while h holds one.
  for (int s = 0; s < 40; ++s) {
    step();
    EXPECT_GE(kv_->pool().num_free() + static_cast<std::int64_t>(kv_->block_table(h->id).size()), 2) << s;
    if (static_cast<std::int64_t>(h->output.size()) >= h->params.max_tokens) break;
  }
}

// The watermark's head-room is for growth within what a lane may use: the high lane's reserve
// counts as used when a low request is admitted. 20 blocks, 4 reserved, watermark 0.85 (17):
// low prompts of 4 blocks start while used + 4 + 4 <= 17, so three, leaving 4 blocks to grow
// into (before, a fourth started and the first block any of them needed preempted one).
TEST_F(SchedulerTest, TheWatermarkLeavesRoomToGrowBesideAnotherLanesReserve) {
  SchedulerOptions o;
  o.kv_watermark = 0.85;
  o.max_num_seqs = 10;
  o.lanes = {{"high", 0.2, 0.2, 100}, {"low", 0, 0, 100}};
  make(20, 4, o);
  std::vector<Request*> lows;
  for (int i = 0; i < 4; ++i) {
    lows.push_back(req(16, 1, 0, 4));
    ASSERT_EQ(sched_->add(lows.back()), Rejection::kNone);
  }
  SchedulerOutput out = step();
  EXPECT_EQ(plan(out).size(), 3u);
  EXPECT_EQ(out.blocked, AdmissionBlock::kKvWatermark);
  EXPECT_EQ(out.blocked_lane, 1u);
  for (int s = 0; s < 3; ++s) EXPECT_TRUE(step().preempted.empty()) << s;  // 3 x 5 blocks fit the 16 low may use
  // The high lane still starts at once in its reserve.
  Request* h = req(8, 0, 0, 4);
  ASSERT_EQ(sched_->add(h), Rejection::kNone);
  step();
  EXPECT_EQ(h->status, RequestStatus::kRunning);
}

// With a growth reserve, the growth the low lane's requests expect must not keep a high request
// out: low would be preempted before it could grow into those blocks.
TEST_F(SchedulerTest, OtherLanesExpectedGrowthDoesNotKeepAHigherLaneOut) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.kv_growth_reserve = 1.0;
  o.max_num_seqs = 10;
  o.lanes = {{"high", 0.2, 0.2, 100}, {"low", 0, 0, 100}};
  make(20, 4, o);
  Request* l1 = req(8, 1, 0, 56);  // 16 blocks expected (64 tokens): the 16 not reserved
  ASSERT_EQ(sched_->add(l1), Rejection::kNone);
  step();
  // h expects 5 blocks: with l1's 13 still to come that is 3 + 13 + 5 > 20 (the old rule), but
  // l1 cannot grow into the reserve, so h starts; l2 (low) counts everyone's growth and waits.
  Request* h = req(8, 0, 0, 12);
  Request* l2 = req(8, 1, 0, 40);
  for (auto* r : {h, l2}) ASSERT_EQ(sched_->add(r), Rejection::kNone);
  SchedulerOutput out = step();
  EXPECT_EQ(plan(out), (Plan{{l1->id, 1}, {h->id, 8}}));
  EXPECT_EQ(out.blocked, AdmissionBlock::kKvBlocks);  // l2: its own lane's growth counts
  EXPECT_EQ(out.blocked_lane, 1u);
}

// A lane with a TTFT target that finds no blocks or no sequence slot preempts the latest-ranked
// requests of later lanes to start in this step; without a target it waits.
TEST_F(SchedulerTest, ALaneWithATtftTargetPreemptsLaterLanesToStart) {
  for (double ttft : {0.0, 0.3}) {
    SchedulerOptions o;
    o.kv_watermark = 1.0;
    o.max_num_seqs = 3;
    o.lanes = {{"high", 0, 0, 100}, {"low", 0, 0, 100}};
    o.lanes[0].ttft_target_s = ttft;
    make(8, 4, o);
    Request* l1 = req(11, 1, 0, 12);
    Request* l2 = req(11, 1, 0, 12);
    Request* h0 = req(3, 0, 0, 12);
    for (auto* r : {l1, l2, h0}) ASSERT_EQ(sched_->add(r), Rejection::kNone);
    step();  // 3 + 3 + 1 blocks, all three slots; the next decodes need no new block
    Request* h = req(8, 0, 0, 4);  // 2 blocks: 1 free, and no slot
    ASSERT_EQ(sched_->add(h), Rejection::kNone);
    SchedulerOutput out = step();
    if (ttft == 0) {
      EXPECT_TRUE(out.preempted.empty());
      EXPECT_EQ(h->status, RequestStatus::kWaiting);
      EXPECT_EQ(out.blocked, AdmissionBlock::kSeqSlots);
      EXPECT_EQ(out.blocked_lane, 0u);
    } else {
      // The slot costs l2 (latest low), and l2's blocks are enough: l1 keeps running.
      EXPECT_EQ(out.preempted, (std::vector<RequestId>{l2->id}));
      EXPECT_EQ(plan(out), (Plan{{h0->id, 1}, {l1->id, 1}, {h->id, 8}}));
    }
    EXPECT_EQ(l1->status, RequestStatus::kRunning);
    EXPECT_EQ(h0->status, RequestStatus::kRunning);
  }
}

// A lane's share of the sequence slots is lent to later lanes while it does not use it, and
// taken back at once: a high request finding every slot taken preempts the latest low request
// while its lane runs fewer than its share; past the share it waits like anyone else.
TEST_F(SchedulerTest, AnIdleSlotReserveIsLentAndTakenBackAtOnce) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.max_num_seqs = 5;
  o.lanes = {{"high", 0, 0.4, 100}, {"low", 0, 0, 100}};  // 2 of 5 slots
  make(40, 4, o);
  std::vector<Request*> lows;
  for (int i = 0; i < 5; ++i) {
    lows.push_back(req(4, 1, 0, 20));
    ASSERT_EQ(sched_->add(lows.back()), Rejection::kNone);
  }
  SchedulerOutput out = step();
  EXPECT_EQ(plan(out).size(), 5u);  // the high lane's two slots are lent
  EXPECT_EQ(out.blocked, AdmissionBlock::kNone);
  std::vector<Request*> highs;
  for (int i = 0; i < 3; ++i) {
    highs.push_back(req(4, 0, 0, 20));
    ASSERT_EQ(sched_->add(highs.back()), Rejection::kNone);
  }
  out = step();
  // Two highs start in this step; their slots cost the latest low requests (lows[4], lows[3]).
  EXPECT_EQ(out.preempted, (std::vector<RequestId>{lows[4]->id, lows[3]->id}));
  EXPECT_EQ(highs[0]->status, RequestStatus::kRunning);
  EXPECT_EQ(highs[1]->status, RequestStatus::kRunning);
  // The third is past the share: it waits, and low keeps its three.
  EXPECT_EQ(highs[2]->status, RequestStatus::kWaiting);
  EXPECT_EQ(out.blocked, AdmissionBlock::kSeqSlots);
  EXPECT_EQ(out.blocked_lane, 0u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(lows[static_cast<std::size_t>(i)]->status, RequestStatus::kRunning) << i;
  EXPECT_EQ(lows[3]->status, RequestStatus::kWaiting);
  EXPECT_EQ(lows[4]->status, RequestStatus::kWaiting);
  // When a high request ends, its slot goes to the waiting high one first, not back to low.
  sched_->remove(highs[0]->id);
  out = step();
  EXPECT_TRUE(out.preempted.empty());
  EXPECT_EQ(highs[2]->status, RequestStatus::kRunning);
  EXPECT_EQ(lows[3]->status, RequestStatus::kWaiting);
}

// A model that predicts 10 ms + 1 ms per token, fitted from exact points.
StepTimeModel linear_model(double fixed, double per_token) {
  StepTimeModel m;
  std::vector<StepShape> shapes;
  std::vector<double> secs;
  for (std::int64_t t : {1, 64, 256, 1024}) {
    for (std::int64_t s : {1, 8}) {
      shapes.push_back({t, s, 0});
      secs.push_back(fixed + per_token * static_cast<double>(t));
    }
  }
  m.calibrate(shapes, secs);
  return m;
}

// While a lane with a TPOT target decodes, later lanes' prefill chunks are cut to what the model
// says fits under the target; the targeted lane's own prefill is not cut; with no targeted
// decode, prefills take the whole budget.
TEST_F(SchedulerTest, TheStepCapFollowsTheCostModel) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.max_num_batched_tokens = 512;
  o.lanes = {{"high", 0, 0, 100}, {"low", 0, 0, 100}};
  o.lanes[0].tpot_target_s = 0.0532;  // steps are planned to 95% of it: 50.54 ms
  make(200, 4, o);
  StepTimeModel model = linear_model(0.010, 0.001);
  ASSERT_NEAR(model.predict({40, 2, 0}), 0.050, 1e-9);
  ASSERT_GT(model.predict({41, 2, 0}), 0.95 * 0.0532);
  sched_->set_step_time_model(&model);
  Request* h = req(60, 0, 0, 50);
  Request* low = req(300, 1, 0, 4);
  for (auto* r : {h, low}) ASSERT_EQ(sched_->add(r), Rejection::kNone);
  // No decodes yet: h's 60 tokens and low's 300 go uncut (a prefill has no TPOT).
  EXPECT_EQ(plan(step()), (Plan{{h->id, 60}, {low->id, 300}}));
  // h decodes: 10 ms + 1 token leaves 39.54 ms, 39 tokens of low's prefill... low is done with
  // its prompt, so a new low request shows it.
  Request* low2 = req(200, 1, 0, 4);
  ASSERT_EQ(sched_->add(low2), Rejection::kNone);
  SchedulerOutput out = step();
  EXPECT_EQ(plan(out), (Plan{{h->id, 1}, {low->id, 1}, {low2->id, 38}}));
  EXPECT_NEAR(out.predicted_seconds, 0.050, 1e-9);
  EXPECT_EQ(out.tpot_unmet_lane, -1);
  EXPECT_EQ(plan(step()), (Plan{{h->id, 1}, {low->id, 1}, {low2->id, 38}}));
  // A second high request's prefill is not cut by its own lane's target.
  Request* h2 = req(100, 0, 0, 50);
  ASSERT_EQ(sched_->add(h2), Rejection::kNone);
  out = step();
  EXPECT_EQ(plan(out), (Plan{{h->id, 1}, {low->id, 1}, {h2->id, 100}}));
  EXPECT_EQ(out.tpot_unmet_lane, 0);  // 10 + 102 ms: the high lane's own prefill overran it
  // Without the model nothing is cut.
  sched_->set_step_time_model(nullptr);
  out = step();
  EXPECT_EQ(plan(out), (Plan{{h->id, 1}, {h2->id, 1}, {low->id, 1}, {low2->id, 124}}));
  EXPECT_EQ(out.tpot_unmet_lane, -1);
}

// A lane with a TTFT target keeps later lanes' prefill steps to a quarter of it even while it has
// nothing running, so that its next request never lands behind a long step.
TEST_F(SchedulerTest, ATtftTargetKeepsLaterPrefillStepsShort) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.max_num_batched_tokens = 512;
  o.lanes = {{"high", 0, 0, 100}, {"low", 0, 0, 100}};
  o.lanes[0].ttft_target_s = 0.2402;  // a quarter: 60.05 ms, 50 tokens past the 10 ms a step costs
  make(200, 4, o);
  StepTimeModel model = linear_model(0.010, 0.001);
  sched_->set_step_time_model(&model);
  Request* low = req(300, 1, 0, 4);
  ASSERT_EQ(sched_->add(low), Rejection::kNone);
  EXPECT_EQ(plan(step()), (Plan{{low->id, 50}}));
  // The high lane's own prefill is not cut; low's chunk gets what is left.
  Request* h = req(30, 0, 0, 4);
  ASSERT_EQ(sched_->add(h), Rejection::kNone);
  EXPECT_EQ(plan(step()), (Plan{{h->id, 30}, {low->id, 20}}));
}

// A target the decodes alone miss is reported, and later lanes' prefills wait rather than make
// it worse; the admission says why.
TEST_F(SchedulerTest, AnUnmeetableTargetIsReported) {
  SchedulerOptions o;
  o.kv_watermark = 1.0;
  o.lanes = {{"high", 0, 0, 100}, {"low", 0, 0, 100}};
  o.lanes[0].tpot_target_s = 0.005;  // below the model's 10 ms per step
  make(100, 4, o);
  StepTimeModel model = linear_model(0.010, 0.001);
  sched_->set_step_time_model(&model);
  Request* h = req(8, 0, 0, 50);
  ASSERT_EQ(sched_->add(h), Rejection::kNone);
  step();
  Request* low = req(8, 1, 0, 4);
  ASSERT_EQ(sched_->add(low), Rejection::kNone);
  SchedulerOutput out = step();
  EXPECT_EQ(plan(out), (Plan{{h->id, 1}}));
  EXPECT_EQ(out.tpot_unmet_lane, 0);
  EXPECT_EQ(out.blocked, AdmissionBlock::kLatencyTarget);
  EXPECT_EQ(out.blocked_lane, 1u);
  sched_->remove(h->id);
  EXPECT_EQ(plan(step()), (Plan{{low->id, 8}}));  // nothing high decodes: no cap
}

// The model: exact data gives its coefficients back, noise averages out, a change of speed is
// followed (older steps weigh less), and no coefficient goes negative.
TEST(StepTimeModel, FitsFollowsAndStaysNonNegative) {
  StepTimeModel m;
  EXPECT_FALSE(m.ready());
  EXPECT_EQ(m.predict({100, 1, 100}), 0.0);
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::int64_t> tok(1, 2048), seq(1, 256), kv(0, 2'000'000);
  auto truth = [](const StepShape& s, double scale) {
    return scale * (0.004 + 2.5e-5 * static_cast<double>(s.tokens) + 1e-5 * static_cast<double>(s.seqs) + 1e-8 * static_cast<double>(s.kv_tokens));
  };
  std::normal_distribution<double> noise(0.0, 0.0005);
  for (int i = 0; i < 3000; ++i) {
    StepShape s{tok(rng), seq(rng), kv(rng)};
    m.observe(s, truth(s, 1.0) + noise(rng));
  }
  const StepShape probe{512, 64, 500'000};
  EXPECT_NEAR(m.predict(probe), truth(probe, 1.0), 0.0005);
  EXPECT_NEAR(m.coefficients()[1], 2.5e-5, 2e-6);
  // The card slows down by half: after a few thousand steps the model says so.
  for (int i = 0; i < 5000; ++i) {
    StepShape s{tok(rng), seq(rng), kv(rng)};
    m.observe(s, truth(s, 1.5));
  }
  EXPECT_NEAR(m.predict(probe), truth(probe, 1.5), 0.0005);
  // Times that fall with the token count would need a negative coefficient: it stays 0.
  StepTimeModel z;
  for (int i = 0; i < 200; ++i) {
    StepShape s{tok(rng), 1, 0};
    z.observe(s, 0.05 - 1e-5 * static_cast<double>(s.tokens));
  }
  for (double c : z.coefficients()) EXPECT_GE(c, 0.0);
  EXPECT_EQ(z.max_tokens_within(1.0, 0), std::int64_t{1} << 62);  // tokens cost nothing in it
  // max_tokens_within: 1 ms a token and nothing else.
  StepTimeModel lin = linear_model(0.0, 0.001);
  EXPECT_EQ(lin.max_tokens_within(0.0395, 1000), 39);
  EXPECT_EQ(lin.max_tokens_within(0.0005, 0), 0);
  // A chunk's attention grows with its square: 1 ns per query-key pair, at context 1000 a chunk
  // of n costs n (1000 + n) ns, so 2.01 ms hold 1003 tokens.
  StepTimeModel quad;
  std::vector<StepShape> shapes;
  std::vector<double> secs;
  for (std::int64_t n : {64, 512, 2048}) {
    for (std::int64_t c : {0, 4096, 16384}) {
      shapes.push_back({n, 1, 0, n * (c + n)});
      secs.push_back(1e-9 * static_cast<double>(n * (c + n)));
    }
  }
  quad.calibrate(shapes, secs);
  EXPECT_NEAR(quad.coefficients()[4], 1e-9, 1e-12);
  EXPECT_EQ(quad.max_tokens_within(0.00201, 1000), 1003);
}

TEST(SchedulerOptions, LaneSpecsParseWithTargets) {
  auto lanes = parse_lanes("high:0.2:ttft=300ms:tpot=50ms,mid:tpot=0.1s,low", 7);
  ASSERT_TRUE(lanes.has_value()) << lanes.error().to_string();
  ASSERT_EQ(lanes->size(), 3u);
  EXPECT_EQ((*lanes)[0].name, "high");
  EXPECT_DOUBLE_EQ((*lanes)[0].kv_reserve, 0.2);
  EXPECT_DOUBLE_EQ((*lanes)[0].seq_reserve, 0.2);
  EXPECT_DOUBLE_EQ((*lanes)[0].ttft_target_s, 0.3);
  EXPECT_DOUBLE_EQ((*lanes)[0].tpot_target_s, 0.05);
  EXPECT_EQ((*lanes)[0].max_queued, 7);
  EXPECT_EQ((*lanes)[1].name, "mid");
  EXPECT_DOUBLE_EQ((*lanes)[1].kv_reserve, 0.0);
  EXPECT_DOUBLE_EQ((*lanes)[1].tpot_target_s, 0.1);
  EXPECT_DOUBLE_EQ((*lanes)[2].ttft_target_s, 0.0);
  for (const char* bad : {"high:0.2:ttft=300", "high:ttft=-1ms", "high:x", ":0.2", "high:0.2:0.3", "a,,b", "high:tpot=ms"}) {
    auto r = parse_lanes(bad, 1);
    ASSERT_FALSE(r.has_value()) << bad;
    EXPECT_NE(r.error().message().find("--lanes"), std::string::npos) << bad;
  }
}

TEST(SchedulerOptions, ValidationNamesTheProblem) {
  SchedulerOptions o;
  o.lanes = {{"a", 0.6, 0, 1}, {"b", 0.5, 0, 1}};
  EXPECT_NE(o.validate().message().find("add up"), std::string::npos);
  o.lanes = {{"a", 0, 0, 1}, {"a", 0, 0, 1}};
  EXPECT_NE(o.validate().message().find("twice"), std::string::npos);
  o.lanes = {{"a", 0, 0, 1}};
  o.kv_watermark = 0;
  EXPECT_NE(o.validate().message().find("kv_watermark"), std::string::npos);
  o.kv_watermark = 0.5;
  o.kv_growth_reserve = 1.5;
  EXPECT_NE(o.validate().message().find("kv_growth_reserve"), std::string::npos);
  o.kv_growth_reserve = 1;
  o.kv_growth_clip = 0;
  EXPECT_NE(o.validate().message().find("kv_growth_clip"), std::string::npos);
  o.kv_growth_clip = 1;
  o.lanes[0].tpot_target_s = -0.05;
  EXPECT_NE(o.validate().message().find("latency targets"), std::string::npos);
}

}  // namespace
}  // namespace lmserve::engine
