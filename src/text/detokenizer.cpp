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
  // A byte-fallback group decodes as a whole (one invalid byte turns all of it into U+FFFD),
  // so nothing is final until a token that is not a byte token closes the group. An id that
  // decode() drops (unknown, or a skipped special token) closes nothing: the bytes on either
  // side of it form one group.
  if (tokenizer_->is_byte_fallback_token(id) || tokenizer_->decodes_to_nothing(id, skip_special_)) return {};
  std::string prefix_text = decode_range(prefix_offset_, read_offset_);
  std::string new_text = decode_range(prefix_offset_, ids_.size());
  // Hold back while the text ends in U+FFFD: the last bytes may complete with the next token.
  if (new_text.size() <= prefix_text.size() || new_text.ends_with(kReplacementUtf8) ||
      !new_text.starts_with(prefix_text)) {
    // But what the tokens before this one decode to is final when this token's text comes after
    // it unchanged: bytes that a later byte did not continue can never complete. Emitting it
    // keeps the window a few tokens long through a run of bytes that never form UTF-8, where
    // holding everything made each push decode the whole run (quadratic in it).
    const std::size_t last = ids_.size() - 1;
    if (last > read_offset_) {
      std::string before = decode_range(prefix_offset_, last);
      if (before.size() > prefix_text.size() && before.starts_with(prefix_text) && new_text.size() > before.size() &&
          new_text.starts_with(before)) {
        prefix_offset_ = read_offset_;
        read_offset_ = last;
        return before.substr(prefix_text.size());
      }
    }
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
  // Not reachable with the decoders lmserve supports (each keeps emitted text stable); if a
  // decoder ever rewrote earlier text, emit what differs from the common prefix, cut at a
  // character boundary so the stream stays valid UTF-8.
  std::size_t common = 0;
  while (common < prefix_text.size() && common < new_text.size() && prefix_text[common] == new_text[common]) ++common;
  while (common > 0 && (static_cast<unsigned char>(new_text[common]) & 0xC0) == 0x80) --common;
  return new_text.substr(common);
}

}  // namespace lmserve::text
