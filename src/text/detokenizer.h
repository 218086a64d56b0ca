// Streaming detokenization: token ids in, one at a time; text deltas out.
//
// Guarantees, for any id sequence:
//  - the deltas of push() followed by finish() concatenate to exactly
//    tokenizer.decode(all ids, skip_special_tokens);
//  - no delta ends inside a UTF-8 sequence that may still complete: bytes are held until
//    their character is whole. U+FFFD appears only where decode() has it, and for bytes
//    that never complete it is emitted by finish().
//  - SentencePiece leading-space rules hold: each delta is computed from a window that
//    starts at an already-emitted token boundary, so "▁world" after "Hello" becomes " world".
// Cost per push is a decode of a few tokens. Not thread-safe: one per request.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace lmserve::text {

class IncrementalDetokenizer {
 public:
  IncrementalDetokenizer(std::shared_ptr<const Tokenizer> tokenizer, bool skip_special_tokens);

  // Appends `id`; returns the text that became final with it (often empty).
  std::string push(std::int32_t id);
  // Ends the stream; returns the rest, including U+FFFD for incomplete trailing bytes.
  std::string finish();

  const std::vector<std::int32_t>& ids() const { return ids_; }

 private:
  std::string decode_range(std::size_t begin, std::size_t end) const;

  std::shared_ptr<const Tokenizer> tokenizer_;
  bool skip_special_;
  std::vector<std::int32_t> ids_;
  std::size_t prefix_offset_ = 0;  // window start: a token boundary already emitted
  std::size_t read_offset_ = 0;    // tokens up to here are emitted
};

}  // namespace lmserve::text
