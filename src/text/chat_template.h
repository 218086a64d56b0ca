// A model's chat template: where it comes from, and rendering a conversation into the prompt
// text exactly as transformers.apply_chat_template(tokenize=False) does.
//
// Source, in order: an explicit template file (--template / --chat-template), the folder's
// chat_template.jinja, tokenizer_config.json's "chat_template" (a string, or a list of
// {"name", "template"} from which "default" is used). The special-token variables
// (bos_token, eos_token, unk_token, pad_token, ..., additional_special_tokens) come from
// tokenizer_config.json.
//
// Everything that comes from the request (messages, tools, documents, extra template
// variables) is marked untrusted: the rendered prompt knows which bytes came from it, so
// encode_segments() never turns them into special tokens. Immutable; thread-safe.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "text/jinja/template.h"
#include "text/tokenizer.h"

namespace lmserve::text {

struct ChatRequest {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;      // null when the request has none
  nlohmann::ordered_json documents;  // null when the request has none
  bool add_generation_prompt = true;
  // Extra variables (vLLM's chat_template_kwargs, e.g. enable_thinking); they override the
  // special-token variables, as in transformers.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
  // Whether `variables` came from the request (untrusted) or from the server's configuration.
  bool variables_untrusted = true;
};

struct RenderedPrompt {
  std::string text;
  std::vector<std::pair<std::size_t, std::size_t>> untrusted;  // byte ranges from the request

  // The prompt as segments for Tokenizer::encode_segments (untrusted ones allow no specials).
  std::vector<TextSegment> segments() const;
};

class ChatTemplate {
 public:
  // NotFound when the folder has no template; InvalidArgument (with line and column) when
  // it does not parse.
  static Result<ChatTemplate> load(const std::filesystem::path& model_dir,
                                   const std::optional<std::filesystem::path>& template_file = std::nullopt);
  static Result<ChatTemplate> from_source(std::string_view source, nlohmann::ordered_json special_tokens);

  // InvalidArgument for template errors, with raise_exception's message kept
  // ("raise_exception: Conversation roles must alternate ...") for the HTTP 400 body.
  Result<RenderedPrompt> render(const ChatRequest& request, const jinja::RenderOptions& options = {}) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  jinja::Template template_;
  nlohmann::ordered_json special_tokens_;  // name -> string (or list, for additional_special_tokens)
};

}  // namespace lmserve::text
