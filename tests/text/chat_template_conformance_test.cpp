// Conformance with transformers.apply_chat_template: tests/fixtures/text/chat_templates/*.json
// hold, for every template, the rendering jinja2 (configured as transformers does) gives for
// each conversation, or that it raised. Every rendering must be byte-identical, and every
// raise must be a raise here too.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fixture_paths.h"
#include "test_util.h"
#include "text/chat_template.h"

namespace lmserve::text {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;
auto read_json(const fs::path& p) { return lmserve::testing::read_json<ojson>(p); }


std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<std::string> fixture_names() { return lmserve::testing::stems_in(lmserve::testing::source_dir() / "tests/fixtures/text/chat_templates"); }

class ChatTemplateConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateConformance, RendersLikeTransformers) {
  ojson fixture = read_json(lmserve::testing::source_dir() / "tests/fixtures/text/chat_templates" / (GetParam() + ".json"));
  fs::path source = lmserve::testing::resolve_fixture_path(fixture.at("template_source"));
  if (!fs::exists(source)) GTEST_SKIP() << "template source not present: " << source;
  std::string text = source.filename() == "tokenizer_config.json"
                         ? read_json(source).at("chat_template").get<std::string>()
                         : read_text(source);
  // Special tokens come with each case's variables, exactly as the fixture passed them.
  auto tmpl = ChatTemplate::from_source(text, ojson::object());
  ASSERT_TRUE(tmpl) << tmpl.error().to_string();

  // strftime_now reads the clock the fixture was rendered at (local time), not today's.
  jinja::RenderOptions options;
  if (fixture.contains("now")) {
    std::tm tm{};
    std::istringstream at(fixture["now"].get<std::string>());
    at >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%S");
    ASSERT_FALSE(at.fail()) << "fixture 'now' is not YYYY-MM-DDTHH:MM:SS";
    tm.tm_isdst = -1;
    const auto when = std::chrono::system_clock::from_time_t(std::mktime(&tm));
    options.now = [when] { return when; };
  }

  int mismatches = 0;
  for (const auto& c : fixture.at("cases")) {
    ChatRequest req;
    req.messages = c.at("messages");
    req.tools = c.contains("tools") ? c["tools"] : ojson();
    req.add_generation_prompt = c.at("add_generation_prompt");
    req.variables = c.at("variables");
    auto out = tmpl->render(req, options);
    std::string name = c.at("name");
    if (c.contains("error")) {
      if (out) {
        ++mismatches;
        ADD_FAILURE() << GetParam() << " / " << name << ": expected an error (" << c["error"].get<std::string>()
                      << ") but rendered:\n" << out->text;
      }
      continue;
    }
    if (!out) {
      ++mismatches;
      ADD_FAILURE() << GetParam() << " / " << name << ": " << out.error().to_string();
      continue;
    }
    std::string expected = c.at("rendered");
    if (out->text != expected) {
      ++mismatches;
      ADD_FAILURE() << GetParam() << " / " << name << "\n--- expected ---\n" << ojson(expected).dump()
                    << "\n--- rendered ---\n" << ojson(out->text).dump();
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ChatTemplateConformance, ::testing::ValuesIn(fixture_names()),
                         lmserve::testing::ParamName());

}  // namespace
}  // namespace lmserve::text
