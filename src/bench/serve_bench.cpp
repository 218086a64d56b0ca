#include "bench/serve_bench.h"

#include <unistd.h>

#include <boost/algorithm/string/predicate.hpp>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "common/progress.h"

namespace lmserve::bench {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A client TLS context: the system's CA certificates, or no verification with --insecure.
void set_up_tls(net::ssl::context& ctx, bool insecure) {
  if (insecure) {
    ctx.set_verify_mode(net::ssl::verify_none);
  } else {
    ctx.set_default_verify_paths();
    ctx.set_verify_mode(net::ssl::verify_peer);
  }
}

struct Run;

template <class Stream>
class Conn : public std::enable_shared_from_this<Conn<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;
  template <class... Args>
  Conn(Run& run, std::size_t index, Args&&... args) : run_(run), i_(index), stream_(std::forward<Args>(args)...) {}
  void start();

 private:
  void on_connected();
  void write();
  void read_body();
  void consume(const char* data, std::size_t n);
  void fail(const std::string& what);
  void finish();

  Run& run_;
  std::size_t i_;
  Stream stream_;
  beast::flat_buffer buf_;
  http::request<http::string_body> req_;
  http::response_parser<http::buffer_body> parser_;
  char chunk_[16384];
  std::string sse_, error_body_;
  Clock::time_point start_, last_;
  bool first_ = true, finished_ = false;
  std::string stream_error_;
};

struct Run {
  Run(const std::vector<PreparedRequest>& r, const ServeBenchOptions& opt, Endpoint e) : reqs(r), o(opt), ep(std::move(e)), results(r.size()) {}
  net::io_context ioc;
  std::optional<net::ssl::context> ssl;
  const std::vector<PreparedRequest>& reqs;
  const ServeBenchOptions& o;
  Endpoint ep;
  tcp::resolver::results_type addrs;
  std::vector<RequestResult> results;
  Clock::time_point t0;
  std::deque<std::size_t> pending;
  std::int64_t in_flight = 0, max_in_flight = 0;
  std::size_t done = 0;
  std::int64_t output_tokens = 0;
  std::optional<Progress> progress;  // with o.progress

  void arrive(std::size_t i) {
    if (o.max_concurrency > 0 && in_flight >= o.max_concurrency) {
      pending.push_back(i);
    } else {
      launch(i);
    }
  }
  void launch(std::size_t i) {
    ++in_flight;
    max_in_flight = std::max(max_in_flight, in_flight);
    if (ssl) {
      std::make_shared<Conn<beast::ssl_stream<beast::tcp_stream>>>(*this, i, net::make_strand(ioc), *ssl)->start();
    } else {
      std::make_shared<Conn<beast::tcp_stream>>(*this, i, net::make_strand(ioc))->start();
    }
  }
  void finished(std::size_t which) {
    --in_flight;
    ++done;
    output_tokens += results[which].output_tokens;
    if (progress) {
      progress->set_note(std::to_string(in_flight) + " in flight, output " + std::to_string(std::llround(static_cast<double>(output_tokens) / std::max(1e-9, std::chrono::duration<double>(Clock::now() - t0).count()))) + " tok/s");
      progress->add(1);
    }
    if (!pending.empty()) {
      const std::size_t i = pending.front();
      pending.pop_front();
      launch(i);
    }
  }
};

template <class Stream>
void Conn<Stream>::start() {
  start_ = Clock::now();
  run_.results[i_].start = secs(start_ - run_.t0);
  req_ = http::request<http::string_body>(http::verb::post, run_.ep.base_path + run_.o.endpoint, 11);
  req_.set(http::field::host, run_.ep.host);
  req_.set(http::field::content_type, "application/json");
  req_.set(http::field::user_agent, "lmserve-bench");
  if (!run_.o.api_key.empty()) req_.set(http::field::authorization, "Bearer " + run_.o.api_key);
  for (const auto& [k, v] : run_.o.headers) req_.set(k, v);
  req_.body() = run_.reqs[i_].body;
  req_.prepare_payload();
  parser_.body_limit(boost::none);
  beast::get_lowest_layer(stream_).expires_after(std::chrono::minutes(30));
  beast::get_lowest_layer(stream_).async_connect(run_.addrs, [self = this->shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
    if (ec) return self->fail("connect: " + ec.message());
    self->on_connected();
  });
}

template <class Stream>
void Conn<Stream>::on_connected() {
  if constexpr (kTls) {
    SSL_set_tlsext_host_name(stream_.native_handle(), run_.ep.host.c_str());
    stream_.async_handshake(net::ssl::stream_base::client, [self = this->shared_from_this()](beast::error_code ec) {
      if (ec) return self->fail("TLS handshake: " + ec.message());
      self->write();
    });
  } else {
    write();
  }
}

template <class Stream>
void Conn<Stream>::write() {
  http::async_write(stream_, req_, [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
    if (ec) return self->fail("write: " + ec.message());
    http::async_read_header(self->stream_, self->buf_, self->parser_, [self](beast::error_code ec2, std::size_t) {
      if (ec2) return self->fail("read: " + ec2.message());
      self->run_.results[self->i_].status = self->parser_.get().result_int();
      self->read_body();
    });
  });
}

template <class Stream>
void Conn<Stream>::read_body() {
  if (parser_.is_done()) return finish();
  parser_.get().body().data = chunk_;
  parser_.get().body().size = sizeof(chunk_);
  http::async_read_some(stream_, buf_, parser_, [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
    if (ec == http::error::need_buffer) ec = {};
    const std::size_t n = sizeof(self->chunk_) - self->parser_.get().body().size;
    if (n > 0) self->consume(self->chunk_, n);
    if (ec == http::error::end_of_stream || ec == net::error::eof) return self->finish();
    if (ec) return self->fail("read: " + ec.message());
    self->read_body();
  });
}

template <class Stream>
void Conn<Stream>::consume(const char* data, std::size_t n) {
  RequestResult& r = run_.results[i_];
  if (r.status != 200) {
    error_body_.append(data, std::min<std::size_t>(n, 4096 - std::min<std::size_t>(4096, error_body_.size())));
    return;
  }
  const auto now = Clock::now();
  sse_.append(data, n);
  std::size_t end;
  while ((end = sse_.find("\n\n")) != std::string::npos) {
    std::string event = sse_.substr(0, end);
    sse_.erase(0, end + 2);
    for (std::size_t pos = 0; pos < event.size();) {
      std::size_t nl = event.find('\n', pos);
      std::string line = event.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      pos = nl == std::string::npos ? event.size() : nl + 1;
      if (line.rfind("data:", 0) != 0) continue;
      std::string payload = line.substr(line.size() > 5 && line[5] == ' ' ? 6 : 5);
      if (payload == "[DONE]") continue;
      auto j = json::parse(payload, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        stream_error_ = j["error"].is_object() ? j["error"].value("message", "error event") : "error event";
        continue;
      }
      // A chunk carrying generated tokens: completion text (possibly empty, when tokens did not
      // complete a character yet), chat content, or the finishing chunk; not a chat role-only
      // chunk nor the usage-only chunk.
      bool text = false;
      if (j.contains("choices") && j["choices"].is_array()) {
        for (const auto& c : j["choices"]) {
          if (c.contains("text") && c["text"].is_string()) text = true;
          if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") && c["delta"]["content"].is_string()) {
            // The role chunk (often with content "") may come before any token.
            const auto& d = c["delta"];
            if (!d.contains("role") || !d["content"].get_ref<const std::string&>().empty()) text = true;
          }
          if (c.contains("finish_reason") && !c["finish_reason"].is_null()) text = true;
        }
      }
      if (text) {
        if (first_) {
          r.ttft = secs(now - start_);
          first_ = false;
        } else {
          r.itl.push_back(secs(now - last_));
        }
        last_ = now;
      }
      if (j.contains("usage") && j["usage"].is_object()) {
        r.prompt_tokens = j["usage"].value("prompt_tokens", std::int64_t{0});
        r.output_tokens = j["usage"].value("completion_tokens", std::int64_t{0});
      }
    }
  }
}

template <class Stream>
void Conn<Stream>::fail(const std::string& what) {
  if (finished_) return;
  run_.results[i_].error = what;
  finish();
}

template <class Stream>
void Conn<Stream>::finish() {
  if (finished_) return;
  finished_ = true;
  RequestResult& r = run_.results[i_];
  r.e2el = secs(Clock::now() - start_);
  if (r.error.empty()) {
    if (r.status != 200) {
      auto j = json::parse(error_body_, nullptr, false);
      r.error = !j.is_discarded() && j.contains("error") && j["error"].is_object() ? j["error"].value("message", error_body_) : error_body_;
      if (r.error.empty()) r.error = "HTTP " + std::to_string(r.status);
    } else if (!stream_error_.empty()) {
      r.error = stream_error_;
    } else if (first_) {
      r.error = "no tokens in the stream";
    } else if (r.output_tokens == 0) {
      r.error = "no usage in the stream (stream_options.include_usage)";
    }
  }
  r.ok = r.error.empty();
  if (r.ok && r.output_tokens > 1) r.tpot = (r.e2el - r.ttft) / static_cast<double>(r.output_tokens - 1);
  beast::error_code ec;
  beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_both, ec);
  beast::get_lowest_layer(stream_).close();
  net::post(run_.ioc, [&run = run_, i = i_] { run.finished(i); });
}

// One request after another at the arrival times.
void schedule(Run& run, std::shared_ptr<net::steady_timer> timer, std::vector<double> offsets, std::size_t next) {
  if (next >= offsets.size()) return;
  timer->expires_at(run.t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(offsets[next])));
  timer->async_wait([&run, timer, offsets = std::move(offsets), next](beast::error_code ec) mutable {
    if (ec) return;
    const auto now = Clock::now();
    std::size_t i = next;
    // Every request whose time has come starts now.
    while (i < offsets.size() && run.t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(offsets[i])) <= now) {
      run.arrive(i++);
    }
    schedule(run, timer, std::move(offsets), i);
  });
}

}  // namespace

Result<Endpoint> parse_base_url(const std::string& url) {
  Endpoint e;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    e.scheme = "http";
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    e.scheme = "https";
    rest = url.substr(8);
  } else {
    return error(StatusCode::kInvalidArgument, "--base-url must start with http:// or https://");
  }
  const std::size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  e.base_path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!e.base_path.empty() && e.base_path.back() == '/') e.base_path.pop_back();
  const std::size_t colon = hostport.rfind(':');
  if (colon != std::string::npos && hostport.find(']') == std::string::npos) {
    e.host = hostport.substr(0, colon);
    e.port = hostport.substr(colon + 1);
  } else {
    e.host = hostport;
    e.port = e.scheme == "https" ? "443" : "80";
  }
  if (e.host.empty() || e.port.empty() || e.port.find_first_not_of("0123456789") != std::string::npos) {
    return error(StatusCode::kInvalidArgument, "--base-url: cannot read host and port from '" + url + "'");
  }
  return e;
}

std::vector<PreparedRequest> prepare_requests(const std::vector<RequestSpec>& specs, const ServeBenchOptions& o) {
  std::vector<PreparedRequest> out;
  const bool chat = o.endpoint.find("chat") != std::string::npos;
  for (const auto& s : specs) {
    json b{{"model", o.model}, {"max_tokens", s.output_len}, {"stream", true}, {"stream_options", {{"include_usage", true}}}, {"temperature", 0}};
    if (o.ignore_eos) b["ignore_eos"] = true;
    if (chat) {
      b["messages"] = json::array({{{"role", "user"}, {"content", s.prompt}}});
    } else {
      b["prompt"] = s.prompt;
    }
    out.push_back({b.dump(-1, ' ', false, json::error_handler_t::replace), s.input_len, s.output_len, s.timestamp});
  }
  return out;
}

Result<ServeBenchResult> run_serve_bench(const std::vector<PreparedRequest>& reqs, const ServeBenchOptions& o) {
  auto ep = parse_base_url(o.base_url);
  if (!ep) return error(ep.error());
  if (reqs.empty()) return error(StatusCode::kInvalidArgument, "bench serve: no requests");
  Run run(reqs, o, *ep);
  if (ep->scheme == "https") {
    set_up_tls(run.ssl.emplace(net::ssl::context::tls_client), o.insecure);
  }
  beast::error_code ec;
  tcp::resolver resolver(run.ioc);
  run.addrs = resolver.resolve(ep->host, ep->port, ec);
  if (ec) return error(StatusCode::kUnavailable, "bench serve: cannot resolve " + ep->host + ": " + ec.message());
  // Start times: a trace's own timestamps, else the arrival process.
  std::vector<double> offsets;
  const bool traced = std::all_of(reqs.begin(), reqs.end(), [](const auto& r) { return r.timestamp.has_value(); });
  Arrivals arrivals(o.request_rate, o.burstiness, o.seed);
  double t = 0;
  for (const auto& r : reqs) {
    if (traced) {
      t = *r.timestamp;
    } else if (!offsets.empty()) {
      t += arrivals.next_gap();
    }
    offsets.push_back(t);
  }
  if (traced) std::sort(offsets.begin(), offsets.end());
  run.t0 = Clock::now();
  if (o.progress) run.progress.emplace("bench serve", static_cast<double>(reqs.size()), Progress::Unit::kCount, "requests");
  auto timer = std::make_shared<net::steady_timer>(run.ioc);
  schedule(run, timer, offsets, 0);
  run.ioc.run();
  if (run.progress) run.progress->done();

  ServeBenchResult r;
  r.duration = secs(Clock::now() - run.t0);
  r.requests = std::move(run.results);
  r.max_in_flight = run.max_in_flight;
  std::vector<double> ttft, tpot, itl, e2el;
  std::int64_t out_tokens = 0, in_tokens = 0;
  for (const auto& q : r.requests) {
    if (!q.ok) {
      ++r.failed;
      ++r.errors[std::to_string(q.status)];
      continue;
    }
    ++r.completed;
    ttft.push_back(q.ttft);
    e2el.push_back(q.e2el);
    if (q.output_tokens > 1) tpot.push_back(q.tpot);
    itl.insert(itl.end(), q.itl.begin(), q.itl.end());
    out_tokens += q.output_tokens;
    in_tokens += q.prompt_tokens;
    const bool good = (!o.goodput_ttft_ms || q.ttft * 1e3 <= *o.goodput_ttft_ms) && (!o.goodput_tpot_ms || q.tpot * 1e3 <= *o.goodput_tpot_ms) &&
                      (!o.goodput_e2el_ms || q.e2el * 1e3 <= *o.goodput_e2el_ms);
    r.good += good;
  }
  r.ttft = summarize(ttft);
  r.tpot = summarize(tpot);
  r.itl = summarize(itl);
  r.e2el = summarize(e2el);
  r.request_throughput = static_cast<double>(r.completed) / r.duration;
  r.output_throughput = static_cast<double>(out_tokens) / r.duration;
  r.total_throughput = static_cast<double>(out_tokens + in_tokens) / r.duration;
  r.goodput = static_cast<double>(r.good) / r.duration;
  return r;
}

Result<std::pair<int, std::string>> http_call(const ServeBenchOptions& o, const std::string& method, const std::string& path,
                                              const std::string& body) {
  auto ep = parse_base_url(o.base_url);
  if (!ep) return error(ep.error());
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    auto addrs = resolver.resolve(ep->host, ep->port);
    http::request<http::string_body> req(method == "GET" ? http::verb::get : http::verb::post, ep->base_path + path, 11);
    req.set(http::field::host, ep->host);
    req.set(http::field::content_type, "application/json");
    if (!o.api_key.empty()) req.set(http::field::authorization, "Bearer " + o.api_key);
    for (const auto& [k, v] : o.headers) req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    beast::flat_buffer buf;
    http::response<http::string_body> res;
    if (ep->scheme == "https") {
      net::ssl::context ctx(net::ssl::context::tls_client);
      set_up_tls(ctx, o.insecure);
      beast::ssl_stream<beast::tcp_stream> s(ioc, ctx);
      SSL_set_tlsext_host_name(s.native_handle(), ep->host.c_str());
      beast::get_lowest_layer(s).expires_after(std::chrono::seconds(60));
      beast::get_lowest_layer(s).connect(addrs);
      s.handshake(net::ssl::stream_base::client);
      http::write(s, req);
      http::read(s, buf, res);
    } else {
      beast::tcp_stream s(ioc);
      s.expires_after(std::chrono::seconds(60));
      s.connect(addrs);
      http::write(s, req);
      http::read(s, buf, res);
    }
    return std::pair<int, std::string>{res.result_int(), res.body()};
  } catch (const std::exception& e) {
    return error(StatusCode::kUnavailable, std::string("cannot reach ") + o.base_url + path + ": " + e.what());
  }
}

namespace {
json summary_json(const Summary& s) {
  return {{"mean_ms", s.mean * 1e3}, {"median_ms", s.median * 1e3}, {"p90_ms", s.p90 * 1e3},
          {"p95_ms", s.p95 * 1e3},   {"p99_ms", s.p99 * 1e3},       {"max_ms", s.max * 1e3}};
}
}  // namespace

std::string result_json(const ServeBenchResult& r, const ServeBenchOptions& o, bool with_requests) {
  json j{{"base_url", o.base_url},
         {"endpoint", o.endpoint},
         {"request_rate", std::isfinite(o.request_rate) ? json(o.request_rate) : json("inf")},
         {"burstiness", o.burstiness},
         {"max_concurrency", o.max_concurrency},
         {"duration_s", r.duration},
         {"completed", r.completed},
         {"failed", r.failed},
         {"errors", r.errors},
         {"max_in_flight", r.max_in_flight},
         {"request_throughput", r.request_throughput},
         {"output_throughput", r.output_throughput},
         {"total_token_throughput", r.total_throughput},
         {"good_requests", r.good},
         {"goodput", r.goodput},
         {"ttft", summary_json(r.ttft)},
         {"tpot", summary_json(r.tpot)},
         {"itl", summary_json(r.itl)},
         {"e2el", summary_json(r.e2el)}};
  if (with_requests) {
    json reqs = json::array();
    for (const auto& q : r.requests) {
      reqs.push_back({{"ok", q.ok},
                      {"status", q.status},
                      {"error", q.error},
                      {"start_s", q.start},
                      {"ttft_s", q.ttft},
                      {"tpot_s", q.tpot},
                      {"e2el_s", q.e2el},
                      {"itl_s", q.itl},
                      {"prompt_tokens", q.prompt_tokens},
                      {"output_tokens", q.output_tokens}});
    }
    j["requests"] = std::move(reqs);
  }
  return j.dump(2, ' ', false, json::error_handler_t::replace);
}

Result<LoadGroup> parse_load_group(std::string_view spec, const ServeBenchOptions& base, std::uint64_t seed, std::size_t index) {
  LoadGroup g;
  g.name = "group" + std::to_string(index);
  g.options = base;
  g.options.progress = false;
  g.options.goodput_ttft_ms = g.options.goodput_tpot_ms = g.options.goodput_e2el_ms = std::nullopt;
  g.options.request_rate = std::numeric_limits<double>::infinity();
  g.options.max_concurrency = 0;
  g.dataset.name = "random";
  g.dataset.seed = g.options.seed = seed + index;
  auto bad = [&](const std::string& why) { return error(StatusCode::kInvalidArgument, "--group '" + std::string(spec) + "': " + why); };
  std::size_t pos = 0;
  while (pos < spec.size()) {
    std::size_t comma = spec.find(',', pos);
    if (comma == std::string_view::npos) comma = spec.size();
    const std::string_view item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0 || eq + 1 == item.size()) return bad("'" + std::string(item) + "' is not KEY=VALUE");
    const std::string key(item.substr(0, eq)), value(item.substr(eq + 1));
    char* end = nullptr;
    const double number = std::strtod(value.c_str(), &end);
    const bool numeric = *end == '\0';
    auto whole = [&](std::int64_t* out, std::int64_t min) {
      if (!numeric || number < static_cast<double>(min) || number != std::floor(number)) return false;
      *out = static_cast<std::int64_t>(number);
      return true;
    };
    if (key == "name") {
      g.name = value;
    } else if (key == "lane") {
      g.lane = value;
    } else if (key == "num-prompts") {
      if (!whole(&g.dataset.num_prompts, 1)) return bad("num-prompts must be a whole number >= 1");
    } else if (key == "request-rate") {
      g.options.request_rate = value == "inf" ? std::numeric_limits<double>::infinity() : number;
      if (value != "inf" && !(numeric && number > 0)) return bad("request-rate must be positive or inf");
    } else if (key == "max-concurrency") {
      if (!whole(&g.options.max_concurrency, 0)) return bad("max-concurrency must be a whole number >= 0");
    } else if (key == "input-len") {
      if (!whole(&g.dataset.input_len, 1)) return bad("input-len must be a whole number >= 1");
    } else if (key == "output-len") {
      if (!whole(&g.dataset.output_len, 1)) return bad("output-len must be a whole number >= 1");
    } else if (key == "range-ratio") {
      if (!(numeric && number >= 0 && number < 1)) return bad("range-ratio must be in [0, 1)");
      g.dataset.range_ratio = number;
    } else {
      return bad("unknown key '" + key + "' (name, lane, num-prompts, request-rate, max-concurrency, input-len, output-len, range-ratio)");
    }
  }
  if (!g.lane.empty()) {
    std::erase_if(g.options.headers, [](const auto& h) { return boost::iequals(h.first, "x-lmserve-lane"); });
    g.options.headers.emplace_back("x-lmserve-lane", g.lane);
  }
  return g;
}

std::string result_csv(const ServeBenchResult& r) {
  std::ostringstream s;
  s << "index,ok,status,start_s,ttft_s,tpot_s,e2el_s,prompt_tokens,output_tokens,error\n";
  for (std::size_t i = 0; i < r.requests.size(); ++i) {
    const auto& q = r.requests[i];
    std::string err = q.error;
    for (char& c : err) {
      if (c == '"' || c == '\n' || c == ',') c = ' ';
    }
    s << i << ',' << (q.ok ? 1 : 0) << ',' << q.status << ',' << q.start << ',' << q.ttft << ',' << q.tpot << ',' << q.e2el << ','
      << q.prompt_tokens << ',' << q.output_tokens << ",\"" << err << "\"\n";
  }
  return s.str();
}

std::string summary_table(const ServeBenchResult& r) {
  char line[256];
  std::string out;
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof(line), fmt, args...);
    out += line;
  };
  add("%-28s %10lld\n", "successful requests", static_cast<long long>(r.completed));
  add("%-28s %10lld\n", "failed requests", static_cast<long long>(r.failed));
  for (const auto& [status, n] : r.errors) add("  status %-19s %10lld\n", status.c_str(), static_cast<long long>(n));
  add("%-28s %10.2f\n", "duration (s)", r.duration);
  add("%-28s %10lld\n", "max requests in flight", static_cast<long long>(r.max_in_flight));
  add("%-28s %10.2f\n", "request throughput (req/s)", r.request_throughput);
  add("%-28s %10.1f\n", "output tokens/s", r.output_throughput);
  add("%-28s %10.1f\n", "total tokens/s", r.total_throughput);
  add("%-28s %10.2f (%lld good)\n", "goodput (req/s)", r.goodput, static_cast<long long>(r.good));
  add("%-10s %9s %9s %9s %9s %9s %9s\n", "ms", "mean", "median", "p90", "p95", "p99", "max");
  for (auto [name, s] : {std::pair<const char*, const Summary*>{"TTFT", &r.ttft}, {"TPOT", &r.tpot}, {"ITL", &r.itl}, {"E2E", &r.e2el}}) {
    add("%-10s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f\n", name, s->mean * 1e3, s->median * 1e3, s->p90 * 1e3, s->p95 * 1e3, s->p99 * 1e3,
        s->max * 1e3);
  }
  return out;
}

}  // namespace lmserve::bench
