// How the guard does on injections no model of it learnt from (issue #30; docs/gateway.md, "The
// injection model"): the measure the injection model's features and corpora are chosen by. Not a
// test: it prints figures.
//
//  - Left-out batches: the injection corpus (src/gateway/data/injections.txt) is a sequence of
//    batches, each opened by a comment block; each of the latest N is scored by the whole guard
//    (rules, and a model trained on every other batch and the whole ordinary corpus).
//  - Out of fold: five models, each trained without a fifth of both corpora, and the guard
//    with each, on that fifth of the ordinary corpus (what the bars are chosen by).
//  - Files (arguments): texts in the corpora's format scored by the guard with the shipped model,
//    each text that goes the unexpected way printed ("--benign FILE" for ordinary ones).
//
// Usage: gateway_guard_batches [--latest N] [--misses] [--quiet] [[--benign] FILE ...]
//   --misses: the left-out batches' texts that pass; --quiet: no ordinary request blocked is printed
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gateway/guard.h"
#include "gateway/injection_model.h"

#include "test_paths.h"

namespace lmserve::gateway {
namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The batches of a corpus file: a comment block after texts opens a new one. Each batch keeps its
// first comment line as its name.
struct Batch {
  std::string name;
  std::vector<std::string> texts;
};
std::vector<Batch> batches_of(const std::string& file) {
  std::vector<Batch> out;
  std::istringstream in(file);
  std::string line, block;
  bool in_comment = false;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '#') {
      if (!in_comment) out.push_back({line, {}});
      in_comment = true;
      continue;
    }
    in_comment = false;
    if (line.empty()) continue;
    if (out.empty()) out.push_back({"(untitled)", {}});
    auto t = parse_corpus(line);
    for (auto& s : t) out.back().texts.push_back(std::move(s));
  }
  std::erase_if(out, [](const Batch& b) { return b.texts.empty(); });
  return out;
}

std::shared_ptr<const Guard> guard_of(const GuardSpec& spec) {
  auto g = Guard::build(spec);
  if (!g) {
    std::fprintf(stderr, "guard: %s\n", g.error().message().c_str());
    std::exit(2);
  }
  return *g;
}

bool blocked(const Guard& g, const std::string& t) { return g.check(std::vector<std::string>{t}).has_value(); }

// A text's verdicts apart: the rules', and the model's probability and anchor, so that other bars
// can be tried on the same scores.
struct Score {
  bool rules;
  double p;
  bool anchored;
  bool blocked(double bar, double bar_unanchored) const { return rules || p >= (anchored ? bar : bar_unanchored); }
};
Score score(const Guard& rules, const InjectionModel& m, const std::string& t) {
  const auto f = guard_normalise(t);
  return {blocked(rules, t), m.probability(f), m.anchored(f)};
}

// The share of the left-out batches and the ordinary requests out of fold that other bars would
// block, on the same scores; and the best pair of bars within a few budgets of ordinary requests.
void sweep(const std::vector<Score>& left_out, const std::vector<Score>& ordinary) {
  std::printf("bars (anchored / not): left-out batches blocked, ordinary requests blocked out of fold\n");
  for (double a : {0.6, 0.7, 0.725, 0.75, 0.775, 0.8}) {
    for (double u : {0.8, 0.825, 0.85, 0.875, 0.9}) {
      if (u < a) continue;
      std::size_t i = 0, o = 0;
      for (const auto& s : left_out) i += s.blocked(a, u);
      for (const auto& s : ordinary) o += s.blocked(a, u);
      std::printf("  %.2f / %.3f: %5.1f%%  %3zu\n", a, u, 100.0 * i / left_out.size(), o);
    }
  }
  // The best pair of bars (steps of 0.025) that blocks at most B ordinary requests out of fold.
  for (std::size_t budget : {9, 13, 17}) {
    double best = 0, ba = 0, bu = 0;
    for (int ai = 12; ai <= 38; ++ai) {
      for (int ui = ai; ui <= 39; ++ui) {
        const double a = ai * 0.025, u = ui * 0.025;
        std::size_t i = 0, o = 0;
        for (const auto& s : ordinary) o += s.blocked(a, u);
        if (o > budget) continue;
        for (const auto& s : left_out) i += s.blocked(a, u);
        const double pct = 100.0 * i / left_out.size();
        if (pct > best) best = pct, ba = a, bu = u;
      }
    }
    std::printf("best with at most %zu ordinary requests blocked: %.1f%% (%.3f / %.3f)\n", budget, best, ba, bu);
  }
}

int run(int argc, char** argv) {
  std::size_t latest = 12;
  bool quiet = false, misses = false;
  std::vector<std::pair<std::string, bool>> files;  // path, attacks
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--latest") && i + 1 < argc) {
      latest = std::stoul(argv[++i]);
    } else if (!std::strcmp(argv[i], "--misses")) {
      misses = true;
    } else if (!std::strcmp(argv[i], "--quiet")) {
      quiet = true;
    } else if (!std::strcmp(argv[i], "--benign") && i + 1 < argc) {
      files.emplace_back(argv[++i], false);
    } else {
      files.emplace_back(argv[i], true);
    }
  }
  const auto data = lmserve::testing::source_dir() / "src" / "gateway" / "data";
  const auto batches = batches_of(read_text(data / "injections.txt"));
  const std::vector<std::string> inj(injection_corpus().begin(), injection_corpus().end()), ben(benign_corpus().begin(), benign_corpus().end());

  const auto rules = guard_of({.injection_model = false});
  std::vector<Score> left_out, ordinary;  // for the sweep of the bars
  std::size_t hit = 0, total = 0;
  for (std::size_t b = batches.size() > latest ? batches.size() - latest : 0; b < batches.size(); ++b) {
    std::vector<std::string> train;
    for (std::size_t o = 0; o < batches.size(); ++o) {
      if (o != b) train.insert(train.end(), batches[o].texts.begin(), batches[o].texts.end());
    }
    std::shared_ptr<const InjectionModel> model = InjectionModel::train(train, ben, {});
    const auto g = guard_of({.model = model});
    std::size_t n = 0;
    for (const auto& t : batches[b].texts) {
      const bool hit_one = blocked(*g, t);
      left_out.push_back(score(*rules, *model, t));
      n += hit_one;
      if (!hit_one && misses) {
        const auto f = guard_normalise(t);
        std::printf("  missed (%.3f%s): %s\n", model->probability(f), model->anchored(f) ? "" : ", no anchor", t.c_str());
      }
    }
    hit += n;
    total += batches[b].texts.size();
    std::printf("left out %5.1f%% %4zu of %4zu  %.70s\n", 100.0 * n / batches[b].texts.size(), n, batches[b].texts.size(), batches[b].name.c_str());
  }
  std::printf("left-out batches: %zu of %zu (%.1f%%)\n", hit, total, total ? 100.0 * hit / total : 0.0);

  constexpr std::size_t kFolds = 5;
  std::size_t ben_blocked = 0;
  for (std::size_t k = 0; k < kFolds; ++k) {
    std::vector<std::string> ti, tb;
    for (std::size_t i = 0; i < inj.size(); ++i) if (i % kFolds != k) ti.push_back(inj[i]);
    for (std::size_t i = 0; i < ben.size(); ++i) if (i % kFolds != k) tb.push_back(ben[i]);
    std::shared_ptr<const InjectionModel> model = InjectionModel::train(ti, tb, {});
    const auto g = guard_of({.model = model});
    for (std::size_t i = k; i < ben.size(); i += kFolds) {
      ordinary.push_back(score(*rules, *model, ben[i]));
      if (blocked(*g, ben[i])) {
        ++ben_blocked;
        if (!quiet) std::printf("  out of fold, blocked: %s\n", ben[i].c_str());
      }
    }
  }
  std::printf("out of fold: %zu of %zu ordinary requests blocked (%.2f%%)\n", ben_blocked, ben.size(), 100.0 * ben_blocked / ben.size());
  if (!left_out.empty()) sweep(left_out, ordinary);
  const auto shipped = guard_of({});
  for (const auto& [path, attacks] : files) {
    const auto texts = parse_corpus(read_text(path));
    std::size_t n = 0;
    for (const auto& t : texts) {
      const bool b = blocked(*shipped, t);
      n += b;
      if (!quiet && b != attacks) std::printf("  %s: %s\n", attacks ? "missed" : "blocked", t.c_str());
    }
    std::printf("%s: %zu of %zu blocked (%.1f%%)\n", path.c_str(), n, texts.size(), texts.empty() ? 0.0 : 100.0 * n / texts.size());
  }
  return 0;
}

}  // namespace
}  // namespace lmserve::gateway

int main(int argc, char** argv) { return lmserve::gateway::run(argc, argv); }
