// The pipeline stages of a tokenizer.json, each built from its JSON object:
// normalizer -> pre-tokenizer -> (BPE model) -> post-processor, and the decoder.
// Internal to src/text; tokenizer.h is the public face.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "text/regex.h"

namespace lmserve::text {

// A piece of the input on its way through the pipeline. `at_start`: it begins at offset 0
// of the original input (Metaspace's prepend_scheme "first" depends on it).
struct Piece {
  std::string text;
  bool at_start = false;
};

// A `pattern` of Split/Replace: {"String": "..."} or {"Regex": "..."}.
class Pattern {
 public:
  static Result<Pattern> from_json(const nlohmann::json& j);
  // Non-overlapping matches as [begin, end) byte offsets.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view s) const;
  std::string replace_all(std::string_view s, std::string_view content) const;

 private:
  std::optional<Regex> regex_;
  std::string literal_;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Transforms the token strings in place (may merge them), as tokenizers' decode_chain.
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
  // Whether <0xXX> tokens are decoded together as one byte group (ByteFallback).
  virtual bool groups_byte_tokens() const { return false; }
  // One token's string as the bytes it adds in the middle of a text (not the first token, no
  // replacement of bytes that do not form UTF-8 on their own): what a token mask tries.
  virtual void to_bytes(std::string& token) const { (void)token; }
};

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // Adds the special tokens of a single sequence (only called with add_special_tokens).
  virtual void process(std::vector<std::int32_t>& ids) const = 0;
};

// Each returns nullptr for a JSON null, and InvalidArgument naming the component type for
// anything unsupported or malformed.
Result<std::unique_ptr<Normalizer>> make_normalizer(const nlohmann::json& j);
Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const nlohmann::json& j);
Result<std::unique_ptr<Decoder>> make_decoder(const nlohmann::json& j);
Result<std::unique_ptr<PostProcessor>> make_post_processor(const nlohmann::json& j);

// Unicode normal forms through utf8proc; `form` is one of NFC, NFD, NFKC, NFKD.
std::string unicode_normalize(std::string_view s, std::string_view form);

}  // namespace lmserve::text
