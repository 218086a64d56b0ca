// gateway/audit: the tamper-evident audit trail (issue #30). Records are JSON lines in segment
// files `audit-NNNNNN.jsonl` under one directory, each line
//
//   {"hash":"<SHA-256 of prev followed by rec>","prev":"<the previous line's hash>","rec":{...}}
//
// (keys sorted, rec serialised as in the line), the first line of the first segment with a prev of 64
// zeros. Changing, deleting, inserting or reordering a record breaks the chain there. A segment
// that reaches its size is sealed with a last line {"seal":"<its last hash>","records":N} and the
// next one goes on from that hash. verify_audit() walks a directory and names the first line that
// breaks the chain. (A chain proves order and integrity, not completeness at its end: records cut
// off the end of the last, unsealed segment leave a shorter valid chain; the seals and an outside
// copy of the last hash are what show that.)
//
// AuditLog::append returns only when its line is in the file (the page cache; `sync` adds
// fdatasync): its failure is what lets the gateway refuse a request it cannot audit (fail-closed).
// Thread-safe, with group commit: the lock covers queueing a record in the open batch; one
// thread at a time takes the batch, chains its records onto the last record written (the
// hashing outside the lock) and writes them with one write(2) (and one fdatasync) while other
// threads' records queue in the next. A batch that cannot be written fails its records alone, and
// the chain goes on from the last record written.
#pragma once

#include <cstddef>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace lmserve::gateway {

class AuditLog {
 public:
  struct Options {
    std::size_t segment_bytes = 64 << 20;  // sealed and a new segment begun past this
    bool sync = false;                     // fdatasync after each record
  };
  // Creates the directory if needed and goes on from the chain already there (a sealed last
  // segment: a new one). Unavailable when it cannot; DataLoss when the last segment's chain is
  // broken (verify it, and move the directory aside).
  static Result<std::unique_ptr<AuditLog>> open(const std::string& dir, Options options);
  ~AuditLog();

  // Appends `rec` (an object) as the next line. Unavailable when it could not be written: the
  // chain then stays as it was.
  Status append(const nlohmann::json& rec);
  std::uint64_t records() const;  // appended by this process

 private:
  struct Batch {
    std::vector<std::string> bodies;  // the records, serialised, in order
    bool done = false;
    Status status;
  };
  AuditLog() = default;
  Status begin_segment();
  Status seal();
  void write_batch(std::unique_lock<std::mutex>& lock);
  std::string dir_;
  Options opt_;
  mutable std::mutex mu_;
  std::condition_variable written_cv_;
  bool writing_ = false;                                   // a thread is writing a batch
  std::shared_ptr<Batch> open_ = std::make_shared<Batch>();  // records queued for the next write
  int fd_ = -1;
  std::uint64_t segment_ = 0, in_segment_ = 0, appended_ = 0;  // written records
  std::size_t segment_size_ = 0;
  std::string written_hash_;  // of the last record written: the chain's tip
};

struct AuditVerdict {
  bool ok = false;
  std::uint64_t records = 0, segments = 0;
  std::string broken;  // "audit-000002.jsonl:17: the previous hash does not match"
};
AuditVerdict verify_audit(const std::string& dir);

}  // namespace lmserve::gateway
