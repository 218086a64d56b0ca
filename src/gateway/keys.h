// gateway/keys: per-system API keys (issue #30, part 2 of the gateway). A key is `sk-lms-` and 43
// random base62 characters; it is shown once, when made, and stored only as its HMAC-SHA-256
// under a server secret (a file of at least 32 bytes), so a copy of the database gives no key.
// Each key belongs to a tenant and carries what that tenant may do: the models it may use (all
// when empty), the lane its requests go to, its limits, an expiry.
//
// KeyStore is the SQLite table and its commands (`lmserve gateway keys ...`); KeyIndex is what the
// gateway checks requests against: the table in memory, read again when the file changed, so a
// revoked key stops working within a refresh (500 ms) without a query per request.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace lmserve::gateway {

struct KeyLimits {
  std::int64_t rpm = 0, tpm = 0, max_concurrency = 0, daily_tokens = 0, max_input_tokens = 0;  // 0: none
};

struct KeyRecord {
  std::string id;      // "key_" + 12 hex digits: what lists, logs and the audit name
  std::string tenant;
  std::string masked;  // "sk-lms-AbCd...wXyZ": enough to recognise, never enough to use
  std::vector<std::string> models;  // empty: every model
  std::string lane;                 // "high", "low" or "" (the client's choice)
  KeyLimits limits;
  std::int64_t created_at = 0;  // unix seconds
  std::int64_t expires_at = 0;  // 0: never
  std::int64_t revoked_at = 0;  // 0: not revoked
  std::string replaced_by;      // rotation: the id of the key that replaced it

  bool valid_at(std::int64_t now) const { return revoked_at == 0 && (expires_at == 0 || now < expires_at); }
  bool may_use(const std::string& model) const;
};

struct NewKey {
  std::string tenant;
  std::vector<std::string> models;
  std::string lane;
  KeyLimits limits;
  std::int64_t expires_at = 0;
};

// The secret the keys are hashed under: the file's bytes, less a trailing newline; at least 32.
Result<std::string> read_key_secret(const std::string& path);
// HMAC-SHA-256 of `key` under `secret`, as 64 hex digits.
std::string key_digest(const std::string& secret, const std::string& key);
// "YYYY-MM-DD" (midnight UTC) or "YYYY-MM-DDTHH:MM:SSZ" to unix seconds.
Result<std::int64_t> parse_expiry(const std::string& text);

class KeyStore {
 public:
  // Opens (creating when absent) the database. InvalidArgument for a secret too short, Unavailable
  // when the file cannot be opened or is not a key database.
  static Result<std::unique_ptr<KeyStore>> open(const std::string& db_path, std::string secret);
  ~KeyStore();

  // Makes a key; the returned string is the key itself, which is stored nowhere.
  Result<std::pair<std::string, KeyRecord>> add(const NewKey& spec, std::int64_t now);
  std::vector<KeyRecord> list();
  // `key_or_id`: the key itself or its id. NotFound when no key matches.
  Result<KeyRecord> revoke(const std::string& key_or_id, std::int64_t now);
  // A new key with the old one's tenant, models, lane and limits; the old one stays valid for
  // `grace` (then expires) and names its successor.
  Result<std::pair<std::string, KeyRecord>> rotate(const std::string& key_or_id, std::chrono::seconds grace, std::int64_t now);
  // Every key by digest, for KeyIndex.
  std::map<std::string, KeyRecord> by_digest();

 private:
  friend class KeyIndex;
  KeyStore() = default;
  Result<KeyRecord> find(const std::string& key_or_id);
  struct Db;
  std::unique_ptr<Db> db_;
  std::string secret_;
};

// The keys the gateway checks requests against. Thread-safe; refresh() re-reads the database when
// it changed (a cheap check otherwise).
class KeyIndex {
 public:
  static Result<std::unique_ptr<KeyIndex>> open(const std::string& db_path, const std::string& secret_path);
  Status refresh();
  // The key's record if it exists (valid or not: the caller tells expired and revoked apart),
  // shared with the index's table of the time (no copy; a refresh does not change it).
  std::shared_ptr<const KeyRecord> find(std::string_view presented) const;

 private:
  static std::uint64_t next_instance();
  const std::uint64_t instance_ = next_instance();  // tells this index's digests from another's in a thread's cache
  std::string db_path_, secret_;
  std::unique_ptr<KeyStore> store_;
  std::int64_t data_version_ = -1;
  mutable std::mutex mu_;
  std::shared_ptr<const std::map<std::string, KeyRecord>> keys_;
};

}  // namespace lmserve::gateway
