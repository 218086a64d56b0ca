#include "gateway/router.h"

#include <algorithm>
#include <boost/container/small_vector.hpp>
#include <limits>
#include <map>

namespace lmserve::gateway {

std::uint64_t hash64(std::string_view s, std::uint64_t seed) {
  // FNV-1a, then a splitmix64 finaliser so that nearby keys spread over the whole range.
  std::uint64_t h = 1469598103934665603ULL ^ (seed * 0x9E3779B97F4A7C15ULL);
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  h ^= h >> 30;
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 27;
  h *= 0x94D049BB133111EBULL;
  h ^= h >> 31;
  return h;
}

namespace {

// The versions with their total weight, in name order (a fixed order keeps sticky hashing stable).
std::map<std::string, std::uint64_t> version_weights(const std::vector<Candidate>& cs, bool available_only) {
  std::map<std::string, std::uint64_t> w;
  for (const auto& c : cs) {
    if (available_only && !c.available) continue;
    w[c.version] += c.weight;
  }
  return w;
}

std::optional<std::string> by_weight(const std::map<std::string, std::uint64_t>& w, double u) {
  std::uint64_t total = 0;
  for (const auto& [v, x] : w) total += x;
  if (total == 0) {
    if (w.empty()) return std::nullopt;
    return w.begin()->first;  // all weights 0 but replicas available: still serve
  }
  auto point = static_cast<std::uint64_t>(u * static_cast<double>(total));
  for (const auto& [v, x] : w) {
    if (point < x) return v;
    point -= x;
  }
  return w.rbegin()->first;
}

}  // namespace

std::optional<std::string> pick_version(const std::vector<Candidate>& cs, const std::string& header_version,
                                        const std::string& sticky_key, double draw) {
  // The common case, one version: no shares to draw from.
  if (!cs.empty() && std::all_of(cs.begin(), cs.end(), [&](const Candidate& c) { return c.version == cs.front().version; })) {
    const bool any = std::any_of(cs.begin(), cs.end(), [](const Candidate& c) { return c.available; });
    if (!any || (!header_version.empty() && header_version != cs.front().version)) return std::nullopt;
    return cs.front().version;
  }
  const auto available = version_weights(cs, true);
  if (available.empty()) return std::nullopt;
  if (!header_version.empty()) {
    if (available.contains(header_version)) return header_version;
    return std::nullopt;
  }
  // The draw (hashed for sticky keys) is made over all configured versions, so a user's version
  // does not change while another version's replicas come and go.
  const double u = sticky_key.empty() ? draw : static_cast<double>(hash64(sticky_key, 0x5717) >> 11) * 0x1.0p-53;
  auto chosen = by_weight(version_weights(cs, false), u);
  if (chosen && available.contains(*chosen) && available.at(*chosen) > 0) return chosen;
  return by_weight(available, u);  // that version has no replica able to serve now
}

std::optional<std::size_t> pick_by_key(const std::vector<Candidate>& cs, const std::string& version, const std::string& key) {
  std::optional<std::size_t> best;
  std::uint64_t best_h = 0;
  const std::uint64_t kh = hash64(key);
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (!cs[i].available || cs[i].version != version) continue;
    const std::uint64_t h = hash64(cs[i].url, kh);
    if (!best || h > best_h) best = i, best_h = h;
  }
  return best;
}

double load_score(const Candidate& c) {
  // Requests waiting at the replica cost most (each delays every later arrival's first token);
  // KV usage near full means the next request may wait or be refused; our own outstanding
  // requests cover what the last scrape has not seen yet. A stale scrape counts as loaded.
  const double scraped = c.fresh ? 4.0 * c.waiting + 8.0 * c.kv_usage : 1000.0;
  return scraped + static_cast<double>(c.outstanding);
}

std::vector<std::uint64_t> PrefixMap::block_hashes(std::string_view text) const {
  std::vector<std::uint64_t> out;
  std::uint64_t h = 0;
  for (std::size_t i = 0; i + config_.block_chars <= text.size() && out.size() < config_.blocks; i += config_.block_chars) {
    h = hash64(text.substr(i, config_.block_chars), h);
    out.push_back(h);
  }
  return out;
}

std::optional<std::pair<std::string, std::size_t>> PrefixMap::longest(const std::vector<std::uint64_t>& hashes) {
  std::lock_guard lock(mu_);
  for (std::size_t i = hashes.size(); i-- > 0;) {
    auto it = index_.find(hashes[i]);
    if (it != index_.end()) return std::make_pair(it->second->second, i + 1);
  }
  return std::nullopt;
}

void PrefixMap::record(const std::vector<std::uint64_t>& hashes, const std::string& url) {
  std::lock_guard lock(mu_);
  for (auto h : hashes) {
    if (auto it = index_.find(h); it != index_.end()) {
      it->second->second = url;
      lru_.splice(lru_.begin(), lru_, it->second);
      continue;
    }
    lru_.emplace_front(h, url);
    index_[h] = lru_.begin();
    if (index_.size() > config_.max_entries) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
  }
}

std::size_t PrefixMap::size() const {
  std::lock_guard lock(mu_);
  return index_.size();
}

std::optional<std::size_t> Router::pick(const std::vector<Candidate>& cs, const Input& in) {
  const auto version = pick_version(cs, in.header_version, in.sticky_key, in.draw);
  if (!version) return std::nullopt;
  if (model_.affinity.enabled && !in.session_key.empty()) return pick_by_key(cs, *version, in.session_key);
  return by_policy(cs, *version, in);
}

std::optional<std::size_t> Router::by_policy(const std::vector<Candidate>& cs, const std::string& version, const Input& in) {
  boost::container::small_vector<std::size_t, 8> ok;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (cs[i].available && cs[i].version == version) ok.push_back(i);
  }
  if (ok.empty()) return std::nullopt;
  const auto turn = static_cast<std::uint64_t>(turns_.next_of_thread());
  // Ties go round-robin, so equal replicas share the load.
  auto least = [&](auto score) {
    std::size_t best = ok[turn % ok.size()];
    for (std::size_t k = 0; k < ok.size(); ++k) {
      const std::size_t i = ok[(turn + k) % ok.size()];
      if (score(cs[i]) < score(cs[best])) best = i;
    }
    return best;
  };
  switch (model_.policy) {
    case Policy::kRoundRobin:
      return ok[turn % ok.size()];
    case Policy::kLeastOutstanding:
      return least([](const Candidate& c) { return static_cast<double>(c.outstanding); });
    case Policy::kKvAware:
      return least(load_score);
    case Policy::kPrefixAware: {
      const std::size_t fallback = least([](const Candidate& c) { return static_cast<double>(c.outstanding); });
      const auto hashes = prefix_.block_hashes(in.prompt);
      if (hashes.empty()) return fallback;
      std::optional<std::size_t> chosen;
      if (auto hit = prefix_.longest(hashes)) {
        for (auto i : ok) {
          if (cs[i].url == hit->first) chosen = i;
        }
      }
      // The replica holding the prefix, unless it is busier than the least loaded by more than
      // the threshold (then the prefix moves to where there is room).
      if (!chosen || cs[*chosen].outstanding - cs[fallback].outstanding > prefix_.config().balance_threshold) chosen = fallback;
      prefix_.record(hashes, std::string(cs[*chosen].url));
      return chosen;
    }
  }
  return std::nullopt;
}

}  // namespace lmserve::gateway
