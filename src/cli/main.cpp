// lmserve: one binary, one subcommand per tool (ARCHITECTURE.md). Exit codes: 0 success,
// 1 runtime failure, 2 usage error.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/build_info.h"
#include "common/log.h"
#include "common/progress.h"

int main(int argc, char** argv) {
  CLI::App app{"lmserve: LLM serving for private deployment", "lmserve"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(lmserve::build_info().version));
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warning, error, critical or off")
      ->capture_default_str();
  bool no_progress = false;
  app.add_flag("--no-progress", no_progress,
               "no progress bars or progress log lines (loading, tuning, graph capture, benchmarks); they are bars on a terminal, else a log "
               "line every 10 s");

  namespace cli = lmserve::cli;
  struct Available {
    const char* name;
    const char* description;
    cli::Command (*add)(CLI::App&);
  };
  const Available available[] = {
      {"serve", "OpenAI-compatible inference server", cli::add_serve_command},
      {"generate", "generate a completion in process and print its text", cli::add_generate_command},
      {"perplexity", "score a text file; prints the perplexity last", cli::add_perplexity_command},
      {"tokenize", "print the token ids of a text as a JSON array", cli::add_tokenize_command},
      {"detokenize", "print the text of token ids", cli::add_detokenize_command},
      {"chat-template", "print a conversation rendered with the model's chat template", cli::add_chat_template_command},
      {"version", "print build and device information", cli::add_version_command},
      {"bench", "benchmarks: latency, throughput (in process), serve (load test of an endpoint)", cli::add_bench_command},
      {"plan", "capacity planner: memory and GPUs for a model and a load", cli::add_plan_command},
      {"gateway", "entry point in front of serve replicas: routing, canary, affinity, health, failover", cli::add_gateway_command},
      {"model", "model integrity and versions: manifest, verify, activate", cli::add_model_command},
  };
  std::vector<std::pair<CLI::App*, cli::Command>> commands;
  for (const auto& a : available) {
    auto* sub = app.add_subcommand(a.name, a.description);
    sub->fallthrough();  // --log-level and --no-progress after the subcommand's name too
    commands.emplace_back(sub, a.add(*sub));
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }

  if (auto status = lmserve::configure_logging({.level = log_level}); !status.is_ok()) {
    std::fprintf(stderr, "lmserve: %s\n", status.message().c_str());
    return 2;
  }
  lmserve::configure_progress(no_progress ? lmserve::ProgressMode::kOff : lmserve::ProgressMode::kAuto);
  for (auto& [sub, run] : commands) {
    if (sub->parsed()) return run();
  }
  return 2;  // unreachable: require_subcommand(1)
}
