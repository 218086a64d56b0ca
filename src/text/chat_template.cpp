#include "text/chat_template.h"

#include "common/file.h"

namespace lmserve::text {

using ojson = nlohmann::ordered_json;

namespace {

// tokenizer_config.json writes special tokens as strings or as {"content": ..., ...}.
ojson token_text(const ojson& t) {
  if (t.is_string()) return t;
  if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"];
  return nullptr;
}

ojson special_tokens_of(const ojson& config) {
  ojson out = ojson::object();
  for (const char* name : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (config.contains(name)) {
      ojson t = token_text(config[name]);
      if (!t.is_null()) out[name] = t;
    }
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    ojson list = ojson::array();
    for (const auto& t : config["additional_special_tokens"]) {
      ojson s = token_text(t);
      if (!s.is_null()) list.push_back(s);
    }
    out["additional_special_tokens"] = list;
  }
  return out;
}

}  // namespace

std::vector<TextSegment> RenderedPrompt::segments() const {
  std::vector<TextSegment> out;
  std::size_t pos = 0;
  std::string_view all(text);
  for (auto [b, e] : untrusted) {
    if (b > pos) out.push_back({all.substr(pos, b - pos), true});
    out.push_back({all.substr(b, e - b), false});
    pos = e;
  }
  if (pos < all.size()) out.push_back({all.substr(pos), true});
  return out;
}

Result<ChatTemplate> ChatTemplate::from_source(std::string_view source, ojson special_tokens) {
  auto t = jinja::Template::parse(source);
  if (!t) return error(t.error().with_context("chat template"));
  ChatTemplate c;
  c.source_ = std::string(source);
  c.template_ = std::move(*t);
  c.special_tokens_ = std::move(special_tokens);
  return c;
}

Result<ChatTemplate> ChatTemplate::load(const std::filesystem::path& dir, const std::optional<std::filesystem::path>& file) {
  ojson config = ojson::object();
  if (std::filesystem::exists(dir / "tokenizer_config.json")) {
    auto text = read_file(dir / "tokenizer_config.json");
    if (!text) return error(text.error());
    config = ojson::parse(*text, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return error(StatusCode::kInvalidArgument, (dir / "tokenizer_config.json").string() + " is not a JSON object");
    }
  }
  std::string source;
  if (file) {
    auto text = read_file(*file);
    if (!text) return error(text.error());
    source = std::move(*text);
  } else if (std::filesystem::exists(dir / "chat_template.jinja")) {
    auto text = read_file(dir / "chat_template.jinja");
    if (!text) return error(text.error());
    source = std::move(*text);
  } else if (config.contains("chat_template") && config["chat_template"].is_string()) {
    source = config["chat_template"].get<std::string>();
  } else if (config.contains("chat_template") && config["chat_template"].is_array()) {
    for (const auto& t : config["chat_template"]) {
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string()) {
        source = t["template"].get<std::string>();
      }
    }
    if (source.empty()) {
      return error(StatusCode::kNotFound, (dir / "tokenizer_config.json").string() + " has no template named 'default'");
    }
  } else {
    return error(StatusCode::kNotFound, dir.string() + " has no chat template (tokenizer_config.json chat_template or chat_template.jinja)");
  }
  return from_source(source, special_tokens_of(config));
}

Result<RenderedPrompt> ChatTemplate::render(const ChatRequest& request, const jinja::RenderOptions& options) const {
  using jinja::Value;
  // Later entries win: special tokens, then the extra variables, then the fixed names.
  std::vector<std::pair<std::string, Value>> vars;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it) {
    vars.emplace_back(it.key(), Value::from_json(it.value(), false));
  }
  if (request.variables.is_object()) {
    for (auto it = request.variables.begin(); it != request.variables.end(); ++it) {
      vars.emplace_back(it.key(), Value::from_json(it.value(), request.variables_untrusted));
    }
  }
  vars.emplace_back("messages", Value::from_json(request.messages, true));
  vars.emplace_back("tools", Value::from_json(request.tools, true));
  vars.emplace_back("documents", Value::from_json(request.documents, true));
  vars.emplace_back("add_generation_prompt", Value::boolean(request.add_generation_prompt));
  auto out = template_.render(vars, options);
  if (!out) return error(out.error());
  return RenderedPrompt{std::move(out->text), std::move(out->tainted)};
}

}  // namespace lmserve::text
