#include "gateway/redact.h"

#include <algorithm>
#include <cctype>
#include <vector>

namespace lmserve::gateway {

namespace {

bool digit(char c) { return c >= '0' && c <= '9'; }
bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

bool email_local(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '%' || c == '+' || c == '-'; }
bool email_domain(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-'; }

struct Find {
  std::size_t begin, end;
  const char* tag;
};

// E-mail addresses: local@domain.tld, the domain with at least one dot and a tld of 2+ letters.
void find_emails(std::string_view t, std::vector<Find>& out) {
  for (std::size_t at = t.find('@'); at != std::string_view::npos; at = t.find('@', at + 1)) {
    std::size_t b = at;
    while (b > 0 && email_local(t[b - 1])) --b;
    std::size_t e = at + 1;
    while (e < t.size() && email_domain(t[e])) ++e;
    while (e > at + 1 && (t[e - 1] == '.' || t[e - 1] == '-')) --e;  // a sentence's full stop
    if (b == at || e == at + 1) continue;
    const auto domain = t.substr(at + 1, e - at - 1);
    const auto dot = domain.rfind('.');
    if (dot == std::string_view::npos || dot == 0 || domain.size() - dot - 1 < 2) continue;
    bool tld_letters = true;
    for (char c : domain.substr(dot + 1)) tld_letters = tld_letters && std::isalpha(static_cast<unsigned char>(c));
    if (!tld_letters) continue;
    out.push_back({b, e, "[EMAIL]"});
  }
}

// What a run of digits is, from its digits and grouping: "[ID]", "[CARD]", "[PHONE]" or nullptr.
// `x`: it ended in an ID's check character X; `plus86`: it began with +86.
const char* classify(std::string_view d, const std::vector<std::size_t>& groups, bool plus86, bool x) {
  const bool single = groups.size() == 1;
  if (single && !plus86 && (d.size() == 18 || x) && valid_resident_id(x ? std::string(d) + "X" : std::string(d))) return "[ID]";
  if (x) return nullptr;
  if (!plus86 && d.size() >= 13 && d.size() <= 19 && (single || groups.front() == 4) && luhn_valid(d)) return "[CARD]";
  std::string_view phone = d;
  if (plus86 || (d.size() == 13 && d.starts_with("86"))) phone = d.starts_with("86") ? d.substr(2) : std::string_view();
  const bool grouped_344 = (groups.size() == 3 && groups[0] == 3 && groups[1] == 4 && groups[2] == 4) ||
                           (groups.size() == 4 && groups[0] == 2 && groups[1] == 3 && groups[2] == 4 && groups[3] == 4);
  const bool shape = single || grouped_344;
  if (shape && phone.size() == 11 && phone[0] == '1' && phone[1] >= '3' && phone[1] <= '9') return "[PHONE]";
  return nullptr;
}

// Runs of digits, possibly in groups joined by one space or hyphen, not part of a longer word.
// A run that is nothing as a whole is looked at group by group ("in 2023 13800138000").
void find_numbers(std::string_view t, std::vector<Find>& out) {
  std::size_t i = 0;
  while (i < t.size()) {
    const bool plus86 = t[i] == '+' && i + 3 < t.size() && t[i + 1] == '8' && t[i + 2] == '6';
    if (!digit(t[i]) && !plus86) {
      ++i;
      continue;
    }
    if (i > 0 && (word_char(t[i - 1]) || t[i - 1] == '.')) {  // inside a word or a decimal
      ++i;  // t[i] may be the '+' of "+86", which is not a word character
      while (i < t.size() && (digit(t[i]) || word_char(t[i]))) ++i;
      continue;
    }
    const std::size_t begin = i;
    if (plus86) ++i;
    std::string digits;
    std::vector<std::size_t> groups;                      // the digit count of each group
    std::vector<std::pair<std::size_t, std::size_t>> at;  // and where it is in the text
    std::size_t end = i;
    while (i < t.size()) {
      const std::size_t g = i;
      while (i < t.size() && digit(t[i])) digits.push_back(t[i++]);
      if (i == g) break;
      groups.push_back(i - g);
      at.emplace_back(g, i);
      end = i;
      if (i + 1 < t.size() && (t[i] == ' ' || t[i] == '-') && digit(t[i + 1])) {
        ++i;
        continue;
      }
      break;
    }
    bool x = false;  // an ID's check character may be X
    if (groups.size() == 1 && digits.size() == 17 && end < t.size() && (t[end] == 'X' || t[end] == 'x')) {
      x = true;
      ++end;
    }
    i = end;
    if (end < t.size() && word_char(t[end])) continue;  // a longer word: not a number of ours
    if (const char* tag = classify(digits, groups, plus86, x)) {
      out.push_back({begin, end, tag});
      continue;
    }
    if (groups.size() < 2) continue;
    for (std::size_t k = 0; k < at.size(); ++k) {
      const auto [b, e] = at[k];
      if (const char* tag = classify(t.substr(b, e - b), {e - b}, k == 0 && plus86, false)) out.push_back({k == 0 ? begin : b, e, tag});
    }
  }
}

}  // namespace

bool valid_resident_id(std::string_view s) {
  static constexpr int kWeights[17] = {7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2};
  static constexpr char kCheck[] = "10X98765432";
  if (s.size() != 18) return false;
  int sum = 0;
  for (int i = 0; i < 17; ++i) {
    if (!digit(s[i])) return false;
    sum += (s[i] - '0') * kWeights[i];
  }
  const char c = s[17] == 'x' ? 'X' : s[17];
  // The birth date's month and day must be possible, as the number's issuers check.
  const int month = (s[10] - '0') * 10 + (s[11] - '0'), day = (s[12] - '0') * 10 + (s[13] - '0');
  return c == kCheck[sum % 11] && month >= 1 && month <= 12 && day >= 1 && day <= 31;
}

bool luhn_valid(std::string_view d) {
  if (d.empty()) return false;
  int sum = 0;
  bool twice = false;
  for (auto it = d.rbegin(); it != d.rend(); ++it) {
    if (!digit(*it)) return false;
    int v = *it - '0';
    if (twice) v = v * 2 > 9 ? v * 2 - 9 : v * 2;
    sum += v;
    twice = !twice;
  }
  return sum % 10 == 0;
}

std::string redact(std::string_view text, RedactionCounts* counts) {
  std::vector<Find> finds;
  find_emails(text, finds);
  std::vector<Find> numbers;
  find_numbers(text, numbers);
  for (const auto& n : numbers) {  // digits inside an e-mail address went with it
    bool inside = false;
    for (const auto& e : finds) inside = inside || (n.begin < e.end && e.begin < n.end);
    if (!inside) finds.push_back(n);
  }
  std::sort(finds.begin(), finds.end(), [](const Find& a, const Find& b) { return a.begin < b.begin; });
  RedactionCounts c;
  std::string out;
  out.reserve(text.size());
  std::size_t at = 0;
  for (const auto& f : finds) {
    if (f.begin < at) continue;
    out.append(text.substr(at, f.begin - at)).append(f.tag);
    at = f.end;
    const std::string_view tag = f.tag;
    if (tag == "[ID]") ++c.ids;
    else if (tag == "[PHONE]") ++c.phones;
    else if (tag == "[CARD]") ++c.cards;
    else ++c.emails;
  }
  out.append(text.substr(at));
  if (counts) *counts = c;
  return out;
}

}  // namespace lmserve::gateway
