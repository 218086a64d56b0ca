// The gateway in process on port 0 in front of fake replicas (fake_upstream.h): the fixture of
// the end-to-end tests (gateway_test.cpp: routing and resilience; gateway_policy_test.cpp: keys,
// audit, limits, guard).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "client.h"
#include "fake_upstream.h"
#include "gateway/gateway.h"

namespace lmserve::gateway {
namespace {

using lmserve::testing::Call;
using lmserve::testing::Client;
using lmserve::testing::completion;
using lmserve::testing::FakeUpstream;
using lmserve::testing::Reply;
using lmserve::testing::run_calls;
using Ms = std::chrono::milliseconds;

[[maybe_unused]] double since(std::chrono::steady_clock::time_point t) { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count(); }

// A deadline fired at its time: never early; late only by what a loaded machine's timers allow.
[[maybe_unused]] void expect_fired_at(double elapsed_ms, double deadline_ms) {
  EXPECT_GE(elapsed_ms, deadline_ms - 5);
  EXPECT_LE(elapsed_ms, deadline_ms + 300);
}

class GatewayTest : public ::testing::Test {
 protected:
  void TearDown() override {
    stop_gateway();
    for (auto& f : fakes_) f->stop();
    std::filesystem::remove(config_path_);
  }

  FakeUpstream& fake(const std::string& name) {
    fakes_.push_back(std::make_unique<FakeUpstream>(name));
    fakes_.back()->start();
    return *fakes_.back();
  }

  // Writes the configuration (the models part plus `extra`) and starts the gateway on it.
  void start_gateway(const std::string& models, const std::string& extra = "") {
    write_config(models, extra);
    auto g = Gateway::create({.config_path = config_path_, .port_override = 0});
    ASSERT_TRUE(g) << g.error().message();
    gateway_ = std::move(*g);
    ASSERT_TRUE(gateway_->start().is_ok());
    port_ = gateway_->port();
    thread_ = std::thread([this] { gateway_->run(false); });
  }

  // Written aside and renamed into place, so that a reload never reads half a file.
  void write_config(const std::string& models, const std::string& extra = "") {
    const auto tmp = config_path_ + ".tmp";
    const bool own_health = extra.find("health:") != std::string::npos;
    const bool own_log = extra.find("access_log:") != std::string::npos;
    std::ofstream(tmp) << "listen: 127.0.0.1:0\n" << (own_log ? "" : "access_log: false\n") << "scrape_interval_ms: 20\n"
                       << (own_health ? "" : "health: {interval_ms: 50, fail_after: 2, pass_after: 2}\n") << extra << "\nmodels:\n"
                       << models;
    std::filesystem::rename(tmp, config_path_);
  }

  void stop_gateway() {
    if (!gateway_) return;
    gateway_->shutdown();
    if (thread_.joinable()) thread_.join();
    gateway_.reset();
  }

  std::string metrics() { return Client(port_).send({.method = "GET", .path = "/metrics"}).body; }

  // Waits until the gateway's /metrics gives the replica's availability as `available`.
  bool wait_available(const std::string& url, bool available, int timeout_ms = 3000) {
    const auto start = std::chrono::steady_clock::now();
    const std::string line = "backend=\"" + url + "\"";
    while (since(start) < timeout_ms) {
      const auto m = metrics();
      std::istringstream in(m);
      for (std::string l; std::getline(in, l);) {
        if (l.rfind("lmserve:gateway_backend_available{", 0) == 0 && l.find(line) != std::string::npos) {
          if (l.back() == (available ? '1' : '0')) return true;
        }
      }
      std::this_thread::sleep_for(Ms(5));
    }
    return false;
  }

  std::string config_path_ = (std::filesystem::temp_directory_path() / ("lmserve_gateway_test_" + std::to_string(::getpid()) + ".yaml")).string();
  std::vector<std::unique_ptr<FakeUpstream>> fakes_;
  std::unique_ptr<Gateway> gateway_;
  std::thread thread_;
  int port_ = 0;
};

[[maybe_unused]] std::string backend(const std::string& url, const std::string& version = "v1", int weight = 100) {
  return "      - {url: " + url + ", version: " + version + ", weight: " + std::to_string(weight) + "}\n";
}

[[maybe_unused]] Call post(const std::string& body, std::vector<std::pair<std::string, std::string>> headers = {}) {
  return {.method = "POST", .path = "/v1/completions", .body = body, .headers = std::move(headers)};
}

}  // namespace
}  // namespace lmserve::gateway
