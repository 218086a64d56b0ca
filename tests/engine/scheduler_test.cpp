// The scheduler's exact behaviour: token budget split, admission under the watermark, lane
// reservation, preemption victim order, queue bound and the typed rejections.
#include "engine/sched/scheduler.h"

#include <set>
#include <gtest/gtest.h>

#include <memory>

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
}

}  // namespace
}  // namespace lmserve::engine
