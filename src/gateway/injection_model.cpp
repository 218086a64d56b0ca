#include "gateway/injection_model.h"

#include <algorithm>
#include <boost/container/small_vector.hpp>
#include <cmath>
#include <fstream>
#include <sstream>
#include <random>
#include <span>
#include <utility>

#include "gateway/injection_corpus.h"  // generated: the corpora's text
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

bool is_cjk(char32_t cp) { return cp >= 0x4E00 && cp <= 0x9FFF; }
bool is_word_ascii(char32_t cp) { return (cp >= 'a' && cp <= 'z') || (cp >= '0' && cp <= '9') || cp == '\''; }

// The text's features: distinct buckets, sorted, to `out` (emptied first). A short text's (a
// prompt's) take no allocation: `out` and the working lists are small_vectors.
template <class Out>
void features(const GuardText& t, Out& out) {
  out.clear();
  // Words of the folded form: runs of ASCII letters, digits and apostrophes; an ideograph alone.
  boost::container::small_vector<std::string_view, 32> words;
  const std::string_view folded = t.folded;
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
  for (std::size_t i = 0; i < words.size(); ++i) {
    out.push_back(bucket('w', words[i]));
    if (i + 1 < words.size()) out.push_back(bucket('b', words[i], words[i + 1]));
  }
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
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-std::clamp(z, -30.0, 30.0))); }

}  // namespace

struct InjectionModel::Impl {
  std::vector<float> w = std::vector<float>(kBuckets, 0.0f);
  double bias = 0;
  text::Regex anchors = *text::Regex::compile(kAnchors);

  double z(std::span<const std::uint32_t> f) const {
    if (f.empty()) return bias;
    double s = 0;
    for (auto j : f) s += w[j];
    return bias + s / std::sqrt(static_cast<double>(f.size()));
  }
};

InjectionModel::InjectionModel() : impl_(std::make_unique<Impl>()) {}
InjectionModel::~InjectionModel() = default;

std::unique_ptr<const InjectionModel> InjectionModel::train(std::span<const std::string> injections, std::span<const std::string> benign, const Options& o) {
  std::unique_ptr<InjectionModel> m(new InjectionModel());
  auto& im = *m->impl_;
  struct Sample {
    std::vector<std::uint32_t> f;
    double y;
  };
  std::vector<Sample> samples;
  for (const auto& [texts, y] : {std::pair{injections, 1.0}, std::pair{benign, 0.0}}) {
    for (const auto& t : texts) {
      samples.push_back({{}, y});
      features(guard_normalise(t), samples.back().f);
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
      const double scale = s.f.empty() ? 0.0 : 1.0 / std::sqrt(static_cast<double>(s.f.size()));
      const double g = sigmoid(im.z(s.f)) - s.y;
      for (auto j : s.f) {
        const double gj = g * scale + o.l2 * im.w[j];
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

bool InjectionModel::anchored(const GuardText& t) const { return impl_->anchors.find(t.compact, 0).has_value(); }

double InjectionModel::probability(const GuardText& t) const {
  boost::container::small_vector<std::uint32_t, 256> f;
  features(t, f);
  return sigmoid(impl_->z(f));
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
