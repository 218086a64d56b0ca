// gateway/tokens: a request's prompt tokens as its replica will count them, for the token limits
// (limits.h): the completion prompt encoded, or the conversation rendered with the model's chat
// template and encoded, with the tokenizer of the model folder the configuration names
// (models[].tokenizer). Without one, an estimate: a token per 3 bytes of the prompt's text (over
// for English, about right for Chinese); the replica's reported usage settles the difference.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

#include "common/status.h"

namespace lmserve::text {
class Tokenizer;
class ChatTemplate;
}  // namespace lmserve::text

namespace lmserve::gateway {

class PromptCounter {
 public:
  // The folder's tokenizer (required) and chat template (when it has one).
  static Result<std::shared_ptr<const PromptCounter>> load(const std::string& model_dir);
  ~PromptCounter();

  // The request body's prompt tokens (a completion's prompt: a string, a list of strings or of
  // token ids; a chat's messages and tools).
  std::int64_t count(const nlohmann::json& body) const;

 private:
  PromptCounter() = default;
  std::shared_ptr<const text::Tokenizer> tokenizer_;
  std::unique_ptr<text::ChatTemplate> template_;
};

// Without a tokenizer: a token per 3 bytes of the prompt's text (at least 1).
std::int64_t estimate_prompt_tokens(const nlohmann::json& body);

}  // namespace lmserve::gateway
