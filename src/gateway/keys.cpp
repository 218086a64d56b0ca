#include "gateway/keys.h"

#include <openssl/rand.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <unordered_map>

#include "common/file.h"
#include "gateway/digest.h"

namespace lmserve::gateway {

namespace {

constexpr char kPrefix[] = "sk-lms-";
constexpr std::size_t kPrefixLen = sizeof(kPrefix) - 1;
constexpr std::size_t kRandomChars = 43;  // base62: about 256 bits

Result<std::string> random_base62(std::size_t n) {
  static constexpr char kAlphabet[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  std::string out;
  unsigned char buf[64];
  while (out.size() < n) {
    if (RAND_bytes(buf, sizeof buf) != 1) return error(StatusCode::kInternal, "no random bytes from OpenSSL");
    for (unsigned char b : buf) {
      if (b < 248 && out.size() < n) out.push_back(kAlphabet[b % 62]);  // 248 = 4 * 62: no bias
    }
  }
  return out;
}

Result<std::string> random_hex(std::size_t bytes) {
  unsigned char buf[32];
  if (bytes > sizeof buf || RAND_bytes(buf, static_cast<int>(bytes)) != 1) return error(StatusCode::kInternal, "no random bytes from OpenSSL");
  return to_hex(buf, bytes);
}

std::string mask(const std::string& key) { return key.substr(0, kPrefixLen + 4) + "..." + key.substr(key.size() - 4); }

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
  return out;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

bool looks_like_key(const std::string& s) { return s.rfind(kPrefix, 0) == 0; }

constexpr char kCheckText[] = "lmserve gateway key secret check";

}  // namespace

bool KeyRecord::may_use(const std::string& model) const { return models.empty() || std::find(models.begin(), models.end(), model) != models.end(); }

Result<std::string> read_key_secret(const std::string& path) {
  auto bytes = read_file(path);
  if (!bytes) return error(StatusCode::kInvalidArgument, "key_secret_file: cannot read " + path);
  std::string secret = std::move(*bytes);
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.size() < 32) return error(StatusCode::kInvalidArgument, "key_secret_file: " + path + " holds fewer than 32 bytes");
  return secret;
}

std::string key_digest(const std::string& secret, const std::string& key) { return hmac_sha256_hex(secret, key); }

Result<std::int64_t> parse_expiry(const std::string& text) {
  std::tm tm{};
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, s = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%c", &y, &mo, &d, &h, &mi, &s, &tail) == 7 && tail == 'Z') {
  } else if (text.size() == 10 && std::sscanf(text.c_str(), "%4d-%2d-%2d", &y, &mo, &d) == 3) {
    h = mi = s = 0;
  } else {
    return error(StatusCode::kInvalidArgument, "--expires: '" + text + "' is not YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ");
  }
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || s > 60) {
    return error(StatusCode::kInvalidArgument, "--expires: '" + text + "' is not a date");
  }
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = s;
  return static_cast<std::int64_t>(timegm(&tm));
}

// ---- the database -----------------------------------------------------------------------------

struct KeyStore::Db {
  sqlite3* handle = nullptr;
  ~Db() {
    if (handle) sqlite3_close(handle);
  }
  Status exec(const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(handle, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      std::string m = err ? err : "unknown error";
      sqlite3_free(err);
      return Status(StatusCode::kUnavailable, "key database: " + m);
    }
    return Status::ok();
  }
};

namespace {

// A prepared statement, finalized on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { ok_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr) == SQLITE_OK; }
  ~Stmt() { sqlite3_finalize(s_); }
  bool ok() const { return ok_; }
  Stmt& text(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.c_str(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& integer(int i, std::int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  int step() { return sqlite3_step(s_); }
  std::string col_text(int i) const {
    const auto* p = sqlite3_column_text(s_, i);
    return p ? reinterpret_cast<const char*>(p) : "";
  }
  std::int64_t col_int(int i) const { return sqlite3_column_int64(s_, i); }

 private:
  sqlite3_stmt* s_ = nullptr;
  bool ok_ = false;
};

constexpr char kColumns[] =
    "id, digest, tenant, masked, models, lane, rpm, tpm, max_concurrency, daily_tokens, max_input_tokens, created_at, expires_at, revoked_at, "
    "replaced_by";

KeyRecord row(const Stmt& s, std::string* digest = nullptr) {
  KeyRecord r;
  r.id = s.col_text(0);
  if (digest) *digest = s.col_text(1);
  r.tenant = s.col_text(2);
  r.masked = s.col_text(3);
  r.models = split(s.col_text(4));
  r.lane = s.col_text(5);
  r.limits = {s.col_int(6), s.col_int(7), s.col_int(8), s.col_int(9), s.col_int(10)};
  r.created_at = s.col_int(11);
  r.expires_at = s.col_int(12);
  r.revoked_at = s.col_int(13);
  r.replaced_by = s.col_text(14);
  return r;
}

}  // namespace

Result<std::unique_ptr<KeyStore>> KeyStore::open(const std::string& db_path, std::string secret) {
  if (secret.size() < 32) return error(StatusCode::kInvalidArgument, "the key secret must be at least 32 bytes");
  std::unique_ptr<KeyStore> ks(new KeyStore());
  ks->db_ = std::make_unique<Db>();
  ks->secret_ = std::move(secret);
  if (sqlite3_open_v2(db_path.c_str(), &ks->db_->handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr) != SQLITE_OK) {
    return error(StatusCode::kUnavailable, "keys_db: cannot open " + db_path + ": " + sqlite3_errmsg(ks->db_->handle));
  }
  sqlite3_busy_timeout(ks->db_->handle, 2000);
  auto st = ks->db_->exec(
      "CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);"
      "CREATE TABLE IF NOT EXISTS keys (id TEXT PRIMARY KEY, digest TEXT UNIQUE NOT NULL, tenant TEXT NOT NULL, masked TEXT NOT NULL,"
      " models TEXT NOT NULL, lane TEXT NOT NULL, rpm INTEGER NOT NULL, tpm INTEGER NOT NULL, max_concurrency INTEGER NOT NULL,"
      " daily_tokens INTEGER NOT NULL, max_input_tokens INTEGER NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,"
      " revoked_at INTEGER NOT NULL, replaced_by TEXT NOT NULL);");
  if (!st.is_ok()) return error(StatusCode::kUnavailable, "keys_db: " + db_path + " is not a key database (" + st.message() + ")");
  // The secret's fingerprint: a database opened with another secret would match no key at all.
  const auto check = key_digest(ks->secret_, kCheckText);
  Stmt get(ks->db_->handle, "SELECT v FROM meta WHERE k = 'secret_check'");
  if (get.step() == SQLITE_ROW) {
    if (get.col_text(0) != check) return error(StatusCode::kInvalidArgument, "key_secret_file: not the secret " + db_path + " was made with");
  } else {
    Stmt put(ks->db_->handle, "INSERT INTO meta (k, v) VALUES ('secret_check', ?)");
    put.text(1, check);
    if (put.step() != SQLITE_DONE) return error(StatusCode::kUnavailable, "keys_db: cannot write " + db_path);
  }
  return ks;
}

KeyStore::~KeyStore() = default;

Result<std::pair<std::string, KeyRecord>> KeyStore::add(const NewKey& spec, std::int64_t now) {
  if (spec.tenant.empty()) return error(StatusCode::kInvalidArgument, "--tenant is required");
  if (!spec.lane.empty() && spec.lane != "high" && spec.lane != "low") return error(StatusCode::kInvalidArgument, "--lane must be high or low");
  const auto& l = spec.limits;
  if (l.rpm < 0 || l.tpm < 0 || l.max_concurrency < 0 || l.daily_tokens < 0 || l.max_input_tokens < 0) {
    return error(StatusCode::kInvalidArgument, "limits must be 0 (none) or positive");
  }
  auto body = random_base62(kRandomChars);
  if (!body) return error(body.error());
  auto id = random_hex(6);
  if (!id) return error(id.error());
  const std::string key = kPrefix + *body;
  KeyRecord r{.id = "key_" + *id, .tenant = spec.tenant, .masked = mask(key), .models = spec.models, .lane = spec.lane, .limits = l,
              .created_at = now, .expires_at = spec.expires_at};
  Stmt ins(db_->handle,
           "INSERT INTO keys (id, digest, tenant, masked, models, lane, rpm, tpm, max_concurrency, daily_tokens, max_input_tokens,"
           " created_at, expires_at, revoked_at, replaced_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, '')");
  ins.text(1, r.id).text(2, key_digest(secret_, key)).text(3, r.tenant).text(4, r.masked).text(5, join(r.models)).text(6, r.lane);
  ins.integer(7, l.rpm).integer(8, l.tpm).integer(9, l.max_concurrency).integer(10, l.daily_tokens).integer(11, l.max_input_tokens);
  ins.integer(12, now).integer(13, r.expires_at);
  if (ins.step() != SQLITE_DONE) return error(StatusCode::kUnavailable, std::string("keys_db: cannot add the key: ") + sqlite3_errmsg(db_->handle));
  return std::make_pair(key, r);
}

std::vector<KeyRecord> KeyStore::list() {
  std::vector<KeyRecord> out;
  Stmt s(db_->handle, (std::string("SELECT ") + kColumns + " FROM keys ORDER BY created_at, rowid").c_str());
  while (s.step() == SQLITE_ROW) out.push_back(row(s));
  return out;
}

std::map<std::string, KeyRecord> KeyStore::by_digest() {
  std::map<std::string, KeyRecord> out;
  Stmt s(db_->handle, (std::string("SELECT ") + kColumns + " FROM keys").c_str());
  while (s.step() == SQLITE_ROW) {
    std::string digest;
    auto r = row(s, &digest);
    out.emplace(std::move(digest), std::move(r));
  }
  return out;
}

Result<KeyRecord> KeyStore::find(const std::string& key_or_id) {
  const bool by_key = looks_like_key(key_or_id);
  Stmt s(db_->handle, (std::string("SELECT ") + kColumns + (by_key ? " FROM keys WHERE digest = ?" : " FROM keys WHERE id = ?")).c_str());
  s.text(1, by_key ? key_digest(secret_, key_or_id) : key_or_id);
  if (s.step() != SQLITE_ROW) return error(StatusCode::kNotFound, by_key ? "no such key" : "no key with id " + key_or_id);
  return row(s);
}

Result<KeyRecord> KeyStore::revoke(const std::string& key_or_id, std::int64_t now) {
  auto r = find(key_or_id);
  if (!r) return error(r.error());
  if (r->revoked_at == 0) {
    Stmt s(db_->handle, "UPDATE keys SET revoked_at = ? WHERE id = ?");
    s.integer(1, now).text(2, r->id);
    if (s.step() != SQLITE_DONE) return error(StatusCode::kUnavailable, "keys_db: cannot revoke the key");
    r->revoked_at = now;
  }
  return r;
}

Result<std::pair<std::string, KeyRecord>> KeyStore::rotate(const std::string& key_or_id, std::chrono::seconds grace, std::int64_t now) {
  auto old = find(key_or_id);
  if (!old) return error(old.error());
  if (!old->valid_at(now)) return error(StatusCode::kFailedPrecondition, "key " + old->id + " is revoked or expired: add a new one");
  if (auto st = db_->exec("BEGIN IMMEDIATE"); !st.is_ok()) return error(st);
  auto made = add({.tenant = old->tenant, .models = old->models, .lane = old->lane, .limits = old->limits, .expires_at = old->expires_at}, now);
  if (!made) {
    (void)db_->exec("ROLLBACK");
    return error(made.error());
  }
  std::int64_t until = now + grace.count();
  if (old->expires_at != 0) until = std::min(until, old->expires_at);
  Stmt s(db_->handle, "UPDATE keys SET expires_at = ?, replaced_by = ? WHERE id = ?");
  s.integer(1, until).text(2, made->second.id).text(3, old->id);
  if (s.step() != SQLITE_DONE) {
    (void)db_->exec("ROLLBACK");
    return error(StatusCode::kUnavailable, "keys_db: cannot rotate the key");
  }
  if (auto st = db_->exec("COMMIT"); !st.is_ok()) return error(st);
  return made;
}

// ---- the gateway's index ------------------------------------------------------------------------

Result<std::unique_ptr<KeyIndex>> KeyIndex::open(const std::string& db_path, const std::string& secret_path) {
  auto secret = read_key_secret(secret_path);
  if (!secret) return error(secret.error());
  auto store = KeyStore::open(db_path, *secret);
  if (!store) return error(store.error());
  auto ix = std::make_unique<KeyIndex>();
  ix->db_path_ = db_path;
  ix->secret_ = std::move(*secret);
  ix->store_ = std::move(*store);
  if (auto st = ix->refresh(); !st.is_ok()) return error(st);
  return ix;
}

Status KeyIndex::refresh() {
  // PRAGMA data_version changes when another connection (the `keys` command) commits.
  Stmt v(store_->db_->handle, "PRAGMA data_version");
  if (v.step() != SQLITE_ROW) return Status(StatusCode::kUnavailable, "keys_db: cannot read " + db_path_);
  const auto version = v.col_int(0);
  if (version == data_version_) return Status::ok();
  auto keys = std::make_shared<const std::map<std::string, KeyRecord>>(store_->by_digest());
  std::lock_guard lock(mu_);
  keys_ = std::move(keys);
  data_version_ = version;
  return Status::ok();
}

std::uint64_t KeyIndex::next_instance() {
  static std::atomic<std::uint64_t> n{1};
  return n++;
}

std::shared_ptr<const KeyRecord> KeyIndex::find(std::string_view presented) const {
  if (!presented.starts_with(kPrefix) || presented.size() != kPrefixLen + kRandomChars) return nullptr;
  // The HMAC was a measurable share of a request's cost: each thread remembers its recent keys'.
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Cache {
    std::uint64_t owner = 0;
    std::unordered_map<std::string, std::string, Hash, std::equal_to<>> digests;
  };
  thread_local Cache cache;
  if (cache.owner != instance_ || cache.digests.size() > 4096) cache = {instance_, {}};
  auto at = cache.digests.find(presented);
  if (at == cache.digests.end()) at = cache.digests.emplace(std::string(presented), key_digest(secret_, std::string(presented))).first;
  std::shared_ptr<const std::map<std::string, KeyRecord>> keys;
  {
    std::lock_guard lock(mu_);
    keys = keys_;
  }
  auto it = keys->find(at->second);
  if (it == keys->end()) return nullptr;
  return std::shared_ptr<const KeyRecord>(std::move(keys), &it->second);
}

}  // namespace lmserve::gateway
