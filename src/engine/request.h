// A request inside the engine: its tokens, progress and place in the queues. Owned by the
// engine thread; other threads only see the RequestStream (engine.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/kv/kv_cache_manager.h"
#include "engine/sampling/sampling_params.h"

namespace lmserve::engine {

enum class RequestStatus { kWaiting, kRunning };
enum class FinishReason { kNone, kStop, kLength, kAbort, kError };

struct Request {
  RequestId id = 0;
  std::vector<std::int32_t> prompt;
  std::vector<std::int32_t> output;
  SamplingParams params;
  std::size_t lane = 0;       // index into SchedulerOptions::lanes
  std::int32_t priority = 0;  // lower runs first (policy "priority")
  std::uint64_t arrival = 0;  // submission order
  std::string cache_salt;
  // For the 2nd..nth choice of a request with n > 1: not admitted until this sibling's
  // prompt is computed, so that the prompt's full blocks come from the prefix cache.
  const Request* wait_for = nullptr;

  RequestStatus status = RequestStatus::kWaiting;
  std::int64_t num_computed = 0;   // tokens whose K/V are in the cache
  std::int64_t num_cached_prompt = 0;  // prompt tokens served by the prefix cache (first admission)
  std::int32_t num_preemptions = 0;

  std::int64_t num_tokens() const { return static_cast<std::int64_t>(prompt.size() + output.size()); }
  // prompt followed by output: the sequence whose K/V the cache holds.
  std::vector<std::int32_t> all_tokens() const {
    std::vector<std::int32_t> t = prompt;
    t.insert(t.end(), output.begin(), output.end());
    return t;
  }
};

}  // namespace lmserve::engine
