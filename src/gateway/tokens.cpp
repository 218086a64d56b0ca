#include "gateway/tokens.h"

#include <nlohmann/json.hpp>

#include "gateway/route_fields.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lmserve::gateway {

Result<std::shared_ptr<const PromptCounter>> PromptCounter::load(const std::string& model_dir) {
  auto tok = text::Tokenizer::load(model_dir);
  if (!tok) return error(tok.error());
  std::shared_ptr<PromptCounter> c(new PromptCounter());
  c->tokenizer_ = std::move(*tok);
  auto tpl = text::ChatTemplate::load(model_dir);
  if (tpl) c->template_ = std::make_unique<text::ChatTemplate>(std::move(*tpl));
  else if (tpl.error().code() != StatusCode::kNotFound) return error(tpl.error());
  return std::shared_ptr<const PromptCounter>(std::move(c));
}

PromptCounter::~PromptCounter() = default;

std::int64_t PromptCounter::count(const nlohmann::json& body) const {
  if (!body.is_object()) return 0;
  if (auto m = body.find("messages"); m != body.end() && m->is_array()) {
    if (!template_) return estimate_prompt_tokens(body);
    text::ChatRequest req;
    req.messages = nlohmann::ordered_json::parse(m->dump(), nullptr, false);
    if (auto t = body.find("tools"); t != body.end() && t->is_array()) req.tools = nlohmann::ordered_json::parse(t->dump(), nullptr, false);
    auto rendered = template_->render(req);
    if (!rendered) return estimate_prompt_tokens(body);  // the replica will refuse it anyway
    const auto segments = rendered->segments();
    return static_cast<std::int64_t>(tokenizer_->encode_segments(segments, false).size());
  }
  auto p = body.find("prompt");
  if (p == body.end()) return 0;
  const auto a = body.find("add_special_tokens");
  const bool add = a == body.end() || !a->is_boolean() || a->get<bool>();  // not a boolean: the replica refuses it
  auto one = [&](const nlohmann::json& v) -> std::int64_t {
    if (v.is_string()) return static_cast<std::int64_t>(tokenizer_->encode(v.get_ref<const std::string&>(), {.add_special_tokens = add}).size());
    if (v.is_array()) return static_cast<std::int64_t>(v.size());  // token ids
    return 0;
  };
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    std::int64_t n = 0;
    for (const auto& v : *p) n += one(v);
    return n;
  }
  return one(*p);
}

std::int64_t estimate_prompt_tokens(const nlohmann::json& body) { return policy_fields(body).estimated_prompt_tokens(); }

}  // namespace lmserve::gateway
