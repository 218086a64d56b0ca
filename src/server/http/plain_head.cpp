#include "server/http/plain_head.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace lmserve::server::http {

const std::array<bool, 256> kTokenChar = [] {
  std::array<bool, 256> t{};
  for (int c = '0'; c <= '9'; ++c) t[c] = true;
  for (int c = 'a'; c <= 'z'; ++c) t[c] = t[c - 32] = true;
  for (const char c : std::string_view("!#$%&'*+-.^_`|~")) t[static_cast<unsigned char>(c)] = true;
  return t;
}();

// Sixteen bytes a step where SSE2 is there.
const char* skip_text(const char* p, const char* end, bool value) {
#if defined(__SSE2__)
  const __m128i lowest = _mm_set1_epi8(value ? 0x20 : 0x21), del = _mm_set1_epi8(0x7f), tab = _mm_set1_epi8(value ? 0x09 : 0x7f);
  for (; end - p >= 16; p += 16) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    // Signed: bytes from 0x80 are below `lowest` too.
    const __m128i bad = _mm_or_si128(_mm_andnot_si128(_mm_cmpeq_epi8(x, tab), _mm_cmplt_epi8(x, lowest)), _mm_cmpeq_epi8(x, del));
    if (const int mask = _mm_movemask_epi8(bad)) return p + __builtin_ctz(static_cast<unsigned>(mask));
  }
#endif
  const unsigned char lowest_c = value ? 0x20 : 0x21;
  for (; p < end; ++p) {
    const auto c = static_cast<unsigned char>(*p);
    if ((c < lowest_c || c > 0x7e) && !(value && c == '\t')) return p;
  }
  return end;
}

}  // namespace lmserve::server::http
