// model/manifest: model integrity (issue #32). A model folder's `lmserve-manifest.json` lists
// every file in it (relative path, size, SHA-256) with the model's name and version; verifying
// the folder recomputes them and names every file that changed, is missing or is not listed.
// `lmserve model manifest|verify`, `serve --verify-model` (refuses to start on any problem) and
// `lmserve model activate` (the versioned layout models/NAME/VERSION/ with a `current` symlink,
// switched atomically, so a rollback is activating the version before) are built on it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "common/status.h"

namespace lmserve::model {

inline constexpr const char* kManifestFile = "lmserve-manifest.json";

struct ManifestFile {
  std::string path;  // relative to the folder, '/'-separated
  std::uint64_t size = 0;
  std::string sha256;  // 64 lower-case hex digits
};

struct Manifest {
  std::string name, version, created;  // created: UTC, ISO 8601
  std::vector<ManifestFile> files;     // sorted by path
};

// Hashes every regular file under `dir` (symlinks to files followed; the manifest itself left
// out), `threads` files at a time.
Result<Manifest> make_manifest(const std::filesystem::path& dir, std::string name, std::string version, int threads = 4);
// Writes it to dir/lmserve-manifest.json (through a temporary file and a rename).
Status write_manifest(const std::filesystem::path& dir, const Manifest& m);
// Reads and checks dir/lmserve-manifest.json: NotFound when there is none, InvalidArgument when
// it is not a manifest.
Result<Manifest> read_manifest(const std::filesystem::path& dir);

struct ManifestProblem {
  std::string path;
  std::string what;  // "SHA-256 differs", "size 1024 bytes, the manifest says 1000", "missing", "not in the manifest"
};
struct Verification {
  Manifest manifest;
  std::vector<ManifestProblem> problems;  // empty: the folder is what the manifest says
  std::uint64_t files = 0, bytes = 0;     // hashed
  bool ok() const { return problems.empty(); }
};
// Checks `dir` against its manifest. An error only when there is no readable manifest.
Result<Verification> verify_model(const std::filesystem::path& dir, int threads = 4);
std::string describe(const ManifestProblem& p);  // "model.safetensors: SHA-256 differs"

// The versioned layout: root/NAME/VERSION/ folders and root/NAME/current -> VERSION. Makes
// VERSION current (verified first when it has a manifest; refused when that fails) by replacing
// the symlink atomically; returns the version that was current before ("" when none).
Result<std::string> activate_version(const std::filesystem::path& root, const std::string& name, const std::string& version,
                                     bool verify = true);

}  // namespace lmserve::model
