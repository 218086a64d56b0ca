// lmserve tokenize / detokenize / chat-template: the text layer from the command line.
// Output is exact (no trailing newline after detokenized text or a rendered prompt), so
// other tools can compare it byte for byte.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "common/file.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lmserve::cli {
namespace {

int fail(const char* command, const std::string& message, int code = 1) {
  std::fprintf(stderr, "lmserve %s: %s\n", command, message.c_str());
  return code;
}

Result<nlohmann::ordered_json> read_json_file(const std::string& path) {
  auto text = read_file(path);
  if (!text) return error(text.error());
  auto j = nlohmann::ordered_json::parse(*text, nullptr, false);
  if (j.is_discarded()) return error(StatusCode::kInvalidArgument, path + " is not valid JSON");
  return j;
}

void write_exact(const std::string& s) {
  std::fwrite(s.data(), 1, s.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

Command add_tokenize_command(CLI::App& app) {
  struct Opts {
    std::string model, text;
    bool no_special = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "model folder (tokenizer.json, or vocab.json + merges.txt)")->required();
  app.add_flag("--no-special", o->no_special, "do not add BOS/EOS (add_special_tokens=False)");
  app.add_option("text", o->text, "the text; '-' reads standard input byte for byte")->required();
  return [o]() {
    auto tok = text::Tokenizer::load(o->model);
    if (!tok) return fail("tokenize", tok.error().message());
    std::string input = o->text;
    if (input == "-") input.assign(std::istreambuf_iterator<char>(std::cin), {});
    auto ids = (*tok)->encode(input, {.add_special_tokens = !o->no_special});
    std::printf("%s\n", nlohmann::json(ids).dump().c_str());
    return 0;
  };
}

Command add_detokenize_command(CLI::App& app) {
  struct Opts {
    std::string model;
    std::vector<std::string> ids;
    bool skip_special = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "model folder")->required();
  app.add_flag("--skip-special-tokens", o->skip_special, "leave special tokens out");
  app.add_option("ids", o->ids, "token ids")->required();
  return [o]() {
    std::vector<std::int32_t> ids;
    for (const auto& s : o->ids) {
      std::int32_t v = 0;
      std::istringstream in(s);
      if (!(in >> v) || !in.eof()) return fail("detokenize", "not a token id: '" + s + "'", 2);
      ids.push_back(v);
    }
    auto tok = text::Tokenizer::load(o->model);
    if (!tok) return fail("detokenize", tok.error().message());
    write_exact((*tok)->decode(ids, o->skip_special));
    return 0;
  };
}

Command add_chat_template_command(CLI::App& app) {
  struct Opts {
    std::string model, messages, tools, template_file, kwargs;
    bool add_generation_prompt = false;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--model", o->model, "model folder (tokenizer_config.json / chat_template.jinja)")->required();
  app.add_option("--messages", o->messages, "JSON file with the messages array")->required();
  app.add_option("--tools", o->tools, "JSON file with the tools array");
  app.add_flag("--add-generation-prompt", o->add_generation_prompt, "end with the assistant's turn header");
  app.add_option("--template", o->template_file, "a .jinja file to use instead of the model's template");
  app.add_option("--chat-template-kwargs", o->kwargs, "JSON object of extra template variables");
  return [o]() {
    std::optional<std::filesystem::path> file;
    if (!o->template_file.empty()) file = o->template_file;
    auto tmpl = text::ChatTemplate::load(o->model, file);
    if (!tmpl) return fail("chat-template", tmpl.error().message());
    text::ChatRequest req;
    auto messages = read_json_file(o->messages);
    if (!messages) return fail("chat-template", messages.error().message());
    if (!messages->is_array()) return fail("chat-template", o->messages + " must hold a JSON array of messages", 2);
    req.messages = std::move(*messages);
    if (!o->tools.empty()) {
      auto tools = read_json_file(o->tools);
      if (!tools) return fail("chat-template", tools.error().message());
      req.tools = std::move(*tools);
    }
    if (!o->kwargs.empty()) {
      req.variables = nlohmann::ordered_json::parse(o->kwargs, nullptr, false);
      if (req.variables.is_discarded() || !req.variables.is_object()) {
        return fail("chat-template", "--chat-template-kwargs must be a JSON object", 2);
      }
    }
    req.add_generation_prompt = o->add_generation_prompt;
    auto out = tmpl->render(req);
    if (!out) return fail("chat-template", out.error().message());
    write_exact(out->text);
    return 0;
  };
}

}  // namespace lmserve::cli
