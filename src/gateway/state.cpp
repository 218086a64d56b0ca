#include "gateway/state.h"

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

namespace lmserve::gateway {

Snapshot::Snapshot(GatewayConfig c) : config(std::move(c)) {
  for (const auto& m : config.models) routers.emplace(m.name, std::make_unique<Router>(m, config.prefix));
}

std::uint64_t State::next_instance() {
  static std::atomic<std::uint64_t> n{1};
  return n++;
}

void State::set(std::shared_ptr<Snapshot> snapshot) {
  snapshot_.store(std::move(snapshot));
  ++generation_;
}

std::shared_ptr<Snapshot> State::current() {
  struct Cache {
    std::uint64_t instance = 0, generation = 0;
    std::shared_ptr<Snapshot> local;  // shares a control block of this thread's own
  };
  thread_local Cache cache;
  const auto gen = generation_.load(std::memory_order_acquire);
  if (cache.instance != instance_ || cache.generation != gen || !cache.local) {
    // A holder of the shared pointer, owned by this thread's copies alone: copying `local` counts
    // on the holder's block, and the snapshot lives while any of them does.
    auto holder = std::make_shared<std::shared_ptr<Snapshot>>(snapshot_.load());
    cache = {instance_, gen, std::shared_ptr<Snapshot>(holder, holder->get())};
  }
  return cache.local;
}

std::uint64_t State::next_id() {
  constexpr std::uint64_t kBlock = 1024;
  thread_local std::uint64_t instance = 0, next = 0, end = 0;
  if (instance != instance_ || next == end) {
    instance = instance_;
    next = ids_.fetch_add(kBlock);
    end = next + kBlock;
  }
  return next++;
}

namespace {
// An I/O thread's records of this turn of its event loop.
struct AuditTurn {
  std::vector<std::string> records;
  std::vector<std::function<void(bool)>> thens;
};
thread_local AuditTurn tl_audit;
}  // namespace

void State::audit_then(boost::asio::io_context& io, std::string record, std::function<void(bool ok)> then) {
  auto& turn = tl_audit;
  if (turn.records.empty()) {
    // Posted now, it runs after the handlers already queued: those of this turn's events.
    boost::asio::post(io, [this, &io] {
      auto& t = tl_audit;
      audit->append(std::move(t.records), [this, &io, thens = std::move(t.thens), fail_closed = audit_fail_closed](const Status& st) mutable {
        if (!st.is_ok()) spdlog::error("gateway: {} audit record(s) not written: {}", thens.size(), st.message());
        audit_failing.store(!st.is_ok(), std::memory_order_relaxed);
        // Moved, not copied: each continuation holds a request's routing state.
        boost::asio::post(io, [thens = std::move(thens), ok = st.is_ok() || !fail_closed] {
          for (const auto& each : thens) {
            if (each) each(ok);
          }
        });
      });
      t.records.clear();  // (moved from)
      t.thens.clear();
    });
  }
  turn.records.push_back(std::move(record));
  turn.thens.push_back(std::move(then));
}

void candidates(const State& state, const GatewayConfig& config, const ModelConfig& model, const std::string& lane,
                std::span<const Replica* const> exclude, std::vector<Candidate>& cs,
                std::vector<const std::shared_ptr<Replica>*>& replicas) {
  cs.clear();
  replicas.clear();
  const auto now = Clock::now();
  // A scrape older than three intervals is stale: the replica counts as loaded.
  const auto stale_after = 3 * config.scrape_interval;
  const bool needs_load = model.policy == Policy::kKvAware;
  const auto tried = [&](const Replica* r) { return std::find(exclude.begin(), exclude.end(), r) != exclude.end(); };
  for (const auto& b : model.backends) {
    const auto& rs = state.replicas.view_of(b);
    for (const auto& r : rs) {
      Candidate& c = cs.emplace_back();
      c.url = r->url();
      c.version = b.version;
      // A name resolving to several replicas shares its backend's weight among them.
      c.weight = static_cast<std::uint32_t>((std::uint64_t{b.weight} * 1000) / rs.size());
      c.available = r->available(now) && !tried(r.get());
      if (needs_load) {
        const auto load = r->load_for(lane);
        c.fresh = load.scraped && now - load.at <= stale_after;
        c.kv_usage = load.kv_usage;
        c.waiting = load.waiting;
      }
      replicas.push_back(&r);
    }
  }
  // Panic: with every replica ejected, ejections are ignored (as Envoy's panic threshold does),
  // so that one failure on each replica does not turn into 503s for the ejection's length.
  if (std::none_of(cs.begin(), cs.end(), [](const Candidate& c) { return c.available; })) {
    for (std::size_t i = 0; i < cs.size(); ++i) cs[i].available = (*replicas[i])->usable_in_panic(now) && !tried(replicas[i]->get());
  }
  // The outstanding counts, summed over the I/O threads' shards, only where they can decide
  // something: a policy that reads them, with a choice among replicas.
  if (model.policy != Policy::kRoundRobin && std::count_if(cs.begin(), cs.end(), [](const Candidate& c) { return c.available; }) > 1) {
    for (std::size_t i = 0; i < cs.size(); ++i) cs[i].outstanding = (*replicas[i])->outstanding.sum();
  }
}

}  // namespace lmserve::gateway
