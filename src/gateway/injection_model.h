// gateway/injection_model: a learned prompt-injection detector beside the guard's rules (issue #30).
//
// A logistic regression over hashed features of the guard's normal forms (guard.h), in two groups
// each scaled by 1/sqrt(its count): the words and word pairs of the folded form (a CJK ideograph
// is a word of its own) with the word classes they name (src/gateway/data/classes.txt: "ignore",
// "disregard", "抛开" are one class, "rules", "guardrails", "条条框框" another) and each class
// followed by the next few within a few words; and, at a fifth of the weight, the 3- to
// 5-character runs of the compact form. The rules name phrases; the model weighs the pieces of
// them and their classes, so rewordings and spellings the rules never saw ("set your previous
// instructions aside", "abandon the guardrails", "D i s r e g a r d") still score high.
//
// A text whose compact form contains an anchor, a word that an injection aims at (instruction,
// rule, prompt, system, restriction, 指令, 规则, 限制, ...), or that names a word of the classes
// "rules", "secret", "free", "loot" or "harm" (safeguards, confidential, unfiltered, 框框, vault,
// password, launder, 盗刷, ...; a class word of six letters or more also misspelt by a letter,
// unless the ordinary corpus has that spelling: "guidlines", "gaurdrails"), is held to a lower
// bar than one that names none (most traffic, and texts unlike anything the model was trained
// on), whose probability must be higher to block it (guard.h: kInjectionThreshold,
// kInjectionThresholdUnanchored), which keeps the model's guesses off questions outside its
// training.
//
// The shipped model is trained at first use from the corpora and the classes in src/gateway/data
// (compiled into the binary): the same data and the same seeded passes give the same weights on
// every run. The whole text is one sample: the model is for what a user says, not for long
// documents (an injection buried in one is diluted; the rules still see it).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "gateway/guard.h"

namespace lmserve::gateway {

class InjectionModel {
 public:
  struct Options {
    int epochs = 30;        // passes over the samples, shuffled each time (Adagrad steps)
    double rate = 0.5;      // Adagrad's base step
    double l2 = 1e-4;       // weight decay per step
    std::uint64_t seed = 1;  // the shuffles'
  };
  // Trained on texts labelled injection (1) and benign (0).
  static std::unique_ptr<const InjectionModel> train(std::span<const std::string> injections, std::span<const std::string> benign, const Options& options);
  // The shipped model (trained once per process, on first use, from the built-in corpora).
  static const InjectionModel& shipped();
  // The shipped corpora with an operator's own examples added (guard.injection_examples and
  // guard.benign_examples: attacks it missed, ordinary requests it blocked), trained afresh.
  static std::unique_ptr<const InjectionModel> with_examples(std::span<const std::string> injections, std::span<const std::string> benign);
  // The threshold the shipped model blocks an anchored text at, chosen by the out-of-fold scores of
  // the benign corpus (docs/gateway.md, "The injection model"; tests/gateway/guard_test.cpp).
  static constexpr double kThreshold = kInjectionThreshold;

  ~InjectionModel();
  // Whether the text names an anchor or a word of an anchoring class (the lower of the guard's two
  // bars applies to it).
  bool anchored(const GuardText& t) const;
  // The probability that the text is an injection.
  double probability(const GuardText& t) const;

 private:
  InjectionModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The built-in corpora the shipped model learns from (src/gateway/data: one text per line, lines
// starting with # skipped, "\n", "\t" and "\u200b" written out).
std::vector<std::string> parse_corpus(std::string_view file_text);
Result<std::vector<std::string>> read_corpus(const std::string& path);  // NotFound when unreadable
std::span<const std::string> injection_corpus();
std::span<const std::string> benign_corpus();

}  // namespace lmserve::gateway
