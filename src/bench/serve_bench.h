// `lmserve bench serve`: an asynchronous load generator for any OpenAI-compatible endpoint.
// One thread runs one Boost.Asio io_context: every request is a connection with streaming SSE,
// so thousands can be in flight without a thread each. Requests start at the arrival process's
// times (or a trace's timestamps), at most max_concurrency at once (the rest wait in order).
//
// Per request: TTFT (start to the first chunk with tokens), ITL (each gap between such chunks),
// E2E latency, TPOT = (E2E - TTFT) / (output tokens - 1), and token counts from the server's
// usage (stream_options.include_usage), never from counting chunks.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "bench/load.h"
#include "common/status.h"

namespace lmserve::bench {

struct Endpoint {
  std::string scheme = "http", host = "127.0.0.1", port = "8000", base_path;
};
// "http[s]://host[:port][/prefix]"; InvalidArgument otherwise.
Result<Endpoint> parse_base_url(const std::string& url);

struct ServeBenchOptions {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";  // or /v1/chat/completions
  std::string model;
  std::string api_key;
  std::vector<std::pair<std::string, std::string>> headers;
  bool insecure = false;  // TLS without certificate verification
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  std::int64_t max_concurrency = 0;  // 0: no limit
  bool ignore_eos = true;
  std::uint64_t seed = 0;
  bool progress = false;  // requests done, in flight and output tok/s (common/progress.h)
  std::optional<double> goodput_ttft_ms, goodput_tpot_ms, goodput_e2el_ms;
};

struct RequestResult {
  bool ok = false;
  int status = 0;  // HTTP status; 0: no response (connection failed)
  std::string error;
  double start = 0;  // seconds from the run's start
  double ttft = 0, e2el = 0, tpot = 0;
  std::vector<double> itl;
  std::int64_t prompt_tokens = 0, output_tokens = 0;
};

struct ServeBenchResult {
  double duration = 0;
  std::vector<RequestResult> requests;
  std::int64_t completed = 0, failed = 0, max_in_flight = 0;
  std::map<std::string, std::int64_t> errors;  // by status ("0" = no response)
  Summary ttft, tpot, itl, e2el;  // seconds
  double request_throughput = 0, output_throughput = 0, total_throughput = 0;
  std::int64_t good = 0;          // requests meeting every goodput limit
  double goodput = 0;             // good requests per second
};

// Request bodies ready to send, built from specs whose prompt texts are filled in.
struct PreparedRequest {
  std::string body;
  std::int64_t input_len = 0, output_len = 0;
  std::optional<double> timestamp;
};
std::vector<PreparedRequest> prepare_requests(const std::vector<RequestSpec>& specs, const ServeBenchOptions& options);

Result<ServeBenchResult> run_serve_bench(const std::vector<PreparedRequest>& requests, const ServeBenchOptions& options);

// A blocking request (for /tokenize, /detokenize, /metrics and set-up): status and body.
Result<std::pair<int, std::string>> http_call(const ServeBenchOptions& options, const std::string& method, const std::string& path,
                                              const std::string& body);

// A client group of `bench serve --group`, run at the same time as the main one with its own
// arrivals, lengths and lane, and reported apart: how operators load two lanes at once.
// SPEC is comma-separated KEY=VALUE: name, lane (sent as x-lmserve-lane), num-prompts,
// request-rate (inf or requests/s), max-concurrency, input-len, output-len, range-ratio (a random
// dataset). Everything else (server, model, endpoint, key, headers, ignore_eos) comes from
// `base`; the seed is base's plus `index`. InvalidArgument naming the key for anything else.
struct LoadGroup {
  std::string name, lane;
  ServeBenchOptions options;
  DatasetOptions dataset;
};
Result<LoadGroup> parse_load_group(std::string_view spec, const ServeBenchOptions& base, std::uint64_t seed, std::size_t index);

// JSON of the summary and, when `with_requests`, every request's record.
std::string result_json(const ServeBenchResult& r, const ServeBenchOptions& o, bool with_requests);
std::string result_csv(const ServeBenchResult& r);
std::string summary_table(const ServeBenchResult& r);

}  // namespace lmserve::bench
