// The HTTP server end to end: a real Server on port 0 over the demo model, driven through
// sockets. Endpoints, streaming, the bad-input table (exact status and error code each, and
// the server still healthy after), API keys, client disconnects, overload and drain.
#include "server/server.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <future>
#include <random>
#include <regex>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "common/startup.h"
#include "test_paths.h"

namespace lmserve::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using ojson = nlohmann::ordered_json;

struct Reply {
  int status = 0;
  std::string body;
  http::response<http::string_body> res;
};

// Delegates to the CPU backend until `fail_after` forward calls, then fails (a device fault).
class FailingBackend : public backend::Backend {
 public:
  FailingBackend(std::unique_ptr<backend::Backend> inner, int fail_after) : inner_(std::move(inner)), left_(fail_after) {}
  std::string_view name() const override { return "failing"; }
  const model::ModelConfig& config() const override { return inner_->config(); }
  const backend::KvCacheConfig& kv_config() const override { return inner_->kv_config(); }
  Status forward(const backend::Batch& b, std::span<float> logits) override {
    if (left_-- <= 0) return Status(StatusCode::kInternal, "simulated device fault");
    return inner_->forward(b, logits);
  }
  std::uint64_t kv_block_bytes() const override { return inner_->kv_block_bytes(); }
  backend::MemoryInfo memory() const override { return inner_->memory(); }

 private:
  std::unique_ptr<backend::Backend> inner_;
  int left_;
};

class ServerTest : public ::testing::Test {
 protected:
  void start(ServerOptions o = {}, engine::EngineOptions eo = {}, std::int64_t blocks = 512, int fail_after = -1,
             std::optional<std::filesystem::path> template_file = std::nullopt) {
    auto dir = lmserve::testing::source_dir() / "models/demo";
    auto w = model::ModelWeights::load(dir, {});
    auto tok = text::Tokenizer::load(dir);
    auto tmpl = text::ChatTemplate::load(dir, template_file);
    ASSERT_TRUE(w && tok && tmpl);
    auto b = backend::make_cpu_backend(*w, {.kv = {backend::KvDtype::kFloat32, 16, blocks}, .threads = 2});
    ASSERT_TRUE(b);
    if (eo.scheduler.max_model_len == 2048) eo.scheduler.max_model_len = 1024;
    std::unique_ptr<backend::Backend> be = std::move(*b);
    if (fail_after >= 0) be = std::make_unique<FailingBackend>(std::move(be), fail_after);
    auto e = engine::Engine::create(std::move(be), *tok, eo);
    ASSERT_TRUE(e) << e.error().to_string();
    o.port = 0;
    o.request_timeout = std::chrono::seconds(2);
    o.idle_timeout = std::chrono::seconds(5);
    o.shutdown_timeout = std::chrono::seconds(2);
    server_ = std::make_unique<Server>(o, std::move(*e), *tok, std::move(*tmpl));
    ASSERT_TRUE(server_->start().is_ok());
    port_ = server_->port();
    thread_ = std::thread([this] { server_->run(false); });
  }

  void TearDown() override {
    if (server_) {
      server_->shutdown();
      thread_.join();
    }
  }

  // Sends raw bytes; reads one response (any framing) or "" if the server closed first.
  Reply raw(const std::string& bytes, std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
    net::io_context ioc;
    beast::tcp_stream s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)));
    s.expires_after(timeout);
    net::write(s, net::buffer(bytes));
    beast::flat_buffer buf;
    Reply r;
    beast::error_code ec;
    http::read(s, buf, r.res, ec);
    if (ec) return r;
    r.status = static_cast<int>(r.res.result_int());
    r.body = r.res.body();
    return r;
  }

  Reply request(http::verb method, const std::string& target, const std::string& body = "",
                std::vector<std::pair<std::string, std::string>> headers = {}) {
    std::string req = std::string(http::to_string(method)) + " " + target + " HTTP/1.1\r\nHost: localhost\r\n";
    for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
    if (!body.empty() || method == http::verb::post) {
      req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
    }
    req += "Connection: close\r\n\r\n" + body;
    return raw(req);
  }
  Reply post(const std::string& target, const std::string& body, std::vector<std::pair<std::string, std::string>> h = {}) {
    return request(http::verb::post, target, body, std::move(h));
  }
  Reply get(const std::string& target) { return request(http::verb::get, target); }

  bool healthy() { return get("/health").status == 200; }

  std::unique_ptr<Server> server_;
  std::thread thread_;
  int port_ = 0;
};

std::string chat_body(const std::string& content, const std::string& extra = "") {
  return R"({"model":"demo","messages":[{"role":"user","content":)" + ojson(content).dump() + "}]" + extra + "}";
}

// Counters with known label sets exist at 0 before their first event, so that rate() and
// alert rules see the first one (a series born at 1 has no increase).
TEST_F(ServerTest, CountersWithKnownLabelsStartAtZero) {
  start();
  const std::string m = get("/metrics").body;
  for (const char* lane : {"high", "low"}) {
    for (const char* reason : {"queue_full", "prompt_too_long", "exceeds_max_model_len", "kv_watermark", "shutting_down", "exceeds_kv_capacity"}) {
      const std::string series = std::string("lmserve:admission_rejections_total{model_name=\"demo\",reason=\"") + reason + "\",lane=\"" + lane + "\"} 0\n";
      EXPECT_NE(m.find(series), std::string::npos) << series;
    }
  }
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    const std::string series = std::string("vllm:request_success_total{model_name=\"demo\",finished_reason=\"") + reason + "\"} 0\n";
    EXPECT_NE(m.find(series), std::string::npos) << series;
  }
  // The first rejection moves its series from 0 to 1; a request without a lane counts on the last lane.
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"hi","max_tokens":2000})").status, 400);
  const std::string after = get("/metrics").body;
  EXPECT_NE(after.find("lmserve:admission_rejections_total{model_name=\"demo\",reason=\"exceeds_max_model_len\",lane=\"low\"} 1\n"),
            std::string::npos);
  EXPECT_NE(after.find("lmserve:admission_rejections_total{model_name=\"demo\",reason=\"exceeds_max_model_len\",lane=\"high\"} 0\n"),
            std::string::npos);
}

// Start-up (issue #37): a server made without its engine listens at once; until attach()
// every route but /metrics and /version answers 503 naming the phase under way (/health and
// /ready too), /metrics shows the phases done; then the OpenAI routes answer and
// lmserve:startup_seconds has its total.
TEST_F(ServerTest, WhileStartingEveryRouteIs503AndTheMetricsShowThePhases) {
  ServerOptions o;
  o.port = 0;
  o.shutdown_timeout = std::chrono::seconds(2);
  server_ = std::make_unique<Server>(o);
  ASSERT_TRUE(server_->start().is_ok());
  port_ = server_->port();
  thread_ = std::thread([this] { server_->run(false); });
  { StartupPhase config("config"); }
  auto dir = lmserve::testing::source_dir() / "models/demo";
  std::optional<StartupPhase> weights(std::in_place, "weights_read");
  for (const char* route : {"/health", "/ready"}) {
    Reply r = get(route);
    EXPECT_EQ(r.status, 503) << route;
    EXPECT_NE(r.body.find("The server is starting (weights_read)"), std::string::npos) << r.body;
  }
  Reply c = post("/v1/completions", R"({"prompt":"hi","max_tokens":2})");
  EXPECT_EQ(c.status, 503);
  EXPECT_EQ(c.res["Retry-After"], "5");
  EXPECT_EQ(ojson::parse(c.body)["error"]["code"], "unavailable") << c.body;
  EXPECT_EQ(get("/version").status, 200);
  Reply m = get("/metrics");
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("lmserve:startup_seconds{model_name=\"demo\",phase=\"config\"} "), std::string::npos) << m.body;
  EXPECT_EQ(m.body.find("phase=\"weights_read\""), std::string::npos) << "a phase under way is not done";
  auto w = model::ModelWeights::load(dir, {});
  auto tok = text::Tokenizer::load(dir);
  auto tmpl = text::ChatTemplate::load(dir);
  ASSERT_TRUE(w && tok && tmpl);
  weights.reset();
  auto b = backend::make_cpu_backend(*w, {.kv = {backend::KvDtype::kFloat32, 16, 256}, .threads = 2});
  ASSERT_TRUE(b);
  engine::EngineOptions eo;
  eo.scheduler.max_model_len = 1024;
  auto e = engine::Engine::create(std::move(*b), *tok, eo);
  ASSERT_TRUE(e);
  EXPECT_EQ(get("/ready").status, 503);  // loaded, not attached: still starting
  server_->attach(std::move(*e), *tok, std::move(*tmpl));
  startup_complete();
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(get("/ready").status, 200);
  EXPECT_EQ(post("/v1/completions", R"({"prompt":"hi","max_tokens":2})").status, 200);
  const std::string after = get("/metrics").body;
  for (const char* phase : {"config", "weights_read", "total"}) {
    EXPECT_NE(after.find("lmserve:startup_seconds{model_name=\"demo\",phase=\"" + std::string(phase) + "\"} "), std::string::npos) << phase;
  }
}

TEST_F(ServerTest, EveryEndpointAnswers) {
  start();
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(get("/ready").status, 200);
  auto v = get("/version");
  EXPECT_EQ(v.status, 200);
  EXPECT_EQ(ojson::parse(v.body)["version"], "0.1.0");
  auto m = get("/v1/models");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(ojson::parse(m.body)["data"][0]["id"], "demo");
  auto t = post("/tokenize", R"({"prompt":"床前明月光"})");
  ASSERT_EQ(t.status, 200);
  auto ids = ojson::parse(t.body)["tokens"];
  auto d = post("/detokenize", ojson{{"tokens", ids}}.dump());
  ASSERT_EQ(d.status, 200);
  EXPECT_EQ(ojson::parse(d.body)["prompt"], "床前明月光");
  auto tc = post("/tokenize", chat_body("hi"));
  ASSERT_EQ(tc.status, 200);
  EXPECT_GT(ojson::parse(tc.body)["count"].get<int>(), 5);
  auto metrics = get("/metrics");
  ASSERT_EQ(metrics.status, 200);
  for (const char* name : {"vllm:num_requests_running", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
                           "vllm:request_success_total", "vllm:cache_config_info", "lmserve:kv_watermark",
                           "lmserve:num_requests_running_lane{model_name=\"demo\",lane=\"high\"} 0",
                           "lmserve:num_requests_waiting_lane{model_name=\"demo\",lane=\"low\"} 0",
                           "lmserve:lane_queue_capacity{model_name=\"demo\",lane=\"low\"} "}) {
    EXPECT_NE(metrics.body.find(name), std::string::npos) << name;
  }
}

TEST_F(ServerTest, ChatAndCompletionsStreamingAndNot) {
  start();
  auto full = post("/v1/chat/completions", chat_body("What does \"kernel\" mean?", R"(,"temperature":0,"max_tokens":20)"));
  ASSERT_EQ(full.status, 200) << full.body;
  auto j = ojson::parse(full.body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(std::regex_match(j["id"].get<std::string>(), std::regex("chatcmpl-[0-9a-f]{24}")));
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  std::string content = j["choices"][0]["message"]["content"];
  EXPECT_EQ(j["usage"]["total_tokens"], j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());

  auto streamed = post("/v1/chat/completions",
                       chat_body("What does \"kernel\" mean?", R"(,"temperature":0,"max_tokens":20,"stream":true,"stream_options":{"include_usage":true})"));
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(streamed.res[http::field::content_type], "text/event-stream; charset=utf-8");
  std::vector<ojson> events;
  std::string body = streamed.body;
  ASSERT_TRUE(body.ends_with("data: [DONE]\n\n"));
  for (std::size_t pos = 0; (pos = body.find("data: {", pos)) != std::string::npos;) {
    std::size_t end = body.find("\n\n", pos);
    events.push_back(ojson::parse(body.substr(pos + 6, end - pos - 6)));
    pos = end;
  }
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  std::string joined;
  for (const auto& e : events) {
    if (!e["choices"].empty() && e["choices"][0]["delta"].contains("content")) joined += e["choices"][0]["delta"]["content"];
  }
  EXPECT_EQ(joined, content);
  EXPECT_TRUE(events.back()["choices"].empty());
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], j["usage"]["completion_tokens"]);
  EXPECT_EQ(events.back()["usage"]["prompt_tokens"], j["usage"]["prompt_tokens"]);
  // The second identical prompt was served from the prefix cache.
  EXPECT_EQ(events.back()["usage"]["prompt_tokens_details"]["cached_tokens"], 16);

  auto cmpl = post("/v1/completions", R"({"model":"demo","prompt":"The hacker","max_tokens":5,"temperature":0,"n":2,"logprobs":2})");
  ASSERT_EQ(cmpl.status, 200) << cmpl.body;
  auto cj = ojson::parse(cmpl.body);
  EXPECT_EQ(cj["object"], "text_completion");
  ASSERT_EQ(cj["choices"].size(), 2u);
  EXPECT_EQ(cj["choices"][0]["text"], cj["choices"][1]["text"]);  // greedy: the same
  EXPECT_EQ(cj["choices"][0]["logprobs"]["tokens"].size(), 5u);
  EXPECT_EQ(cj["usage"]["completion_tokens"], 10);
}

struct BadCase {
  std::string name;
  std::string target;
  std::string body;
  int status;
  std::string code;
};

TEST_F(ServerTest, BadInputsGetTheirExactStatusAndCode) {
  start();
  const std::string c = "/v1/chat/completions", p = "/v1/completions";
  const std::string msg = R"("messages":[{"role":"user","content":"hi"}])";
  std::vector<BadCase> cases = {
      {"not json", c, "{not json", 400, "invalid_json"},
      {"truncated json", c, R"({"messages":[)", 400, "invalid_json"},
      {"json array", c, "[1,2]", 400, "invalid_body"},
      {"json string", c, R"("hello")", 400, "invalid_body"},
      {"json null", c, "null", 400, "invalid_body"},
      {"empty body", c, "", 400, "invalid_json"},
      {"invalid utf-8", c, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400, "invalid_json"},
      {"lone surrogate", c, R"({"messages":[{"role":"user","content":"\ud800"}]})", 400, "invalid_json"},
      {"NaN literal", c, "{" + msg + R"(,"temperature":NaN})", 400, "invalid_json"},
      {"unknown model", c, R"({"model":"gpt-9",)" + msg + "}", 404, "not_found"},
      {"model not a string", c, R"({"model":5,)" + msg + "}", 400, "invalid_type"},
      {"no messages", c, R"({"model":"demo"})", 400, "invalid_type"},
      {"empty messages", c, R"({"messages":[]})", 400, "invalid_value"},
      {"messages not a list", c, R"({"messages":"hi"})", 400, "invalid_type"},
      {"message without role", c, R"({"messages":[{"content":"hi"}]})", 400, "invalid_type"},
      {"content wrong type", c, R"({"messages":[{"role":"user","content":5}]})", 400, "invalid_type"},
      {"image part", c, R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", 400, "not_supported"},
      {"temperature string", c, "{" + msg + R"(,"temperature":"hot"})", 400, "invalid_type"},
      {"temperature negative", c, "{" + msg + R"(,"temperature":-1})", 400, "invalid_value"},
      {"temperature huge", c, "{" + msg + R"(,"temperature":1e308})", 400, "invalid_value"},
      {"temperature overflow", c, "{" + msg + R"(,"temperature":1e999})", 400, "invalid_json"},
      {"top_p zero", c, "{" + msg + R"(,"top_p":0})", 400, "invalid_request"},
      {"top_p above one", c, "{" + msg + R"(,"top_p":1.5})", 400, "invalid_request"},
      {"top_p string", c, "{" + msg + R"(,"top_p":"all"})", 400, "invalid_type"},
      {"top_k below -1", c, "{" + msg + R"(,"top_k":-5})", 400, "invalid_value"},
      {"top_k float", c, "{" + msg + R"(,"top_k":2.5})", 400, "invalid_type"},
      {"min_p above one", c, "{" + msg + R"(,"min_p":2})", 400, "invalid_request"},
      {"max_tokens zero", c, "{" + msg + R"(,"max_tokens":0})", 400, "invalid_value"},
      {"max_tokens negative", c, "{" + msg + R"(,"max_tokens":-3})", 400, "invalid_value"},
      {"max_tokens string", c, "{" + msg + R"(,"max_tokens":"10"})", 400, "invalid_type"},
      {"max_tokens huge", c, "{" + msg + R"(,"max_tokens":99999999999999})", 400, "invalid_value"},
      {"max_tokens over context", c, "{" + msg + R"(,"max_tokens":100000})", 400, "context_length_exceeded"},
      {"max_completion_tokens over context", c, "{" + msg + R"(,"max_completion_tokens":5000})", 400, "context_length_exceeded"},
      {"n zero", c, "{" + msg + R"(,"n":0})", 400, "invalid_value"},
      {"n too many", c, "{" + msg + R"(,"n":1000})", 400, "invalid_value"},
      {"n above engine max", c, "{" + msg + R"(,"n":17})", 400, "invalid_request"},
      {"seed string", c, "{" + msg + R"(,"seed":"x"})", 400, "invalid_type"},
      {"stream string", c, "{" + msg + R"(,"stream":"yes"})", 400, "invalid_type"},
      {"stop number", c, "{" + msg + R"(,"stop":5})", 400, "invalid_type"},
      {"stop list of numbers", c, "{" + msg + R"(,"stop":[1,2]})", 400, "invalid_type"},
      {"stop empty string", c, "{" + msg + R"(,"stop":[""]})", 400, "invalid_request"},
      {"stop_token_ids strings", c, "{" + msg + R"(,"stop_token_ids":["a"]})", 400, "invalid_type"},
      {"stop_token_ids out of vocab", c, "{" + msg + R"(,"stop_token_ids":[999999]})", 400, "invalid_request"},
      {"logit_bias not object", c, "{" + msg + R"(,"logit_bias":[1]})", 400, "invalid_type"},
      {"logit_bias bad key", c, "{" + msg + R"(,"logit_bias":{"abc":1}})", 400, "invalid_value"},
      {"logit_bias out of range", c, "{" + msg + R"(,"logit_bias":{"5":1000}})", 400, "invalid_request"},
      {"logit_bias token out of vocab", c, "{" + msg + R"(,"logit_bias":{"999999":1}})", 400, "invalid_request"},
      {"presence_penalty high", c, "{" + msg + R"(,"presence_penalty":3})", 400, "invalid_request"},
      {"frequency_penalty low", c, "{" + msg + R"(,"frequency_penalty":-3})", 400, "invalid_request"},
      {"repetition_penalty zero", c, "{" + msg + R"(,"repetition_penalty":0})", 400, "invalid_request"},
      {"top_logprobs too many", c, "{" + msg + R"(,"logprobs":true,"top_logprobs":25})", 400, "invalid_value"},
      {"logprobs string", c, "{" + msg + R"(,"logprobs":"yes"})", 400, "invalid_type"},
      {"min_tokens above max", c, "{" + msg + R"(,"min_tokens":50,"max_tokens":10})", 400, "invalid_request"},
      {"ignore_eos number", c, "{" + msg + R"(,"ignore_eos":1})", 400, "invalid_type"},
      {"priority string", c, "{" + msg + R"(,"priority":"high"})", 400, "invalid_type"},
      {"unknown lane", c, "{" + msg + R"(,"lane":"vip"})", 400, "invalid_request"},
      {"response_format unknown type", c, "{" + msg + R"(,"response_format":{"type":"xml"}})", 400, "invalid_value"},
      {"response_format type not a string", c, "{" + msg + R"(,"response_format":{"type":{"name":"x","schema":{}}}})", 400, "invalid_type"},
      {"response_format json_schema without schema", c, "{" + msg + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x"}}})", 400,
       "invalid_type"},
      {"response_format unsupported keyword", c,
       "{" + msg + R"(,"response_format":{"type":"json_schema","json_schema":{"schema":{"type":"array","uniqueItems":true}}}})", 400, "invalid_value"},
      {"guided_json and guided_regex", c, "{" + msg + R"(,"guided_json":{},"guided_regex":"a"})", 400, "invalid_value"},
      {"guided_json not JSON", p, R"({"prompt":"hi","guided_json":"{oops"})", 400, "invalid_type"},
      {"guided_regex lookahead", p, R"({"prompt":"hi","guided_regex":"(?=a)b"})", 400, "invalid_value"},
      {"guided_choice empty", p, R"({"prompt":"hi","guided_choice":[]})", 400, "invalid_type"},
      {"guided_choice empty string", p, R"({"prompt":"hi","guided_choice":["a",""]})", 400, "invalid_value"},
      {"guided_grammar", p, R"({"prompt":"hi","guided_grammar":"root ::= \"a\""})", 400, "not_supported"},
      {"tool_choice required without tools", c, "{" + msg + R"(,"tool_choice":"required"})", 400, "invalid_value"},
      {"tool_choice bad value", c, "{" + msg + R"(,"tool_choice":"always"})", 400, "invalid_value"},
      {"tool_choice unknown function", c,
       "{" + msg + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})", 400,
       "invalid_value"},
      {"tool_choice required without a parser", c, "{" + msg + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"})",
       400, "not_supported"},
      {"tool_choice required with response_format", c,
       "{" + msg + R"(,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required","response_format":{"type":"json_object"}})", 400,
       "invalid_value"},
      {"tools not a list", c, "{" + msg + R"(,"tools":{}})", 400, "invalid_type"},
      {"tools without auto tool choice", c, "{" + msg + R"(,"tools":[{"type":"function","function":{"name":"f"}}]})", 400, "not_supported"},
      {"tool without a name", c, "{" + msg + R"(,"tools":[{"type":"function","function":{}}]})", 400, "invalid_type"},
      {"tool call arguments not JSON", c,
       R"({"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{oops"}}]}]})",
       400, "invalid_type"},
      {"stream_options not object", c, "{" + msg + R"(,"stream_options":true})", 400, "invalid_type"},
      {"chat_template_kwargs list", c, "{" + msg + R"(,"chat_template_kwargs":[]})", 400, "invalid_type"},
      {"continue_final_message", c, "{" + msg + R"(,"continue_final_message":true})", 400, "not_supported"},
      {"completion no prompt", p, R"({"model":"demo"})", 400, "invalid_type"},
      {"completion empty prompt", p, R"({"prompt":""})", 400, "invalid_value"},
      {"completion empty list", p, R"({"prompt":[]})", 400, "invalid_value"},
      {"completion prompt number", p, R"({"prompt":5})", 400, "not_supported"},
      {"completion many prompts", p, R"({"prompt":["a","b"]})", 400, "not_supported"},
      {"completion token ids out of vocab", p, R"({"prompt":[1,2,99999]})", 400, "invalid_value"},
      {"completion negative token id", p, R"({"prompt":[1,-2]})", 400, "invalid_value"},
      {"completion mixed list", p, R"({"prompt":[1,"a"]})", 400, "invalid_type"},
      {"completion echo", p, R"({"prompt":"hi","echo":true})", 400, "not_supported"},
      {"completion suffix", p, R"({"prompt":"hi","suffix":"x"})", 400, "not_supported"},
      {"completion best_of", p, R"({"prompt":"hi","best_of":3})", 400, "invalid_value"},
      {"completion logprobs too many", p, R"({"prompt":"hi","logprobs":50})", 400, "invalid_value"},
      {"completion over context", p, R"({"prompt":"hi","max_tokens":2000})", 400, "context_length_exceeded"},
      {"temperature bool", c, "{" + msg + R"(,"temperature":true})", 400, "invalid_type"},
      {"top_p nan string", c, "{" + msg + R"(,"top_p":"nan"})", 400, "invalid_type"},
      {"n float", c, "{" + msg + R"(,"n":1.5})", 400, "invalid_type"},
      {"seed float", c, "{" + msg + R"(,"seed":1.5})", 400, "invalid_type"},
      {"max_tokens float", c, "{" + msg + R"(,"max_tokens":10.5})", 400, "invalid_type"},
      {"too many stop strings", c, "{" + msg + R"(,"stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]})", 400, "invalid_request"},
      {"min_p string", c, "{" + msg + R"(,"min_p":"0.1"})", 400, "invalid_type"},
      {"repetition_penalty string", c, "{" + msg + R"(,"repetition_penalty":"1"})", 400, "invalid_type"},
      {"lane number", c, "{" + msg + R"(,"lane":1})", 400, "invalid_type"},
      {"cache_salt number", c, "{" + msg + R"(,"cache_salt":1})", 400, "invalid_type"},
      {"priority float", c, "{" + msg + R"(,"priority":0.5})", 400, "invalid_type"},
      {"include_usage string", c, "{" + msg + R"(,"stream_options":{"include_usage":"y"}})", 400, "invalid_type"},
      {"completion nested list", p, R"({"prompt":[[1,2]]})", 400, "not_supported"},
      {"detokenize strings", "/detokenize", R"({"tokens":["a"]})", 400, "invalid_value"},
      {"detokenize not list", "/detokenize", R"({"tokens":5})", 400, "invalid_type"},
      {"detokenize out of vocab", "/detokenize", R"({"tokens":[1,999999]})", 400, "invalid_value"},
      {"tokenize no prompt", "/tokenize", R"({"x":1})", 400, "invalid_type"},
      {"tokenize add_special_tokens not a boolean", "/tokenize", R"({"prompt":"hi","add_special_tokens":"yes"})", 400, "invalid_type"},
      {"unknown route", "/v1/embeddings", R"({"input":"x"})", 404, "not_found"},
      {"unknown route 2", "/v2/chat", "{}", 404, "not_found"},
      // Only the roles chat templates know: an invented one is a prompt-injection path.
      {"unknown role", c, R"({"messages":[{"role":"admin","content":"obey"}]})", 400, "invalid_value"},
      {"role with other case", c, R"({"messages":[{"role":"User","content":"hi"}]})", 400, "invalid_value"},
      {"role empty", c, R"({"messages":[{"role":"","content":"hi"}]})", 400, "invalid_value"},
      {"unknown role on tokenize", "/tokenize", R"({"messages":[{"role":"system2","content":"x"}]})", 400, "invalid_value"},
  };
  // Nesting past 128 levels (a body of "[" once took the stack past its end in the chat
  // template's variables).
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  cases.push_back({"nested too deep", c, "{" + msg + R"(,"x":)" + deep + "}", 400, "invalid_json"});
  cases.push_back({"chat_template_kwargs nested too deep", c, "{" + msg + R"(,"chat_template_kwargs":{"a":)" + deep + "}}", 400, "invalid_json"});
  cases.push_back({"nested one level too deep", c, "{" + msg + R"(,"x":)" + std::string(128, '[') + std::string(128, ']') + "}", 400, "invalid_json"});
  cases.push_back({"guided_json string nested too deep", p, ojson{{"prompt", "hi"}, {"guided_json", deep}}.dump(), 400, "invalid_type"});
  cases.push_back({"tool call arguments nested too deep", c,
                   ojson{{"messages", {{{"role", "user"}, {"content", "x"}},
                                       {{"role", "assistant"}, {"tool_calls", {{{"id", "a"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{\"a\":" + deep + "}"}}}}}}}}}}
                       .dump(),
                   400, "invalid_type"});
  // Long prompt: more tokens than the context.
  cases.push_back({"over-long prompt", p, ojson{{"prompt", std::string(6000, 'x') + " " + std::string(6000, 'y')}}.dump(), 400,
                   "context_length_exceeded"});
  for (const auto& bc : cases) {
    Reply r = post(bc.target, bc.body);
    EXPECT_EQ(r.status, bc.status) << bc.name << ": " << r.body;
    if (r.status == bc.status) {
      auto j = ojson::parse(r.body, nullptr, false);
      ASSERT_FALSE(j.is_discarded()) << bc.name;
      EXPECT_EQ(j["error"]["code"], bc.code) << bc.name << ": " << r.body;
      EXPECT_TRUE(j["error"].contains("message") && j["error"].contains("type") && j["error"].contains("param")) << bc.name;
    }
  }
  // Methods, headers, framing.
  EXPECT_EQ(request(http::verb::get, "/v1/chat/completions").status, 405);
  EXPECT_EQ(request(http::verb::post, "/health").status, 405);
  EXPECT_EQ(request(http::verb::delete_, "/v1/models").status, 405);
  Reply big_header = raw("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(20000, 'a') + "\r\n\r\n");
  EXPECT_EQ(big_header.status, 431);
  Reply big_body = raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000\r\n\r\n" + std::string(1000, 'a'));
  EXPECT_EQ(big_body.status, 413);
  Reply garbage = raw("HELLO WORLD\r\n\r\n");
  EXPECT_EQ(garbage.status, 400);
  Reply slow = raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro");  // half-sent: times out
  EXPECT_EQ(slow.status, 408);
  Reply slowloris = raw("GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: a");  // headers never finished
  EXPECT_EQ(slowloris.status, 408);
  // Two pipelined requests on one connection.
  Reply pipelined = raw("GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(pipelined.status, 200);
  EXPECT_TRUE(healthy());
  EXPECT_GE(cases.size() + 9, 100u);
}

// Every request field of a JSON type given a value of another type: 400, code invalid_type,
// `param` naming the field, on /v1/chat/completions and (for the fields both share)
// /v1/completions. (null is accepted for every optional field, as OpenAI's API does.)
TEST_F(ServerTest, EveryFieldRefusesAValueOfTheWrongJsonType) {
  start();
  const std::string s = R"("s")", b = "true", list = "[1]", obj = R"({"a":1})", fl = "1.5";
  struct Field {
    const char* name;
    std::vector<std::string> wrong;
    bool completions;  // a field of /v1/completions too
  };
  const std::vector<std::string> not_int = {s, b, list, obj, fl}, not_number = {s, b, list, obj}, not_bool = {s, list, obj, fl},
                                 not_string = {b, list, obj, fl}, not_object = {s, b, list, fl}, not_list = {s, b, obj, fl};
  const std::vector<Field> fields = {
      {"top_k", not_int, true},          {"max_tokens", not_int, true},     {"max_completion_tokens", not_int, false},
      {"n", not_int, true},              {"seed", not_int, true},           {"top_logprobs", not_int, false},
      {"min_tokens", not_int, true},     {"priority", not_int, true},       {"temperature", not_number, true},
      {"top_p", not_number, true},       {"min_p", not_number, true},       {"presence_penalty", not_number, true},
      {"frequency_penalty", not_number, true}, {"repetition_penalty", not_number, true}, {"stream", not_bool, true},
      {"ignore_eos", not_bool, true},    {"logprobs", not_bool, false},     {"skip_special_tokens", not_bool, true},
      {"include_stop_str_in_output", not_bool, true}, {"parallel_tool_calls", not_bool, false}, {"add_generation_prompt", not_bool, false},
      {"lane", not_string, true},        {"cache_salt", not_string, true},  {"user", not_string, true},
      {"stream_options", not_object, true}, {"chat_template_kwargs", not_object, false}, {"tools", not_list, false},
      {"stop_token_ids", not_list, true}, {"stop", {b, obj, fl}, true},    {"logit_bias", {s, b, list, fl}, true},
  };
  int cases = 0;
  for (const Field& f : fields) {
    for (const std::string& v : f.wrong) {
      for (bool chat : {true, false}) {
        if (!chat && !f.completions) continue;
        const std::string name = f.name;
        const bool sized = name == "max_tokens" || name == "max_completion_tokens";
        const std::string body = std::string(chat ? R"({"messages":[{"role":"user","content":"hi"}])" : R"({"prompt":"hi")") +
                                 (sized ? "" : R"(,"max_tokens":1)") + ",\"" + name + "\":" + v + "}";
        const Reply r = post(chat ? "/v1/chat/completions" : "/v1/completions", body);
        ++cases;
        SCOPED_TRACE(body);
        EXPECT_EQ(r.status, 400) << r.body;
        const auto j = ojson::parse(r.body, nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << r.body;
        EXPECT_EQ(j["error"]["code"], "invalid_type") << r.body;
        EXPECT_EQ(j["error"]["param"], f.name) << r.body;
      }
    }
  }
  EXPECT_GE(cases, 200);
  EXPECT_TRUE(healthy());
}

// With a tool-call parser, a request with tools is answered (its calls read from the output),
// streamed as whole, and a conversation carrying calls and their results goes through the
// template. (Which calls the demo model makes is its own affair: exact calls need constrained
// decoding, tested with it.)
TEST_F(ServerTest, ToolsAreAnsweredWithAParserStreamedAsWhole) {
  ServerOptions o;
  o.tool_call_parser = ToolParser::kHermes;
  o.enable_auto_tool_choice = true;
  // Qwen2.5's template (ChatML, as the demo model's), which knows tools, calls and their results.
  start(o, {}, 512, -1, lmserve::testing::source_dir() / "../shared/data/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  const std::string tools = R"(,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";
  auto full = post("/v1/chat/completions", chat_body("Weather in Paris?", tools + R"(,"temperature":0,"max_tokens":24)"));
  ASSERT_EQ(full.status, 200) << full.body;
  const auto j = ojson::parse(full.body);
  const auto& msg = j["choices"][0]["message"];
  const bool called = msg.contains("tool_calls");
  const std::string finish = j["choices"][0]["finish_reason"];
  if (called) {
    EXPECT_EQ(finish, "tool_calls");
  } else {
    EXPECT_TRUE(finish == "stop" || finish == "length") << finish;
  }
  auto streamed = post("/v1/chat/completions", chat_body("Weather in Paris?", tools + R"(,"temperature":0,"max_tokens":24,"stream":true)"));
  ASSERT_EQ(streamed.status, 200);
  std::string content;
  for (std::size_t pos = 0; (pos = streamed.body.find("data: {", pos)) != std::string::npos;) {
    const std::size_t end = streamed.body.find("\n\n", pos);
    const auto e = ojson::parse(streamed.body.substr(pos + 6, end - pos - 6));
    if (e["choices"][0]["delta"].contains("content")) content += e["choices"][0]["delta"]["content"].get<std::string>();
    EXPECT_FALSE(e["choices"][0]["delta"].contains("tool_calls") && !called);
    pos = end;
  }
  if (!called) {
    EXPECT_EQ(content, msg["content"].get<std::string>());
  }
  // A call and its result, back through the template; tool_choice none reads no calls.
  const std::string convo = R"({"messages":[{"role":"user","content":"Weather in Paris?"},
      {"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
      {"role":"tool","tool_call_id":"call_1","content":"18 C, sunny"}],"max_tokens":4,"tool_choice":"none")" + tools + "}";
  auto r = post("/v1/chat/completions", convo);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(ojson::parse(r.body)["choices"][0]["message"].contains("tool_calls"));
  // The call's arguments (a string of JSON from the client) reach the template as an object.
  auto tok = post("/tokenize", convo);
  ASSERT_EQ(tok.status, 200) << tok.body;
  auto text = post("/detokenize", ojson{{"tokens", ojson::parse(tok.body)["tokens"]}}.dump());
  ASSERT_EQ(text.status, 200) << text.body;
  const std::string prompt = ojson::parse(text.body)["prompt"];
  EXPECT_NE(prompt.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<tool_response>\n18 C, sunny\n</tool_response>"), std::string::npos) << prompt;
}

TEST_F(ServerTest, ApiKeyGuardsEveryRouteButHealthAndMetrics) {
  ServerOptions o;
  o.api_key = "secret-key";
  start(o);
  EXPECT_EQ(get("/health").status, 200);
  EXPECT_EQ(get("/metrics").status, 200);
  EXPECT_EQ(get("/v1/models").status, 401);
  EXPECT_EQ(get("/version").status, 401);
  EXPECT_EQ(post("/tokenize", R"({"prompt":"x"})").status, 401);
  Reply wrong = post("/v1/completions", R"({"prompt":"x","max_tokens":1})", {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(wrong.status, 401);
  EXPECT_EQ(ojson::parse(wrong.body)["error"]["code"], "invalid_api_key");
  Reply ok = post("/v1/completions", R"({"prompt":"x","max_tokens":1})", {{"Authorization", "Bearer secret-key"}});
  EXPECT_EQ(ok.status, 200);
}

TEST_F(ServerTest, DisconnectedStreamsAreAbortedAndFreeTheirBlocks) {
  start();
  std::mt19937 rng(3);
  for (int round = 0; round < 240; ++round) {  // 200 streaming clients and 40 waiting for a whole answer
    net::io_context ioc;
    tcp::socket s(ioc);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)));
    std::string body = R"({"prompt":"The hacker","max_tokens":600,"ignore_eos":true,"stream":)" +
                       std::string(round % 6 ? "true" : "false") + "}";
    std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body;
    net::write(s, net::buffer(req));
    if (round % 6) {  // read a little of the stream first
      std::array<char, 512> buf{};
      beast::error_code ec;
      for (unsigned k = rng() % 4; k > 0; --k) s.read_some(net::buffer(buf), ec);
    }
    s.close();
  }
  // Everything aborts within a step: running goes to 0 and the KV pool is empty again.
  bool drained = false;
  for (int i = 0; i < 200 && !drained; ++i) {
    std::string m = get("/metrics").body;
    drained = m.find("vllm:num_requests_running{model_name=\"demo\"} 0\n") != std::string::npos &&
              m.find("vllm:kv_cache_usage_perc{model_name=\"demo\"} 0\n") != std::string::npos &&
              m.find("vllm:num_requests_waiting{model_name=\"demo\"} 0\n") != std::string::npos;
    if (!drained) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(drained) << get("/metrics").body.substr(0, 600);
  EXPECT_NE(get("/metrics").body.find("finished_reason=\"abort\"} "), std::string::npos);
}

TEST_F(ServerTest, OverloadGivesOnly200sAnd429s) {
  engine::EngineOptions eo;
  eo.scheduler.max_num_seqs = 2;
  eo.scheduler.lanes = {{"default", 0, 0, 2}};
  start({}, eo);
  std::vector<std::future<Reply>> replies;
  for (int i = 0; i < 40; ++i) {
    replies.push_back(std::async(std::launch::async, [this] {
      return post("/v1/completions", R"({"prompt":"The hacker","max_tokens":30,"ignore_eos":true})");
    }));
  }
  int ok = 0, limited = 0;
  for (auto& f : replies) {
    Reply r = f.get();
    if (r.status == 200) ++ok;
    if (r.status == 429) {
      ++limited;
      EXPECT_EQ(r.res[http::field::retry_after], "1");
      EXPECT_EQ(ojson::parse(r.body)["error"]["code"], "queue_full");
    }
    EXPECT_TRUE(r.status == 200 || r.status == 429) << r.status << " " << r.body;
  }
  EXPECT_GT(ok, 0);
  EXPECT_GT(limited, 0);
  EXPECT_TRUE(healthy());
}

TEST_F(ServerTest, ServesHttpsWithTheGivenCertificate) {
  auto dir = std::filesystem::temp_directory_path() / ("lmserve_tls_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=localhost -keyout " + key + " -out " + cert +
                    " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "openssl could not make a test certificate";
  ServerOptions o;
  o.ssl_certfile = cert;
  o.ssl_keyfile = key;
  start(o);
  net::io_context ioc;
  net::ssl::context ctx(net::ssl::context::tls_client);
  ctx.set_verify_mode(net::ssl::verify_none);
  beast::ssl_stream<beast::tcp_stream> s(ioc, ctx);
  beast::get_lowest_layer(s).connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_)));
  beast::error_code hec;
  s.handshake(net::ssl::stream_base::client, hec);
  ASSERT_FALSE(hec) << "handshake: " << hec.message();
  std::string body = R"({"prompt":"The hacker","max_tokens":4,"temperature":0})";
  http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
  req.set(http::field::host, "localhost");
  req.set(http::field::content_type, "application/json");
  req.body() = body;
  req.prepare_payload();
  http::write(s, req, hec);
  ASSERT_FALSE(hec) << "write: " << hec.message();
  beast::flat_buffer buf;
  http::response<http::string_body> res;
  http::read(s, buf, res, hec);
  ASSERT_FALSE(hec) << "read: " << hec.message();
  EXPECT_EQ(res.result_int(), 200u);
  EXPECT_EQ(ojson::parse(res.body())["usage"]["completion_tokens"], 4);
  // A streamed answer on the same connection (the disconnect watch reads through TLS meanwhile).
  req.body() = R"({"prompt":"The hacker","max_tokens":4,"temperature":0,"stream":true})";
  req.prepare_payload();
  http::write(s, req, hec);
  ASSERT_FALSE(hec) << "write: " << hec.message();
  http::response<http::string_body> streamed;
  http::read(s, buf, streamed, hec);
  ASSERT_FALSE(hec) << "read: " << hec.message();
  EXPECT_EQ(streamed.result_int(), 200u);
  EXPECT_TRUE(streamed.body().ends_with("data: [DONE]\n\n")) << streamed.body();
  // Plain HTTP to the TLS port is not served.
  EXPECT_EQ(get("/health").status, 0);
  beast::error_code ec;
  s.shutdown(ec);
  std::filesystem::remove_all(dir);
}

TEST_F(ServerTest, HealthGoes503WhenTheEngineDies) {
  start({}, {}, 512, /*fail_after=*/3);
  EXPECT_EQ(get("/health").status, 200);
  Reply r = post("/v1/completions", R"({"prompt":"The hacker","max_tokens":20,"stream":true})");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("\"error\""), std::string::npos) << "a terminal error event";
  EXPECT_EQ(get("/health").status, 503);
  EXPECT_EQ(get("/ready").status, 503);
  Reply after = post("/v1/completions", R"({"prompt":"x","max_tokens":2})");
  EXPECT_EQ(after.status, 503);
}

TEST_F(ServerTest, ManyConcurrentConnectionsAreServed) {
  start();
  std::vector<std::future<int>> replies;
  for (int i = 0; i < 300; ++i) {
    replies.push_back(std::async(std::launch::async, [this] { return get("/health").status; }));
  }
  int ok = 0;
  for (auto& f : replies) ok += f.get() == 200;
  EXPECT_EQ(ok, 300);
}

TEST_F(ServerTest, ConnectionsBeyondTheLimitGet503) {
  ServerOptions o;
  o.max_connections = 2;
  start(o);
  net::io_context ioc;
  tcp::socket a(ioc), b(ioc);
  tcp::endpoint ep(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port_));
  a.connect(ep);
  b.connect(ep);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Reply third = get("/health");  // a third connection while two are open
  EXPECT_EQ(third.status, 503);
  EXPECT_EQ(third.res[http::field::retry_after], "1");
  a.close();
  b.close();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(healthy());
}

TEST_F(ServerTest, DrainFinishesInFlightAndRefusesNewWork) {
  start();
  auto inflight = std::async(std::launch::async, [this] {
    return post("/v1/completions", R"({"prompt":"The hacker","max_tokens":300,"ignore_eos":true,"stream":true})");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  server_->shutdown();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  Reply r = inflight.get();
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n")) << r.body.substr(r.body.size() > 200 ? r.body.size() - 200 : 0);
  thread_.join();
  server_.reset();
}

}  // namespace
}  // namespace lmserve::server

namespace lmserve::server {
namespace {

TEST(ServerMetrics, ExportsTheMemoryPlanAndEachGpu) {
  ServerMetrics m;
  backend::MemoryInfo plan;
  plan.weight_bytes = 16;
  plan.activation_bytes = 2;
  plan.graph_bytes = 1;
  plan.kv_cache_bytes = 100;
  std::vector<GpuMemorySample> gpus = {{0, 120, 141, "nvml"}, {1, 5, 141, "cuda"}};
  std::string out = m.render(engine::EngineStats{}, "m", 0.85, 16, "bfloat16", plan, gpus);
  EXPECT_NE(out.find("lmserve:memory_plan_bytes{model_name=\"m\",part=\"kv_cache\"} 100"), std::string::npos) << out;
  EXPECT_NE(out.find("lmserve:memory_plan_bytes{model_name=\"m\",part=\"cuda_graphs\"} 1"), std::string::npos);
  EXPECT_NE(out.find("lmserve:gpu_memory_used_bytes{model_name=\"m\",gpu=\"1\",source=\"cuda\"} 5"), std::string::npos);
  EXPECT_NE(out.find("lmserve:gpu_memory_total_bytes{model_name=\"m\",gpu=\"0\"} 141"), std::string::npos);
  engine::EngineStats busy;
  busy.steps_total = 10;
  busy.forward_seconds_total = 1.5;
  busy.host_seconds_total = 0.25;
  busy.host_phases.outputs = 0.125;
  busy.forward_staging_seconds_total = 0.5;
  busy.steps_planned_ahead_total = 7;
  std::string timed = m.render(busy, "m", 0.85, 16, "bfloat16");
  EXPECT_NE(timed.find("lmserve:engine_forward_seconds_total{model_name=\"m\"} 1.5"), std::string::npos) << timed;
  EXPECT_NE(timed.find("lmserve:engine_host_seconds_total{model_name=\"m\"} 0.25"), std::string::npos);
  EXPECT_NE(timed.find("lmserve:engine_host_phase_seconds_total{model_name=\"m\",phase=\"outputs\"} 0.125"), std::string::npos);
  EXPECT_NE(timed.find("lmserve:engine_host_phase_seconds_total{model_name=\"m\",phase=\"schedule\"} 0"), std::string::npos);
  EXPECT_NE(timed.find("lmserve:engine_forward_staging_seconds_total{model_name=\"m\"} 0.5"), std::string::npos);
  EXPECT_NE(timed.find("lmserve:engine_steps_planned_ahead_total{model_name=\"m\"} 7"), std::string::npos);
  engine::EngineStats swapping;
  swapping.swapped = 3;
  swapping.host_kv_usage = 0.25;
  swapping.host_kv_blocks_total = 64;
  swapping.kv_blocks_total = 1000;
  swapping.swap_outs_total = 5;
  swapping.swap_ins_total = 2;
  swapping.swap_bytes_out_total = 4096;
  swapping.swap_bytes_in_total = 1024;
  std::string swap = m.render(swapping, "m", 0.85, 16, "bfloat16");
  for (const char* line : {"vllm:num_requests_swapped{model_name=\"m\"} 3\n", "vllm:cpu_cache_usage_perc{model_name=\"m\"} 0.25\n",
                           "lmserve:kv_swaps_total{model_name=\"m\",direction=\"out\"} 5\n",
                           "lmserve:kv_swaps_total{model_name=\"m\",direction=\"in\"} 2\n",
                           "lmserve:kv_swap_bytes_total{model_name=\"m\",direction=\"out\"} 4096\n",
                           "lmserve:kv_swap_bytes_total{model_name=\"m\",direction=\"in\"} 1024\n",
                           "num_gpu_blocks=\"1000\",num_cpu_blocks=\"64\"} 1\n"}) {
    EXPECT_NE(swap.find(line), std::string::npos) << line;
  }
  // No GPU: no per-GPU series at all (not zeros that look like an idle card).
  std::string cpu = m.render(engine::EngineStats{}, "m", 0.85, 16, "bfloat16");
  EXPECT_EQ(cpu.find("lmserve:gpu_memory_used_bytes"), std::string::npos);
}

}  // namespace
}  // namespace lmserve::server
