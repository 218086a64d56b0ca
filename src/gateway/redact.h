// gateway/redact: personal data taken out of text before it goes into an audit record (issue #30):
// Chinese resident ID numbers (18 characters, the ISO 7064 MOD 11-2 check character valid),
// mainland mobile numbers (11 digits 1[3-9]..., with or without +86 and 3-4-4 grouping), bank card
// numbers (13-19 digits, alone or in groups of four, Luhn-valid) and e-mail addresses. Numbers
// that only look like these (a wrong check digit, a digit too many) are left as they are, so the
// record keeps what is not personal data. Pure functions, thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace lmserve::gateway {

struct RedactionCounts {
  int ids = 0, phones = 0, cards = 0, emails = 0;
  int total() const { return ids + phones + cards + emails; }
};

// `text` with each find replaced by [ID], [PHONE], [CARD] or [EMAIL].
std::string redact(std::string_view text, RedactionCounts* counts = nullptr);

// The checks, for tests and for configured patterns that want them.
bool valid_resident_id(std::string_view eighteen);  // 17 digits and a check digit or X
bool luhn_valid(std::string_view digits);

}  // namespace lmserve::gateway
