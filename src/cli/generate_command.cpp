// lmserve generate / lmserve perplexity: the engine from the command line.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "engine/evaluate.h"
#include "text/chat_template.h"

namespace lmserve::cli {
namespace {

int fail(const char* command, const Status& s) {
  std::fprintf(stderr, "lmserve %s: %s\n", command, s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

Command add_generate_command(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    std::string prompt;
    bool chat = false;
    std::int64_t max_tokens = 128;
    double temperature = 1.0, top_p = 1.0;
    std::int32_t top_k = -1;
    std::optional<std::uint64_t> seed;
    bool ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  o->model.add_to(app);
  app.add_option("--prompt", o->prompt, "the prompt text")->required();
  app.add_flag("--chat", o->chat, "send the prompt as a user message through the model's chat template");
  app.add_option("--max-tokens", o->max_tokens, "tokens to generate at most")->capture_default_str();
  app.add_option("--temperature", o->temperature, "0 for greedy")->capture_default_str();
  app.add_option("--top-p", o->top_p)->capture_default_str();
  app.add_option("--top-k", o->top_k)->capture_default_str();
  app.add_option("--seed", o->seed, "sampling seed");
  app.add_flag("--ignore-eos", o->ignore_eos, "keep going past end-of-sequence tokens");
  return [o]() {
    auto m = o->model.load(std::max<std::int64_t>(4096, o->max_tokens * 2));
    if (!m) return fail("generate", m.error());
    std::vector<std::int32_t> prompt;
    if (o->chat) {
      auto tmpl = text::ChatTemplate::load(o->model.model);
      if (!tmpl) return fail("generate", tmpl.error());
      text::ChatRequest req;
      req.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", o->prompt}}});
      auto rendered = tmpl->render(req);
      if (!rendered) return fail("generate", rendered.error());
      auto segments = rendered->segments();
      prompt = m->tokenizer->encode_segments(segments, false);
    } else {
      prompt = m->tokenizer->encode(o->prompt);
    }
    engine::EngineOptions eo;
    eo.scheduler.max_model_len = std::min<std::int64_t>(m->weights->config().max_position_embeddings,
                                                        static_cast<std::int64_t>(prompt.size()) + o->max_tokens + 1);
    eo.scheduler.lanes = {{"default", 0, 0, 16}};
    auto engine = engine::Engine::create(std::move(m->backend), m->tokenizer, eo);
    if (!engine) return fail("generate", engine.error());
    engine::SamplingParams p;
    p.temperature = o->temperature;
    p.top_p = o->top_p;
    p.top_k = o->top_k;
    p.seed = o->seed;
    p.max_tokens = o->max_tokens;
    p.ignore_eos = o->ignore_eos;
    auto sub = (*engine)->submit({.prompt = prompt, .params = p});
    if (!sub) return fail("generate", sub.error().status);
    engine::StreamEvent e;
    while (sub->stream->next(&e)) {
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      std::fflush(stdout);
      if (e.finish == engine::FinishReason::kError) return fail("generate", Status(StatusCode::kInternal, e.error));
    }
    return 0;
  };
}

Command add_perplexity_command(CLI::App& app) {
  struct Opts {
    ModelOptions model;
    std::string file;
    std::int64_t context = 512;
    bool documents = false;
  };
  auto o = std::make_shared<Opts>();
  o->model.add_to(app);
  app.add_option("--file", o->file, "UTF-8 text to score")->required();
  app.add_option("--context", o->context, "window length in tokens")->capture_default_str();
  app.add_flag("--documents", o->documents,
               "score each document (separated by a blank line) on its own, followed by the tokenizer's end-of-text token "
               "(<|endoftext|>, <|end_of_text|> or </s>, if it has one)");
  return [o]() {
    std::ifstream in(o->file, std::ios::binary);
    if (!in) return fail("perplexity", Status(StatusCode::kNotFound, "cannot read " + o->file));
    std::string text((std::istreambuf_iterator<char>(in)), {});
    o->model.max_num_batched_tokens = std::max(o->model.max_num_batched_tokens, o->context);
    auto m = o->model.load(o->context);
    if (!m) return fail("perplexity", m.error());
    if (o->context > m->weights->config().max_position_embeddings) {
      return fail("perplexity", Status(StatusCode::kInvalidArgument, "--context exceeds the model's max_position_embeddings"));
    }
    std::vector<std::vector<std::int32_t>> docs;
    if (o->documents) {
      std::optional<std::int32_t> eot;
      for (const char* t : {"<|endoftext|>", "<|end_of_text|>", "</s>"}) {
        if (!eot) eot = m->tokenizer->token_to_id(t);
      }
      for (std::size_t at = 0; at < text.size();) {
        std::size_t end = text.find("\n\n", at);
        if (end == std::string::npos) end = text.size();
        std::string_view doc(text.data() + at, end - at);
        at = end + 2;
        if (doc.find_first_not_of(" \t\r\n") == std::string_view::npos) continue;
        docs.push_back(m->tokenizer->encode(doc, {.add_special_tokens = false}));
        if (eot) docs.back().push_back(*eot);
      }
    } else {
      docs.push_back(m->tokenizer->encode(text, {.add_special_tokens = false}));
    }
    auto r = engine::perplexity(*m->backend, std::span<const std::vector<std::int32_t>>(docs), o->context);
    if (!r) return fail("perplexity", r.error());
    std::printf("tokens %lld, windows %lld, kv %s, mean nll %.6f, perplexity %.4f\n", static_cast<long long>(r->predicted),
                static_cast<long long>(r->windows), std::string(backend::kv_dtype_name(m->backend->kv_config().dtype)).c_str(),
                r->mean_nll, r->perplexity);
    return 0;
  };
}

}  // namespace lmserve::cli
