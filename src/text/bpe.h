// The BPE model of Hugging Face tokenizers: a vocabulary, ranked merges, and the options
// byte-level (GPT-2, Llama 3, Qwen2) and SentencePiece-style (Llama 2, Mistral) files use.
// Immutable after construction except for an internal word cache; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace lmserve::text {

struct BpeOptions {
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool byte_fallback = false;  // characters outside the vocabulary become <0xXX> byte tokens
  bool ignore_merges = false;  // a word that is itself in the vocabulary is one token
  std::string continuing_subword_prefix;
  std::string end_of_word_suffix;
};

class BpeModel {
 public:
  // `merges` are (left, right) token strings in rank order. InvalidArgument when a merge
  // names a token, or yields one, that is not in the vocabulary.
  static Result<std::unique_ptr<BpeModel>> create(std::unordered_map<std::string, std::int32_t> vocab,
                                                  const std::vector<std::pair<std::string, std::string>>& merges,
                                                  BpeOptions options);

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<std::int32_t>* ids) const;

  std::optional<std::int32_t> token_to_id(std::string_view token) const;
  const std::string* id_to_token(std::int32_t id) const;  // nullptr if not in the vocabulary
  std::size_t size() const { return vocab_.size(); }

 private:
  struct Symbol {
    std::int32_t id;
    std::int32_t prev, next;
    std::uint32_t len;  // bytes of the word it covers; 0 once merged away
  };
  struct MergeInfo {
    std::int32_t rank;
    std::int32_t new_id;
  };
  static std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
  }
  void split_into_symbols(std::string_view word, std::vector<Symbol>* symbols) const;
  void merge_all(std::vector<Symbol>* symbols) const;

  BpeOptions options_;
  std::unordered_map<std::string, std::int32_t> vocab_;
  std::vector<const std::string*> id_to_token_;
  std::unordered_map<std::uint64_t, MergeInfo> merges_;
  std::optional<std::int32_t> unk_id_;
  std::array<std::int32_t, 256> byte_ids_{};  // <0xXX> ids, -1 where absent

  static constexpr std::size_t kCacheCapacity = 65536;
  static constexpr std::size_t kCacheMaxWordBytes = 256;
  mutable std::shared_mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache_;
};

}  // namespace lmserve::text
