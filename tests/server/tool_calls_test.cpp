// server/tool_calls: each parser's format, whole and streamed, cut at every byte: the same
// content and calls, a call's name before its arguments, and no marker text in content.
#include "server/tool_calls.h"

#include "server/openai.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

namespace lmserve::server {
namespace {

// The stream's deltas put together, checking the stream's order on the way.
struct Collected {
  std::string content;
  std::vector<ToolCall> calls;
};
Collected stream_in_pieces(ToolParser p, std::string_view text, std::size_t piece) {
  ToolCallStream s(p);
  Collected out;
  auto take = [&](const ToolStreamDelta& d) {
    out.content += d.content;
    for (const auto& c : d.calls) {
      if (c.index == static_cast<int>(out.calls.size())) {
        EXPECT_FALSE(c.id.empty());  // a call's first delta: its id and name
        EXPECT_FALSE(c.name.empty());
        out.calls.push_back({.id = c.id, .name = c.name});
      } else {
        EXPECT_EQ(c.index, static_cast<int>(out.calls.size()) - 1);  // then the latest call's arguments
        EXPECT_TRUE(c.id.empty() && c.name.empty());
      }
      out.calls.back().arguments += c.arguments;
    }
  };
  for (std::size_t i = 0; i < text.size(); i += piece) take(s.feed(text.substr(i, piece)));
  take(s.finish());
  return out;
}

void expect_same_every_cut(ToolParser p, const std::string& text, const ParsedToolOutput& want) {
  for (std::size_t piece : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7}, text.size()}) {
    const auto got = stream_in_pieces(p, text, piece);
    // (A whole output's content that is only space beside calls is dropped; a stream has sent it.)
    if (want.content.empty() && !want.calls.empty()) {
      EXPECT_EQ(got.content.find_first_not_of(" \n"), std::string::npos) << "piece " << piece;
    } else {
      EXPECT_EQ(got.content, want.content) << "piece " << piece;
    }
    ASSERT_EQ(got.calls.size(), want.calls.size()) << "piece " << piece << ": " << text;
    for (std::size_t i = 0; i < want.calls.size(); ++i) {
      EXPECT_EQ(got.calls[i].name, want.calls[i].name);
      EXPECT_EQ(got.calls[i].arguments, want.calls[i].arguments) << "piece " << piece;
    }
  }
}

TEST(ToolCalls, ParsersByVllmsNamesAndIds) {
  EXPECT_EQ(tool_parser_named("hermes"), ToolParser::kHermes);
  EXPECT_EQ(tool_parser_named("llama3_json"), ToolParser::kLlama3Json);
  EXPECT_EQ(tool_parser_named("mistral"), ToolParser::kMistral);
  EXPECT_FALSE(tool_parser_named("pythonic"));
  EXPECT_TRUE(std::regex_match(make_tool_call_id(ToolParser::kHermes), std::regex("call_[A-Za-z0-9]{24}")));
  EXPECT_TRUE(std::regex_match(make_tool_call_id(ToolParser::kMistral), std::regex("[A-Za-z0-9]{9}")));
  EXPECT_NE(make_tool_call_id(ToolParser::kHermes), make_tool_call_id(ToolParser::kHermes));
}

TEST(ToolCalls, HermesCallsAmongText) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2], \"note\": \"a } in \\\"text\\\"\"}}\n"
      "</tool_call>\n<tool_call>\n{\"arguments\": {\"q\": \"<tool_call>\"}, \"name\": \"search\"}\n</tool_call>";
  const auto r = parse_tool_calls(ToolParser::kHermes, text);
  EXPECT_EQ(r.content, "Let me check.\n\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse(r.calls[0].arguments), nlohmann::json::parse(R"({"city":"Paris","days":[1,2],"note":"a } in \"text\""})"));
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Paris", "days": [1, 2], "note": "a } in \"text\""})");  // as the model wrote it
  EXPECT_EQ(r.calls[1].name, "search");  // arguments before the name
  EXPECT_EQ(r.calls[1].arguments, R"({"q": "<tool_call>"})");
  EXPECT_TRUE(r.calls[0].id.starts_with("call_"));
  expect_same_every_cut(ToolParser::kHermes, text, r);
  // The marker never reaches content, whatever the cut.
  for (std::size_t piece : {1, 2, 5}) EXPECT_EQ(stream_in_pieces(ToolParser::kHermes, text, piece).content.find('<'), std::string::npos);
}

TEST(ToolCalls, HermesTextWithoutCallsAndWhatIsNotOne) {
  for (const std::string text : {"Plain answer with < and <tool and a <tool_cal", "x <tool_call> not json </tool_call> y",
                                 "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
                                 "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}"}) {
    const auto r = parse_tool_calls(ToolParser::kHermes, text);
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
  }
  // Streamed, text that is not a call comes out as content in full.
  EXPECT_EQ(stream_in_pieces(ToolParser::kHermes, "Plain answer with < and <tool and a <tool_cal", 1).content, "Plain answer with < and <tool and a <tool_cal");
  EXPECT_EQ(stream_in_pieces(ToolParser::kHermes, "x <tool_call> not json </tool_call> y", 1).content, "x <tool_call> not json </tool_call> y");
}

TEST(ToolCalls, Llama3JsonCalls) {
  const std::string one = R"({"name": "get_weather", "parameters": {"city": "Oslo"}})";
  auto r = parse_tool_calls(ToolParser::kLlama3Json, one);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, R"({"city": "Oslo"})");
  EXPECT_EQ(r.content, "");
  expect_same_every_cut(ToolParser::kLlama3Json, one, r);
  const std::string two = "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": 1}}";
  r = parse_tool_calls(ToolParser::kLlama3Json, two);
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[1].arguments, R"({"x": 1})");
  expect_same_every_cut(ToolParser::kLlama3Json, two, r);
  // Arguments given as a string of JSON, and none at all.
  r = parse_tool_calls(ToolParser::kLlama3Json, R"({"name": "f", "parameters": "{\"k\": \"v\"}"})");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, R"({"k": "v"})");
  r = parse_tool_calls(ToolParser::kLlama3Json, R"({"name": "now"})");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  // Text is text: an answer that does not begin with a call, and JSON that is not one.
  for (const std::string text : {"The weather is {\"name\": \"x\"}", R"({"answer": 42})", "  <|python", "{\"name\": \"f\", \"parameters\": {"}) {
    r = parse_tool_calls(ToolParser::kLlama3Json, text);
    EXPECT_TRUE(r.calls.empty()) << text;
    EXPECT_EQ(r.content, text);
  }
  EXPECT_EQ(stream_in_pieces(ToolParser::kLlama3Json, R"({"answer": 42})", 1).content, R"({"answer": 42})");
}

TEST(ToolCalls, MistralCalls) {
  const std::string text = "Checking both.[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": \"]\"}}, {\"name\": \"b\", \"arguments\": {}}]";
  const auto r = parse_tool_calls(ToolParser::kMistral, text);
  EXPECT_EQ(r.content, "Checking both.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].arguments, R"({"x": "]"})");
  EXPECT_EQ(r.calls[1].name, "b");
  EXPECT_EQ(r.calls[0].id.size(), 9u);
  expect_same_every_cut(ToolParser::kMistral, text, r);
  for (std::size_t piece : {1, 3}) EXPECT_EQ(stream_in_pieces(ToolParser::kMistral, text, piece).content, "Checking both.");
  const std::string broken = "[TOOL_CALLS] no array";
  EXPECT_EQ(parse_tool_calls(ToolParser::kMistral, broken).content, broken);
}

// The stream gives a call's name as soon as it is whole, and its arguments as they come.
TEST(ToolCalls, TheNameComesFirstAndTheArgumentsInPieces) {
  ToolCallStream s(ToolParser::kHermes);
  EXPECT_TRUE(s.feed("<tool_call>{\"name\": \"get_").empty());
  auto d = s.feed("weather\", \"arguments\": {\"ci");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "get_weather");
  EXPECT_EQ(d.calls[0].arguments, "{\"ci");
  d = s.feed("ty\": \"Rome\"}}</tool_call>");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_TRUE(d.calls[0].name.empty());
  EXPECT_EQ(d.calls[0].arguments, "ty\": \"Rome\"}");
  EXPECT_TRUE(s.finish().empty());
  EXPECT_TRUE(s.well_formed());
  EXPECT_EQ(s.calls(), 1);
}

// The answer's shapes, as OpenAI's: message.tool_calls with content null and finish_reason
// "tool_calls"; in a stream, a call's id, type and name first, then its arguments by index.
TEST(ToolCalls, TheAnswersShapesAreOpenAis) {
  ResponseWriter w(true, "chatcmpl-x", 1, "m", nullptr);
  ChoiceResult c;
  c.finish = engine::FinishReason::kStop;
  c.tool_calls = {{.id = "call_a", .name = "get_weather", .arguments = R"({"city": "Paris"})"}};
  auto j = nlohmann::json::parse(w.full({c}, {}, false));
  const auto& choice = j["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["tool_calls"], nlohmann::json::parse(
                                                  R"([{"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}])"));
  c.text = "Checking.";
  c.finish = engine::FinishReason::kLength;
  j = nlohmann::json::parse(w.full({c}, {}, false));
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Checking.");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");

  const auto event = [](const std::string& sse) { return nlohmann::json::parse(sse.substr(6, sse.size() - 8)); };
  auto first = event(w.tool_calls_chunk(0, {{.index = 0, .id = "call_a", .name = "get_weather", .arguments = "{\"ci"}}));
  EXPECT_EQ(first["choices"][0]["delta"], nlohmann::json::parse(
                                              R"({"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"ci"}}]})"));
  auto next = event(w.tool_calls_chunk(0, {{.index = 0, .arguments = "ty\": 1}"}}));
  EXPECT_EQ(next["choices"][0]["delta"], nlohmann::json::parse(R"({"tool_calls":[{"index":0,"function":{"arguments":"ty\": 1}"}}]})"));
  auto last = event(w.delta_chunk(0, "", {}, engine::FinishReason::kStop, false, true));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_EQ(event(w.delta_chunk(0, "", {}, engine::FinishReason::kStop, false, false))["choices"][0]["finish_reason"], "stop");
}

}  // namespace
}  // namespace lmserve::server
