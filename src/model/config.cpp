#include "model/config.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/file.h"

namespace lmserve::model {

using json = nlohmann::json;

std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kF8E4M3: return "float8_e4m3fn";
  }
  return "?";
}

std::string_view safetensors_dtype(DType d) {
  switch (d) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF8E4M3: return "F8_E4M3";
  }
  return "?";
}

int dtype_bytes(DType d) { return d == DType::kF32 ? 4 : d == DType::kF8E4M3 ? 1 : 2; }

Result<DType> parse_dtype(std::string_view n) {
  if (n == "float32" || n == "fp32" || n == "float") return DType::kF32;
  if (n == "float16" || n == "fp16" || n == "half") return DType::kF16;
  if (n == "bfloat16" || n == "bf16") return DType::kBF16;
  return error(StatusCode::kInvalidArgument,
               "unknown dtype '" + std::string(n) + "' (expected auto, float32, bfloat16 or float16)");
}

std::int64_t ModelConfig::num_parameters() const {
  std::int64_t q = num_heads * head_dim, kv = num_kv_heads * head_dim;
  std::int64_t per_layer = hidden_size * (q + 2 * kv) + q * hidden_size + 3 * hidden_size * intermediate_size + 2 * hidden_size;
  if (qkv_bias) per_layer += q + 2 * kv;
  if (qk_norm) per_layer += 2 * head_dim;
  std::int64_t embed = vocab_size * hidden_size;
  return embed * (tie_word_embeddings ? 1 : 2) + num_layers * per_layer + hidden_size;
}

std::int64_t ModelConfig::num_projection_parameters() const {
  const std::int64_t q = num_heads * head_dim, kv = num_kv_heads * head_dim;
  return num_layers * (hidden_size * (q + 2 * kv) + q * hidden_size + 3 * hidden_size * intermediate_size);
}

std::int64_t ModelConfig::num_projection_rows() const {
  const std::int64_t q = num_heads * head_dim, kv = num_kv_heads * head_dim;
  return num_layers * (q + 2 * kv + hidden_size + 2 * intermediate_size + hidden_size);
}

namespace {

Status field_error(const std::string& field, const std::string& what) {
  return Status(StatusCode::kInvalidArgument, "config.json: " + field + " " + what);
}

Result<std::int64_t> positive_int(const json& j, const char* field) {
  if (!j.contains(field) || !j[field].is_number_integer()) return error(field_error(field, "must be an integer"));
  std::int64_t v = j[field].get<std::int64_t>();
  if (v <= 0 || v > (std::int64_t{1} << 40)) return error(field_error(field, "must be positive"));
  return v;
}

void add_ids(const json& j, std::vector<std::int32_t>& out) {
  if (j.is_number_integer()) {
    out.push_back(j.get<std::int32_t>());
  } else if (j.is_array()) {
    for (const auto& x : j) {
      if (x.is_number_integer()) out.push_back(x.get<std::int32_t>());
    }
  }
}

Result<RopeScaling> parse_rope(const json& j) {
  RopeScaling r;
  if (j.is_null()) return r;
  if (!j.is_object()) return error(field_error("rope_scaling", "must be an object or null"));
  std::string type = j.value("rope_type", j.value("type", std::string("default")));
  if (type == "default") return r;
  auto num = [&](const char* k, double def) { return j.contains(k) && j[k].is_number() ? j[k].get<double>() : def; };
  r.factor = num("factor", 1.0);
  if (r.factor <= 0) return error(field_error("rope_scaling.factor", "must be positive"));
  if (type == "linear") {
    r.type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    r.type = RopeScaling::Type::kLlama3;
    r.low_freq_factor = num("low_freq_factor", 1.0);
    r.high_freq_factor = num("high_freq_factor", 4.0);
    r.original_max_position_embeddings = static_cast<std::int64_t>(num("original_max_position_embeddings", 8192));
    if (r.high_freq_factor <= r.low_freq_factor || r.original_max_position_embeddings <= 0) {
      return error(field_error("rope_scaling", "has inconsistent llama3 factors"));
    }
  } else {
    return error(field_error("rope_scaling", "type '" + type + "' is not supported (default, linear, llama3)"));
  }
  return r;
}

}  // namespace

Result<ModelConfig> parse_config(std::string_view config_json, std::string_view generation_json) {
  json j = json::parse(config_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return error(StatusCode::kInvalidArgument, "config.json is not a JSON object");
  ModelConfig c;
  try {
    if (!j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].empty() ||
        !j["architectures"][0].is_string()) {
      return error(field_error("architectures", "must list the model class"));
    }
    c.architecture_name = j["architectures"][0].get<std::string>();
    if (c.architecture_name == "LlamaForCausalLM") {
      c.architecture = Architecture::kLlama;
    } else if (c.architecture_name == "MistralForCausalLM") {
      c.architecture = Architecture::kMistral;
    } else if (c.architecture_name == "Qwen2ForCausalLM") {
      c.architecture = Architecture::kQwen2;
      c.qkv_bias = true;
    } else if (c.architecture_name == "Qwen3ForCausalLM") {
      c.architecture = Architecture::kQwen3;
      c.qk_norm = true;
    } else {
      return error(StatusCode::kUnimplemented, "config.json: architecture '" + c.architecture_name +
                                                   "' is not supported (Llama, Mistral, Qwen2, Qwen3 causal LMs)");
    }
    for (auto [field, dst] : {std::pair{"vocab_size", &c.vocab_size}, {"hidden_size", &c.hidden_size},
                              {"intermediate_size", &c.intermediate_size}, {"num_hidden_layers", &c.num_layers},
                              {"num_attention_heads", &c.num_heads}}) {
      auto v = positive_int(j, field);
      if (!v) return error(v.error());
      *dst = *v;
    }
    if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()) {
      auto v = positive_int(j, "num_key_value_heads");
      if (!v) return error(v.error());
      c.num_kv_heads = *v;
    } else {
      c.num_kv_heads = c.num_heads;
    }
    if (c.num_heads % c.num_kv_heads != 0) {
      return error(field_error("num_key_value_heads", "must divide num_attention_heads"));
    }
    if (j.contains("head_dim") && !j["head_dim"].is_null()) {
      auto v = positive_int(j, "head_dim");
      if (!v) return error(v.error());
      c.head_dim = *v;
    } else {
      if (c.hidden_size % c.num_heads != 0) return error(field_error("num_attention_heads", "must divide hidden_size"));
      c.head_dim = c.hidden_size / c.num_heads;
    }
    if (c.head_dim % 2 != 0) return error(field_error("head_dim", "must be even for rotary embeddings"));
    c.max_position_embeddings = j.value("max_position_embeddings", std::int64_t{4096});
    if (c.max_position_embeddings <= 0) return error(field_error("max_position_embeddings", "must be positive"));
    std::string act = j.value("hidden_act", std::string("silu"));
    if (act != "silu") return error(field_error("hidden_act", "'" + act + "' is not supported (silu)"));
    c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
    c.tie_word_embeddings = j.value("tie_word_embeddings", false);
    if (j.contains("attention_bias") && j["attention_bias"].is_boolean()) c.qkv_bias = c.qkv_bias || j["attention_bias"].get<bool>();
    if (j.value("mlp_bias", false)) return error(field_error("mlp_bias", "true is not supported"));

    // Rope: hub layout (rope_theta, rope_scaling) or transformers 5 (rope_parameters).
    json rope = j.contains("rope_scaling") ? j["rope_scaling"] : json();
    if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
      rope = j["rope_parameters"];
      if (rope.contains("rope_theta")) c.rope_theta = rope["rope_theta"].get<double>();
    }
    if (j.contains("rope_theta") && j["rope_theta"].is_number()) c.rope_theta = j["rope_theta"].get<double>();
    auto r = parse_rope(rope);
    if (!r) return error(r.error());
    c.rope_scaling = *r;
    if (c.architecture != Architecture::kLlama && c.rope_scaling.type == RopeScaling::Type::kLlama3) {
      return error(field_error("rope_scaling", "llama3 scaling is only supported for Llama"));
    }
    if (c.architecture == Architecture::kMistral || c.architecture == Architecture::kQwen2 ||
        c.architecture == Architecture::kQwen3) {
      bool sliding = j.contains("sliding_window") && j["sliding_window"].is_number_integer() &&
                     j["sliding_window"].get<std::int64_t>() < c.max_position_embeddings &&
                     (c.architecture == Architecture::kMistral || j.value("use_sliding_window", false));
      if (sliding) return error(field_error("sliding_window", "attention windows are not supported yet"));
    }
    std::string dt = j.value("torch_dtype", j.value("dtype", std::string("bfloat16")));
    auto d = parse_dtype(dt);
    if (!d) return error(field_error("torch_dtype", "'" + dt + "' is not supported"));
    c.dtype = *d;
    if (j.contains("quantization_config") && j["quantization_config"].is_object()) {
      // FP8 checkpoints as llm-compressor writes them: compressed-tensors, float-quantized,
      // 8-bit float weights per channel or per tensor, activations quantized per token at run time.
      const json& q = j["quantization_config"];
      const std::string method = q.value("quant_method", std::string());
      if (method != "compressed-tensors") {
        return error(field_error("quantization_config", "quant_method '" + method + "' is not supported (compressed-tensors FP8)"));
      }
      const std::string format = q.value("format", std::string());
      if (format != "float-quantized" && format != "naive-quantized") {
        return error(field_error("quantization_config", "format '" + format + "' is not supported (float-quantized)"));
      }
      if (!q.contains("config_groups") || !q["config_groups"].is_object() || q["config_groups"].empty()) {
        return error(field_error("quantization_config", "needs config_groups"));
      }
      for (const auto& [name, group] : q["config_groups"].items()) {
        const json w = group.value("weights", json());
        const std::string strategy = w.is_object() ? w.value("strategy", std::string()) : "";
        if (!w.is_object() || w.value("num_bits", 0) != 8 || w.value("type", std::string()) != "float" ||
            (strategy != "channel" && strategy != "tensor")) {
          return error(field_error("quantization_config", "group " + name + ": only 8-bit float weights per channel or per tensor are supported"));
        }
        const json a = group.value("input_activations", json());
        if (!a.is_null() && (!a.is_object() || !a.value("dynamic", false) || a.value("num_bits", 0) != 8 || a.value("type", std::string()) != "float")) {
          return error(field_error("quantization_config", "group " + name + ": only dynamic 8-bit float activations are supported"));
        }
      }
      c.fp8_checkpoint = true;
    }
    if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) c.bos_token_id = j["bos_token_id"].get<std::int32_t>();
    if (j.contains("eos_token_id")) add_ids(j["eos_token_id"], c.eos_token_ids);
  } catch (const json::exception& e) {
    return error(StatusCode::kInvalidArgument, std::string("config.json: ") + e.what());
  }
  if (!generation_json.empty()) {
    json g = json::parse(generation_json, nullptr, false);
    if (!g.is_discarded() && g.is_object() && g.contains("eos_token_id")) add_ids(g["eos_token_id"], c.eos_token_ids);
  }
  std::sort(c.eos_token_ids.begin(), c.eos_token_ids.end());
  c.eos_token_ids.erase(std::unique(c.eos_token_ids.begin(), c.eos_token_ids.end()), c.eos_token_ids.end());
  return c;
}

Result<ModelConfig> load_config(const std::filesystem::path& dir) {
  if (!std::filesystem::exists(dir / "config.json")) return error(StatusCode::kNotFound, "no config.json in " + dir.string());
  auto config = read_file(dir / "config.json");
  if (!config) return error(config.error());
  std::string gen;
  if (std::filesystem::exists(dir / "generation_config.json")) {
    auto g = read_file(dir / "generation_config.json");
    if (!g) return error(g.error());
    gen = std::move(*g);
  }
  return parse_config(*config, gen);
}

}  // namespace lmserve::model
