#include "gateway/injection_model.h"

#include <algorithm>
#include <boost/container/small_vector.hpp>
#include <cmath>
#include <fstream>
#include <random>
#include <span>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "gateway/injection_corpus.h"  // generated: the corpora's and the word classes' text
#include "text/regex.h"
#include "text/utf8.h"

namespace lmserve::gateway {

namespace {

constexpr std::uint32_t kBuckets = 1u << 18;  // hashed features

// What an injection aims at, in the compact form (no spaces: "developermode").
constexpr const char* kAnchors =
    "instr|rule|prompt|guideline|guardrail|restrict|polic|system|directive|filter|ethic|limit|jailbreak|developermode|censor|programming|moral"
    "|safety|secur|configur|constraint|setup|assistant|conversation|told|refuse|command|hidden"
    "|指令|指示|规则|提示|系统|限制|约束|设定|道德|审查|越狱|规定|底线|要求|安全|策略|过滤|政策|助手|收到";

// A text that names a word of these classes (data/classes.txt) is anchored too.
constexpr const char* kAnchorClasses[] = {"rules", "secret", "free", "loot", "harm"};
constexpr std::size_t kMaxTermChars = 4;   // the longest Chinese term of the class list
constexpr std::size_t kMaxTermGap = 3;     // bytes of spacing marks between a term's ideographs
constexpr std::size_t kMinReversedChars = 5;  // a word read backwards for its class
constexpr std::size_t kMaxSyllableChars = 6;  // two words read as one (pinyin syllables)
constexpr std::size_t kMinMisspeltChars = 6;  // a class word this long is also read misspelt by a letter
constexpr std::size_t kClassFollowers = 3;  // class pairs: a class and the next ones ...
constexpr std::size_t kClassWindow = 8;     // ... within this many words
// The runs of characters weigh this much beside the words (each group scaled by 1/sqrt(its
// size)): enough to read "i g n o r e" and "ignoreprevious", little enough that the words and
// their classes decide (docs/gateway.md, the 47th session's choice by held-out batches).
constexpr double kRunWeight = 0.2;

// FNV-1a over a kind tag and the feature's bytes, to a bucket.
std::uint32_t bucket(char kind, std::string_view a, std::string_view b = {}) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](unsigned char c) {
    h ^= c;
    h *= 1099511628211ull;
  };
  mix(static_cast<unsigned char>(kind));
  for (unsigned char c : a) mix(c);
  if (!b.empty()) {
    mix(' ');
    for (unsigned char c : b) mix(c);
  }
  return static_cast<std::uint32_t>(h % kBuckets);
}

bool is_letter(char ch) { return ch >= 'a' && ch <= 'z'; }  // of the folded form's ASCII words
bool all_letters(std::string_view w) { return std::all_of(w.begin(), w.end(), is_letter); }

// The word classes of data/classes.txt: each word or Chinese term to its class's number.
struct Classes {
  std::vector<std::string> lines = parse_corpus(kClassList);  // the corpora's format; views below point here
  std::vector<std::string_view> names;
  std::unordered_map<std::string_view, std::uint8_t> of;
  // Each ASCII class word of kMinMisspeltChars letters or more with one letter left out
  // ("ignor", "guidlines"), to its class.
  std::unordered_map<std::string, std::uint8_t> missing_letter;
  std::uint32_t anchors = 0;  // the classes that anchor a text (bit per class)
  Classes() {
    for (const std::string& text : lines) {
      std::string_view line = text;
      const auto colon = line.find(':');
      if (colon == std::string_view::npos) continue;
      const auto id = static_cast<std::uint8_t>(names.size());
      names.push_back(line.substr(0, colon));
      for (const char* a : kAnchorClasses) anchors |= names.back() == a ? 1u << id : 0u;
      line.remove_prefix(colon + 1);
      while (!line.empty()) {
        const auto sp = line.find(' ');
        const auto w = line.substr(0, sp);
        line.remove_prefix(sp == std::string_view::npos ? line.size() : sp + 1);
        if (!w.empty()) of.emplace(w, id);  // a word listed twice keeps its first class
        if (w.size() >= kMinMisspeltChars && all_letters(w)) {
          for (std::size_t k = 0; k < w.size(); ++k) missing_letter.emplace(std::string(w.substr(0, k)).append(w.substr(k + 1)), id);
        }
      }
    }
  }
};
const Classes& classes() {
  static const Classes c;
  return c;
}

bool is_cjk(char32_t cp) { return cp >= 0x4E00 && cp <= 0x9FFF; }
bool is_word_ascii(char32_t cp) { return (cp >= 'a' && cp <= 'z') || (cp >= '0' && cp <= '9') || cp == '\''; }

using Words = boost::container::small_vector<std::string_view, 32>;
using ClassSeq = boost::container::small_vector<std::pair<std::size_t, std::uint8_t>, 16>;  // word index, class

// Words of the folded form: runs of ASCII letters, digits and apostrophes; an ideograph alone.
void words_of(std::string_view folded, Words& words) {
  std::size_t start = std::string_view::npos;
  for (std::size_t i = 0; i < folded.size();) {
    char32_t cp = 0;
    const auto len = static_cast<std::size_t>(std::max(1, text::utf8_decode(folded, i, &cp)));
    if (is_word_ascii(cp)) {
      if (start == std::string_view::npos) start = i;
    } else {
      if (start != std::string_view::npos) words.push_back(folded.substr(start, i - start));
      start = std::string_view::npos;
      if (is_cjk(cp)) words.push_back(folded.substr(i, len));
    }
    i += len;
  }
  if (start != std::string_view::npos) words.push_back(folded.substr(start));
}

// The words of the ordinary corpus: a word the model knows as ordinary is not read as a
// misspelling of a class word ("personal" is not "persona", "directory" not "director").
const std::unordered_set<std::string>& ordinary_words() {
  static const auto words = [] {
    std::unordered_set<std::string> set;
    Words ws;
    for (const std::string& text : benign_corpus()) {
      ws.clear();
      const GuardText n = guard_normalise(text);
      words_of(n.folded, ws);
      for (const auto w : ws) set.emplace(w);
    }
    return set;
  }();
  return words;
}

// The class of a word of letters that is a class word of kMinMisspeltChars letters or more
// misspelt by one letter: one left out ("guidlines"), one added ("ignorre") or two next to each
// other swapped ("ingore"); -1 when none, or when the ordinary corpus has the word.
int misspelt_class(std::string_view w, std::string& buf) {
  const auto& c = classes();
  if (w.size() + 1 < kMinMisspeltChars || !all_letters(w)) return -1;
  buf.assign(w);
  if (ordinary_words().contains(buf)) return -1;
  if (const auto it = c.missing_letter.find(buf); it != c.missing_letter.end()) return it->second;
  auto known = [&](std::string_view v) {
    const auto it = v.size() >= kMinMisspeltChars ? c.of.find(v) : c.of.end();
    return it == c.of.end() ? -1 : static_cast<int>(it->second);
  };
  for (std::size_t k = 0; k < w.size(); ++k) {
    buf.assign(w.substr(0, k)).append(w.substr(k + 1));
    if (const int cl = known(buf); cl >= 0) return cl;
  }
  for (std::size_t k = 0; k + 1 < w.size(); ++k) {
    buf.assign(w);
    std::swap(buf[k], buf[k + 1]);
    if (const int cl = known(buf); cl >= 0) return cl;
  }
  return -1;
}

// The class of the ASCII word at i: as written; with its digits read as the letters they stand
// for ("1gn0r3", "rul3s": 1 as i, then as l); backwards when it is long enough not to meet another
// word by chance ("snoitcurtsni"); with the next word, as one ("gui ze": pinyin in syllables); or
// as a misspelt class word (misspelt_class). -1 when none; `took` is how many words it used.
int ascii_class(const Words& words, std::size_t i, std::string& buf, std::size_t& took) {
  const auto& of = classes().of;
  auto find = [&](std::string_view w) { const auto it = of.find(w); return it == of.end() ? -1 : static_cast<int>(it->second); };
  const std::string_view w = words[i];
  if (const int c = find(w); c >= 0) return c;
  const bool digits = std::any_of(w.begin(), w.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  const bool letters = std::any_of(w.begin(), w.end(), is_letter);
  if (digits && letters) {
    for (const char one : {'i', 'l'}) {
      buf.assign(w);
      for (char& ch : buf) {
        switch (ch) {
          case '0': ch = 'o'; break;
          case '1': ch = one; break;
          case '3': ch = 'e'; break;
          case '4': ch = 'a'; break;
          case '5': ch = 's'; break;
          case '7': ch = 't'; break;
          case '8': ch = 'b'; break;
          default: break;
        }
      }
      if (const int c = find(buf); c >= 0) return c;
    }
  }
  if (w.size() >= kMinReversedChars) {
    buf.assign(w.rbegin(), w.rend());
    if (const int c = find(buf); c >= 0) return c;
  }
  if (i + 1 < words.size() && static_cast<unsigned char>(words[i + 1][0]) < 0x80 && w.size() <= kMaxSyllableChars && words[i + 1].size() <= kMaxSyllableChars) {
    buf.assign(w).append(words[i + 1]);
    if (const int c = find(buf); c >= 0) {
      took = 2;
      return c;
    }
  }
  return misspelt_class(w, buf);
}

// The classes the words name, in order: an ASCII word by ascii_class; a Chinese term as the
// longest run of up to kMaxTermChars ideographs that the list has, the ideographs next to each
// other or apart by no more than a few spaces, hyphens or dots ("忽 略", "无-视").
void classes_of(const Words& words, ClassSeq& seq) {
  const auto& of = classes().of;
  auto ideograph = [&](std::size_t j) { return static_cast<unsigned char>(words[j][0]) >= 0x80; };
  auto joined = [&](std::size_t j) {
    if (!ideograph(j)) return false;
    const char* end = words[j - 1].data() + words[j - 1].size();
    const auto gap = static_cast<std::size_t>(words[j].data() - end);
    return gap <= kMaxTermGap && std::all_of(end, end + gap, [](char ch) { return ch == ' ' || ch == '-' || ch == '.' || ch == '_' || ch == '*' || ch == '/'; });
  };
  std::string buf;
  for (std::size_t i = 0; i < words.size();) {
    std::size_t took = 1;
    int c = -1;
    if (!ideograph(i)) {
      c = ascii_class(words, i, buf, took);
    } else {
      std::size_t run = 1;  // the term's ideographs from i
      while (run < kMaxTermChars && i + run < words.size() && joined(i + run)) ++run;
      for (std::size_t k = run; k >= 1 && c < 0; --k) {
        buf.clear();
        for (std::size_t j = i; j < i + k; ++j) buf.append(words[j]);
        if (const auto it = of.find(buf); it != of.end()) {
          c = it->second;
          took = k;
        }
      }
    }
    if (c >= 0) seq.push_back({i, static_cast<std::uint8_t>(c)});
    i += took;
  }
}

// The text's features to `out` (emptied first), in two groups, each of distinct buckets, sorted:
// the words, word pairs, classes and class pairs; then the compact form's runs of characters.
// Returns the first group's size. A short text's (a prompt's) take no allocation.
template <class Out>
std::size_t features(const GuardText& t, Out& out) {
  out.clear();
  Words words;
  words_of(t.folded, words);
  for (std::size_t i = 0; i < words.size(); ++i) {
    out.push_back(bucket('w', words[i]));
    if (i + 1 < words.size()) out.push_back(bucket('b', words[i], words[i + 1]));
  }
  // Each class, and each with the next kClassFollowers classes within kClassWindow words.
  ClassSeq seq;
  classes_of(words, seq);
  const auto& names = classes().names;
  for (std::size_t a = 0; a < seq.size(); ++a) {
    out.push_back(bucket('c', names[seq[a].second]));
    for (std::size_t b = a + 1; b < seq.size() && b <= a + kClassFollowers && seq[b].first - seq[a].first <= kClassWindow; ++b) {
      out.push_back(bucket('p', names[seq[a].second], names[seq[b].second]));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  const std::size_t split = out.size();
  // Runs of 3 to 5 characters of the compact form.
  const std::string_view compact = t.compact;
  boost::container::small_vector<std::size_t, 128> at;  // each character's first byte, then the end
  for (std::size_t i = 0; i < compact.size();) {
    at.push_back(i);
    char32_t cp = 0;
    i += static_cast<std::size_t>(std::max(1, text::utf8_decode(compact, i, &cp)));
  }
  at.push_back(compact.size());
  const std::size_t chars = at.size() - 1;
  for (std::size_t n = 3; n <= 5; ++n) {
    for (std::size_t i = 0; i + n <= chars; ++i) out.push_back(bucket(static_cast<char>('0' + n), compact.substr(at[i], at[i + n] - at[i])));
  }
  std::sort(out.begin() + static_cast<std::ptrdiff_t>(split), out.end());
  out.erase(std::unique(out.begin() + static_cast<std::ptrdiff_t>(split), out.end()), out.end());
  return split;
}

// The scales of a text's two groups of features (words and classes; character runs): each group
// 1/sqrt(its count), the runs' times kRunWeight.
std::pair<double, double> scales(std::size_t n, std::size_t split) {
  return {split ? 1.0 / std::sqrt(static_cast<double>(split)) : 0.0, n > split ? kRunWeight / std::sqrt(static_cast<double>(n - split)) : 0.0};
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-std::clamp(z, -30.0, 30.0))); }

}  // namespace

struct InjectionModel::Impl {
  std::vector<float> w = std::vector<float>(kBuckets, 0.0f);
  double bias = 0;
  text::Regex anchors = *text::Regex::compile(kAnchors);

  double z(std::span<const std::uint32_t> f, std::size_t split) const {
    const auto [a, b] = scales(f.size(), split);
    double s = 0, r = 0;
    for (std::size_t i = 0; i < split; ++i) s += w[f[i]];
    for (std::size_t i = split; i < f.size(); ++i) r += w[f[i]];
    return bias + s * a + r * b;
  }
};

InjectionModel::InjectionModel() : impl_(std::make_unique<Impl>()) {}
InjectionModel::~InjectionModel() = default;

std::unique_ptr<const InjectionModel> InjectionModel::train(std::span<const std::string> injections, std::span<const std::string> benign, const Options& o) {
  std::unique_ptr<InjectionModel> m(new InjectionModel());
  auto& im = *m->impl_;
  struct Sample {
    std::vector<std::uint32_t> f;
    std::size_t split;
    double y;
  };
  std::vector<Sample> samples;
  for (const auto& [texts, y] : {std::pair{injections, 1.0}, std::pair{benign, 0.0}}) {
    for (const auto& t : texts) {
      samples.push_back({{}, 0, y});
      samples.back().split = features(guard_normalise(t), samples.back().f);
    }
  }
  // Adagrad: each weight's step shrinks with the squares of its gradients so far.
  std::vector<double> g2(kBuckets, 1e-8);
  double gb2 = 1e-8;
  std::vector<std::size_t> order(samples.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937_64 rng(o.seed);
  for (int e = 0; e < o.epochs; ++e) {
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng() % i]);  // Fisher-Yates, the same on every library
    for (auto k : order) {
      const auto& s = samples[k];
      const auto [a, b] = scales(s.f.size(), s.split);
      const double g = sigmoid(im.z(s.f, s.split)) - s.y;
      for (std::size_t i = 0; i < s.f.size(); ++i) {
        const auto j = s.f[i];
        const double gj = g * (i < s.split ? a : b) + o.l2 * im.w[j];
        g2[j] += gj * gj;
        im.w[j] = static_cast<float>(im.w[j] - o.rate * gj / std::sqrt(g2[j]));
      }
      gb2 += g * g;
      im.bias -= o.rate * g / std::sqrt(gb2);
    }
  }
  return m;
}

const InjectionModel& InjectionModel::shipped() {
  static const std::unique_ptr<const InjectionModel> model = train(injection_corpus(), benign_corpus(), Options{});
  return *model;
}

std::unique_ptr<const InjectionModel> InjectionModel::with_examples(std::span<const std::string> injections, std::span<const std::string> benign) {
  std::vector<std::string> inj(injection_corpus().begin(), injection_corpus().end()), ben(benign_corpus().begin(), benign_corpus().end());
  inj.insert(inj.end(), injections.begin(), injections.end());
  ben.insert(ben.end(), benign.begin(), benign.end());
  return train(inj, ben, Options{});
}

bool InjectionModel::anchored(const GuardText& t) const {
  if (impl_->anchors.find(t.compact, 0).has_value()) return true;
  Words words;
  words_of(t.folded, words);
  ClassSeq seq;
  classes_of(words, seq);
  const auto anchors = classes().anchors;
  return std::any_of(seq.begin(), seq.end(), [&](const auto& c) { return (anchors >> c.second) & 1u; });
}

double InjectionModel::probability(const GuardText& t) const {
  boost::container::small_vector<std::uint32_t, 256> f;
  const auto split = features(t, f);
  return sigmoid(impl_->z(f, split));
}

std::vector<std::string> parse_corpus(std::string_view file_text) {
  std::vector<std::string> out;
  while (!file_text.empty()) {
    const auto eol = file_text.find('\n');
    std::string_view line = file_text.substr(0, eol);
    file_text.remove_prefix(eol == std::string_view::npos ? file_text.size() : eol + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    std::string text;
    for (std::size_t i = 0; i < line.size(); ++i) {
      if (line.substr(i, 2) == "\\n") {
        text.push_back('\n');
        i += 1;
      } else if (line.substr(i, 2) == "\\t") {
        text.push_back('\t');
        i += 1;
      } else if (line.substr(i, 6) == "\\u200b") {
        text.append("\xe2\x80\x8b");
        i += 5;
      } else {
        text.push_back(line[i]);
      }
    }
    out.push_back(std::move(text));
  }
  return out;
}

Result<std::vector<std::string>> read_corpus(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(Status(StatusCode::kNotFound, "cannot read " + path));
  std::stringstream text;
  text << in.rdbuf();
  return parse_corpus(text.str());
}

std::span<const std::string> injection_corpus() {
  static const auto corpus = parse_corpus(kInjectionCorpus);
  return corpus;
}

std::span<const std::string> benign_corpus() {
  static const auto corpus = parse_corpus(kBenignCorpus);
  return corpus;
}

}  // namespace lmserve::gateway
