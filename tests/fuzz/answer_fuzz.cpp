// libFuzzer target: any bytes as a replica's answer passing through the gateway: the SSE reader
// (gateway/answer.h) fed the bytes in pieces cut where the input says, the same bytes read as a
// whole JSON answer, and the audit trail's redaction (gateway/redact.h) of the text collected.
// The usage read from a stream must not depend on where the reads cut it; a JSON answer's usage
// scanned in place must be the parsed document's; nothing may crash.
#include <cstdint>
#include <string>
#include <string_view>

#include "gateway/answer.h"
#include "gateway/redact.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  using namespace lmserve::gateway;
  const std::size_t cut_every = 1 + data[0] % 64;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  AnswerReader pieces(true), once(true);
  for (std::size_t at = 0; at < body.size(); at += cut_every) pieces.feed_stream(body.substr(at, cut_every));
  once.feed_stream(body);
  if (pieces.usage().prompt_tokens != once.usage().prompt_tokens || pieces.usage().completion_tokens != once.usage().completion_tokens ||
      pieces.text() != once.text()) {
    __builtin_trap();
  }
  AnswerReader whole(true);
  whole.read_whole(body);
  // The usage scanned in place (no text wanted) is the document's.
  AnswerReader lean(false);
  lean.read_whole(body);
  if (lean.usage().prompt_tokens != whole.usage().prompt_tokens || lean.usage().completion_tokens != whole.usage().completion_tokens) __builtin_trap();
  RedactionCounts counts;
  const std::string redacted = redact(pieces.text() + whole.text() + std::string(body), &counts);
  if (counts.total() < 0 || (counts.total() == 0 && redacted != pieces.text() + whole.text() + std::string(body))) __builtin_trap();
  return 0;
}
