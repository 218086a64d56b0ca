// A real redis-server for a test (Debian's, from scripts/install-deps.sh): started on a free
// loopback port with nothing persisted, stopped with the object.
#pragma once

#include <hiredis/hiredis.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "client.h"

namespace lmserve::testing {

class RedisServer {
 public:
  RedisServer() {
    port_ = unused_loopback_port();
    pid_ = fork();
    if (pid_ == 0) {
      const std::string port = std::to_string(port_);
      execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--loglevel", "warning", static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 200; ++i) {
      if (ping()) return;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("redis-server did not start (is it installed? scripts/install-deps.sh)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    throw std::runtime_error("redis-server did not answer");
  }
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  void stop() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  bool ping() const {
    auto* c = redisConnect("127.0.0.1", port_);
    bool ok = c && !c->err;
    if (ok) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
      ok = r && r->type == REDIS_REPLY_STATUS;
      if (r) freeReplyObject(r);
    }
    if (c) redisFree(c);
    return ok;
  }
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace lmserve::testing
