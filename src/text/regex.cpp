#include "text/regex.h"

namespace lmserve::text {

Result<Regex> Regex::compile(std::string_view pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  // The pattern's UTF-8 is checked (no PCRE2_NO_UTF_CHECK here): a pattern from a config file or
  // a request that is not UTF-8 is refused, where PCRE2 would otherwise read past it (found by
  // guard_fuzz). Subjects are checked by their callers.
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return error(StatusCode::kInvalidArgument, "regex '" + std::string(pattern) + "' does not compile at offset " +
                                                   std::to_string(offset) + ": " + reinterpret_cast<char*>(msg));
  }
  Regex r;
  r.jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;  // optional speed-up; the interpreter is the fallback
  r.pattern_ = std::string(pattern);
  std::uint32_t min_chars = 0;  // 0 when PCRE2 cannot tell
  if (pcre2_pattern_info(code, PCRE2_INFO_MINLENGTH, &min_chars) == 0) r.min_bytes_ = min_chars;
  r.code_ = std::shared_ptr<pcre2_code>(code, CodeDeleter{});
  return r;
}

namespace {

// One match-data block per thread, reused by every pattern: find() reads only the whole match's
// offsets, which a one-pair block holds whatever the pattern's groups (pcre2_match then returns 0,
// "ovector too small", with the first pair set). Saves an allocation per call.
pcre2_match_data* thread_match_data() {
  struct Holder {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~Holder() { pcre2_match_data_free(md); }
  };
  thread_local Holder h;
  return h.md;
}

}  // namespace

std::optional<std::pair<std::size_t, std::size_t>> Regex::find(std::string_view subject, std::size_t from) const {
  // A subject too short for any match is not searched (a character is at least a byte): most
  // guard rules are phrases, and a short prompt then costs no call into PCRE2 per rule.
  if (subject.size() < min_bytes_ || from > subject.size() - min_bytes_) return std::nullopt;
  pcre2_match_data* md = thread_match_data();
  auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  std::size_t pos = from;
  while (pos <= subject.size()) {
    // A JIT-compiled pattern goes straight to its machine code (pcre2_jit_match: pcre2_match's
    // checks of the arguments, a quarter of a short search, are skipped: these are always valid).
    const int rc = jit_ ? pcre2_jit_match(code_.get(), s, subject.size(), pos, 0, md, nullptr)
                        : pcre2_match(code_.get(), s, subject.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) return std::nullopt;  // PCRE2_ERROR_NOMATCH, or a resource limit: no further matches
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const std::size_t b = ov[0], e = ov[1];
    if (e > b) return std::pair{b, e};
    // Empty match: step over one whole character so we never split a UTF-8 sequence.
    pos = b + 1;
    while (pos < subject.size() && (static_cast<unsigned char>(subject[pos]) & 0xC0) == 0x80) ++pos;
  }
  return std::nullopt;
}

std::vector<std::pair<std::size_t, std::size_t>> Regex::find_all(std::string_view subject) const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  for (auto m = find(subject, 0); m; m = find(subject, m->second)) out.push_back(*m);
  return out;
}

std::string regex_escape(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}-/").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace lmserve::text
