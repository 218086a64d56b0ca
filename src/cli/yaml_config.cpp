#include "cli/yaml_config.h"

#include <yaml-cpp/yaml.h>

namespace lmserve::cli {

void add_config_option(CLI::App& app, std::string* path) {
  app.add_option("--config", *path, "YAML file of flag: value pairs, same names as the flags (the command line wins)");
}

Status apply_yaml_config(CLI::App& app, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    return Status(StatusCode::kNotFound, "--config: cannot read " + path);
  } catch (const YAML::Exception& e) {
    return Status(StatusCode::kInvalidArgument, "--config: " + path + " is not valid YAML (line " + std::to_string(e.mark.line + 1) + ")");
  }
  if (root.IsNull()) return Status::ok();
  if (!root.IsMap()) return Status(StatusCode::kInvalidArgument, "--config: " + path + " must hold a mapping of flag names to values");
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    for (char& c : key) c = c == '_' ? '-' : c;
    if (key == "config") return Status(StatusCode::kInvalidArgument, "--config: a config file cannot name another one");
    CLI::Option* opt = nullptr;
    try {
      opt = app.get_option("--" + key);
    } catch (const CLI::OptionNotFound&) {
      return Status(StatusCode::kInvalidArgument, "--config: unknown key '" + key + "'");
    }
    if (opt->count() > 0) continue;  // given on the command line
    std::vector<std::string> values;
    if (kv.second.IsSequence()) {
      for (const auto& x : kv.second) values.push_back(x.as<std::string>());
    } else if (kv.second.IsScalar()) {
      values.push_back(kv.second.as<std::string>());
    } else {
      return Status(StatusCode::kInvalidArgument, "--config: '" + key + "' must be a value or a list of values");
    }
    try {
      for (const auto& v : values) opt->add_result(v);
      opt->run_callback();
    } catch (const CLI::Error& e) {
      return Status(StatusCode::kInvalidArgument, "--config: bad value for '" + key + "': " + e.what());
    }
  }
  return Status::ok();
}

}  // namespace lmserve::cli
