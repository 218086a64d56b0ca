#include "text/detokenizer.h"

#include <span>

#include "text/utf8.h"

namespace lmserve::text {

IncrementalDetokenizer::IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special_tokens) {}

std::string IncrementalDetokenizer::decode_range(std::size_t begin, std::size_t end) const {
  return tokenizer_->decode(std::span<const std::int32_t>(ids_).subspan(begin, end - begin), skip_special_);
}

std::string IncrementalDetokenizer::push(std::int32_t id) {
  ids_.push_back(id);
  std::string prefix_text = decode_range(prefix_offset_, read_offset_);
  std::string new_text = decode_range(prefix_offset_, ids_.size());
  // Hold back while the text ends in U+FFFD: the last bytes may complete with the next token.
  if (new_text.size() <= prefix_text.size() || new_text.ends_with(kReplacementUtf8) ||
      !new_text.starts_with(prefix_text)) {
    return {};
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return new_text.substr(prefix_text.size());
}

std::string IncrementalDetokenizer::finish() {
  std::string prefix_text = decode_range(prefix_offset_, read_offset_);
  std::string new_text = decode_range(prefix_offset_, ids_.size());
  prefix_offset_ = read_offset_ = ids_.size();
  if (new_text.starts_with(prefix_text)) return new_text.substr(prefix_text.size());
  return new_text.size() > prefix_text.size() ? new_text.substr(prefix_text.size()) : std::string();
}

}  // namespace lmserve::text
