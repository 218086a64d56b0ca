// --config FILE.yaml for subcommands: a YAML mapping whose keys are the long flag names
// (dashes or underscores), values scalars or lists. Flags given on the command line win.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "common/status.h"

namespace lmserve::cli {

// Adds --config FILE to `app`, storing the path in *path.
void add_config_option(CLI::App& app, std::string* path);

// Applies the YAML file's values to `app`'s options that the command line did not set.
// InvalidArgument naming the key for unknown keys, bad values or malformed YAML.
Status apply_yaml_config(CLI::App& app, const std::string& path);

}  // namespace lmserve::cli
