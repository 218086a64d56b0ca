// One function per subcommand: each registers its flags on the parent app and returns the
// callback that runs it. main.cpp only dispatches. A callback returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace lmserve::bench {
struct DatasetOptions;
}

namespace lmserve::cli {

using Command = std::function<int()>;

Command add_version_command(CLI::App& app);
Command add_tokenize_command(CLI::App& app);
Command add_detokenize_command(CLI::App& app);
Command add_chat_template_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_perplexity_command(CLI::App& app);
Command add_serve_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_bench_serve(CLI::App& app);  // the `bench serve` subcommand
// The log-normal length-mix flags (--mixed-*) of `bench serve` and `bench throughput`.
void add_mixed_length_options(CLI::App& app, bench::DatasetOptions& d);
Command add_plan_command(CLI::App& app);
Command add_gateway_command(CLI::App& app);
Command add_model_command(CLI::App& app);

}  // namespace lmserve::cli
