// gateway/audit: the tamper-evident audit trail (issue #30). Records are JSON lines in segment
// files `audit-NNNNNN.jsonl` under one directory, each line
//
//   {"hash":"<SHA-256 of prev followed by rec>","prev":"<the previous line's hash>","rec":{...}}
//
// (the hash is over the record's text as it stands in the line, byte for byte), the first line
// of the first segment with a prev of 64 zeros. Changing, deleting, inserting or reordering a record breaks the chain there. A segment
// that reaches its size is sealed with a last line {"seal":"<its last hash>","records":N} and the
// next one goes on from that hash. verify_audit() walks a directory and names the first line that
// breaks the chain. (A chain proves order and integrity, not completeness at its end: records cut
// off the end of the last, unsealed segment leave a shorter valid chain; the seals and an outside
// copy of the last hash are what show that.)
//
// Group commit: append() queues a group of records; a thread that finds no write under way
// writes everything queued (chained onto the last record written, one write(2)), then what others
// queued meanwhile, and each group's callback runs with the outcome; a thread that finds a write
// under way returns at once, its group going out with the next batch. No caller waits for
// another's write, so an I/O thread goes on with other requests while its records are written,
// and a request's answer waits (its callback) until its record is in the file (the page cache).
// With `sync` (fdatasync after each batch) the writing is the trail's own thread's, so that no
// caller waits on the disk. A batch that cannot be written fails its own records only (the caller
// refuses what it cannot audit: fail-closed), and the chain goes on from the last record written.
// A sealed segment is flushed to the disk (fdatasync) and closed by a thread of the trail's own,
// started at the first seal: done by the writing thread, the flush of a 64 MB segment held up
// every request of its I/O thread for tens of milliseconds (the policy gateway's p99 16 ms
// against 1.5 ms without seals, docs/perf.md). With `sync` every batch is flushed already.
// Once flushed, a sealed segment's pages are dropped from the page cache (nothing reads them
// again), so a long run's trail does not grow the cache by its own size.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace lmserve::gateway {

class AuditLog {
 public:
  struct Options {
    std::size_t segment_bytes = 64 << 20;  // sealed and a new segment begun past this
    bool sync = false;                     // fdatasync after each batch of records
  };
  // Creates the directory if needed and goes on from the chain already there (a sealed last
  // segment: a new one). Unavailable when it cannot; DataLoss when the last segment's chain is
  // broken (verify it, and move the directory aside).
  static Result<std::unique_ptr<AuditLog>> open(const std::string& dir, Options options);
  ~AuditLog();

  // Queues `records` (JSON objects, serialised: the lines' "rec"), to be written together in
  // their order; `done` runs once their lines are in the file (OK) or could not be written
  // (Unavailable: the chain then stays as it was), on the thread that wrote them: this one before
  // append() returns, another appending thread, or with `sync` the trail's own thread. Groups are
  // written, and their callbacks run, in the order they were queued.
  using Done = std::function<void(const Status&)>;
  void append(std::vector<std::string> records, Done done);
  // The same for an object, waiting for the outcome (tools and tests).
  Status append(const nlohmann::json& rec);
  std::uint64_t records() const;  // appended by this process

 private:
  struct Queued {
    std::vector<std::string> records;
    Done done;
  };
  AuditLog() = default;
  Status begin_segment();
  Status seal();
  void retire(int fd);  // a sealed segment's: flushed and closed by `retirer_`
  void run_retirer();
  void run();                                            // the `sync` writer thread
  void write_queued(std::unique_lock<std::mutex>& lock);  // everything queued, until none is
  Status write_batch(const std::vector<Queued>& batch);  // by the writing thread
  std::string dir_;
  Options opt_;
  std::mutex mu_;
  std::condition_variable queued_cv_;
  std::vector<Queued> queue_;  // under mu_
  bool writing_ = false;       // under mu_: a thread is writing (not the `sync` thread)
  bool stopping_ = false;      // under mu_
  std::thread writer_;         // with `sync`
  std::mutex retire_mu_;
  std::condition_variable retire_cv_;
  std::vector<int> retired_;  // under retire_mu_: sealed segments to flush and close
  bool retire_stop_ = false;  // under retire_mu_
  std::thread retirer_;       // from the first seal
  // The writing thread's alone (one at a time):
  int fd_ = -1;
  std::uint64_t segment_ = 0, in_segment_ = 0;
  std::size_t segment_size_ = 0;
  std::string written_hash_;  // of the last record written: the chain's tip
  std::atomic<std::uint64_t> appended_{0};
};

struct AuditVerdict {
  bool ok = false;
  std::uint64_t records = 0, segments = 0;
  std::string broken;  // "audit-000002.jsonl:17: the previous hash does not match"
};
AuditVerdict verify_audit(const std::string& dir);

}  // namespace lmserve::gateway
