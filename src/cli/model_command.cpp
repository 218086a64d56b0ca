// `lmserve model`: model integrity and versions (issue #32; model/manifest.h).
//   model manifest DIR [--name N] [--model-version V]   writes DIR/lmserve-manifest.json
//   model verify DIR                                     exit 0 when DIR matches it, 1 naming every problem
//   model activate NAME VERSION [--root models]          root/NAME/current -> VERSION (verified first)
//   model write-random CONFIG_DIR OUT_DIR [--dtype D] [--seed S] [--shard-size BYTES]
//                                                        a sharded safetensors checkpoint of random values (issue #37)
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "model/checkpoint_writer.h"
#include "model/manifest.h"
#include "model/weights.h"

namespace lmserve::cli {

namespace {

int fail(const char* sub, const Status& s) {
  std::fprintf(stderr, "lmserve model %s: %s\n", sub, s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

Command add_model_command(CLI::App& app) {
  app.require_subcommand(1);
  struct Opts {
    std::string dir, name, version, root = "models";
    int threads = 4;
    bool no_verify = false;
    std::string out, dtype = "auto";
    std::uint64_t seed = 0;
    double shard_bytes = 5e9;
  };
  auto o = std::make_shared<Opts>();

  auto* manifest = app.add_subcommand("manifest", "write DIR/lmserve-manifest.json: SHA-256 and size of every file, name, version");
  manifest->add_option("dir", o->dir, "model folder")->required();
  manifest->add_option("--name", o->name, "model name (default: the folder's name, or its parent's in a NAME/VERSION layout)");
  manifest->add_option("--model-version", o->version, "model version (default: the folder's name)");
  manifest->add_option("--threads", o->threads, "files hashed at once")->capture_default_str();

  auto* verify = app.add_subcommand("verify", "check a model folder against its manifest; names every changed, missing or unlisted file");
  verify->add_option("dir", o->dir, "model folder")->required();
  verify->add_option("--threads", o->threads, "files hashed at once")->capture_default_str();

  auto* activate = app.add_subcommand("activate", "make ROOT/NAME/VERSION current (ROOT/NAME/current, replaced atomically); rollback: activate the previous one");
  activate->add_option("name", o->name, "model name (a folder under --root)")->required();
  activate->add_option("version", o->version, "version (a folder under ROOT/NAME)")->required();
  activate->add_option("--root", o->root, "the models' root folder")->capture_default_str();
  activate->add_flag("--no-verify", o->no_verify, "skip checking the version against its manifest");

  auto* write = app.add_subcommand("write-random",
                                   "write a safetensors checkpoint of random values for a config.json (the weights of --load-format dummy), sharded "
                                   "with an index as published checkpoints are: real-size loading without downloading a model");
  write->add_option("config_dir", o->dir, "folder with config.json (and generation_config.json)")->required();
  write->add_option("out_dir", o->out, "where the checkpoint goes (made if missing)")->required();
  write->add_option("--dtype", o->dtype, "auto (config.json's torch_dtype), float32, bfloat16, float16")->capture_default_str();
  write->add_option("--seed", o->seed, "random values' seed (the same as --load-format dummy's)")->capture_default_str();
  write->add_option("--shard-size", o->shard_bytes, "bytes per shard at most (a larger tensor gets one of its own)")->capture_default_str();

  return [o, manifest, verify, activate, write]() -> int {
    namespace fs = std::filesystem;
    if (manifest->parsed()) {
      const fs::path dir = fs::absolute(o->dir).lexically_normal();
      const fs::path base = dir.has_filename() ? dir : dir.parent_path();
      std::string name = o->name, version = o->version;
      if (version.empty()) version = base.filename().string();
      if (name.empty()) name = o->version.empty() && base.has_parent_path() ? base.parent_path().filename().string() : base.filename().string();
      auto m = model::make_manifest(o->dir, name, version, o->threads);
      if (!m) return fail("manifest", m.error());
      if (Status s = model::write_manifest(o->dir, *m); !s.is_ok()) return fail("manifest", s);
      std::uint64_t bytes = 0;
      for (const auto& f : m->files) bytes += f.size;
      std::printf("%s: %s %s, %zu files, %llu bytes\n", (fs::path(o->dir) / model::kManifestFile).c_str(), m->name.c_str(), m->version.c_str(),
                  m->files.size(), static_cast<unsigned long long>(bytes));
      return 0;
    }
    if (verify->parsed()) {
      auto v = model::verify_model(o->dir, o->threads);
      if (!v) return fail("verify", v.error());
      for (const auto& p : v->problems) std::printf("%s\n", model::describe(p).c_str());
      if (!v->ok()) {
        std::fprintf(stderr, "lmserve model verify: %s does not match its manifest: %zu problem(s)\n", o->dir.c_str(), v->problems.size());
        return 1;
      }
      std::printf("%s: %s %s verified, %llu files, %llu bytes\n", o->dir.c_str(), v->manifest.name.c_str(), v->manifest.version.c_str(),
                  static_cast<unsigned long long>(v->files), static_cast<unsigned long long>(v->bytes));
      return 0;
    }
    if (write->parsed()) {
      if (!(o->shard_bytes >= 1)) return fail("write-random", Status(StatusCode::kInvalidArgument, "--shard-size must be at least 1 byte"));
      auto config = model::load_config(o->dir);
      if (!config) return fail("write-random", config.error());
      auto w = model::ModelWeights::dummy(*config, o->dtype, o->seed);
      if (!w) return fail("write-random", w.error());
      const auto t0 = std::chrono::steady_clock::now();
      auto s = model::write_checkpoint(**w, o->dir, o->out, static_cast<std::uint64_t>(o->shard_bytes));
      if (!s) return fail("write-random", s.error());
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%s: %d tensors, %llu bytes in %d shards, written in %.1f s (%.2f GB/s)\n", o->out.c_str(), s->tensors,
                  static_cast<unsigned long long>(s->bytes), s->shards, secs, static_cast<double>(s->bytes) / secs / 1e9);
      return 0;
    }
    if (activate->parsed()) {
      auto before = model::activate_version(o->root, o->name, o->version, !o->no_verify);
      if (!before) return fail("activate", before.error());
      std::printf("%s: current -> %s (was %s)\n", (fs::path(o->root) / o->name).c_str(), o->version.c_str(), before->empty() ? "none" : before->c_str());
      return 0;
    }
    return 2;
  };
}

}  // namespace lmserve::cli
