// gateway/guard: deny and allow rules over what a user (or a tool) says, per tenant (issue #30).
//
// Text is matched in two normal forms: `folded` (NFKC, case-folded, default-ignorable characters
// such as zero-width spaces removed: full-width letters become ASCII ones; Cyrillic and Greek
// letters that look like Latin ones become those, traditional Chinese characters simplified ones)
// and `compact` (folded, less every space, punctuation mark and symbol: "i g n o r e",
// "ignore...previous" and a line break in a phrase do not hide it). A rule is a PCRE2 regex over one of the forms, or a keyword
// list matched over the compact form with Aho-Corasick (keywords compacted the same way). Allow
// rules are regexes over the folded form: a deny match inside an allow match does not count. A
// request is blocked by the first deny rule (in order: the defaults, the tenant's regexes, its
// keywords) that matches any of its texts, and with the default rules, last, by the injection
// model (injection_model.h) when it scores a text at or above its threshold (the text less what
// allow rules match). Immutable once built; check() from many threads.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace lmserve::gateway {

class InjectionModel;

// The probabilities at which the shipped injection model blocks a text that names an anchor, and
// one that names none (injection_model.h says how they were chosen).
inline constexpr double kInjectionThreshold = 0.75;
inline constexpr double kInjectionThresholdUnanchored = 0.875;
// A text without an anchor is scored only up to this many bytes (of its folded form): what the
// model weighs is diluted over a long document (1/sqrt(features)), and scoring 4 KB takes ~0.6 ms.
inline constexpr std::size_t kInjectionUnanchoredMaxBytes = 2048;

struct GuardSpec {
  bool default_rules = true;  // the shipped prompt-injection rules (English and Chinese)
  // With the default rules: the shipped injection model too (rule id "default.injection_model"),
  // blocking at these probabilities (a text that names an anchor, one that names none).
  bool injection_model = true;
  double injection_threshold = kInjectionThreshold;
  double injection_threshold_unanchored = kInjectionThresholdUnanchored;
  // The model to use; null: the shipped one (InjectionModel::shipped()).
  std::shared_ptr<const InjectionModel> model;
  std::vector<std::string> deny, allow;  // regexes (tenant's: ids "deny[N]")
  std::vector<std::string> keywords;     // phrases (ids "keyword:PHRASE")
};

// The folded and compact forms (exposed for tests). `to_folded` maps each compact byte to the
// folded byte it came from.
struct GuardText {
  std::string folded, compact;
  std::vector<std::size_t> to_folded;
};
GuardText guard_normalise(std::string_view text);

class Guard {
 public:
  // InvalidArgument naming a regex that does not compile.
  static Result<std::shared_ptr<const Guard>> build(const GuardSpec& spec);
  ~Guard();

  // The id of the first deny rule matching one of `texts`; nullopt when they pass.
  std::optional<std::string> check(std::span<const std::string> texts) const;
  std::size_t rules() const;  // deny rules, keywords counted one each
  // The injection model it checks with (null: none) and the probabilities it blocks at.
  const InjectionModel* injection_model() const;
  double injection_threshold() const;
  double injection_threshold_unanchored() const;

 private:
  Guard();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Keywords from a file: one per line, blank lines and lines starting with # skipped.
Result<std::vector<std::string>> read_keywords(const std::string& path);

}  // namespace lmserve::gateway
