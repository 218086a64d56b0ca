// gateway: `lmserve gateway`, the entry point in front of `serve` replicas. It routes each
// OpenAI request by its model to a replica (policies, canary versions, session affinity; see
// router.h), passes the answer through as it comes (proxy.h), watches the replicas (monitor.h),
// and serves its own /health, /ready, /metrics, GET /v1/models and POST /admin/reload.
// It speaks only HTTP to replicas and never links the engine.
//
// Threading: one io_context run by the transport's io_threads. A request and its upstream
// exchange live on the client connection's strand; the monitor has a strand of its own; the
// replicas' state is shared under their own locks. The configuration is an immutable snapshot
// swapped whole on reload (SIGHUP or POST /admin/reload): requests under way keep theirs.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "gateway/config.h"

namespace lmserve::gateway {

struct GatewayOptions {
  std::string config_path;
  int port_override = -1;  // >= 0: listen on this port instead of the file's (0: any free port)
};

class Gateway {
 public:
  // Loads and validates the configuration; InvalidArgument naming the key otherwise.
  static Result<std::unique_ptr<Gateway>> create(GatewayOptions options);
  ~Gateway();

  // Resolves the backends, binds, starts the monitor. Unavailable when the port cannot be bound.
  Status start();
  int port() const;
  int admin_port() const;  // admin_listen's port, bound; -1 without admin_listen
  // Serves until shutdown (SIGINT/SIGTERM when handle_signals; SIGHUP reloads).
  void run(bool handle_signals = true);
  void shutdown();
  // Reads the configuration file again. A bad file keeps the configuration in force and says why.
  Status reload();

  struct Impl;

 private:
  explicit Gateway(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lmserve::gateway
