#include "gateway/replicas.h"

#include <algorithm>
#include <set>

namespace lmserve::gateway {

namespace {
std::string url_of(const boost::asio::ip::address& a, std::uint16_t port) {
  const auto s = a.to_string();
  return "http://" + (a.is_v6() ? "[" + s + "]" : s) + ":" + std::to_string(port);
}
}  // namespace

Replica::Replica(boost::asio::ip::address address, std::uint16_t port)
    : endpoint_(address, port), url_(url_of(address, port)), host_port_(url_.substr(std::string_view("http://").size())) {}

bool Replica::available(Clock::time_point now) const {
  return healthy_.load(std::memory_order_relaxed) && now >= ejected_until_.get() && now >= retry_after_until_.get();
}

bool Replica::usable_in_panic(Clock::time_point now) const {
  return healthy_.load(std::memory_order_relaxed) && now >= retry_after_until_.get();
}

bool Replica::healthy() const { return healthy_.load(std::memory_order_relaxed); }

bool Replica::on_failure(Clock::time_point now, const EjectConfig& eject) {
  std::lock_guard lock(mu_);
  if (now < ejected_until_.get()) return false;  // already out: the requests of that moment failing too
  backoff_ = backoff_.count() == 0 ? eject.base : std::min(eject.max, backoff_ * 2);
  backing_off_ = true;
  ejected_until_.set(now + backoff_);
  return true;
}

void Replica::on_success() {
  if (!backing_off_.load(std::memory_order_relaxed)) return;  // the common case: nothing to write
  std::lock_guard lock(mu_);
  backoff_ = std::chrono::milliseconds(0);
  backing_off_ = false;
}

void Replica::on_retry_after(Clock::time_point until) {
  std::lock_guard lock(mu_);
  retry_after_until_.set(std::max(retry_after_until_.get(), until));
}

int Replica::on_check(bool passed, const HealthConfig& health) {
  std::lock_guard lock(mu_);
  if (passed) {
    fails_ = 0;
    if (!healthy_ && ++passes_ >= health.pass_after) {
      healthy_ = true;
      passes_ = 0;
      backoff_ = std::chrono::milliseconds(0);
      backing_off_ = false;
      ejected_until_.set({});  // it answered its checks: back in at once
      return +1;
    }
    return 0;
  }
  passes_ = 0;
  if (healthy_ && ++fails_ >= health.fail_after) {
    healthy_ = false;
    fails_ = 0;
    return -1;
  }
  return 0;
}

void Replica::set_load(ReplicaLoad load) {
  std::lock_guard lock(mu_);
  load_ = std::move(load);
}

void Replica::set_metrics_text(std::string text) {
  std::lock_guard lock(mu_);
  metrics_text_ = std::move(text);
}

std::string Replica::metrics_text() const {
  std::lock_guard lock(mu_);
  return metrics_text_;
}

Replica::LoadFigures Replica::load_for(const std::string& lane) const {
  std::lock_guard lock(mu_);
  LoadFigures f{load_.scraped, load_.at, load_.kv_usage, load_.waiting};
  if (!lane.empty()) {
    if (auto it = load_.waiting_by_lane.find(lane); it != load_.waiting_by_lane.end()) f.waiting = it->second;
  }
  return f;
}

Replica::IdlePool& Replica::my_pool() {
  static std::atomic<std::size_t> next{0};
  thread_local const std::size_t slot = next++ % kPools;
  return idle_[slot];
}

std::optional<UpstreamSocket> Replica::take_idle(boost::asio::io_context& io) {
  // Not checked for the replica having closed it meanwhile: that costs a system call per
  // request, and the proxy retries a reused connection that fails at once on a fresh one.
  auto& pool = my_pool();
  std::lock_guard lock(pool.mu);
  for (auto it = pool.sockets.rbegin(); it != pool.sockets.rend(); ++it) {  // the most recently used first
    if (&it->get_executor().context() != &io) continue;
    auto s = std::move(*it);
    pool.sockets.erase(std::next(it).base());
    return s;
  }
  return std::nullopt;
}

void Replica::put_idle(UpstreamSocket socket) {
  auto& pool = my_pool();
  std::lock_guard lock(pool.mu);
  if (pool.sockets.size() >= kMaxIdle || !healthy()) {
    boost::system::error_code ec;
    socket.close(ec);
    return;
  }
  pool.sockets.push_back(std::move(socket));
}

void Replica::close_idle() {
  for (auto& pool : idle_) {
    std::lock_guard lock(pool.mu);
    for (auto& s : pool.sockets) {
      boost::system::error_code ec;
      s.close(ec);
    }
    pool.sockets.clear();
  }
}

ReplicaRegistry::~ReplicaRegistry() {
  for (const auto& [_, list] : by_backend_) {
    for (const auto& r : list) r->close_idle();
  }
}

std::vector<std::shared_ptr<Replica>> ReplicaRegistry::of(const BackendConfig& backend) const {
  std::lock_guard lock(mu_);
  auto it = by_backend_.find(key(backend.host, backend.port));
  return it == by_backend_.end() ? std::vector<std::shared_ptr<Replica>>{} : it->second;
}

std::uint64_t ReplicaRegistry::next_instance() {
  static std::atomic<std::uint64_t> n{1};
  return n++;
}

const std::vector<std::shared_ptr<Replica>>& ReplicaRegistry::view_of(const BackendConfig& backend) const {
  struct View {
    std::uint64_t instance = 0, generation = 0;
    std::map<std::string, std::vector<std::shared_ptr<Replica>>, std::less<>> by_backend;
    std::string key;  // reused: looking a backend up allocates nothing
  };
  thread_local View view;
  const auto gen = generation_.load(std::memory_order_acquire);
  if (view.instance != instance_ || view.generation != gen) {
    std::lock_guard lock(mu_);
    // Each replica through a holder of this thread's own: copying a replica's pointer (every
    // request does) then counts on the holder's block, not on one every thread shares.
    view.by_backend.clear();
    for (const auto& [k, list] : by_backend_) {
      auto& mine = view.by_backend[k];
      for (const auto& r : list) {
        auto holder = std::make_shared<std::shared_ptr<Replica>>(r);
        mine.push_back(std::shared_ptr<Replica>(holder, r.get()));
      }
    }
    view.instance = instance_;
    view.generation = generation_.load();
  }
  view.key.assign(backend.host).append("|").append(std::to_string(backend.port));
  static const std::vector<std::shared_ptr<Replica>> kNone;
  auto it = view.by_backend.find(view.key);
  return it == view.by_backend.end() ? kNone : it->second;
}

void ReplicaRegistry::set_addresses(const std::string& host, std::uint16_t port, const std::vector<boost::asio::ip::address>& addresses) {
  std::lock_guard lock(mu_);
  auto& list = by_backend_[key(host, port)];
  std::vector<std::shared_ptr<Replica>> next;
  std::set<boost::asio::ip::address> seen;
  for (const auto& a : addresses) {
    if (!seen.insert(a).second) continue;
    auto it = std::find_if(list.begin(), list.end(), [&](const auto& r) { return r->endpoint().address() == a; });
    next.push_back(it != list.end() ? *it : std::make_shared<Replica>(a, port));
  }
  for (const auto& r : list) {
    if (std::find(next.begin(), next.end(), r) == next.end()) r->close_idle();
  }
  if (next != list) ++generation_;
  list = std::move(next);
}

void ReplicaRegistry::retain(const std::vector<std::pair<std::string, std::uint16_t>>& backends) {
  std::set<std::string> keep;
  for (const auto& [h, p] : backends) keep.insert(key(h, p));
  std::lock_guard lock(mu_);
  for (auto it = by_backend_.begin(); it != by_backend_.end();) {
    if (keep.contains(it->first)) {
      ++it;
      continue;
    }
    for (const auto& r : it->second) r->close_idle();
    it = by_backend_.erase(it);
    ++generation_;
  }
}

std::vector<std::shared_ptr<Replica>> ReplicaRegistry::all() const {
  std::lock_guard lock(mu_);
  std::vector<std::shared_ptr<Replica>> out;
  std::set<Replica*> seen;
  for (const auto& [k, list] : by_backend_) {
    for (const auto& r : list) {
      if (seen.insert(r.get()).second) out.push_back(r);
    }
  }
  return out;
}

}  // namespace lmserve::gateway
