#include "model/weights.h"

#include <thread>

#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <set>

#include "common/numeric.h"
#include "common/progress.h"

namespace lmserve::model {

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::uint64_t Tensor::bytes() const {
  return static_cast<std::uint64_t>(numel() * dtype_bytes(dtype) + num_scales * static_cast<std::int64_t>(sizeof(float)));
}

namespace {
float fp8_scale(const Tensor& t, std::int64_t i) {
  return t.num_scales == 1 ? t.scales[0] : t.scales[i / t.shape.back()];
}
// The 256 e4m3 values: a weight upload decodes billions of them.
const std::array<float, 256>& e4m3_values() {
  static const auto t = [] {
    std::array<float, 256> v{};
    for (int c = 0; c < 256; ++c) v[static_cast<std::size_t>(c)] = fp8_e4m3_to_float(static_cast<std::uint8_t>(c));
    return v;
  }();
  return t;
}
}  // namespace

float Tensor::at(std::int64_t i) const {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return f16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::kBF16: return bf16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::kF8E4M3: return fp8_e4m3_to_float(static_cast<const std::uint8_t*>(data)[i]) * fp8_scale(*this, i);
  }
  return 0.0f;
}

void Tensor::to_float(std::int64_t offset, std::int64_t count, float* out) const {
  switch (dtype) {
    case DType::kF32: std::memcpy(out, static_cast<const float*>(data) + offset, static_cast<std::size_t>(count) * 4); return;
    case DType::kF16: {
      const auto* p = static_cast<const std::uint16_t*>(data) + offset;
      for (std::int64_t i = 0; i < count; ++i) out[i] = f16_to_float(p[i]);
      return;
    }
    case DType::kBF16: {
      const auto* p = static_cast<const std::uint16_t*>(data) + offset;
      for (std::int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(p[i]);
      return;
    }
    case DType::kF8E4M3: {
      const auto* p = static_cast<const std::uint8_t*>(data) + offset;
      const auto& v = e4m3_values();
      const std::int64_t cols = shape.back();
      for (std::int64_t i = 0; i < count;) {  // a row's elements share its scale
        const std::int64_t row_end = std::min(count, ((offset + i) / cols + 1) * cols - offset);
        const float s = fp8_scale(*this, offset + i);
        for (; i < row_end; ++i) out[i] = v[p[i]] * s;
      }
      return;
    }
  }
}

namespace {

Result<DType> dtype_of(const std::string& s) {
  if (s == "F32") return DType::kF32;
  if (s == "F16") return DType::kF16;
  if (s == "BF16") return DType::kBF16;
  if (s == "F8_E4M3") return DType::kF8E4M3;
  return error(StatusCode::kInvalidArgument, "dtype " + s + " is not supported for weights (F32, F16, BF16, F8_E4M3)");
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

void store(DType d, float v, std::byte* out, std::int64_t i) {
  switch (d) {
    case DType::kF32: reinterpret_cast<float*>(out)[i] = v; break;
    case DType::kF16: reinterpret_cast<std::uint16_t*>(out)[i] = float_to_f16(v); break;
    case DType::kBF16: reinterpret_cast<std::uint16_t*>(out)[i] = float_to_bf16(v); break;
    case DType::kF8E4M3: reinterpret_cast<std::uint8_t*>(out)[i] = float_to_fp8_e4m3(v); break;
  }
}

bool is_projection(const std::string& name) { return name.ends_with("_proj.weight"); }

}  // namespace

Status ModelWeights::bind(const std::function<Result<Tensor>(const std::string&, std::vector<std::int64_t>)>& get) {
  const ModelConfig& c = config_;
  const std::int64_t H = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  auto take = [&](Tensor& dst, const std::string& name, std::vector<std::int64_t> shape) -> Status {
    auto t = get(name, std::move(shape));
    if (!t) return t.error();
    dst = std::move(*t);
    bytes_ += dst.bytes();
    return Status::ok();
  };
  LMSERVE_RETURN_IF_ERROR(take(embed_, "model.embed_tokens.weight", {c.vocab_size, H}));
  LMSERVE_RETURN_IF_ERROR(take(norm_, "model.norm.weight", {H}));
  tied_ = c.tie_word_embeddings;
  if (!tied_) LMSERVE_RETURN_IF_ERROR(take(lm_head_, "lm_head.weight", {c.vocab_size, H}));
  layers_.resize(static_cast<std::size_t>(c.num_layers));
  for (std::int64_t l = 0; l < c.num_layers; ++l) {
    auto& L = layers_[static_cast<std::size_t>(l)];
    std::string p = "model.layers." + std::to_string(l) + ".";
    LMSERVE_RETURN_IF_ERROR(take(L.input_norm, p + "input_layernorm.weight", {H}));
    LMSERVE_RETURN_IF_ERROR(take(L.post_attention_norm, p + "post_attention_layernorm.weight", {H}));
    LMSERVE_RETURN_IF_ERROR(take(L.q_proj, p + "self_attn.q_proj.weight", {q, H}));
    LMSERVE_RETURN_IF_ERROR(take(L.k_proj, p + "self_attn.k_proj.weight", {kv, H}));
    LMSERVE_RETURN_IF_ERROR(take(L.v_proj, p + "self_attn.v_proj.weight", {kv, H}));
    LMSERVE_RETURN_IF_ERROR(take(L.o_proj, p + "self_attn.o_proj.weight", {H, q}));
    if (c.qkv_bias) {
      LMSERVE_RETURN_IF_ERROR(take(L.q_bias, p + "self_attn.q_proj.bias", {q}));
      LMSERVE_RETURN_IF_ERROR(take(L.k_bias, p + "self_attn.k_proj.bias", {kv}));
      LMSERVE_RETURN_IF_ERROR(take(L.v_bias, p + "self_attn.v_proj.bias", {kv}));
    }
    if (c.qk_norm) {
      LMSERVE_RETURN_IF_ERROR(take(L.q_norm, p + "self_attn.q_norm.weight", {c.head_dim}));
      LMSERVE_RETURN_IF_ERROR(take(L.k_norm, p + "self_attn.k_norm.weight", {c.head_dim}));
    }
    LMSERVE_RETURN_IF_ERROR(take(L.gate_proj, p + "mlp.gate_proj.weight", {c.intermediate_size, H}));
    LMSERVE_RETURN_IF_ERROR(take(L.up_proj, p + "mlp.up_proj.weight", {c.intermediate_size, H}));
    LMSERVE_RETURN_IF_ERROR(take(L.down_proj, p + "mlp.down_proj.weight", {H, c.intermediate_size}));
  }
  return Status::ok();
}

Result<std::shared_ptr<const ModelWeights>> ModelWeights::from_files(ModelConfig config, WeightFiles files, const std::string& dtype,
                                                                    const std::string& quantization) {
  auto w = std::shared_ptr<ModelWeights>(new ModelWeights());
  w->config_ = std::move(config);
  w->files_ = std::move(files);
  std::optional<DType> target;
  if (dtype != "auto") {
    auto d = parse_dtype(dtype);
    if (!d) return error(d.error());
    target = *d;
  }
  std::set<std::string> used;
  Status st = w->bind([&](const std::string& name, std::vector<std::int64_t> shape) -> Result<Tensor> {
    const TensorView* v = w->files_.find(name);
    if (v == nullptr) return error(StatusCode::kInvalidArgument, "weights: tensor '" + name + "' is missing");
    if (v->shape != shape) {
      return error(StatusCode::kInvalidArgument, "weights: tensor '" + name + "' has shape " + shape_str(v->shape) +
                                                     ", the architecture needs " + shape_str(shape) + " (in " + v->file + ")");
    }
    auto d = dtype_of(v->dtype);
    if (!d) return error(d.error().with_context("weights: tensor '" + name + "'"));
    used.insert(name);
    Tensor t{*d, std::move(shape), v->data, name};
    if (*d == DType::kF8E4M3) {
      // An FP8 projection and its scales: [rows, 1] or [rows] per channel, [] or [1] per tensor.
      if (!is_projection(name)) return error(StatusCode::kInvalidArgument, "weights: tensor '" + name + "': FP8 is supported for the linear projections only");
      const std::string scale_name = name.substr(0, name.size() - std::string_view("weight").size()) + "weight_scale";
      const TensorView* s = w->files_.find(scale_name);
      if (s == nullptr) return error(StatusCode::kInvalidArgument, "weights: FP8 tensor '" + name + "' has no '" + scale_name + "'");
      std::int64_t n = 1;
      for (auto x : s->shape) n *= x;
      const bool per_channel = n == t.shape[0] && (s->shape.size() == 1 || (s->shape.size() == 2 && s->shape[1] == 1));
      if (!(per_channel || n == 1)) {
        return error(StatusCode::kInvalidArgument, "weights: '" + scale_name + "' has shape " + shape_str(s->shape) + ", not one scale per tensor or per output channel");
      }
      auto sd = dtype_of(s->dtype);
      if (!sd || *sd == DType::kF8E4M3) return error(StatusCode::kInvalidArgument, "weights: '" + scale_name + "' must be F32, F16 or BF16");
      auto scales = std::make_shared<std::vector<float>>(static_cast<std::size_t>(n));
      Tensor(Tensor{*sd, s->shape, s->data, scale_name}).to_float(0, n, scales->data());
      for (float x : *scales) {
        if (!(x > 0.0f) || !std::isfinite(x)) return error(StatusCode::kInvalidArgument, "weights: '" + scale_name + "' holds a scale that is not a positive number");
      }
      used.insert(scale_name);
      w->scales_.push_back(scales);
      t.scales = scales->data();
      t.num_scales = n;
      w->fp8_ = true;
      return t;
    }
    if (target && *target != *d) {  // --dtype: convert once at load
      auto buf = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(t.numel() * dtype_bytes(*target)));
      for (std::int64_t i = 0; i < t.numel(); ++i) store(*target, t.at(i), buf->data(), i);
      w->owned_.push_back(buf);
      t.dtype = *target;
      t.data = buf->data();
    }
    return t;
  });
  if (!st.is_ok()) return error(st);
  for (const auto& [name, v] : w->files_.all()) {
    // rotary_emb.inv_freq buffers appear in some older checkpoints; they are recomputed.
    if (!used.contains(name) && name.find("rotary_emb.inv_freq") == std::string::npos &&
        !(w->config_.tie_word_embeddings && name == "lm_head.weight")) {
      return error(StatusCode::kInvalidArgument, "weights: unexpected tensor '" + name + "' for " + w->config_.architecture_name);
    }
  }
  w->dtype_ = target ? *target : w->embed_.dtype;
  LMSERVE_RETURN_IF_ERROR(w->quantize(quantization));
  return std::shared_ptr<const ModelWeights>(std::move(w));
}

Result<std::shared_ptr<const ModelWeights>> ModelWeights::dummy(ModelConfig config, const std::string& dtype, std::uint64_t seed,
                                                               const std::string& quantization) {
  auto w = std::shared_ptr<ModelWeights>(new ModelWeights());
  w->config_ = std::move(config);
  DType d = w->config_.dtype;
  if (dtype != "auto") {
    auto p = parse_dtype(dtype);
    if (!p) return error(p.error());
    d = *p;
  }
  w->dtype_ = d;
  std::uint64_t tensor_index = 0;
  Progress progress("generating dummy weights", static_cast<double>(w->config_.num_parameters()) * static_cast<double>(dtype_bytes(d)),
                    Progress::Unit::kBytes);
  Status st = w->bind([&](const std::string& name, std::vector<std::int64_t> shape) -> Result<Tensor> {
    Tensor t{d, std::move(shape), nullptr, name};
    const auto size = static_cast<std::size_t>(t.numel() * dtype_bytes(d));
    // Not zeroed first (a vector would be, on this thread: seconds for an 8B model): the threads
    // below write every byte, their first touch of the pages spread over them.
    std::shared_ptr<std::byte[]> buf(new std::byte[size]);
    const bool norm = name.ends_with("norm.weight");
    // Uniform weights scaled by 1/sqrt(fan_in) keep activations O(1) through the layers. Each
    // element is a hash of (seed, tensor, index), so threads can fill a tensor in any order
    // and an 8B-parameter model takes seconds, with the same values on every machine.
    const float scale = t.shape.size() == 2 ? 1.0f / std::sqrt(static_cast<float>(t.shape[1])) : 0.02f;
    const std::uint64_t key = seed * 0x9E3779B97F4A7C15ull + (++tensor_index) * 0xD1B54A32D192ED03ull;
    const std::int64_t n = t.numel();
    auto value = [key, norm, scale](std::int64_t i) {
      std::uint64_t z = key + static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);  // [0, 1)
      return norm ? 1.0f : (2.0f * u - 1.0f) * scale;
    };
    // One loop per dtype, the conversion inlined (a store() per element cost a dispatch each).
    auto fill = [&, value](std::int64_t b, std::int64_t e) {
      switch (d) {
        case DType::kBF16:
          for (std::int64_t i = b; i < e; ++i) reinterpret_cast<std::uint16_t*>(buf.get())[i] = float_to_bf16(value(i));
          break;
        case DType::kF16:
          for (std::int64_t i = b; i < e; ++i) reinterpret_cast<std::uint16_t*>(buf.get())[i] = float_to_f16(value(i));
          break;
        default:
          for (std::int64_t i = b; i < e; ++i) store(d, value(i), buf.get(), i);
      }
    };
    const std::int64_t threads = n < (1 << 20) ? 1 : std::max<std::int64_t>(1, std::thread::hardware_concurrency());
    std::vector<std::thread> pool;
    for (std::int64_t k = 0; k < threads; ++k) pool.emplace_back(fill, n * k / threads, n * (k + 1) / threads);
    for (auto& th : pool) th.join();
    w->owned_.push_back(buf);
    t.data = buf.get();
    progress.add(static_cast<double>(size));
    return t;
  });
  progress.done();
  if (!st.is_ok()) return error(st);
  LMSERVE_RETURN_IF_ERROR(w->quantize(quantization));
  return std::shared_ptr<const ModelWeights>(std::move(w));
}

Status ModelWeights::quantize(const std::string& quantization) {
  if (quantization == "none" || quantization.empty()) return Status::ok();
  if (quantization != "fp8") return Status(StatusCode::kInvalidArgument, "quantization '" + quantization + "' is not supported (none, fp8)");
  std::vector<Tensor*> todo;
  for (auto& L : layers_) {
    for (Tensor* t : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj}) {
      if (t->dtype != DType::kF8E4M3) todo.push_back(t);
    }
  }
  // One output channel at a time: scale = max|row| / 448 (1 for a row of zeros), each element
  // e4m3(w / scale). Tensors are spread over the host's threads.
  std::vector<std::shared_ptr<std::vector<std::byte>>> bufs(todo.size());
  std::vector<std::shared_ptr<std::vector<float>>> scales(todo.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    std::vector<float> row;
    for (std::size_t k; (k = next++) < todo.size();) {
      const Tensor& t = *todo[k];
      const std::int64_t rows = t.shape[0], cols = t.shape[1];
      bufs[k] = std::make_shared<std::vector<std::byte>>(static_cast<std::size_t>(rows * cols));
      scales[k] = std::make_shared<std::vector<float>>(static_cast<std::size_t>(rows));
      row.resize(static_cast<std::size_t>(cols));
      auto* q = reinterpret_cast<std::uint8_t*>(bufs[k]->data());
      for (std::int64_t r = 0; r < rows; ++r) {
        t.to_float(r * cols, cols, row.data());
        float amax = 0.0f;
        for (float x : row) amax = std::max(amax, std::fabs(x));
        const float s = amax > 0.0f && std::isfinite(amax) ? amax / 448.0f : 1.0f;
        (*scales[k])[static_cast<std::size_t>(r)] = s;
        for (std::int64_t c = 0; c < cols; ++c) q[r * cols + c] = float_to_fp8_e4m3(row[static_cast<std::size_t>(c)] / s);
      }
    }
  };
  const unsigned threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), static_cast<unsigned>(todo.size())));
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < threads; ++i) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  for (std::size_t k = 0; k < todo.size(); ++k) {
    Tensor& t = *todo[k];
    bytes_ -= t.bytes();
    t.dtype = DType::kF8E4M3;
    t.data = bufs[k]->data();
    t.scales = scales[k]->data();
    t.num_scales = static_cast<std::int64_t>(scales[k]->size());
    bytes_ += t.bytes();
    owned_.push_back(bufs[k]);
    scales_.push_back(scales[k]);
  }
  fp8_ = true;
  return Status::ok();
}

Result<std::shared_ptr<const ModelWeights>> ModelWeights::load(const std::filesystem::path& dir, const LoadOptions& options) {
  auto config = load_config(dir);
  if (!config) return error(config.error());
  if (options.format == LoadOptions::Format::kDummy) return dummy(std::move(*config), options.dtype, options.dummy_seed, options.quantization);
  auto files = WeightFiles::open(dir);
  if (!files) return error(files.error());
  return from_files(std::move(*config), std::move(*files), options.dtype, options.quantization);
}

}  // namespace lmserve::model
