#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/file.h"

namespace lmserve::model {

using json = nlohmann::json;

int safetensors_dtype_size(std::string_view d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(map_, map_size_);
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return error(StatusCode::kNotFound, "cannot open " + path.string());
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return error(StatusCode::kInvalidArgument, path.string() + " is not a regular file");
  }
  auto f = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  f->name_ = path.string();
  f->map_size_ = static_cast<std::uint64_t>(st.st_size);
  if (f->map_size_ > 0) {
    f->map_ = mmap(nullptr, f->map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map_ == MAP_FAILED) {
      f->map_ = nullptr;
      ::close(fd);
      return error(StatusCode::kInternal, "cannot map " + path.string());
    }
  }
  ::close(fd);
  LMSERVE_RETURN_IF_ERROR(f->parse(static_cast<const std::byte*>(f->map_), f->map_size_));
  return f;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::from_memory(std::string_view bytes, std::string name) {
  auto f = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  f->name_ = std::move(name);
  LMSERVE_RETURN_IF_ERROR(f->parse(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
  return f;
}

Status SafetensorsFile::parse(const std::byte* base, std::uint64_t size) {
  auto fail = [&](StatusCode code, const std::string& msg) { return Status(code, name_ + ": " + msg); };
  if (size < 8) return fail(StatusCode::kDataLoss, "file is shorter than the 8-byte header length");
  std::uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<std::uint8_t>(base[i]);
  if (len > size - 8) return fail(StatusCode::kDataLoss, "header length " + std::to_string(len) + " runs past the end of the file (truncated?)");
  if (len > (100u << 20)) return fail(StatusCode::kInvalidArgument, "header is larger than 100 MB");
  std::string_view header(reinterpret_cast<const char*>(base + 8), len);
  json j = json::parse(header, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fail(StatusCode::kInvalidArgument, "header is not a JSON object");
  const std::byte* data = base + 8 + len;
  const std::uint64_t data_size = size - 8 - len;

  struct Span {
    std::uint64_t b, e;
    const std::string* name;
  };
  std::vector<Span> spans;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) return fail(StatusCode::kInvalidArgument, "__metadata__ is not an object");
      for (const auto& m : v.items()) {
        if (!m.value().is_string()) return fail(StatusCode::kInvalidArgument, "__metadata__ value '" + m.key() + "' is not a string");
      }
      continue;
    }
    auto bad = [&](const std::string& msg) { return fail(StatusCode::kInvalidArgument, "tensor '" + name + "': " + msg); };
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets")) {
      return bad("needs dtype, shape and data_offsets");
    }
    if (!v["dtype"].is_string()) return bad("dtype is not a string");
    TensorView t;
    t.dtype = v["dtype"].get<std::string>();
    t.file = name_;
    int esize = safetensors_dtype_size(t.dtype);
    if (esize == 0) return bad("unknown dtype '" + t.dtype + "'");
    if (!v["shape"].is_array()) return bad("shape is not a list");
    std::uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<std::int64_t>() >= 0)) {
        return bad("shape has a negative or non-integer dimension");
      }
      auto dim = d.get<std::uint64_t>();
      if (dim > (std::uint64_t{1} << 40) || (dim != 0 && numel > (std::uint64_t{1} << 50) / dim)) return bad("shape is too large");
      t.shape.push_back(static_cast<std::int64_t>(dim));
      numel *= dim;
    }
    const json& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad("data_offsets must be two non-negative integers");
    }
    std::uint64_t b = off[0].get<std::uint64_t>(), e = off[1].get<std::uint64_t>();
    if (b > e || e > data_size) {
      return fail(StatusCode::kDataLoss, "tensor '" + name + "': data_offsets [" + std::to_string(b) + ", " + std::to_string(e) +
                                             "] are outside the " + std::to_string(data_size) + "-byte data section");
    }
    if (e - b != numel * static_cast<std::uint64_t>(esize)) {
      return bad("data_offsets cover " + std::to_string(e - b) + " bytes but shape x dtype needs " +
                 std::to_string(numel * static_cast<std::uint64_t>(esize)));
    }
    t.data = data + b;
    t.nbytes = e - b;
    auto [pos, inserted] = tensors_.emplace(name, std::move(t));
    if (!inserted) return bad("appears twice");
    spans.push_back({b, e, &pos->first});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& c) { return a.b < c.b; });
  for (std::size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].b < spans[i - 1].e) {
      return fail(StatusCode::kInvalidArgument, "tensors '" + *spans[i - 1].name + "' and '" + *spans[i].name + "' overlap");
    }
  }
  return Status::ok();
}

Result<WeightFiles> WeightFiles::open(const std::filesystem::path& dir) {
  WeightFiles w;
  auto index_path = dir / "model.safetensors.index.json";
  if (std::filesystem::exists(index_path)) {
    auto text = read_file(index_path);
    if (!text) return error(text.error());
    json idx = json::parse(*text, nullptr, false);
    if (idx.is_discarded() || !idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object()) {
      return error(StatusCode::kInvalidArgument, index_path.string() + ": no weight_map object");
    }
    std::map<std::string, std::shared_ptr<SafetensorsFile>> shards;
    for (const auto& [tensor, file] : idx["weight_map"].items()) {
      if (!file.is_string()) return error(StatusCode::kInvalidArgument, index_path.string() + ": bad entry for '" + tensor + "'");
      std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos || f.find("..") != std::string::npos) {
        return error(StatusCode::kInvalidArgument, index_path.string() + ": shard name '" + f + "' leaves the model folder");
      }
      if (!shards.contains(f)) {
        auto s = SafetensorsFile::open(dir / f);
        if (!s) return error(s.error());
        shards[f] = std::move(*s);
        w.files_.push_back(shards[f]);
      }
      const auto& t = shards[f]->tensors();
      auto it = t.find(tensor);
      if (it == t.end()) return error(StatusCode::kDataLoss, index_path.string() + ": '" + tensor + "' is not in " + f);
      w.all_.emplace(tensor, it->second);
    }
    return w;
  }
  auto f = SafetensorsFile::open(dir / "model.safetensors");
  if (!f) return error(f.error());
  std::shared_ptr<SafetensorsFile> file = std::move(*f);
  w.all_ = file->tensors();
  w.files_.push_back(std::move(file));
  return w;
}

const TensorView* WeightFiles::find(const std::string& name) const {
  auto it = all_.find(name);
  return it == all_.end() ? nullptr : &it->second;
}

}  // namespace lmserve::model
