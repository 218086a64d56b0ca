// The gateway end to end, in process on port 0, in front of fault-injecting fake replicas
// (fake_upstream.h): canary splits and stickiness, session affinity, failover before the first
// byte, the terminal event after it, the four timeouts, 429 back-off, client disconnects, reloads
// under load, and kv_aware against round_robin on a skewed load. Real `lmserve serve` replicas
// are in gateway_serve_test.cpp; keys, the audit trail, limits and the guard in
// gateway_policy_test.cpp.
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "gateway_fixture.h"

namespace lmserve::gateway {
namespace {

TEST_F(GatewayTest, CanarySplitsByWeightStaysStickyPerUserAndFollowsTheHeader) {
  auto& a = fake("a");
  auto& b = fake("b");
  auto& c = fake("c");
  start_gateway("  - name: m\n    policy: least_outstanding\n    canary: {header: x-lmserve-version, sticky: user}\n    backends:\n" +
                backend(a.url(), "v1", 45) + backend(b.url(), "v1", 45) + backend(c.url(), "v2", 10));
  // 2,000 requests without a user: weighted draws.
  auto replies = run_calls(port_, 2000, 8, [](int) { return post(completion()); });
  int v2 = 0;
  for (const auto& r : replies) {
    ASSERT_EQ(r.status, 200) << r.body;
    const auto v = r.header("x-lmserve-version");
    ASSERT_TRUE(v == "v1" || v == "v2") << v;
    EXPECT_EQ(r.header("x-lmserve-backend").rfind("http://127.0.0.1:", 0), 0u);
    v2 += v == "v2";
  }
  EXPECT_NEAR(100.0 * v2 / 2000, 10.0, 2.0);
  // 2,000 users, twice each: the split holds over users and no user changes version.
  auto sticky = run_calls(port_, 4000, 8, [](int i) { return post(completion(false, "user-" + std::to_string(i % 2000))); });
  std::map<std::string, std::set<std::string>> versions;
  int users_on_v2 = 0;
  for (int i = 0; i < 4000; ++i) {
    ASSERT_EQ(sticky[i].status, 200);
    versions["user-" + std::to_string(i % 2000)].insert(sticky[i].header("x-lmserve-version"));
  }
  for (const auto& [user, vs] : versions) {
    EXPECT_EQ(vs.size(), 1u) << user << " changed version";
    users_on_v2 += vs.contains("v2");
  }
  EXPECT_NEAR(100.0 * users_on_v2 / 2000, 10.0, 2.0);
  // The header wins over weights and stickiness.
  auto forced = run_calls(port_, 200, 4, [](int i) { return post(completion(false, "user-" + std::to_string(i)), {{"x-lmserve-version", "v2"}}); });
  for (const auto& r : forced) EXPECT_EQ(r.header("x-lmserve-backend"), c.url());
  // A version nobody serves: 503 with Retry-After.
  auto none = Client(port_).send(post(completion(), {{"x-lmserve-version", "v9"}}));
  EXPECT_EQ(none.status, 503);
  EXPECT_FALSE(none.header("retry-after").empty());
  EXPECT_NE(none.body.find("\"code\":\"service_unavailable\""), std::string::npos) << none.body;
}

TEST_F(GatewayTest, AffinityKeepsSessionsOnOneReplicaAndMovesOnlyThoseOfAReplicaThatLeaves) {
  auto& a = fake("a");
  auto& b = fake("b");
  auto& c = fake("c");
  start_gateway("  - name: m\n    policy: round_robin\n    affinity: {header: x-session-id}\n    backends:\n" + backend(a.url()) + backend(b.url()) +
                backend(c.url()));
  auto session = [](int i) { return "s-" + std::to_string(i % 200); };
  auto replies = run_calls(port_, 2000, 8, [&](int i) { return post(completion(), {{"x-session-id", session(i)}}); });
  std::map<std::string, std::map<std::string, int>> where;
  for (int i = 0; i < 2000; ++i) {
    ASSERT_EQ(replies[i].status, 200);
    ++where[session(i)][replies[i].header("x-lmserve-backend")];
  }
  std::map<std::string, std::string> home;
  std::map<std::string, int> per_replica;
  for (const auto& [s, counts] : where) {
    int best = 0, total = 0;
    for (const auto& [url, n] : counts) {
      total += n;
      if (n > best) best = n, home[s] = url;
    }
    EXPECT_GE(best, total * 99 / 100) << s;
    ++per_replica[home[s]];
  }
  EXPECT_EQ(per_replica.size(), 3u);  // sessions spread over all three
  // b leaves (fails its health checks): its sessions move, every other session stays.
  b.behaviour.healthy = false;
  ASSERT_TRUE(wait_available(b.url(), false));
  auto after = run_calls(port_, 200, 8, [&](int i) { return post(completion(), {{"x-session-id", session(i)}}); });
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(after[i].status, 200);
    const auto now = after[i].header("x-lmserve-backend");
    if (home[session(i)] == b.url()) {
      EXPECT_NE(now, b.url());
    } else {
      EXPECT_EQ(now, home[session(i)]) << session(i) << " moved though its replica stayed";
    }
  }
  // b comes back: its sessions come home.
  b.behaviour.healthy = true;
  ASSERT_TRUE(wait_available(b.url(), true));
  auto back = run_calls(port_, 200, 8, [&](int i) { return post(completion(), {{"x-session-id", session(i)}}); });
  for (int i = 0; i < 200; ++i) EXPECT_EQ(back[i].header("x-lmserve-backend"), home[session(i)]);
}


TEST_F(GatewayTest, FailoverBeforeTheFirstByteLosesNoRequest) {
  auto& failing = fake("failing");
  failing.behaviour.status = 500;
  auto& ok = fake("ok");
  const auto refused = "http://127.0.0.1:" + std::to_string(lmserve::testing::unused_loopback_port());
  // A short ejection keeps the failing replicas in rotation, so failover is exercised all along.
  start_gateway("  - name: m\n    policy: round_robin\n    backends:\n" + backend(failing.url()) + backend(refused) + backend(ok.url()),
                "eject: {base_ms: 1, max_ms: 2}\nmax_attempts: 3\nhealth: {interval_ms: 60000}");
  auto replies = run_calls(port_, 2000, 8, [](int i) { return post(completion(i % 2 == 0)); });
  for (const auto& r : replies) {
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("x-lmserve-backend"), ok.url());
  }
  EXPECT_GT(failing.requests.load(), 50);
  const auto m = metrics();
  EXPECT_NE(m.find("lmserve:gateway_retries_total{model=\"m\",backend=\"" + failing.url() + "\",reason=\"status_500\"}"), std::string::npos);
  EXPECT_NE(m.find("reason=\"connect\""), std::string::npos);
  EXPECT_NE(m.find("lmserve:gateway_ejections_total{backend=\"" + failing.url() + "\",reason=\"passive\"}"), std::string::npos);
  EXPECT_NE(m.find("lmserve:gateway_requests_total{model=\"m\",backend=\"" + ok.url() + "\",version=\"v1\",status=\"200\"} 2000"), std::string::npos);
}

TEST_F(GatewayTest, SlowAndHangingReplicasAreLeftForAnotherBeforeTheFirstByte) {
  auto& hanging = fake("hanging");
  hanging.behaviour.first_byte_delay_ms = 20000;
  auto& ok = fake("ok");
  start_gateway("  - name: m\n    policy: round_robin\n    backends:\n" + backend(hanging.url()) + backend(ok.url()),
                "eject: {base_ms: 40, max_ms: 80}\ntimeouts_ms: {first_token: 150}\nhealth: {interval_ms: 60000}");
  auto replies = run_calls(port_, 2000, 16, [](int i) { return post(completion(i % 2 == 0)); });
  for (const auto& r : replies) {
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("x-lmserve-backend"), ok.url());
  }
  EXPECT_GT(hanging.requests.load(), 3);  // it came back after each ejection
  EXPECT_NE(metrics().find("reason=\"first_token_timeout\""), std::string::npos);
}

TEST_F(GatewayTest, AFailureAfterTheFirstByteEndsTheStreamWithATerminalEvent) {
  auto& dropping = fake("dropping");
  dropping.behaviour.chunks = 10;
  dropping.behaviour.drop_after_chunks = 2;
  start_gateway("  - name: m\n    backends:\n" + backend(dropping.url()), "health: {interval_ms: 60000}");
  auto r = Client(port_).send(post(completion(true)));
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("x-accel-buffering"), "no");
  EXPECT_EQ(r.header("content-type"), "text/event-stream");
  EXPECT_NE(r.body.find("\"text\":\"t1\""), std::string::npos) << r.body;
  EXPECT_EQ(r.body.find("\"text\":\"t2\""), std::string::npos) << r.body;
  const auto err = r.body.find("data: {\"error\":{\"code\":\"upstream_failed\",\"message\":\"the replica failed mid-answer\"");
  ASSERT_NE(err, std::string::npos) << r.body;
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n")) << r.body;
  EXPECT_EQ(dropping.requests.load(), 1);  // not retried: the client had bytes already
}

TEST_F(GatewayTest, TheFourTimeoutsFireAsConfigured) {
  // connect: a listener whose backlog is full never completes the handshake.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 0), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::vector<int> fillers;
  for (int i = 0; i < 4; ++i) {
    int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    fillers.push_back(c);
  }
  std::this_thread::sleep_for(Ms(100));
  auto& slow = fake("slow");
  slow.behaviour.first_byte_delay_ms = 5000;
  auto& stalling = fake("stalling");
  stalling.behaviour.chunks = 10;
  stalling.behaviour.stall_after_chunks = 2;
  auto& long_stream = fake("long");
  long_stream.behaviour.chunks = 1000;
  long_stream.behaviour.chunk_delay_ms = 20;
  const auto blackhole = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  start_gateway("  - name: connect\n    backends:\n" + backend(blackhole) + "  - name: first\n    backends:\n" + backend(slow.url()) +
                    "  - name: idle\n    backends:\n" + backend(stalling.url()) + "  - name: total\n    backends:\n" + backend(long_stream.url()),
                "timeouts_ms: {connect: 300, first_token: 400, idle: 300, total: 900}\nhealth: {interval_ms: 60000}\nmax_attempts: 1");
  Client c(port_);
  auto t = std::chrono::steady_clock::now();
  auto r = c.send(post(completion(false, "", "connect")));
  EXPECT_EQ(r.status, 504) << r.body;
  expect_fired_at(since(t), 300);
  EXPECT_NE(metrics().find("kind=\"connect_timeout\""), std::string::npos);

  t = std::chrono::steady_clock::now();
  r = c.send(post(completion(true, "", "first")));
  EXPECT_EQ(r.status, 504) << r.body;
  expect_fired_at(since(t), 400);
  EXPECT_NE(metrics().find("kind=\"first_token_timeout\""), std::string::npos);

  t = std::chrono::steady_clock::now();
  r = c.send(post(completion(true, "", "idle")));
  EXPECT_EQ(r.status, 200);
  expect_fired_at(since(t), 300);
  EXPECT_NE(r.body.find("the replica stopped answering in time"), std::string::npos) << r.body;
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n"));

  t = std::chrono::steady_clock::now();
  r = c.send(post(completion(true, "", "total")));
  EXPECT_EQ(r.status, 200);
  expect_fired_at(since(t), 900);
  EXPECT_NE(r.body.find("\"text\":\"t10\""), std::string::npos);  // it streamed until the deadline
  EXPECT_NE(r.body.find("the replica stopped answering in time"), std::string::npos) << r.body;
  EXPECT_NE(metrics().find("kind=\"total_timeout\""), std::string::npos);
  for (int f : fillers) ::close(f);
  ::close(fd);
}

TEST_F(GatewayTest, WithEveryReplicaEjectedTheEjectionsAreIgnored) {
  auto& only = fake("only");
  only.behaviour.status = 500;
  start_gateway("  - name: m\n    backends:\n" + backend(only.url()), "eject: {base_ms: 60000, max_ms: 60000}\nhealth: {interval_ms: 60000}");
  Client c(port_);
  auto r = c.send(post(completion()));
  EXPECT_EQ(r.status, 502) << r.body;  // its only replica failed
  EXPECT_NE(r.body.find("\"code\":\"upstream_failed\""), std::string::npos) << r.body;
  only.behaviour.status = 200;
  r = c.send(post(completion()));  // ejected for a minute, but the only one there is
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(only.requests.load(), 2);
}

// The replica gets the client's headers but the hop-by-hop and framing ones (the gateway sets its
// own Host, Content-Type, Content-Length), the client's X-Forwarded-For with the client's address
// after it, and the lane the client asked for (no key here to override it) once, as the gateway's.
TEST_F(GatewayTest, TheReplicaGetsTheClientsHeadersButTheHopByHopOnes) {
  auto& a = fake("a");
  start_gateway("  - name: m\n    backends:\n" + backend(a.url()));
  auto r = Client(port_).send(post(completion(), {{"X-Custom", "kept"},
                                                  {"x-forwarded-for", "10.0.0.9"},
                                                  {"Keep-Alive", "timeout=5"},
                                                  {"TE", "trailers"},
                                                  {"X-Lmserve-Lane", "high"},
                                                  {"x-second", "b"}}));
  ASSERT_EQ(r.status, 200) << r.body;
  std::lock_guard lock(a.seen_mu);
  std::vector<std::pair<std::string, std::string>> passed;
  for (const auto& [k, v] : a.seen_headers) {
    if (k == "Host" || k == "Content-Type" || k == "X-Forwarded-For" || k == "Content-Length") {
      EXPECT_EQ(std::count_if(a.seen_headers.begin(), a.seen_headers.end(), [&](const auto& h) { return h.first == k; }), 1) << k;
      const std::string want = k == "Host" ? a.url().substr(7) : k == "Content-Type" ? "application/json" : k == "X-Forwarded-For" ? "10.0.0.9, 127.0.0.1" : v;
      EXPECT_EQ(v, want) << k;  // Host: the replica's address ("http://" left out)
      continue;
    }
    passed.emplace_back(k, v);
  }
  EXPECT_EQ(passed, (std::vector<std::pair<std::string, std::string>>{{"X-Custom", "kept"}, {"x-second", "b"}, {"x-lmserve-lane", "high"}}));
}

TEST_F(GatewayTest, AReplicaAnswering429IsSkippedForItsRetryAfterAndNoneLeftIs503) {
  auto& busy = fake("busy");
  busy.behaviour.status = 429;
  busy.behaviour.retry_after_s = 30;
  auto& ok = fake("ok");
  start_gateway("  - name: m\n    policy: round_robin\n    backends:\n" + backend(busy.url()) + backend(ok.url()), "health: {interval_ms: 60000}");
  auto replies = run_calls(port_, 300, 4, [](int) { return post(completion()); });
  for (const auto& r : replies) EXPECT_EQ(r.status, 200);
  EXPECT_LE(busy.requests.load(), 4);  // at most one per client raced in before the first 429
  ok.behaviour.status = 429;
  ok.behaviour.retry_after_s = 7;
  auto r = Client(port_).send(post(completion()));
  EXPECT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.header("retry-after"), "7");
}

TEST_F(GatewayTest, AClientLeavingClosesTheUpstreamRequestAtOnce) {
  auto& f = fake("f");
  f.behaviour.chunks = 1000;
  f.behaviour.chunk_delay_ms = 10;
  start_gateway("  - name: m\n    backends:\n" + backend(f.url()), "health: {interval_ms: 60000}");
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::socket s(io);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)});
    const auto body = completion(true);
    const auto req = "POST /v1/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                     "\r\n\r\n" + body;
    boost::asio::write(s, boost::asio::buffer(req));
    char buf[256];
    s.read_some(boost::asio::buffer(buf));  // the stream has started
  }
  const auto t = std::chrono::steady_clock::now();
  while (f.disconnects.load() == 0 && since(t) < 2000) std::this_thread::sleep_for(Ms(2));
  EXPECT_EQ(f.disconnects.load(), 1);
  EXPECT_LT(since(t), 500);
  EXPECT_NE(metrics().find("status=\"499\"} 1"), std::string::npos);
}

// A client that stops reading holds the replica back through the gateway (the gateway reads
// from the replica only while the client keeps up), instead of the answer piling up in memory.
TEST_F(GatewayTest, BackpressureReachesTheReplicaWhenTheClientStopsReading) {
  auto& f = fake("bulk");
  f.behaviour.chunks = 4096;
  f.behaviour.event_bytes = 16 * 1024;  // 64 MiB in all
  // An idle deadline shorter than the stall: waiting on the client is not the replica idling.
  start_gateway("  - name: m\n    backends:\n" + backend(f.url()), "health: {interval_ms: 60000}\ntimeouts_ms: {idle: 200}");
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket s(io);
  s.open(boost::asio::ip::tcp::v4());
  s.set_option(boost::asio::socket_base::receive_buffer_size(64 * 1024));
  s.connect({boost::asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)});
  const auto body = completion(true);
  boost::asio::write(s, boost::asio::buffer("POST /v1/completions HTTP/1.1\r\nHost: g\r\nConnection: close\r\nContent-Type: application/json\r\n"
                                            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body));
  std::this_thread::sleep_for(Ms(500));  // not reading
  const double stalled_mib = f.events_sent.load() * 16.0 / 1024;
  std::printf("replica got %.1f MiB ahead of a client that stopped reading\n", stalled_mib);
  EXPECT_LT(stalled_mib, 24.0);
  std::string got;
  boost::system::error_code ec;
  std::vector<char> buf(1 << 16);
  for (;;) {
    const std::size_t n = s.read_some(boost::asio::buffer(buf), ec);
    got.append(buf.data(), n);
    if (ec) break;
  }
  EXPECT_EQ(f.events_sent.load(), 4096);
  EXPECT_GT(got.size(), 64u << 20);
  EXPECT_NE(got.find("data: [DONE]\n\n"), std::string::npos);
  EXPECT_EQ(got.find("\"error\""), std::string::npos);
}

TEST_F(GatewayTest, AReloadUnderLoadDropsNothingAndABadFileKeepsTheOldConfiguration) {
  auto& a = fake("a");
  auto& b = fake("b");
  const std::string first = "  - name: m\n    backends:\n" + backend(a.url(), "v1", 100);
  const std::string second = "  - name: m\n    backends:\n" + backend(a.url(), "v1", 50) + backend(b.url(), "v2", 50);
  start_gateway(first);
  std::atomic<bool> stop{false};
  std::thread reloader([&] {
    for (int i = 0; !stop; ++i) {
      write_config(i % 2 == 0 ? second : first);
      EXPECT_EQ(Client(port_).send({.method = "POST", .path = "/admin/reload"}).status, 200);
      std::this_thread::sleep_for(Ms(20));
    }
  });
  auto replies = run_calls(port_, 2000, 8, [](int i) { return post(completion(i % 3 == 0)); });
  stop = true;
  reloader.join();
  for (const auto& r : replies) ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(b.requests.load(), 0);
  // A bad file: 400 naming the key, and the configuration in force stays.
  write_config(second);
  ASSERT_EQ(Client(port_).send({.method = "POST", .path = "/admin/reload"}).status, 200);
  write_config("  - name: m\n    backends:\n      - {url: http://127.0.0.1:1, weight: heavy}\n");
  auto bad = Client(port_).send({.method = "POST", .path = "/admin/reload"});
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("models[0].backends[0].weight: must be an integer"), std::string::npos) << bad.body;
  auto after = run_calls(port_, 100, 4, [](int) { return post(completion()); });
  std::set<std::string> versions;
  for (const auto& r : after) versions.insert(r.header("x-lmserve-version"));
  EXPECT_EQ(versions, (std::set<std::string>{"v1", "v2"}));
}

TEST_F(GatewayTest, ABackendNamedByDnsIsEveryAddressTheNameResolvesTo) {
  auto& f = fake("f");
  start_gateway("  - name: m\n    backends:\n      - {url: 'http://localhost:" + std::to_string(f.port()) + "'}\n",
                "health: {interval_ms: 50, fail_after: 1, pass_after: 1}\ndns_refresh_ms: 100");
  auto replies = run_calls(port_, 200, 4, [](int) { return post(completion()); });
  for (const auto& r : replies) {
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.header("x-lmserve-backend"), f.url());  // localhost's IPv4 address (the fake listens there only)
  }
  EXPECT_NE(metrics().find("backend=\"" + f.url() + "\""), std::string::npos);
}

TEST_F(GatewayTest, OwnRoutesAnswerAndBadRequestsGetOpenAiErrors) {
  auto& a = fake("a");
  start_gateway("  - name: m\n    backends:\n" + backend(a.url()) + "  - name: other\n    backends:\n" + backend(a.url()));
  Client c(port_);
  auto models = c.send({.method = "GET", .path = "/v1/models"});
  EXPECT_EQ(models.status, 200);
  EXPECT_NE(models.body.find("\"id\":\"m\""), std::string::npos);
  EXPECT_NE(models.body.find("\"id\":\"other\""), std::string::npos);
  EXPECT_EQ(c.send({.method = "GET", .path = "/v1/models/other"}).status, 200);
  EXPECT_EQ(c.send({.method = "GET", .path = "/health"}).status, 200);
  EXPECT_EQ(c.send({.method = "GET", .path = "/ready"}).status, 200);
  struct Case {
    std::string body;
    int status;
    std::string code;
  };
  for (const auto& k : std::vector<Case>{{"{\"model\":\"nope\",\"prompt\":\"x\"}", 404, "model_not_found"},
                                         {"not json", 400, "invalid_request"},
                                         {"{\"prompt\":\"x\"}", 400, "invalid_request"},
                                         {"[1,2]", 400, "invalid_request"}}) {
    auto r = c.send(post(k.body));
    EXPECT_EQ(r.status, k.status) << k.body;
    EXPECT_NE(r.body.find("\"code\":\"" + k.code + "\""), std::string::npos) << r.body;
  }
  a.stop();  // no replica left: /ready says so once the checks notice
  const auto t = std::chrono::steady_clock::now();
  while (c.send({.method = "GET", .path = "/ready"}).status != 503 && since(t) < 3000) std::this_thread::sleep_for(Ms(10));
  EXPECT_EQ(c.send({.method = "GET", .path = "/ready"}).status, 503);
  auto r = c.send(post(completion()));
  EXPECT_EQ(r.status, 503);
  EXPECT_FALSE(r.header("retry-after").empty());
}

// The gateway's share of the bad-input suite (issue #35): what it reads of a request itself (the
// framing, the route and method, the body's JSON and its "model") gets its exact status and
// OpenAI error, and none of it reaches a replica. (What only a replica reads, such as
// max_tokens's range, is the replica's to refuse: serve's suites.)
TEST_F(GatewayTest, BadInputsGetTheirExactStatusAndErrorAndReachNoReplica) {
  auto& a = fake("a");
  start_gateway("  - name: m\n    backends:\n" + backend(a.url()));
  struct Case {
    std::string name, method, path, body;
    int status;
    std::string code, message;
  };
  const std::string chat = "/v1/chat/completions", comp = "/v1/completions";
  const std::string not_object = "the request body must be a JSON object", required = "'model' is required",
                    not_string = "'model' must be a string", no_model = "the model does not exist";
  auto body = [&](const std::string& name, const std::string& b, int status, const std::string& code, const std::string& message) {
    return Case{name, "POST", comp, b, status, code, message};
  };
  std::string deep_array = R"({"model":"m","prompt":"x","x":)" + std::string(129, '[') + std::string(129, ']') + "}";
  std::string deep_object = R"({"model":"m","prompt":"x","x":)";
  for (int i = 0; i < 200; ++i) deep_object += R"({"a":)";
  deep_object += "1" + std::string(200, '}') + "}";
  std::string ok_depth = R"({"model":"m","prompt":"x","x":)" + std::string(127, '[') + std::string(127, ']') + "}";
  std::vector<Case> cases = {
      body("not json", "not json", 400, "invalid_request", not_object),
      body("truncated", R"({"model":"m",)", 400, "invalid_request", not_object),
      body("an array", R"([{"model":"m"}])", 400, "invalid_request", not_object),
      body("a string", R"("m")", 400, "invalid_request", not_object),
      body("null", "null", 400, "invalid_request", not_object),
      body("a number", "42", 400, "invalid_request", not_object),
      body("true", "true", 400, "invalid_request", not_object),
      body("empty", "", 400, "invalid_request", not_object),
      body("only whitespace", " \r\n\t ", 400, "invalid_request", not_object),
      body("invalid UTF-8 in a string", "{\"model\":\"m\",\"prompt\":\"\xff\xfe\"}", 400, "invalid_request", not_object),
      body("invalid UTF-8 in the model", "{\"model\":\"m\xc3\"}", 400, "invalid_request", not_object),
      body("overlong UTF-8", "{\"model\":\"m\",\"prompt\":\"\xc0\xaf\"}", 400, "invalid_request", not_object),
      body("a lone surrogate", R"({"model":"m","prompt":"\ud800"})", 400, "invalid_request", not_object),
      body("NaN", R"({"model":"m","temperature":NaN})", 400, "invalid_request", not_object),
      body("Infinity", R"({"model":"m","temperature":Infinity})", 400, "invalid_request", not_object),
      body("a number past double", R"({"model":"m","temperature":1e999})", 400, "invalid_request", not_object),
      body("trailing bytes", R"({"model":"m","prompt":"x"} x)", 400, "invalid_request", not_object),
      body("two objects", R"({"model":"m"}{"model":"m"})", 400, "invalid_request", not_object),
      body("a comment", R"({"model":"m" /* c */})", 400, "invalid_request", not_object),
      body("single quotes", R"({'model':'m'})", 400, "invalid_request", not_object),
      body("an unquoted key", R"({model:"m"})", 400, "invalid_request", not_object),
      body("a trailing comma", R"({"model":"m",})", 400, "invalid_request", not_object),
      body("a control character in a string", "{\"model\":\"m\",\"prompt\":\"a\x01\"}", 400, "invalid_request", not_object),
      body("a bad escape", R"({"model":"m","prompt":"\q"})", 400, "invalid_request", not_object),
      body("nested too deep (arrays)", deep_array, 400, "invalid_request", "the request body is nested too deeply"),
      body("nested too deep (objects)", deep_object, 400, "invalid_request", "the request body is nested too deeply"),
      body("no model", R"({"prompt":"x"})", 400, "invalid_request", required),
      body("an empty object", "{}", 400, "invalid_request", required),
      body("model only inside", R"({"x":{"model":"m"},"prompt":"x"})", 400, "invalid_request", required),
      body("Model in capitals", R"({"Model":"m","prompt":"x"})", 400, "invalid_request", required),
      body("model a number", R"({"model":5,"prompt":"x"})", 400, "invalid_request", not_string),
      body("model null", R"({"model":null,"prompt":"x"})", 400, "invalid_request", not_string),
      body("model true", R"({"model":true,"prompt":"x"})", 400, "invalid_request", not_string),
      body("model a float", R"({"model":1.5,"prompt":"x"})", 400, "invalid_request", not_string),
      body("model negative", R"({"model":-1,"prompt":"x"})", 400, "invalid_request", not_string),
      body("model a list", R"({"model":["m"],"prompt":"x"})", 400, "invalid_request", not_string),
      body("model an object", R"({"model":{"id":"m"},"prompt":"x"})", 400, "invalid_request", not_string),
      body("model twice", R"({"model":"m","prompt":"x","model":"m"})", 400, "invalid_request", "'model' is given twice"),
      body("model twice, escaped", R"({"model":"m","prompt":"x","\u006dodel":"other"})", 400, "invalid_request", "'model' is given twice"),
      body("an unknown model", R"({"model":"gpt-9","prompt":"x"})", 404, "model_not_found", no_model),
      body("an empty model", R"({"model":"","prompt":"x"})", 404, "model_not_found", no_model),
      body("a model with NUL", R"({"model":"m\u0000","prompt":"x"})", 404, "model_not_found", no_model),
      body("a model in other case", R"({"model":"M","prompt":"x"})", 404, "model_not_found", no_model),
      body("a model with spaces", R"({"model":" m ","prompt":"x"})", 404, "model_not_found", no_model),
      body("a model with a path", R"({"model":"../m","prompt":"x"})", 404, "model_not_found", no_model),
      body("a huge model name", R"({"model":")" + std::string(100000, 'm') + R"(","prompt":"x"})", 404, "model_not_found", no_model),
      {"chat: not json", "POST", chat, "{", 400, "invalid_request", not_object},
      {"chat: no model", "POST", chat, R"({"messages":[{"role":"user","content":"x"}]})", 400, "invalid_request", required},
      {"chat: model a list", "POST", chat, R"({"model":[],"messages":[]})", 400, "invalid_request", not_string},
      {"GET a completion", "GET", comp, "", 405, "method_not_allowed", "this route takes POST"},
      {"PUT a chat", "PUT", chat, R"({"model":"m"})", 405, "method_not_allowed", "this route takes POST"},
      {"DELETE a chat", "DELETE", chat, "", 405, "method_not_allowed", "this route takes POST"},
      {"PATCH an unknown /v1 route", "PATCH", "/v1/unknown", "", 405, "method_not_allowed", "this route takes POST"},
      {"POST the models", "POST", "/v1/models", "{}", 405, "method_not_allowed", "this route takes GET"},
      {"DELETE a model", "DELETE", "/v1/models/m", "", 405, "method_not_allowed", "this route takes GET"},
      {"POST health", "POST", "/health", "", 405, "method_not_allowed", "this route takes GET"},
      {"PUT ready", "PUT", "/ready", "", 405, "method_not_allowed", "this route takes GET"},
      {"POST metrics", "POST", "/metrics", "", 405, "method_not_allowed", "this route takes GET"},
      {"GET reload", "GET", "/admin/reload", "", 405, "method_not_allowed", "this route takes POST"},
      {"GET an unknown route", "GET", "/nope", "", 404, "not_found", "no such route"},
      {"DELETE an unknown route", "DELETE", "/nope", "", 404, "not_found", "no such route"},
      {"GET an unknown admin route", "GET", "/admin/nope", "", 404, "not_found", "no such route"},
  };
  Client c(port_);
  for (const auto& k : cases) {
    Reply r = c.send({.method = k.method, .path = k.path, .body = k.body});
    EXPECT_EQ(r.status, k.status) << k.name << ": " << r.body.substr(0, 200);
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << k.name << ": " << r.body.substr(0, 200);
    EXPECT_EQ(j["error"]["code"], k.code) << k.name;
    EXPECT_EQ(j["error"]["message"], k.message) << k.name;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error") << k.name;
    EXPECT_TRUE(j["error"].contains("param")) << k.name;
    if (k.status == 405) {
      EXPECT_FALSE(r.header("allow").empty()) << k.name;
    }
  }
  // Nesting up to the limit passes to the replica.
  EXPECT_EQ(c.send(post(ok_depth)).status, 200);
  EXPECT_EQ(a.requests, 1);
  // Framing: smuggling attempts and abuse get one 400 (431, 413) and the close; a request
  // behind them is never read.
  const std::string head = "POST /v1/completions HTTP/1.1\r\nHost: gw\r\n", ok = completion();
  const std::string smuggled = "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Length: " + std::to_string(ok.size()) + "\r\n\r\n" + ok;
  struct Raw {
    std::string name, bytes;
    int status;
    std::string message;
  };
  const std::string bad_http = "the request is not valid HTTP";
  const std::vector<Raw> raws = {
      {"length and chunked", head + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled, 400, bad_http},
      {"chunked and length", head + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n" + smuggled, 400, bad_http},
      {"two lengths", head + "Content-Length: 0\r\nContent-Length: 5\r\n\r\n" + smuggled, 400, bad_http},
      {"a length list", head + "Content-Length: 0,5\r\n\r\n" + smuggled, 400, bad_http},
      {"a negative length", head + "Content-Length: -5\r\n\r\n" + smuggled, 400, bad_http},
      {"gzip only", head + "Transfer-Encoding: gzip\r\n\r\n" + smuggled, 400, bad_http},
      {"chunked, then identity", head + "Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + smuggled, 400, bad_http},
      {"a space before the colon", head + "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + smuggled, 400, bad_http},
      {"a bad chunk size", head + "Transfer-Encoding: chunked\r\n\r\n-1\r\n\r\n" + smuggled, 400, bad_http},
      {"no Host", "POST /v1/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n" + smuggled, 400, bad_http},
      {"two Hosts", head + "Host: other\r\nContent-Length: 0\r\n\r\n" + smuggled, 400, bad_http},
      {"a bare CR in a header", head + "X-A: a\rb\r\nContent-Length: 0\r\n\r\n" + smuggled, 400, bad_http},
      {"not HTTP", "HELLO\r\n\r\n" + smuggled, 400, bad_http},
      {"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400, bad_http},
      {"a header past the limit", head + "X-Big: " + std::string(20000, 'a') + "\r\n\r\n" + smuggled, 431, "the request headers are too large"},
      {"a body past the limit", head + "Content-Length: 99000000\r\n\r\n{" + smuggled, 413, "the request body is too large"},
  };
  for (const auto& k : raws) {
    const std::string got = lmserve::testing::raw_until_closed(port_, k.bytes);
    EXPECT_TRUE(got.starts_with("HTTP/1.1 " + std::to_string(k.status) + " ")) << k.name << ": " << got.substr(0, 60);
    EXPECT_EQ(got.find("HTTP/1.1", 8), std::string::npos) << k.name << ": a second answer";
    const auto at = got.find("\r\n\r\n");
    auto j = nlohmann::json::parse(at == std::string::npos ? "" : got.substr(at + 4), nullptr, false);
    EXPECT_EQ(j.is_object() ? j["error"]["message"] : nlohmann::json(), k.message) << k.name;
  }
  EXPECT_EQ(a.requests, 1);  // none of it reached the replica
  EXPECT_EQ(c.send(post(completion())).status, 200);
  EXPECT_GE(cases.size() + raws.size(), 75u);
}

// API keys (issue #30's first part): every /v1 route needs a valid key; the key's models and lane
// hold; a revoked key fails within a second; no key reaches the replica, the log or /metrics.
// least_outstanding reads the live counts (summed over the I/O threads): a replica slow to answer
// holds its requests longer and is given far fewer than the even split round_robin gives.
TEST_F(GatewayTest, LeastOutstandingSendsLessToTheReplicaThatHoldsRequestsLonger) {
  auto& slow = fake("slow");
  slow.behaviour.first_byte_delay_ms = 40;
  auto& fast = fake("fast");
  start_gateway("  - name: m\n    policy: least_outstanding\n    backends:\n" + backend(slow.url()) + backend(fast.url()));
  constexpr int kRequests = 400;
  std::atomic<int> next{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&] {
      Client c(port_);
      for (int i = next++; i < kRequests; i = next++) EXPECT_EQ(c.send(post(completion())).status, 200);
    });
  }
  for (auto& t : ts) t.join();
  stop_gateway();
  EXPECT_EQ(slow.requests.load() + fast.requests.load(), kRequests);
  EXPECT_LT(slow.requests.load(), kRequests / 4) << "slow " << slow.requests.load() << ", fast " << fast.requests.load();
}

TEST_F(GatewayTest, KvAwareBeatsRoundRobinWhenOneReplicaIsSlow) {
  // The slow replica serves one request at a time (20 ms each) and reports its queue in
  // /metrics as a loaded `serve` does; the fast one takes everything at once (5 ms).
  auto& slow = fake("slow");
  slow.behaviour.max_concurrent = 1;
  slow.behaviour.service_ms = 20;
  auto& fast = fake("fast");
  fast.behaviour.first_byte_delay_ms = 5;
  auto measure = [&](const char* policy) {
    start_gateway(std::string("  - name: m\n    policy: ") + policy + "\n    backends:\n" + backend(slow.url()) + backend(fast.url()));
    std::this_thread::sleep_for(Ms(100));  // the first scrapes
    std::vector<double> ms(400);
    std::atomic<int> next{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < 16; ++t) {
      ts.emplace_back([&] {
        Client c(port_);
        for (int i = next++; i < 400; i = next++) {
          const auto t0 = std::chrono::steady_clock::now();
          EXPECT_EQ(c.send(post(completion())).status, 200);
          ms[i] = since(t0);
        }
      });
    }
    for (auto& t : ts) t.join();
    stop_gateway();
    std::sort(ms.begin(), ms.end());
    double mean = 0;
    for (double x : ms) mean += x / 400;
    std::printf("%s: mean %.1f ms, p50 %.1f ms, p99 %.1f ms\n", policy, mean, ms[200], ms[396]);
    return mean;
  };
  const double rr = measure("round_robin");
  const double kv = measure("kv_aware");
  EXPECT_LT(kv, 0.5 * rr) << "kv_aware " << kv << " ms vs round_robin " << rr << " ms";
}

}  // namespace
}  // namespace lmserve::gateway
