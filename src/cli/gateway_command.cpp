// lmserve gateway --config FILE: the entry point in front of `serve` replicas (src/gateway/).
#include <spdlog/spdlog.h>

#include <cstdio>

#include "cli/commands.h"
#include "gateway/gateway.h"

namespace lmserve::cli {

Command add_gateway_command(CLI::App& app) {
  struct Opts {
    std::string config;
    int port = -1;
    bool check = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--config", o->config, "the gateway's YAML file (models, backends, policies, timeouts, health)")->required();
  app.add_option("--port", o->port, "listen on this port instead of the file's `listen` port (0: any free port)");
  app.add_flag("--check", o->check, "validate the configuration, print it back in brief, and exit");
  return [o]() {
    if (o->check) {
      auto c = gateway::load_config(o->config);
      if (!c) {
        std::fprintf(stderr, "lmserve gateway: %s\n", c.error().message().c_str());
        return 2;
      }
      std::printf("listen %s:%d\n", c->listen_host.c_str(), c->listen_port);
      for (const auto& m : c->models) {
        std::printf("model %s: %s, %zu backend(s)\n", m.name.c_str(), gateway::policy_name(m.policy), m.backends.size());
      }
      return 0;
    }
    auto g = gateway::Gateway::create({.config_path = o->config, .port_override = o->port});
    if (!g) {
      std::fprintf(stderr, "lmserve gateway: %s\n", g.error().message().c_str());
      return 2;
    }
    if (auto st = (*g)->start(); !st.is_ok()) {
      std::fprintf(stderr, "lmserve gateway: %s\n", st.message().c_str());
      return 1;
    }
    spdlog::info("gateway: listening on port {}", (*g)->port());
    (*g)->run();
    spdlog::info("gateway: stopped");
    return 0;
  };
}

}  // namespace lmserve::cli
