#include "gateway/guards.h"

#include <utility>
#include <vector>

#include "gateway/injection_model.h"

namespace lmserve::gateway {

Result<Guards> build_guards(const GatewayConfig& cfg) {
  Guards out;
  GuardSpec defaults{.default_rules = cfg.guard_default_rules, .injection_model = cfg.guard_injection_model,
                     .injection_threshold = cfg.guard_injection_threshold,
                     .injection_threshold_unanchored = cfg.guard_injection_threshold_unanchored};
  if (cfg.guard_default_rules && cfg.guard_injection_model && (!cfg.guard_injection_examples.empty() || !cfg.guard_benign_examples.empty())) {
    std::vector<std::string> examples[2];
    const std::pair<const char*, const std::string*> files[2] = {{"guard.injection_examples", &cfg.guard_injection_examples},
                                                                 {"guard.benign_examples", &cfg.guard_benign_examples}};
    for (int i = 0; i < 2; ++i) {
      if (files[i].second->empty()) continue;
      auto c = read_corpus(*files[i].second);
      if (!c) return error(Status(StatusCode::kInvalidArgument, std::string(files[i].first) + ": " + c.error().message()));
      examples[i] = std::move(*c);
    }
    defaults.model = InjectionModel::with_examples(examples[0], examples[1]);
  }
  if (cfg.guard_default_rules) {
    auto g = Guard::build(defaults);
    if (!g) return error(g.error());
    out.defaults = std::move(*g);
  }
  for (const auto& [name, t] : cfg.tenants) {
    if (t.deny.empty() && t.allow.empty() && t.keywords_file.empty()) continue;
    GuardSpec spec = defaults;
    spec.deny = t.deny;
    spec.allow = t.allow;
    if (!t.keywords_file.empty()) {
      auto k = read_keywords(t.keywords_file);
      if (!k) return error(Status(StatusCode::kInvalidArgument, "tenants." + name + ".keywords_file: " + k.error().message()));
      spec.keywords = std::move(*k);
    }
    auto g = Guard::build(spec);
    if (!g) return error(Status(StatusCode::kInvalidArgument, "tenants." + name + "." + g.error().message()));
    out.tenants.emplace(name, std::move(*g));
  }
  return out;
}

}  // namespace lmserve::gateway
