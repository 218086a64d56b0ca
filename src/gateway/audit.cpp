#include "gateway/audit.h"

#include "gateway/digest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <vector>

namespace lmserve::gateway {

namespace fs = std::filesystem;

namespace {

const std::string kGenesis(64, '0');

std::string segment_name(std::uint64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "audit-%06llu.jsonl", static_cast<unsigned long long>(n));
  return buf;
}

// The segments in a directory, by number.
std::vector<std::pair<std::uint64_t, fs::path>> segments(const std::string& dir) {
  std::vector<std::pair<std::uint64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file()) continue;  // (a device would be read forever)
    const auto name = e.path().filename().string();
    unsigned long long n = 0;
    char tail[8] = {0};
    if (std::sscanf(name.c_str(), "audit-%6llu.%5s", &n, tail) == 2 && std::string(tail) == "jsonl" && name.size() == 18) out.emplace_back(n, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A record line's layout: {"hash":"<64>","prev":"<64>","rec":<the record's text>}. The hash is over
// the record's text as written, byte for byte.
constexpr std::string_view kHashKey = R"({"hash":")", kPrevKey = R"(","prev":")", kRecKey = R"(","rec":)";
constexpr std::size_t kRecAt = kHashKey.size() + 64 + kPrevKey.size() + 64 + kRecKey.size();

// The record's text in a line laid out as written, with its hash and prev; false when the line is
// not laid out so.
bool split_line(std::string_view line, std::string_view& hash, std::string_view& prev, std::string_view& rec) {
  if (line.size() < kRecAt + 3 || !line.starts_with(kHashKey) || line.substr(kHashKey.size() + 64, kPrevKey.size()) != kPrevKey ||
      line.substr(kRecAt - kRecKey.size(), kRecKey.size()) != kRecKey || line.back() != '}') {
    return false;
  }
  hash = line.substr(kHashKey.size(), 64);
  prev = line.substr(kHashKey.size() + 64 + kPrevKey.size(), 64);
  rec = line.substr(kRecAt, line.size() - kRecAt - 1);
  return true;
}

// Walks one segment's lines, checking the chain from `hash`; returns false with `why` (and the
// line number) at the first break. `sealed` tells whether it ended with its seal.
bool walk(const fs::path& path, std::string& hash, std::uint64_t& records, bool& sealed, std::uint64_t& line_no, std::string& why) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    why = "cannot be read";
    return false;
  }
  sealed = false;
  std::uint64_t in_segment = 0;
  line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (sealed) {
      why = "a line after the seal";
      return false;
    }
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      why = "not a JSON object";
      return false;
    }
    if (j.contains("seal")) {
      if (!j["seal"].is_string() || j["seal"] != hash || !j.contains("records") || j["records"] != in_segment) {
        why = "the seal does not match the records before it";
        return false;
      }
      sealed = true;
      continue;
    }
    std::string_view line_hash, line_prev, rec;
    if (j.size() != 3 || !j.contains("rec") || !j["rec"].is_object() || !split_line(line, line_hash, line_prev, rec)) {
      why = "not an audit record";
      return false;
    }
    if (line_prev != hash) {
      why = "the previous hash does not match (a record before it was changed, removed or moved)";
      return false;
    }
    if (line_hash != sha256_hex(hash, rec)) {
      why = "its hash does not match its content (the record was changed)";
      return false;
    }
    hash = std::string(line_hash);
    ++in_segment;
    ++records;
  }
  return true;
}

}  // namespace

AuditVerdict verify_audit(const std::string& dir) {
  AuditVerdict v;
  if (!fs::is_directory(dir)) {
    v.broken = dir + ": not a directory";
    return v;
  }
  const auto segs = segments(dir);
  std::string hash = kGenesis;
  std::uint64_t expect = segs.empty() ? 0 : segs.front().first;
  for (std::size_t i = 0; i < segs.size(); ++i) {
    const auto& [n, path] = segs[i];
    const auto name = path.filename().string();
    if (n != expect) {
      v.broken = segment_name(expect) + ": missing (the segments jump to " + name + ")";
      return v;
    }
    ++expect;
    bool sealed = false;
    std::uint64_t line = 0;
    std::string why;
    if (!walk(path, hash, v.records, sealed, line, why)) {
      v.broken = name + ":" + std::to_string(line) + ": " + why;
      return v;
    }
    if (!sealed && i + 1 < segs.size()) {
      v.broken = name + ": not sealed, yet another segment follows";
      return v;
    }
    ++v.segments;
  }
  v.ok = true;
  return v;
}

Result<std::unique_ptr<AuditLog>> AuditLog::open(const std::string& dir, Options options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir)) return error(StatusCode::kUnavailable, "audit.dir: cannot create " + dir);
  std::unique_ptr<AuditLog> log(new AuditLog());
  log->dir_ = dir;
  log->opt_ = options;
  log->written_hash_ = kGenesis;
  const auto segs = segments(dir);
  if (segs.empty()) {
    log->segment_ = 1;
  } else {
    // Go on from the chain there; it must hold (only the last segment is walked: the rest is
    // for `audit verify`).
    const auto& [n, path] = segs.back();
    std::string hash;
    if (segs.size() == 1) {
      hash = kGenesis;
    } else {
      // The previous segment's seal is where this one starts.
      std::ifstream in(segs[segs.size() - 2].second, std::ios::binary);
      std::string line, last;
      while (std::getline(in, line)) last = line;
      const auto j = nlohmann::json::parse(last, nullptr, false);
      if (j.is_discarded() || !j.contains("seal")) return error(StatusCode::kDataLoss, "audit.dir: " + segs[segs.size() - 2].second.string() + " is not sealed");
      hash = j["seal"].get<std::string>();
    }
    std::uint64_t records = 0, line = 0;
    bool sealed = false;
    std::string why;
    if (!walk(path, hash, records, sealed, line, why)) {
      return error(StatusCode::kDataLoss, "audit.dir: " + path.filename().string() + ":" + std::to_string(line) + ": " + why);
    }
    log->written_hash_ = hash;
    log->segment_ = sealed ? n + 1 : n;
    log->in_segment_ = sealed ? 0 : records;
  }
  if (auto st = log->begin_segment(); !st.is_ok()) return error(st);
  if (options.sync) log->writer_ = std::thread([l = log.get()] { l->run(); });
  return log;
}

AuditLog::~AuditLog() {
  if (writer_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    queued_cv_.notify_one();
    writer_.join();
  }
  if (fd_ >= 0) ::close(fd_);
  {
    std::lock_guard lock(retire_mu_);
    retire_stop_ = true;
  }
  retire_cv_.notify_one();
  if (retirer_.joinable()) retirer_.join();  // after the segments it was given are flushed
}

// A sealed segment, once on the disk, is never read by the gateway again: its pages leave the page
// cache, so that the next segment's writes take pages the kernel has just freed. Left cached, a
// trail of ~1 KB a request grew the cache by ~60 MB a second, the write path taking fresh pages
// (and on a virtual machine, memory its host had not yet given it): on the build VM the policy
// gateway's system time a request rose by a third within 20 s (docs/perf.md, the 48th session).
static void drop_cached(int fd) { (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED); }

void AuditLog::retire(int fd) {
  std::lock_guard lock(retire_mu_);
  retired_.push_back(fd);
  if (!retirer_.joinable()) retirer_ = std::thread([this] { run_retirer(); });
  retire_cv_.notify_one();
}

void AuditLog::run_retirer() {
  std::unique_lock lock(retire_mu_);
  for (;;) {
    retire_cv_.wait(lock, [&] { return retire_stop_ || !retired_.empty(); });
    if (retired_.empty()) return;  // stopping, and nothing left
    std::vector<int> fds;
    fds.swap(retired_);
    lock.unlock();
    for (const int fd : fds) {
      // The records were written and answered: a flush that fails can only be reported.
      if (::fdatasync(fd) != 0) spdlog::error("audit: a sealed segment could not be flushed to the disk: {}", std::strerror(errno));
      drop_cached(fd);
      ::close(fd);
    }
    lock.lock();
  }
}

Status AuditLog::begin_segment() {
  const auto path = (fs::path(dir_) / segment_name(segment_)).string();
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd_ < 0) return Status(StatusCode::kUnavailable, "audit: cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  segment_size_ = ::fstat(fd_, &st) == 0 ? static_cast<std::size_t>(st.st_size) : 0;
  return Status::ok();
}

// Writes all of `line` or fails; a short write is undone (the chain stays whole).
static Status write_line(int fd, const std::string& line, bool sync, std::size_t size_before) {
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      if (done > 0) (void)::ftruncate(fd, static_cast<off_t>(size_before));
      return Status(StatusCode::kUnavailable, std::string("audit: cannot write a record: ") + std::strerror(err));
    }
    done += static_cast<std::size_t>(n);
  }
  if (sync && ::fdatasync(fd) != 0) return Status(StatusCode::kUnavailable, std::string("audit: cannot sync a record: ") + std::strerror(errno));
  return Status::ok();
}

Status AuditLog::seal() {
  const std::string line = nlohmann::json{{"seal", written_hash_}, {"records", in_segment_}}.dump() + "\n";
  if (auto st = write_line(fd_, line, opt_.sync, segment_size_); !st.is_ok()) return st;
  if (opt_.sync) {  // flushed with its seal
    drop_cached(fd_);
    ::close(fd_);
  } else {
    retire(fd_);
  }
  fd_ = -1;
  ++segment_;
  in_segment_ = 0;
  return begin_segment();
}

void AuditLog::append(std::vector<std::string> records, Done done) {
  std::unique_lock lock(mu_);
  queue_.push_back({std::move(records), std::move(done)});
  if (opt_.sync) {  // the writer thread waits on the disk, not the caller
    lock.unlock();
    queued_cv_.notify_one();
    return;
  }
  if (writing_) return;  // the thread writing takes this group with its next batch
  // This thread writes: what is queued, then what others queue meanwhile, until nothing is.
  writing_ = true;
  write_queued(lock);
  writing_ = false;
}

// Writes everything queued, batch after batch, until the queue is empty; each batch's callbacks
// run outside the lock. `lock` holds mu_ on entry and on return.
void AuditLog::write_queued(std::unique_lock<std::mutex>& lock) {
  std::vector<Queued> batch;
  while (!queue_.empty()) {
    batch.swap(queue_);
    lock.unlock();
    const Status st = write_batch(batch);
    for (auto& q : batch) q.done(st);
    batch.clear();
    lock.lock();
  }
}

Status AuditLog::append(const nlohmann::json& rec) {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<Status> outcome;
  append({rec.dump()}, [&](const Status& st) {
    std::lock_guard lock(mu);
    outcome = st;
    cv.notify_one();
  });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return outcome.has_value(); });
  return *outcome;
}

// The `sync` writer: everything queued since its last write goes out together, then the callbacks
// run. On destruction it writes what is queued before it ends.
void AuditLog::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    queued_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left
    write_queued(lock);
  }
}

// One batch chained onto the last record written and written at once. A batch that cannot be
// written fails alone: the next one chains onto the last record that was written, as this one did.
Status AuditLog::write_batch(const std::vector<Queued>& batch) {
  if (fd_ < 0) {  // a seal that failed to begin the next segment
    if (auto st = begin_segment(); !st.is_ok()) return st;
  }
  std::string lines, prev = written_hash_;
  std::uint64_t n = 0;
  for (const auto& q : batch) {
    for (const auto& record : q.records) {
      const auto hash = sha256_hex(prev, record);
      lines.append(kHashKey).append(hash).append(kPrevKey).append(prev).append(kRecKey).append(record).append("}\n");
      prev = hash;
      ++n;
    }
  }
  if (auto st = write_line(fd_, lines, opt_.sync, segment_size_); !st.is_ok()) return st;
  segment_size_ += lines.size();
  in_segment_ += n;
  appended_ += n;
  written_hash_ = prev;
  if (segment_size_ >= opt_.segment_bytes) {
    // The records are in: a seal that fails is tried again after the next batch.
    if (auto sealed = seal(); !sealed.is_ok()) spdlog::error("{}", sealed.message());
  }
  return Status::ok();
}

std::uint64_t AuditLog::records() const { return appended_.load(); }

}  // namespace lmserve::gateway
