// gateway/router: which replica takes a request. Pure decisions over snapshots of the replicas'
// state, so every rule is tested without a network; randomness comes in as a number.
//
// The order of questions for one request:
//   1. the version: a canary header naming one wins; else a sticky key (the `user` field, or a
//      header) hashed onto the versions' cumulative weights, so a user keeps the version they got
//      for as long as the weights stand (raising a canary's weight moves users only onto it);
//      else a weighted draw. A version with no replica able to serve gives way to the others,
//      unless the header asked for it.
//   2. the replica within the version: session affinity when configured (rendezvous hashing of
//      the session key over the available replicas: a replica leaving moves only its own
//      sessions), else the model's policy.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/sharded_counter.h"
#include "gateway/config.h"

namespace lmserve::gateway {

// A replica as the router sees it at the moment of the decision.
struct Candidate {
  std::string_view url;  // identity (rendezvous hashing uses it); the replica's, which outlives the decision
  std::string version;
  std::uint32_t weight = 0;
  bool available = true;   // healthy, not ejected, not backing off after a 429, not tried yet
  std::int64_t outstanding = 0;  // requests this gateway has in flight on it
  // From the replica's /metrics (kv_aware); `fresh` false when the last scrape is too old, which
  // makes it count as loaded.
  bool fresh = false;
  double kv_usage = 0;  // 0..1
  double waiting = 0;   // requests queued there (for the request's lane when it has one)
};

std::uint64_t hash64(std::string_view s, std::uint64_t seed = 0);

// The version to use (step 1 above); nullopt when the header names a version that has no
// available replica or none has any. `draw` in [0, 1) for the weighted draw.
std::optional<std::string> pick_version(const std::vector<Candidate>& cs, const std::string& header_version,
                                        const std::string& sticky_key, double draw);

// Rendezvous (highest random weight) hashing: the available candidate of `version` with the
// highest hash(key, url). nullopt when none is available.
std::optional<std::size_t> pick_by_key(const std::vector<Candidate>& cs, const std::string& version, const std::string& key);

// The kv_aware load score: lower is better.
double load_score(const Candidate& c);

// Remembers which replica last took which prompt prefix (block hashes chained over the prompt's
// leading blocks, as a replica's prefix cache chains token blocks), bounded, least recently used
// first out. Thread-safe.
class PrefixMap {
 public:
  explicit PrefixMap(PrefixConfig config) : config_(config) {}
  // The chained hashes of the text's full leading blocks (at most config.blocks).
  std::vector<std::uint64_t> block_hashes(std::string_view text) const;
  // The replica holding the longest of these prefixes, and how many blocks matched.
  std::optional<std::pair<std::string, std::size_t>> longest(const std::vector<std::uint64_t>& hashes);
  void record(const std::vector<std::uint64_t>& hashes, const std::string& url);
  std::size_t size() const;
  const PrefixConfig& config() const { return config_; }

 private:
  PrefixConfig config_;
  mutable std::mutex mu_;
  std::list<std::pair<std::uint64_t, std::string>> lru_;  // most recent first
  std::unordered_map<std::uint64_t, std::list<std::pair<std::uint64_t, std::string>>::iterator> index_;
};

// One model's routing state (round-robin position, prefix map). Thread-safe.
class Router {
 public:
  Router(const ModelConfig& model, const PrefixConfig& prefix) : model_(model), prefix_(prefix) {}

  struct Input {
    std::string header_version;  // the canary header's value
    std::string sticky_key;      // for sticky versions ("" = none)
    std::string session_key;     // for affinity ("" = none)
    std::string prompt;          // for prefix_aware
    double draw = 0;             // uniform [0, 1)
  };
  // An index into `cs`, or nullopt when no candidate can take the request.
  std::optional<std::size_t> pick(const std::vector<Candidate>& cs, const Input& in);

 private:
  std::optional<std::size_t> by_policy(const std::vector<Candidate>& cs, const std::string& version, const Input& in);

  const ModelConfig model_;
  PrefixMap prefix_;
  // The round-robin position, each I/O thread's own (as each nginx worker keeps its own): one
  // position shared by every request on every thread was a lock and a cache line they fought over.
  ShardedCounter turns_;
};

}  // namespace lmserve::gateway
