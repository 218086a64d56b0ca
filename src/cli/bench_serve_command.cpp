// lmserve bench serve: the load tester (src/bench/serve_bench.h) with datasets, sweeps,
// goodput, reports and plots.
#include <sys/resource.h>
#include <unistd.h>

#include <boost/algorithm/string/predicate.hpp>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "bench/serve_bench.h"
#include "cli/commands.h"
#include "text/tokenizer.h"

namespace lmserve::cli {
namespace {

using json = nlohmann::json;

int fail(const Status& s) {
  std::fprintf(stderr, "lmserve bench serve: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

// Filler words for prompts of a given token length (cut to length by a tokenizer).
constexpr const char* kWords[] = {"the",   "system", "report", "quarterly", "risk",    "account",  "transfer", "policy", "customer",
                                  "audit", "model",  "server", "market",    "credit",  "factory",  "sensor",   "line",   "batch",
                                  "query", "review", "data",   "process",   "control", "standard", "measure",  "value",  "order",
                                  "time",  "plant",  "branch", "limit",     "summary", "ledger",   "yield",    "shift",  "quality"};

// Fills in the prompt text of every spec that only has a length: local tokenizer if given,
// else the server's /tokenize and /detokenize (so the length is in the server's tokens).
Status fill_prompts(std::vector<bench::RequestSpec>& specs, const bench::ServeBenchOptions& o, const text::Tokenizer* tok, std::uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x5bd1e995u);
  std::uniform_int_distribution<std::size_t> word(0, std::size(kWords) - 1);
  for (auto& s : specs) {
    if (!s.prompt.empty()) continue;
    std::string text;
    for (std::int64_t i = 0; i < s.input_len + 8; ++i) {
      if (!text.empty()) text += ' ';
      text += kWords[word(rng)];
    }
    std::vector<std::int32_t> ids;
    if (tok) {
      ids = tok->encode(text, {.add_special_tokens = false});
      ids.resize(std::min<std::size_t>(ids.size(), static_cast<std::size_t>(s.input_len)));
      s.prompt = tok->decode(ids);
      continue;
    }
    auto r = bench::http_call(o, "POST", "/tokenize", json{{"model", o.model}, {"prompt", text}, {"add_special_tokens", false}}.dump());
    if (!r) return r.error();
    auto j = json::parse(r->second, nullptr, false);
    if (r->first != 200 || j.is_discarded() || !j.contains("tokens")) {
      return Status(StatusCode::kUnavailable, "the server's /tokenize did not answer (HTTP " + std::to_string(r->first) + "); pass --tokenizer DIR");
    }
    ids = j["tokens"].get<std::vector<std::int32_t>>();
    ids.resize(std::min<std::size_t>(ids.size(), static_cast<std::size_t>(s.input_len)));
    r = bench::http_call(o, "POST", "/detokenize", json{{"model", o.model}, {"tokens", ids}}.dump());
    if (!r) return r.error();
    j = json::parse(r->second, nullptr, false);
    if (r->first != 200 || j.is_discarded() || !j.contains("prompt")) return Status(StatusCode::kUnavailable, "the server's /detokenize did not answer");
    s.prompt = j["prompt"].get<std::string>();
  }
  return Status::ok();
}

// Latency percentiles against throughput over the sweep, and the TTFT / ITL distributions of
// the last run, as one SVG.
std::string plot_svg(const std::vector<std::pair<std::string, bench::ServeBenchResult>>& runs) {
  const int W = 900, H = 360, pad = 50;
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << 2 * H << "' font-family='sans-serif' font-size='12'>\n";
  // Panel 1: x = output tokens/s, y = ms (TTFT p50/p99, E2E p50/p99).
  double xmax = 1, ymax = 1;
  for (const auto& [label, r] : runs) {
    xmax = std::max(xmax, r.output_throughput);
    ymax = std::max({ymax, r.ttft.p99 * 1e3, r.e2el.p99 * 1e3});
  }
  auto px = [&](double x) { return pad + (W - 2 * pad) * x / (xmax * 1.05); };
  auto py = [&](double y) { return H - pad - (H - 2 * pad) * y / (ymax * 1.05); };
  s << "<text x='" << pad << "' y='20'>latency (ms) vs output tokens/s over the sweep</text>\n";
  s << "<line x1='" << pad << "' y1='" << H - pad << "' x2='" << W - pad << "' y2='" << H - pad << "' stroke='black'/>\n";
  s << "<line x1='" << pad << "' y1='" << pad << "' x2='" << pad << "' y2='" << H - pad << "' stroke='black'/>\n";
  s << "<text x='" << W - pad << "' y='" << H - pad + 30 << "' text-anchor='end'>" << xmax << " tok/s</text>\n";
  s << "<text x='5' y='" << pad << "'>" << static_cast<int>(ymax) << " ms</text>\n";
  const char* colors[] = {"#1f77b4", "#aec7e8", "#d62728", "#ff9896"};
  const char* names[] = {"TTFT p50", "TTFT p99", "E2E p50", "E2E p99"};
  for (int k = 0; k < 4; ++k) {
    s << "<polyline fill='none' stroke='" << colors[k] << "' stroke-width='2' points='";
    for (const auto& [label, r] : runs) {
      const double y = (k == 0 ? r.ttft.median : k == 1 ? r.ttft.p99 : k == 2 ? r.e2el.median : r.e2el.p99) * 1e3;
      s << px(r.output_throughput) << ',' << py(y) << ' ';
    }
    s << "'/>\n<text x='" << W - pad - 80 << "' y='" << pad + 15 * k << "' fill='" << colors[k] << "'>" << names[k] << "</text>\n";
  }
  for (const auto& [label, r] : runs) s << "<text x='" << px(r.output_throughput) << "' y='" << H - pad + 15 << "' text-anchor='middle'>" << label << "</text>\n";
  // Panel 2: histograms of TTFT and ITL (last run), 40 bins each.
  const auto& last = runs.back().second;
  std::vector<double> ttft, itl;
  for (const auto& q : last.requests) {
    if (!q.ok) continue;
    ttft.push_back(q.ttft * 1e3);
    for (double g : q.itl) itl.push_back(g * 1e3);
  }
  auto hist = [&](const std::vector<double>& v, int x0, const char* title, const char* color) {
    const int w = W / 2 - pad, h = H - 2 * pad, bins = 40;
    const double top = std::max(1e-9, v.empty() ? 1.0 : bench::percentile(v, 99.5));
    std::vector<int> c(bins, 0);
    for (double x : v) c[static_cast<std::size_t>(std::min(bins - 1, static_cast<int>(x / top * bins)))]++;
    const int cmax = std::max(1, *std::max_element(c.begin(), c.end()));
    s << "<text x='" << x0 << "' y='" << H + 20 << "'>" << title << " (ms, to p99.5 = " << top << ")</text>\n";
    for (int b = 0; b < bins; ++b) {
      const double bh = static_cast<double>(h) * c[static_cast<std::size_t>(b)] / cmax;
      s << "<rect x='" << x0 + b * w / bins << "' y='" << 2 * H - pad - bh << "' width='" << w / bins - 1 << "' height='" << bh << "' fill='" << color << "'/>\n";
    }
  };
  hist(ttft, pad, "TTFT distribution", "#1f77b4");
  hist(itl, W / 2 + pad / 2, "ITL distribution", "#2ca02c");
  s << "</svg>\n";
  return s.str();
}

}  // namespace

void add_mixed_length_options(CLI::App& app, bench::DatasetOptions& d) {
  app.add_option("--mixed-input-median", d.input_median, "mixed: median prompt tokens")->capture_default_str();
  app.add_option("--mixed-output-median", d.output_median, "mixed: median output tokens")->capture_default_str();
  char sigma[32];
  std::snprintf(sigma, sizeof sigma, "%g", d.input_sigma);
  app.add_option_function<double>(
         "--mixed-sigma", [&d](double s) { d.input_sigma = d.output_sigma = s; }, "mixed: sigma of log length (both)")
      ->default_str(sigma);
  app.add_option("--mixed-max-input-len", d.max_input_len, "mixed: clip prompts at")->capture_default_str();
  app.add_option("--mixed-max-output-len", d.max_output_len, "mixed: clip outputs at")->capture_default_str();
}

namespace {

struct BenchServeOpts {
  bench::ServeBenchOptions o;
  bench::DatasetOptions d;
  std::string rate = "inf", sweep, result_json, result_csv, plot, tokenizer;
  std::vector<std::string> headers, goodput, groups;
  bool ignore_eos = true, compare_uniform = false;
};

// --group: the main group and the others at the same time, each on its own thread and event
// loop, each reported apart (then one line each, side by side).
int run_groups(const BenchServeOpts& p, const std::vector<bench::RequestSpec>& main_specs, const text::Tokenizer* tok) {
  if (!p.sweep.empty() || p.compare_uniform) {
    return fail(Status(StatusCode::kInvalidArgument, "--group runs once: it does not combine with --sweep or --compare-uniform"));
  }
  struct Run {
    std::string name, lane;
    bench::ServeBenchOptions opts;
    std::vector<bench::RequestSpec> specs;
    Result<bench::ServeBenchResult> result = Unexpected<Status>(Status(StatusCode::kInternal, "not run"));
  };
  std::vector<Run> runs;
  std::string main_lane;
  for (const auto& [name, value] : p.o.headers) {
    if (boost::iequals(name, "x-lmserve-lane")) main_lane = value;
  }
  runs.push_back({"main", main_lane, p.o, main_specs});
  for (std::size_t i = 0; i < p.groups.size(); ++i) {
    auto g = bench::parse_load_group(p.groups[i], p.o, p.d.seed, i + 1);
    if (!g) return fail(g.error());
    auto specs = bench::make_dataset(g->dataset);
    if (!specs) return fail(specs.error());
    if (Status s = fill_prompts(*specs, g->options, tok, g->dataset.seed); !s.is_ok()) return fail(s);
    for (const auto& r : runs) {
      if (r.name == g->name) return fail(Status(StatusCode::kInvalidArgument, "--group: two groups are named '" + g->name + "'"));
    }
    runs.push_back({g->name, g->lane, g->options, std::move(*specs)});
  }
  {
    std::vector<std::thread> threads;
    for (auto& r : runs) {
      threads.emplace_back([&r] { r.result = bench::run_serve_bench(bench::prepare_requests(r.specs, r.opts), r.opts); });
    }
    for (auto& t : threads) t.join();
  }
  std::int64_t failed = 0;
  nlohmann::json report;
  for (auto& r : runs) {
    if (!r.result) return fail(r.result.error());
    std::printf("==== group %s (lane %s): %zu requests, rate %s, max concurrency %lld\n", r.name.c_str(),
                r.lane.empty() ? "default" : r.lane.c_str(), r.specs.size(),
                std::isfinite(r.opts.request_rate) ? std::to_string(r.opts.request_rate).c_str() : "inf",
                static_cast<long long>(r.opts.max_concurrency));
    std::printf("%s", bench::summary_table(*r.result).c_str());
    failed += r.result->failed;
    auto j = json::parse(bench::result_json(*r.result, r.opts, !p.result_json.empty()));
    j["group"] = r.name;
    j["lane"] = r.lane;
    report["groups"].push_back(std::move(j));
  }
  std::printf("\n%-12s %-8s %9s %11s %9s %9s %9s %9s %9s %8s\n", "group", "lane", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
              "TPOT p99", "E2E p99", "failed");
  for (const auto& r : runs) {
    const auto& x = *r.result;
    std::printf("%-12s %-8s %9.2f %11.1f %9.1f %9.1f %9.2f %9.2f %9.1f %8lld\n", r.name.c_str(), r.lane.empty() ? "-" : r.lane.c_str(),
                x.request_throughput, x.output_throughput, x.ttft.median * 1e3, x.ttft.p99 * 1e3, x.tpot.median * 1e3, x.tpot.p99 * 1e3,
                x.e2el.p99 * 1e3, static_cast<long long>(x.failed));
  }
  if (!p.result_json.empty()) {
    std::ofstream f(p.result_json, std::ios::binary);
    f << report.dump(2, ' ', false, json::error_handler_t::replace);
    if (!f) return fail(Status(StatusCode::kInternal, "cannot write " + p.result_json));
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

Command add_bench_serve(CLI::App& app) {
  using Opts = BenchServeOpts;
  auto p = std::make_shared<Opts>();
  app.add_option("--base-url", p->o.base_url, "server address, http[s]://host:port")->capture_default_str();
  app.add_option("--endpoint", p->o.endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  app.add_option("--model", p->o.model, "model name to send (default: the server's first model)");
  app.add_option("--api-key", p->o.api_key, "sent as 'Authorization: Bearer KEY'");
  app.add_option("--header", p->headers, "extra header NAME:VALUE (repeatable), e.g. x-lmserve-lane:low");
  app.add_flag("--insecure", p->o.insecure, "HTTPS without certificate verification");
  app.add_option("--num-prompts", p->d.num_prompts, "requests per run")->capture_default_str();
  app.add_option("--request-rate", p->rate, "requests/s (Poisson; inf: all at once)")->capture_default_str();
  app.add_option("--burstiness", p->o.burstiness, "gamma shape of the gaps (1: Poisson)")->capture_default_str();
  app.add_option("--max-concurrency", p->o.max_concurrency, "requests in flight at most (0: no limit)")->capture_default_str();
  app.add_option("--sweep", p->sweep, "rate:R1,R2,... or concurrency:C1,C2,...: one run and one row per point");
  app.add_option("--dataset-name", p->d.name, "random, mixed, jsonl or sharegpt")->capture_default_str();
  app.add_option("--dataset-path", p->d.path, "file for jsonl / sharegpt");
  app.add_option("--random-input-len", p->d.input_len, "random: prompt tokens")->capture_default_str();
  app.add_option("--random-output-len", p->d.output_len, "random: output tokens")->capture_default_str();
  app.add_option("--random-range-ratio", p->d.range_ratio, "random: lengths uniform within +-ratio")->capture_default_str();
  add_mixed_length_options(app, p->d);
  app.add_option("--tokenizer", p->tokenizer, "tokenizer folder to build prompts (default: the server's /tokenize)");
  app.add_flag("--ignore-eos,!--no-ignore-eos", p->ignore_eos,
               "generate exactly output_len tokens past any end-of-sequence (the default, as vLLM's bench serve --ignore-eos); "
               "--no-ignore-eos lets requests stop at end-of-sequence");
  app.add_option("--seed", p->d.seed, "dataset and arrivals")->capture_default_str();
  app.add_option("--goodput", p->goodput, "SLOs: ttft:MS tpot:MS e2el:MS")->expected(1, 3);
  app.add_option("--result-json", p->result_json, "write the summary and every request");
  app.add_option("--result-csv", p->result_csv, "write one row per request");
  app.add_option("--plot", p->plot, "write an SVG: latency vs throughput, TTFT/ITL distributions");
  app.add_option("--group", p->groups,
                 "another client group run at the same time and reported apart (repeatable): name=N,lane=L,num-prompts=N,"
                 "request-rate=R,max-concurrency=C,input-len=N,output-len=N,range-ratio=X (random lengths)");
  app.add_flag("--compare-uniform", p->compare_uniform, "also run uniform lengths with the same means and compare");

  return [p]() -> int {
    auto& o = p->o;
    auto& d = p->d;
    // One socket per request in flight: allow as many descriptors as the hard limit does.
    if (rlimit lim{}; getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = lim.rlim_max;
      setrlimit(RLIMIT_NOFILE, &lim);
    }
    o.ignore_eos = p->ignore_eos;
    o.seed = d.seed;
    o.progress = true;  // a bar on a terminal, log lines elsewhere, none with --no-progress
    o.request_rate = p->rate == "inf" ? INFINITY : std::strtod(p->rate.c_str(), nullptr);
    if (!(o.request_rate > 0)) return fail(Status(StatusCode::kInvalidArgument, "--request-rate must be positive or inf"));
    if (o.burstiness <= 0) return fail(Status(StatusCode::kInvalidArgument, "--burstiness must be positive"));
    if (o.max_concurrency < 0) return fail(Status(StatusCode::kInvalidArgument, "--max-concurrency must be >= 0"));
    for (const auto& h : p->headers) {
      const auto c = h.find(':');
      if (c == std::string::npos || c == 0) return fail(Status(StatusCode::kInvalidArgument, "--header must be NAME:VALUE"));
      std::string v = h.substr(c + 1);
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      o.headers.emplace_back(h.substr(0, c), v);
    }
    for (const auto& g : p->goodput) {
      const auto c = g.find(':');
      const std::string k = g.substr(0, c);
      const double v = c == std::string::npos ? -1 : std::strtod(g.c_str() + c + 1, nullptr);
      if (v <= 0) return fail(Status(StatusCode::kInvalidArgument, "--goodput takes ttft:MS tpot:MS e2el:MS"));
      if (k == "ttft") o.goodput_ttft_ms = v;
      else if (k == "tpot") o.goodput_tpot_ms = v;
      else if (k == "e2el") o.goodput_e2el_ms = v;
      else return fail(Status(StatusCode::kInvalidArgument, "--goodput keys are ttft, tpot and e2el"));
    }
    if (auto e = bench::parse_base_url(o.base_url); !e) return fail(e.error());
    if (o.model.empty()) {
      auto r = bench::http_call(o, "GET", "/v1/models", "");
      if (!r) return fail(r.error());
      auto j = json::parse(r->second, nullptr, false);
      if (r->first != 200 || j.is_discarded() || !j.contains("data") || j["data"].empty()) {
        return fail(Status(StatusCode::kUnavailable, "GET /v1/models answered HTTP " + std::to_string(r->first) + "; pass --model"));
      }
      o.model = j["data"][0].value("id", "");
    }
    std::shared_ptr<const text::Tokenizer> tok;
    if (!p->tokenizer.empty()) {
      auto t = text::Tokenizer::load(p->tokenizer);
      if (!t) return fail(t.error());
      tok = *t;
    }
    auto specs = bench::make_dataset(d);
    if (!specs) return fail(specs.error());
    if (Status s = fill_prompts(*specs, o, tok.get(), d.seed); !s.is_ok()) return fail(s);

    if (!p->groups.empty()) return run_groups(*p, *specs, tok.get());

    // The points: one run, a sweep, or mixed-vs-uniform.
    struct Point {
      std::string label;
      bench::ServeBenchOptions opts;
      std::vector<bench::RequestSpec> specs;
    };
    std::vector<Point> points;
    if (!p->sweep.empty()) {
      const auto colon = p->sweep.find(':');
      const std::string kind = p->sweep.substr(0, colon);
      if (colon == std::string::npos || (kind != "rate" && kind != "concurrency")) {
        return fail(Status(StatusCode::kInvalidArgument, "--sweep must be rate:R1,R2,... or concurrency:C1,C2,..."));
      }
      std::stringstream list(p->sweep.substr(colon + 1));
      for (std::string v; std::getline(list, v, ',');) {
        Point pt{kind + "=" + v, o, *specs};
        const double x = v == "inf" ? INFINITY : std::strtod(v.c_str(), nullptr);
        if (!(x > 0)) return fail(Status(StatusCode::kInvalidArgument, "--sweep values must be positive"));
        if (kind == "rate") pt.opts.request_rate = x;
        else pt.opts.max_concurrency = static_cast<std::int64_t>(x);
        points.push_back(std::move(pt));
      }
    } else {
      points.push_back({d.name, o, *specs});
    }
    if (p->compare_uniform) {
      auto [mi, mo] = bench::mean_lengths(*specs);
      bench::DatasetOptions u = d;
      u.name = "random";
      u.input_len = std::max<std::int64_t>(1, std::llround(mi));
      u.output_len = std::max<std::int64_t>(1, std::llround(mo));
      u.range_ratio = 0;
      auto us = bench::make_dataset(u);
      if (!us) return fail(us.error());
      if (Status s = fill_prompts(*us, o, tok.get(), d.seed + 1); !s.is_ok()) return fail(s);
      points.push_back({"uniform", o, *us});
    }

    std::vector<std::pair<std::string, bench::ServeBenchResult>> runs;
    for (auto& pt : points) {
      auto reqs = bench::prepare_requests(pt.specs, pt.opts);
      auto r = bench::run_serve_bench(reqs, pt.opts);
      if (!r) return fail(r.error());
      std::printf("==== %s: %zu requests, rate %s, max concurrency %lld\n", pt.label.c_str(), reqs.size(),
                  std::isfinite(pt.opts.request_rate) ? std::to_string(pt.opts.request_rate).c_str() : "inf",
                  static_cast<long long>(pt.opts.max_concurrency));
      std::printf("%s", bench::summary_table(*r).c_str());
      std::fflush(stdout);
      runs.emplace_back(pt.label, std::move(*r));
    }
    if (runs.size() > 1) {
      std::printf("\n%-22s %10s %12s %10s %10s %10s %10s\n", "point", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "E2E p99", "goodput");
      for (const auto& [label, r] : runs) {
        std::printf("%-22s %10.2f %12.1f %10.1f %10.1f %10.1f %10.2f\n", label.c_str(), r.request_throughput, r.output_throughput,
                    r.ttft.median * 1e3, r.ttft.p99 * 1e3, r.e2el.p99 * 1e3, r.goodput);
      }
    }
    if (p->compare_uniform) {
      const auto& mixed = runs[runs.size() - 2].second;
      const auto& uni = runs.back().second;
      std::printf("\nmixed lengths reach %.1f%% of the uniform run's output tokens/s (%.1f vs %.1f): size on the mixed number\n",
                  100.0 * mixed.output_throughput / std::max(1e-9, uni.output_throughput), mixed.output_throughput, uni.output_throughput);
    }
    const auto& last = runs.back().second;
    auto write = [](const std::string& path, const std::string& data) {
      std::ofstream f(path, std::ios::binary);
      f << data;
      return static_cast<bool>(f);
    };
    if (!p->result_json.empty()) {
      const auto& main_run = p->compare_uniform && runs.size() > 1 ? runs[runs.size() - 2].second : last;
      std::string js = bench::result_json(main_run, o, true);
      if (runs.size() > 1) {
        auto j = json::parse(js);
        json pts = json::array();
        for (const auto& [label, r] : runs) {
          auto pj = json::parse(bench::result_json(r, o, false));
          pj["label"] = label;
          pts.push_back(pj);
        }
        j["points"] = pts;
        js = j.dump(2);
      }
      if (!write(p->result_json, js)) return fail(Status(StatusCode::kInternal, "cannot write " + p->result_json));
    }
    if (!p->result_csv.empty() && !write(p->result_csv, bench::result_csv(last))) return fail(Status(StatusCode::kInternal, "cannot write " + p->result_csv));
    if (!p->plot.empty()) {
      const bool png = p->plot.size() > 4 && p->plot.compare(p->plot.size() - 4, 4, ".png") == 0;
      const std::string svg = png ? p->plot + ".svg" : p->plot;
      if (!write(svg, plot_svg(runs))) return fail(Status(StatusCode::kInternal, "cannot write " + svg));
      if (png && p->plot.find('\'') != std::string::npos) return fail(Status(StatusCode::kInvalidArgument, "--plot: a PNG path may not contain quotes"));
      if (png) {
        // PNG through librsvg's converter (Debian: librsvg2-bin), when it is installed.
        const std::string cmd = "rsvg-convert -o '" + p->plot + "' '" + svg + "' 2>/dev/null";
        if (std::system(cmd.c_str()) != 0) {
          return fail(Status(StatusCode::kUnavailable, "--plot " + p->plot + ": PNG needs rsvg-convert (apt-get install librsvg2-bin); the SVG is in " + svg));
        }
        std::remove(svg.c_str());
      }
    }
    std::int64_t failed = 0;
    for (const auto& [label, r] : runs) failed += r.failed;
    return failed == 0 ? 0 : 1;
  };
}

}  // namespace lmserve::cli
