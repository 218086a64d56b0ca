// lmserve's tokenizer: reads a Hugging Face model folder and produces exactly the ids that
// Hugging Face `tokenizers` produces for its tokenizer.json (`Tokenizer.from_file(path)
// .encode(text, add_special_tokens).ids`), and decodes as `Tokenizer.decode` does.
//
// Supported: BPE (byte-level, and SentencePiece-style with byte_fallback); normalizers NFC,
// NFKC, NFD, NFKD, Lowercase, Prepend, Replace, Strip, Sequence; pre-tokenizers ByteLevel,
// Split, Digits, Metaspace, Whitespace-free Sequence; post-processors TemplateProcessing,
// ByteLevel, Sequence; decoders ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace,
// Sequence. Anything else in a tokenizer.json is a load-time InvalidArgument naming it.
// When tokenizer.json is absent, vocab.json + merges.txt + tokenizer_config.json build the
// byte-level tokenizer transformers would convert them to (Qwen2's slow files).
//
// Thread-safety: a loaded Tokenizer is immutable (its word cache is internally locked);
// share one instance across threads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace lmserve::text {

// A piece of text to encode, and whether added tokens (<|im_start|>, <s>, ...) written in it
// may become their ids. Chat prompts mark text that came from a request (message content,
// tool arguments) as allow_special = false, so that a user cannot inject control tokens.
struct TextSegment {
  std::string_view text;
  bool allow_special = true;
};

struct EncodeOptions {
  bool add_special_tokens = true;  // let the post-processor add BOS/EOS
  bool parse_special = true;       // added-token strings in the text become their ids
};

class TokenizerImpl;

class Tokenizer {
 public:
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Loads DIR/tokenizer.json, or DIR/vocab.json + merges.txt (+ tokenizer_config.json).
  static Result<std::shared_ptr<const Tokenizer>> load(const std::filesystem::path& dir);
  // Builds from the text of a tokenizer.json.
  static Result<std::shared_ptr<const Tokenizer>> from_json(std::string_view tokenizer_json);

  // Invalid UTF-8 in `text` is first replaced with U+FFFD (never a crash).
  std::vector<std::int32_t> encode(std::string_view text, const EncodeOptions& options = {}) const;

  // Encodes the concatenation of `segments` as one text (identical ids to encode() of the
  // joined string when every segment allows special tokens), except that an added token is
  // recognised only where it lies entirely inside segments that allow it.
  std::vector<std::int32_t> encode_segments(std::span<const TextSegment> segments, bool add_special_tokens) const;

  // Unknown ids are skipped, as in tokenizers. Invalid UTF-8 from byte tokens becomes U+FFFD.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const;

  // Largest id + 1 over the model vocabulary and the added tokens.
  std::size_t vocab_size() const;
  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(std::int32_t id) const;
  // The bytes `id` adds in the middle of a text (raw: a byte-level token may hold part of a
  // UTF-8 character); nullopt for special tokens and unknown ids. What a token mask tries.
  std::optional<std::string> token_bytes(std::int32_t id) const;
  // True for added tokens marked special (BOS, EOS, <|im_end|>, ...).
  bool is_special(std::int32_t id) const;
  // True when `id` is a <0xXX> byte token that this tokenizer's decoder groups with its
  // neighbours (ByteFallback): such a group decodes as a whole, so text ending in one may
  // still change when the next token arrives.
  bool is_byte_fallback_token(std::int32_t id) const;
  // True when decode() drops `id`: an unknown id, or a skippable added token when special
  // tokens are skipped. Such an id does not end a group of byte tokens around it.
  bool decodes_to_nothing(std::int32_t id, bool skip_special_tokens) const;

 private:
  explicit Tokenizer(std::unique_ptr<TokenizerImpl> impl);
  std::unique_ptr<TokenizerImpl> impl_;
};

}  // namespace lmserve::text
