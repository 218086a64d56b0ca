// libFuzzer target: any bytes through encode (with and without special-token parsing, and as
// chat segments), decode of arbitrary ids, and the incremental detokenizer. Must never crash,
// hang or break the detokenizer's guarantee. Tokenizers: models/demo (byte-level BPE) and,
// when ../shared is present, Llama 2 (SentencePiece-style with byte fallback).
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "text/detokenizer.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace {

using lmserve::text::Tokenizer;

std::vector<std::shared_ptr<const Tokenizer>>& tokenizers() {
  static std::vector<std::shared_ptr<const Tokenizer>> all = [] {
    std::vector<std::shared_ptr<const Tokenizer>> t;
    const char* src = std::getenv("LMSERVE_SOURCE_DIR");
    std::string root = src ? src : LMSERVE_SOURCE_DIR;
    for (std::string dir : {root + "/models/demo", std::string(LMSERVE_SHARED_DIR) + "/data/tokenizers/Llama-2-7b-chat-hf"}) {
      if (auto tok = Tokenizer::load(dir)) t.push_back(*tok);
    }
    if (t.empty()) std::abort();  // models/demo must load
    return t;
  }();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  std::string input(reinterpret_cast<const char*>(data), size);
  const auto& tok = tokenizers()[data[0] % tokenizers().size()];

  auto ids = tok->encode(input);
  auto plain = tok->encode(input, {.add_special_tokens = false, .parse_special = false});
  lmserve::text::TextSegment segments[] = {{std::string_view(input).substr(0, size / 2), true},
                                           {std::string_view(input).substr(size / 2), false}};
  auto seg_ids = tok->encode_segments(segments, false);
  (void)seg_ids;
  for (auto id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= tok->vocab_size()) std::abort();
  }

  // Arbitrary ids, including out-of-range ones, through decode and the detokenizer.
  std::vector<std::int32_t> raw;
  for (std::size_t i = 0; i + 1 < size && raw.size() < 64; i += 2) {
    raw.push_back(static_cast<std::int32_t>((data[i] << 8 | data[i + 1]) % (tok->vocab_size() + 16)));
  }
  for (const auto* seq : {&plain, &raw}) {
    for (bool skip : {false, true}) {
      std::string whole = tok->decode(*seq, skip);
      lmserve::text::IncrementalDetokenizer detok(tok, skip);
      std::string streamed;
      for (auto id : *seq) streamed += detok.push(id);
      streamed += detok.finish();
      if (streamed != whole || !lmserve::text::utf8_is_valid(whole)) std::abort();
    }
  }
  return 0;
}
