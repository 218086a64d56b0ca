// common: how deeply a JSON text nests, counted on its bytes before any parser builds it.
//
// Request bodies are parsed into documents that are then copied and walked recursively (chat
// template variables, tool-call arguments, schemas), so a body of a few megabytes of "[" would
// take the stack past its end. Both `serve` and `gateway` refuse a body nested deeper than
// kMaxJsonDepth (no request of the API needs more; schemas have their own, smaller limit).
#pragma once

#include <string_view>

namespace lmserve {

inline constexpr int kMaxJsonDepth = 128;

// True when `text` opens more than `limit` arrays and objects inside one another. Strings and
// their escapes are skipped; the scan stops at the first level past the limit. Not a validator:
// malformed text is the parser's to refuse.
bool json_deeper_than(std::string_view text, int limit = kMaxJsonDepth);

}  // namespace lmserve
