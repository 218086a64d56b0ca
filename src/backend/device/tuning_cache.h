// backend/device: the GEMM algorithms a start-up chose by timing (cuBLASLt's heuristic's first
// candidates, gemm.cuh), kept in a directory between runs (`--tuning-cache DIR`) so that the
// next start on the same GPU with the same libraries skips the timing.
//
// A file per identity (GPU model and multiprocessors, compute capability, driver, CUDA runtime
// and cuBLASLt versions, lmserve's version): tuning-<hash of the identity>.json, which also
// holds the identity in full. A file whose identity is not exactly this one's (another GPU, a
// library upgraded, a file renamed or copied) is ignored and left alone, never trusted; so is
// one that does not parse. The CUDA side checks every algorithm it takes from the cache with
// cuBLASLt before using it (cublasLtMatmulAlgoCheck) and times anew where the check fails.
//
// Safe to share between replicas: save() merges what the file holds by then with this
// process's entries and replaces the file atomically (a temporary file renamed over it), so
// concurrent writers never leave a torn file (the last rename wins; an entry lost that way is
// timed again on a later start). Thread-safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "backend/device/algo_cache.h"
#include "common/status.h"

namespace lmserve::backend {

struct TuningIdentity {
  std::string gpu;  // the device's name, e.g. "NVIDIA H200"
  int multiprocessors = 0;
  int compute_capability = 0;  // major * 10 + minor
  int driver = 0;              // cudaDriverGetVersion
  int cuda_runtime = 0;        // cudaRuntimeGetVersion
  std::size_t cublaslt = 0;    // cublasLtGetVersion
  std::string build;           // lmserve's version and commit
  bool operator==(const TuningIdentity&) const = default;
};

class TuningCache : public AlgoCache {
 public:
  // Reads DIR's file for `identity` (creating DIR if needed). Never fails: a missing, foreign
  // or unreadable file gives an empty cache, and note() says why.
  static std::unique_ptr<TuningCache> open(const std::filesystem::path& dir, TuningIdentity identity);

  std::optional<Algo> find(const std::string& shape) override;
  void put(const std::string& shape, const Algo& algo) override;
  // Writes the file when this process added entries (see the file comment).
  Status save();

  std::filesystem::path file() const { return file_; }
  const std::string& note() const { return note_; }  // how the file was found: "", "no file yet", "made for another ..."
  std::size_t hits() const;
  std::size_t misses() const;
  std::size_t size() const;

 private:
  TuningCache(std::filesystem::path file, TuningIdentity identity) : file_(std::move(file)), identity_(std::move(identity)) {}
  // The entries of `text` if it is a cache file of this identity; else nullopt with the reason.
  std::optional<std::map<std::string, Algo>> parse(const std::string& text, std::string* why) const;

  const std::filesystem::path file_;
  const TuningIdentity identity_;
  mutable std::mutex mu_;
  std::map<std::string, Algo> entries_;
  bool dirty_ = false;
  std::size_t hits_ = 0, misses_ = 0;
  std::string note_;
};

}  // namespace lmserve::backend
