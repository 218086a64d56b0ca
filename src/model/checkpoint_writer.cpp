#include "model/checkpoint_writer.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "common/progress.h"

namespace lmserve::model {

namespace {

// The tensors in the order of the published checkpoints: embedding, layers, final norm, head.
std::vector<const Tensor*> tensors_of(const ModelWeights& w) {
  std::vector<const Tensor*> out{&w.embed_tokens()};
  for (const auto& L : w.layers()) {
    for (const Tensor* t : {&L.input_norm, &L.q_proj, &L.k_proj, &L.v_proj, &L.q_bias, &L.k_bias, &L.v_bias, &L.q_norm, &L.k_norm, &L.o_proj,
                            &L.post_attention_norm, &L.gate_proj, &L.up_proj, &L.down_proj}) {
      if (t->data != nullptr && t->numel() > 0) out.push_back(t);
    }
  }
  out.push_back(&w.final_norm());
  if (!w.config().tie_word_embeddings) out.push_back(&w.lm_head());
  return out;
}

std::uint64_t data_bytes(const Tensor& t) { return static_cast<std::uint64_t>(t.numel()) * static_cast<std::uint64_t>(dtype_bytes(t.dtype)); }

Status write_shard(const std::filesystem::path& path, const std::vector<const Tensor*>& tensors, Progress& progress) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::uint64_t at = 0;
  for (const Tensor* t : tensors) {
    const std::uint64_t n = data_bytes(*t);
    header[t->name] = {{"dtype", std::string(safetensors_dtype(t->dtype))}, {"shape", t->shape}, {"data_offsets", {at, at + n}}};
    at += n;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data section 8-byte aligned, as the format advises
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status(StatusCode::kUnavailable, "cannot write " + path.string());
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(h.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const Tensor* t : tensors) {
    out.write(static_cast<const char*>(t->data), static_cast<std::streamsize>(data_bytes(*t)));
    progress.add(static_cast<double>(data_bytes(*t)));
  }
  out.flush();
  if (!out) return Status(StatusCode::kUnavailable, "writing " + path.string() + " failed (disk full?)");
  return Status::ok();
}

}  // namespace

Result<CheckpointSummary> write_checkpoint(const ModelWeights& w, const std::filesystem::path& config_dir, const std::filesystem::path& out_dir,
                                           std::uint64_t shard_bytes) {
  if (w.fp8()) return error(StatusCode::kInvalidArgument, "write_checkpoint: FP8 weights are not written");
  if (shard_bytes == 0) return error(StatusCode::kInvalidArgument, "write_checkpoint: the shard size must be positive");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return error(StatusCode::kUnavailable, "cannot make " + out_dir.string() + ": " + ec.message());
  // Shards: tensors in order, a new shard when the next tensor would pass shard_bytes.
  std::vector<std::vector<const Tensor*>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (const Tensor* t : tensors_of(w)) {
    const std::uint64_t n = data_bytes(*t);
    if (!shards.back().empty() && in_shard + n > shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += n;
    total += n;
  }
  CheckpointSummary s;
  s.shards = static_cast<int>(shards.size());
  s.bytes = total;
  Progress progress("writing checkpoint", static_cast<double>(total), Progress::Unit::kBytes);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (std::size_t i = 0; i < shards.size(); ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    LMSERVE_RETURN_IF_ERROR(write_shard(out_dir / name, shards[i], progress));
    for (const Tensor* t : shards[i]) {
      weight_map[t->name] = name;
      ++s.tensors;
    }
  }
  const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream(out_dir / "model.safetensors.index.json", std::ios::trunc) << index.dump(2) << "\n";
  for (const char* f : {"config.json", "generation_config.json"}) {
    if (!std::filesystem::exists(config_dir / f)) continue;
    if (std::filesystem::equivalent(config_dir, out_dir, ec)) continue;
    std::filesystem::copy_file(config_dir / f, out_dir / f, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return error(StatusCode::kUnavailable, std::string("cannot copy ") + f + ": " + ec.message());
  }
  progress.done();
  return s;
}

}  // namespace lmserve::model
