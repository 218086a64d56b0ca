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
// AuditLog::append writes the line with one write(2) and returns only when it is in the file
// (the page cache; `sync` adds fdatasync): its failure is what lets the gateway refuse a request
// it cannot audit (fail-closed). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

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
  AuditLog() = default;
  Status begin_segment();
  Status seal();
  std::string dir_;
  Options opt_;
  mutable std::mutex mu_;
  int fd_ = -1;
  std::uint64_t segment_ = 0, in_segment_ = 0, appended_ = 0;
  std::size_t segment_size_ = 0;
  std::string last_hash_;
};

struct AuditVerdict {
  bool ok = false;
  std::uint64_t records = 0, segments = 0;
  std::string broken;  // "audit-000002.jsonl:17: the previous hash does not match"
};
AuditVerdict verify_audit(const std::string& dir);

}  // namespace lmserve::gateway
