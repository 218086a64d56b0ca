#include "backend/device/tuning_cache.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace lmserve::backend {

namespace {

constexpr int kFormat = 1;

nlohmann::json to_json(const TuningIdentity& i) {
  return {{"gpu", i.gpu},         {"multiprocessors", i.multiprocessors}, {"compute_capability", i.compute_capability}, {"driver", i.driver},
          {"cuda_runtime", i.cuda_runtime}, {"cublaslt", i.cublaslt}, {"build", i.build}};
}

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string hex(const AlgoCache::Algo& a) {
  std::string out;
  char buf[17];
  for (auto w : a) {
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(w));
    out += buf;
  }
  return out;
}

std::optional<AlgoCache::Algo> unhex(const std::string& s) {
  if (s.size() != 8 * 16) return std::nullopt;
  AlgoCache::Algo a{};
  for (std::size_t i = 0; i < 8; ++i) {
    std::uint64_t w = 0;
    for (std::size_t j = 0; j < 16; ++j) {
      const char c = s[i * 16 + j];
      const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (v < 0) return std::nullopt;
      w = w << 4 | static_cast<std::uint64_t>(v);
    }
    a[i] = w;
  }
  return a;
}

std::optional<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::unique_ptr<TuningCache> TuningCache::open(const std::filesystem::path& dir, TuningIdentity identity) {
  char name[64];
  std::snprintf(name, sizeof name, "tuning-%016llx.json", static_cast<unsigned long long>(fnv1a(to_json(identity).dump())));
  std::unique_ptr<TuningCache> c(new TuningCache(dir / name, std::move(identity)));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  auto text = read_file(c->file_);
  if (!text) {
    c->note_ = "no file yet";
    return c;
  }
  std::string why;
  if (auto entries = c->parse(*text, &why)) {
    c->entries_ = std::move(*entries);
  } else {
    c->note_ = why;
  }
  return c;
}

std::optional<std::map<std::string, AlgoCache::Algo>> TuningCache::parse(const std::string& text, std::string* why) const {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object() || !j.contains("format") || !j.contains("identity") || !j.contains("plans") || !j["plans"].is_object()) {
    *why = "not a tuning cache file; ignored";
    return std::nullopt;
  }
  if (j["format"] != kFormat) {
    *why = "written in another format; ignored";
    return std::nullopt;
  }
  if (j["identity"] != to_json(identity_)) {
    *why = "made for another GPU, driver, library or build (" + j["identity"].dump() + "); ignored";
    return std::nullopt;
  }
  std::map<std::string, Algo> out;
  for (const auto& [shape, v] : j["plans"].items()) {
    auto a = v.is_string() ? unhex(v.get<std::string>()) : std::nullopt;
    if (!a) {
      *why = "holds a malformed entry (" + shape + "); ignored";
      return std::nullopt;
    }
    out.emplace(shape, *a);
  }
  return out;
}

std::optional<AlgoCache::Algo> TuningCache::find(const std::string& shape) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(shape);
  if (it == entries_.end()) {
    ++misses_;
    return std::nullopt;
  }
  ++hits_;
  return it->second;
}

void TuningCache::put(const std::string& shape, const Algo& algo) {
  std::lock_guard lock(mu_);
  auto [it, added] = entries_.emplace(shape, algo);
  if (!added && it->second == algo) return;
  it->second = algo;
  dirty_ = true;
}

Status TuningCache::save() {
  std::lock_guard lock(mu_);
  if (!dirty_) return Status::ok();
  // What another replica wrote meanwhile (of this identity) joins ours; ours win on a clash.
  std::map<std::string, Algo> merged;
  if (auto text = read_file(file_)) {
    std::string why;
    if (auto theirs = parse(*text, &why)) merged = std::move(*theirs);
  }
  for (const auto& [k, v] : entries_) merged[k] = v;
  nlohmann::json plans = nlohmann::json::object();
  for (const auto& [k, v] : merged) plans[k] = hex(v);
  const nlohmann::json j = {{"format", kFormat}, {"identity", to_json(identity_)}, {"plans", plans}};
  static std::atomic<unsigned> serial{0};  // several caches of one process may save at once
  const auto tmp = file_.string() + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(serial++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << j.dump(1) << "\n";
    out.flush();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      return Status(StatusCode::kUnavailable, "tuning cache: cannot write " + tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, file_, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return Status(StatusCode::kUnavailable, "tuning cache: cannot replace " + file_.string() + ": " + ec.message());
  }
  entries_ = std::move(merged);
  dirty_ = false;
  return Status::ok();
}

std::size_t TuningCache::hits() const {
  std::lock_guard lock(mu_);
  return hits_;
}
std::size_t TuningCache::misses() const {
  std::lock_guard lock(mu_);
  return misses_;
}
std::size_t TuningCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace lmserve::backend
