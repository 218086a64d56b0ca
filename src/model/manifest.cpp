#include "model/manifest.h"

#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

namespace lmserve::model {

namespace fs = std::filesystem;

namespace {

// SHA-256 of a file, read 4 MiB at a time.
Result<std::string> file_sha256(const fs::path& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) return error(StatusCode::kUnavailable, path.string() + ": cannot be read: " + std::strerror(errno));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), &EVP_MD_CTX_free);
  std::unique_ptr<EVP_MD, void (*)(EVP_MD*)> md(EVP_MD_fetch(nullptr, "SHA256", nullptr), &EVP_MD_free);
  if (!ctx || !md || EVP_DigestInit_ex2(ctx.get(), md.get(), nullptr) != 1) return error(StatusCode::kInternal, "SHA-256 unavailable");
  std::vector<unsigned char> buf(4 << 20);
  while (true) {
    const std::size_t n = std::fread(buf.data(), 1, buf.size(), f.get());
    if (n > 0) EVP_DigestUpdate(ctx.get(), buf.data(), n);
    if (n < buf.size()) {
      if (std::ferror(f.get())) return error(StatusCode::kUnavailable, path.string() + ": read error");
      break;
    }
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), out, &len);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex(2 * len, '0');
  for (unsigned int i = 0; i < len; ++i) {
    hex[2 * i] = kHex[out[i] >> 4];
    hex[2 * i + 1] = kHex[out[i] & 15];
  }
  return hex;
}

// Every regular file under dir (relative path -> size), the manifest left out.
Result<std::map<std::string, std::uint64_t>> list_files(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return error(StatusCode::kNotFound, dir.string() + ": not a folder");
  std::map<std::string, std::uint64_t> out;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const std::string rel = fs::relative(it->path(), dir, ec).generic_string();
    if (rel == kManifestFile) continue;
    out[rel] = static_cast<std::uint64_t>(it->file_size(ec));
  }
  if (ec) return error(StatusCode::kUnavailable, dir.string() + ": cannot be listed: " + ec.message());
  return out;
}

// Hashes `paths` under dir on up to `threads` threads; results in the same order.
Result<std::vector<std::string>> hash_files(const fs::path& dir, const std::vector<std::string>& paths, int threads) {
  std::vector<Result<std::string>> results(paths.size(), Result<std::string>(std::string()));
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next++) < paths.size();) results[i] = file_sha256(dir / paths[i]);
  };
  std::vector<std::thread> pool;
  const auto n = static_cast<std::size_t>(std::clamp(threads, 1, 64));
  for (std::size_t t = 1; t < std::min(n, paths.size()); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  std::vector<std::string> out;
  for (auto& r : results) {
    if (!r) return error(r.error());
    out.push_back(std::move(*r));
  }
  return out;
}

std::string utc_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

bool is_hex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

Result<Manifest> make_manifest(const fs::path& dir, std::string name, std::string version, int threads) {
  auto files = list_files(dir);
  if (!files) return error(files.error());
  std::vector<std::string> paths;
  for (const auto& [p, size] : *files) paths.push_back(p);
  auto hashes = hash_files(dir, paths, threads);
  if (!hashes) return error(hashes.error());
  Manifest m{std::move(name), std::move(version), utc_now(), {}};
  for (std::size_t i = 0; i < paths.size(); ++i) m.files.push_back({paths[i], files->at(paths[i]), (*hashes)[i]});
  return m;
}

Status write_manifest(const fs::path& dir, const Manifest& m) {
  nlohmann::ordered_json j{{"format", "lmserve-manifest/1"}, {"name", m.name}, {"version", m.version}, {"created", m.created}};
  auto files = nlohmann::ordered_json::array();
  for (const auto& f : m.files) files.push_back({{"path", f.path}, {"size", f.size}, {"sha256", f.sha256}});
  j["files"] = std::move(files);
  const fs::path tmp = dir / (std::string(kManifestFile) + ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    if (!out.flush()) return Status(StatusCode::kUnavailable, tmp.string() + ": cannot be written");
  }
  std::error_code ec;
  fs::rename(tmp, dir / kManifestFile, ec);
  if (ec) return Status(StatusCode::kUnavailable, (dir / kManifestFile).string() + ": " + ec.message());
  return Status::ok();
}

Result<Manifest> read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifestFile;
  std::ifstream in(path);
  if (!in) return error(StatusCode::kNotFound, path.string() + ": no manifest (write one with `lmserve model manifest`)");
  const auto j = nlohmann::json::parse(in, nullptr, false);
  auto bad = [&](const std::string& why) { return error(StatusCode::kInvalidArgument, path.string() + ": " + why); };
  if (j.is_discarded() || !j.is_object()) return bad("not JSON");
  // A text member, "" when absent; nullopt when it is something else.
  auto text = [&](const char* key) -> std::optional<std::string> {
    if (!j.contains(key)) return std::string();
    if (!j[key].is_string()) return std::nullopt;
    return j[key].get<std::string>();
  };
  if (text("format") != "lmserve-manifest/1") return bad("not an lmserve manifest (format lmserve-manifest/1)");
  if (!j.contains("files") || !j["files"].is_array()) return bad("no files list");
  Manifest m;
  for (auto [key, to] : {std::pair{"name", &m.name}, std::pair{"version", &m.version}, std::pair{"created", &m.created}}) {
    auto v = text(key);
    if (!v) return bad(std::string("'") + key + "' is not a string");
    *to = std::move(*v);
  }
  for (const auto& f : j["files"]) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("size") || !f["size"].is_number_unsigned() ||
        !f.contains("sha256") || !f["sha256"].is_string() || !is_hex64(f["sha256"].get<std::string>())) {
      return bad("a files entry is not {path, size, sha256}");
    }
    const auto p = f["path"].get<std::string>();
    if (p.empty() || p.front() == '/' || fs::path(p).lexically_normal().generic_string() != p || p.rfind("../", 0) == 0) {
      return bad("'" + p + "' is not a path inside the folder");
    }
    m.files.push_back({p, f["size"].get<std::uint64_t>(), f["sha256"].get<std::string>()});
  }
  return m;
}

Result<Verification> verify_model(const fs::path& dir, int threads) {
  auto m = read_manifest(dir);
  if (!m) return error(m.error());
  auto present = list_files(dir);
  if (!present) return error(present.error());
  Verification v;
  v.manifest = std::move(*m);
  std::vector<std::string> to_hash;
  std::vector<const ManifestFile*> listed;
  std::map<std::string, bool> in_manifest;
  for (const auto& f : v.manifest.files) {
    in_manifest[f.path] = true;
    auto it = present->find(f.path);
    if (it == present->end()) {
      v.problems.push_back({f.path, "missing"});
    } else if (it->second != f.size) {
      v.problems.push_back({f.path, "size " + std::to_string(it->second) + " bytes, the manifest says " + std::to_string(f.size)});
    } else {
      to_hash.push_back(f.path);
      listed.push_back(&f);
    }
  }
  for (const auto& [p, size] : *present) {
    if (!in_manifest.count(p)) v.problems.push_back({p, "not in the manifest"});
  }
  auto hashes = hash_files(dir, to_hash, threads);
  if (!hashes) return error(hashes.error());
  for (std::size_t i = 0; i < to_hash.size(); ++i) {
    ++v.files;
    v.bytes += listed[i]->size;
    if ((*hashes)[i] != listed[i]->sha256) v.problems.push_back({to_hash[i], "SHA-256 differs"});
  }
  std::sort(v.problems.begin(), v.problems.end(), [](const ManifestProblem& a, const ManifestProblem& b) { return a.path < b.path; });
  return v;
}

std::string describe(const ManifestProblem& p) { return p.path + ": " + p.what; }

Result<std::string> activate_version(const fs::path& root, const std::string& name, const std::string& version, bool verify) {
  auto plain = [](const std::string& s) { return !s.empty() && s != "." && s != ".." && s != "current" && s.find('/') == std::string::npos; };
  if (!plain(name) || !plain(version)) return error(StatusCode::kInvalidArgument, "a model name and version are plain folder names");
  const fs::path model = root / name;
  const fs::path target = model / version;
  std::error_code ec;
  if (!fs::is_directory(target, ec)) return error(StatusCode::kNotFound, target.string() + ": no such version folder");
  if (verify && fs::exists(target / kManifestFile, ec)) {
    auto v = verify_model(target);
    if (!v) return error(v.error());
    if (!v->ok()) return error(StatusCode::kFailedPrecondition, target.string() + " fails verification: " + describe(v->problems.front()));
  }
  const fs::path current = model / "current";
  std::string before;
  if (fs::is_symlink(current, ec)) {
    before = fs::read_symlink(current, ec).filename().string();
  } else if (fs::exists(current, ec)) {
    return error(StatusCode::kFailedPrecondition, current.string() + " exists and is not a symlink");
  }
  const fs::path tmp = model / ".current.tmp";
  fs::remove(tmp, ec);
  fs::create_directory_symlink(version, tmp, ec);  // relative: the layout can move as a whole
  if (ec) return error(StatusCode::kUnavailable, tmp.string() + ": " + ec.message());
  fs::rename(tmp, current, ec);  // rename(2) replaces the old link in one step
  if (ec) return error(StatusCode::kUnavailable, current.string() + ": " + ec.message());
  return before;
}

}  // namespace lmserve::model
