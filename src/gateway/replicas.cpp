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
  std::lock_guard lock(mu_);
  return healthy_ && now >= ejected_until_ && now >= retry_after_until_;
}

bool Replica::usable_in_panic(Clock::time_point now) const {
  std::lock_guard lock(mu_);
  return healthy_ && now >= retry_after_until_;
}

bool Replica::healthy() const {
  std::lock_guard lock(mu_);
  return healthy_;
}

bool Replica::on_failure(Clock::time_point now, const EjectConfig& eject) {
  std::lock_guard lock(mu_);
  if (now < ejected_until_) return false;  // already out: the requests of that moment failing too
  backoff_ = backoff_.count() == 0 ? eject.base : std::min(eject.max, backoff_ * 2);
  ejected_until_ = now + backoff_;
  return true;
}

void Replica::on_success() {
  std::lock_guard lock(mu_);
  backoff_ = std::chrono::milliseconds(0);
}

void Replica::on_retry_after(Clock::time_point until) {
  std::lock_guard lock(mu_);
  retry_after_until_ = std::max(retry_after_until_, until);
}

int Replica::on_check(bool passed, const HealthConfig& health) {
  std::lock_guard lock(mu_);
  if (passed) {
    fails_ = 0;
    if (!healthy_ && ++passes_ >= health.pass_after) {
      healthy_ = true;
      passes_ = 0;
      backoff_ = std::chrono::milliseconds(0);
      ejected_until_ = {};  // it answered its checks: back in at once
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

Replica::LoadFigures Replica::load_for(const std::string& lane) const {
  std::lock_guard lock(mu_);
  LoadFigures f{load_.scraped, load_.at, load_.kv_usage, load_.waiting};
  if (!lane.empty()) {
    if (auto it = load_.waiting_by_lane.find(lane); it != load_.waiting_by_lane.end()) f.waiting = it->second;
  }
  return f;
}

std::optional<boost::asio::ip::tcp::socket> Replica::take_idle() {
  // Not checked for the replica having closed it meanwhile: that costs a system call per
  // request, and the proxy retries a reused connection that fails at once on a fresh one.
  std::lock_guard lock(mu_);
  if (idle_.empty()) return std::nullopt;
  auto s = std::move(idle_.back());
  idle_.pop_back();
  return s;
}

void Replica::put_idle(boost::asio::ip::tcp::socket socket) {
  std::lock_guard lock(mu_);
  if (idle_.size() >= kMaxIdle || !healthy_) {
    boost::system::error_code ec;
    socket.close(ec);
    return;
  }
  idle_.push_back(std::move(socket));
}

void Replica::close_idle() {
  std::lock_guard lock(mu_);
  for (auto& s : idle_) {
    boost::system::error_code ec;
    s.close(ec);
  }
  idle_.clear();
}

std::vector<std::shared_ptr<Replica>> ReplicaRegistry::of(const BackendConfig& backend) const {
  std::lock_guard lock(mu_);
  auto it = by_backend_.find(key(backend.host, backend.port));
  return it == by_backend_.end() ? std::vector<std::shared_ptr<Replica>>{} : it->second;
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
