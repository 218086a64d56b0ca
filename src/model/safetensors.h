// Memory-mapped safetensors files with a fully validated header.
//
// Validation (every failure is InvalidArgument/DataLoss naming the file and tensor, never a
// crash): the 8-byte header length fits the file; the header is a JSON object; every entry
// has a known dtype, a shape of non-negative integers and data_offsets [begin, end] inside
// the data section whose size equals elements x dtype size; entries do not overlap;
// "__metadata__", if present, maps strings to strings.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace lmserve::model {

struct TensorView {
  std::string dtype;                // "F32", "F16", "BF16", "I64", ...
  std::vector<std::int64_t> shape;
  const std::byte* data = nullptr;  // into the mapping; valid while the file is alive
  std::uint64_t nbytes = 0;
  std::string file;                 // for error messages

  std::int64_t numel() const;
};

// One mapped file. Thread-safe after open (read-only).
class SafetensorsFile {
 public:
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  static Result<std::unique_ptr<SafetensorsFile>> open(const std::filesystem::path& path);
  // Parses `bytes` in place (no mapping; `bytes` must outlive the result). For tests and fuzzing.
  static Result<std::unique_ptr<SafetensorsFile>> from_memory(std::string_view bytes, std::string name);

  const std::map<std::string, TensorView>& tensors() const { return tensors_; }

 private:
  SafetensorsFile() = default;
  Status parse(const std::byte* base, std::uint64_t size);

  std::string name_;
  void* map_ = nullptr;
  std::uint64_t map_size_ = 0;
  std::map<std::string, TensorView> tensors_;
};

// Bytes per element of a safetensors dtype name; 0 if unknown.
int safetensors_dtype_size(std::string_view dtype);

// All tensors of a model folder: model.safetensors, or the shards listed in
// model.safetensors.index.json (each tensor must be in the shard the index names, and no
// tensor may appear twice).
class WeightFiles {
 public:
  static Result<WeightFiles> open(const std::filesystem::path& model_dir);
  const TensorView* find(const std::string& name) const;
  const std::map<std::string, TensorView>& all() const { return all_; }

 private:
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView> all_;
};

}  // namespace lmserve::model
