// Redaction (gateway/redact.h) over a generated corpus: every planted resident ID, mobile number,
// bank card and e-mail address is found; look-alikes that fail their checks are left alone.
#include "gateway/redact.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace lmserve::gateway {
namespace {

std::mt19937_64 rng(20261202);

std::string digits(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>('0' + rng() % 10));
  return s;
}

char id_check(const std::string& seventeen) {
  static constexpr int kWeights[17] = {7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2};
  int sum = 0;
  for (int i = 0; i < 17; ++i) sum += (seventeen[i] - '0') * kWeights[i];
  return "10X98765432"[sum % 11];
}

std::string id_body() {  // region, a possible birth date, a sequence number
  char date[16];
  std::snprintf(date, sizeof date, "%04d%02d%02d", 1950 + static_cast<int>(rng() % 60), 1 + static_cast<int>(rng() % 12), 1 + static_cast<int>(rng() % 28));
  std::string s = "1";  // (appended, not concatenated: GCC 12 warns falsely on "1" + std::string)
  s += digits(5);
  s += date;
  s += digits(3);
  return s;
}

std::string valid_id() {
  const auto b = id_body();
  return b + id_check(b);
}

char luhn_digit(const std::string& body) {  // the check digit that makes body + it valid
  for (char c = '0'; c <= '9'; ++c) {
    if (luhn_valid(body + c)) return c;
  }
  return '0';
}

std::string valid_card(int len) {
  std::string body = "6";
  body += digits(len - 2);
  return body + luhn_digit(body);
}

std::string phone() {
  std::string s = "1";
  s.push_back(static_cast<char>('3' + rng() % 7));
  s += digits(9);
  return s;
}

std::string grouped(const std::string& d, const std::vector<int>& sizes, char sep) {
  std::string out;
  std::size_t at = 0;
  for (int n : sizes) {
    if (!out.empty()) out.push_back(sep);
    out += d.substr(at, n);
    at += n;
  }
  return out;
}

TEST(Redact, FindsEveryPlantedItemInEnglishAndChinese) {
  std::vector<std::pair<std::string, std::string>> planted;  // text, tag
  for (int i = 0; i < 200; ++i) {
    planted.emplace_back(valid_id(), "[ID]");
    planted.emplace_back(phone(), "[PHONE]");
    const auto p = phone();
    planted.emplace_back(grouped(p, {3, 4, 4}, i % 2 ? ' ' : '-'), "[PHONE]");
    planted.emplace_back("+86" + p, "[PHONE]");
    planted.emplace_back("+86 " + grouped(p, {3, 4, 4}, ' '), "[PHONE]");
    const auto card = valid_card(13 + static_cast<int>(rng() % 7));
    planted.emplace_back(card, "[CARD]");
    const auto card16 = valid_card(16);
    planted.emplace_back(grouped(card16, {4, 4, 4, 4}, i % 2 ? ' ' : '-'), "[CARD]");
    planted.emplace_back("user" + std::to_string(i) + ".name+tag@bank-" + std::to_string(i) + ".com.cn", "[EMAIL]");
  }
  // An ID ending in X, made on purpose.
  for (int tries = 0; tries < 100000; ++tries) {
    const auto b = id_body();
    if (id_check(b) == 'X') {
      planted.emplace_back(b + "X", "[ID]");
      planted.emplace_back(b + "x", "[ID]");
      break;
    }
  }
  const char* frames[] = {"My number is %s, please call.", "客户的身份证号是%s，请核对。", "(%s)", "%s", "卡号：%s；手机：见上。", "Send it to %s."};
  int found = 0;
  for (std::size_t i = 0; i < planted.size(); ++i) {
    const auto& [item, tag] = planted[i];
    char text[256];
    std::snprintf(text, sizeof text, frames[i % 6], item.c_str());
    RedactionCounts c;
    const auto out = redact(text, &c);
    EXPECT_EQ(out.find(item), std::string::npos) << "not redacted: " << text << " -> " << out;
    EXPECT_NE(out.find(tag), std::string::npos) << text << " -> " << out;
    EXPECT_EQ(c.total(), 1) << text << " -> " << out;
    found += out.find(item) == std::string::npos;
  }
  EXPECT_EQ(found, static_cast<int>(planted.size()));
}

TEST(Redact, LeavesLookAlikesThatFailTheirChecks) {
  std::vector<std::string> lookalikes;
  for (int i = 0; lookalikes.size() < 600; ++i) {
    // An ID with a wrong check character (and not a valid card either).
    const auto b = id_body();
    const char good = id_check(b);
    const std::string bad_id = b + (good == '0' ? '1' : '0');
    if (!luhn_valid(bad_id)) lookalikes.push_back(bad_id);
    // A card number one digit off (not an ID's length with a valid check either).
    auto card = valid_card(16);
    card.back() = static_cast<char>('0' + (card.back() - '0' + 1) % 10);
    lookalikes.push_back(card);
    // Not a mobile: starting 12, or 10 or 12 digits.
    std::string p12x = "12", p10 = "13", p12 = "13";
    p12x += digits(9);
    p10 += digits(8);
    p12 += digits(10);
    lookalikes.push_back(p12x);
    if (!luhn_valid(p10)) lookalikes.push_back(p10);
    if (!luhn_valid(p12)) lookalikes.push_back(p12);
  }
  lookalikes.push_back("version 1.13800138000");  // a decimal
  lookalikes.push_back("order A13800138000");     // inside a word
  lookalikes.push_back("user@localhost");         // no domain
  lookalikes.push_back("a@b.c");                  // a one-letter tld
  lookalikes.push_back("2026-12-02 15:30");       // a date and a time
  for (const auto& l : lookalikes) {
    const std::string text = "reference " + l + " end";
    RedactionCounts c;
    EXPECT_EQ(redact(text, &c), text) << "redacted a look-alike: " << l;
    EXPECT_EQ(c.total(), 0) << l;
  }
}

TEST(Redact, SeveralFindsInOneTextKeepTheRest) {
  const auto id = valid_id();
  const auto card = valid_card(16);
  const std::string text = "ID " + id + ", card " + card + ", mail li.lei@example.com and phone 13800138000.";
  RedactionCounts c;
  EXPECT_EQ(redact(text, &c), "ID [ID], card [CARD], mail [EMAIL] and phone [PHONE].");
  EXPECT_EQ(c.ids, 1);
  EXPECT_EQ(c.cards, 1);
  EXPECT_EQ(c.emails, 1);
  EXPECT_EQ(c.phones, 1);
  EXPECT_EQ(redact(""), "");
  // "+86" right after a word is not a phone's prefix, and is stepped over (it once looped forever).
  EXPECT_EQ(redact("x+8613800138000"), "x+8613800138000");
  EXPECT_EQ(redact("ab+86+86 +8613800138000"), "ab+86+86 [PHONE]");
  // A run of groups that is nothing as a whole is looked at group by group.
  EXPECT_EQ(redact("in 2023 13800138000 items, 2026-12-02"), "in 2023 [PHONE] items, 2026-12-02");
  EXPECT_TRUE(luhn_valid("4111111111111111"));
  EXPECT_FALSE(luhn_valid("4111111111111112"));
  EXPECT_TRUE(valid_resident_id("11010519491231002X"));  // the standard's example
  EXPECT_FALSE(valid_resident_id("110105194912310021"));
}

}  // namespace
}  // namespace lmserve::gateway
