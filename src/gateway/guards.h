// gateway/guards: the guards a configuration asks for (config.h's `guard` and the tenants'
// rules), built once per (re)load and shared by every request; `lmserve gateway guard check`
// builds the same ones to explain a verdict.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "gateway/config.h"
#include "gateway/guard.h"

namespace lmserve::gateway {

struct Guards {
  std::shared_ptr<const Guard> defaults;  // with default_rules; else null
  // Each tenant with rules of its own (the defaults too when they are on).
  std::map<std::string, std::shared_ptr<const Guard>, std::less<>> tenants;
  // What a tenant's requests are checked against (null: nothing).
  const Guard* for_tenant(std::string_view tenant) const {
    auto it = tenants.find(tenant);
    return it != tenants.end() ? it->second.get() : defaults.get();
  }
};

// InvalidArgument naming the key (a rule that does not compile, a file that cannot be read).
Result<Guards> build_guards(const GatewayConfig& config);

}  // namespace lmserve::gateway
