#include "gateway/state.h"

#include <algorithm>

namespace lmserve::gateway {

Snapshot::Snapshot(GatewayConfig c) : config(std::move(c)) {
  for (const auto& m : config.models) routers.emplace(m.name, std::make_unique<Router>(m, config.prefix));
}

std::vector<Candidate> candidates(const State& state, const GatewayConfig& config, const ModelConfig& model, const std::string& lane,
                                  const std::vector<const Replica*>& exclude, std::vector<std::shared_ptr<Replica>>& replicas) {
  std::vector<Candidate> cs;
  replicas.clear();
  const auto now = Clock::now();
  // A scrape older than three intervals is stale: the replica counts as loaded.
  const auto stale_after = 3 * config.scrape_interval;
  for (const auto& b : model.backends) {
    auto rs = state.replicas.of(b);
    for (const auto& r : rs) {
      Candidate c;
      c.url = r->url();
      c.version = b.version;
      // A name resolving to several replicas shares its backend's weight among them.
      c.weight = static_cast<std::uint32_t>((std::uint64_t{b.weight} * 1000) / rs.size());
      c.available = r->available(now) && std::find(exclude.begin(), exclude.end(), r.get()) == exclude.end();
      c.outstanding = r->outstanding.load();
      const auto load = r->load_for(lane);
      c.fresh = load.scraped && now - load.at <= stale_after;
      c.kv_usage = load.kv_usage;
      c.waiting = load.waiting;
      cs.push_back(std::move(c));
      replicas.push_back(r);
    }
  }
  // Panic: with every replica ejected, ejections are ignored (as Envoy's panic threshold does),
  // so that one failure on each replica does not turn into 503s for the ejection's length.
  if (std::none_of(cs.begin(), cs.end(), [](const Candidate& c) { return c.available; })) {
    for (std::size_t i = 0; i < cs.size(); ++i) {
      cs[i].available = replicas[i]->usable_in_panic(now) && std::find(exclude.begin(), exclude.end(), replicas[i].get()) == exclude.end();
    }
  }
  return cs;
}

}  // namespace lmserve::gateway
