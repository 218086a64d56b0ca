#include "common/startup.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <mutex>

namespace lmserve {

namespace {

const auto g_process_start = std::chrono::steady_clock::now();  // at static initialisation

struct Registry {
  std::mutex mu;
  std::vector<std::pair<std::string, double>> phases;
  std::vector<std::string> open;  // begun and not ended, innermost last
  std::atomic<bool> complete{false};
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

StartupPhase::StartupPhase(std::string name) : name_(std::move(name)), start_(std::chrono::steady_clock::now()) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.open.push_back(name_);
}

StartupPhase::~StartupPhase() {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  auto& r = registry();
  {
    std::lock_guard lock(r.mu);
    if (auto o = std::find(r.open.rbegin(), r.open.rend(), name_); o != r.open.rend()) r.open.erase(std::next(o).base());
  }
  if (r.complete.load()) return;
  {
    std::lock_guard lock(r.mu);
    auto it = std::find_if(r.phases.begin(), r.phases.end(), [&](const auto& p) { return p.first == name_; });
    if (it == r.phases.end()) r.phases.emplace_back(name_, s);
    else it->second += s;
  }
  spdlog::debug("start-up: {} {:.3f} s", name_, s);  // all of them in one line at info: startup_complete()
}

void startup_complete() {
  auto& r = registry();
  if (r.complete.exchange(true)) return;
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - g_process_start).count();
  std::string table;
  {
    std::lock_guard lock(r.mu);
    r.phases.emplace_back("total", total);
    for (const auto& [name, s] : r.phases) table += fmt::format("{}{} {:.3f} s", table.empty() ? "" : ", ", name, s);
  }
  spdlog::info("start-up complete: {}", table);
}

std::string startup_current_phase() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  return r.open.empty() ? std::string() : r.open.back();
}

bool startup_is_complete() { return registry().complete.load(); }

std::vector<std::pair<std::string, double>> startup_phases() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  return r.phases;
}

}  // namespace lmserve
