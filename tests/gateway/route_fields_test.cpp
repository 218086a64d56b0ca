// The routing pass over a request body (gateway/route_fields.h): the fields it reads and refuses,
// and the document it builds on the way, which must be what nlohmann::json::parse makes of the
// same text (the guard and the token limits read it); and scan_route_fields, which must read
// every body as RouteFields does.
#include "gateway/route_fields.h"

#include <gtest/gtest.h>

namespace lmserve::gateway {
namespace {

struct Pass {
  bool parsed = false;
  RouteFields fields;
  nlohmann::json document;
};

// Both ways: with the document built, and without.
void route(const std::string& body, Pass& with, Pass& without) {
  with.fields = RouteFields(&with.document);
  without.fields = RouteFields();
  with.parsed = nlohmann::json::sax_parse(body, &with.fields);
  without.parsed = nlohmann::json::sax_parse(body, &without.fields);
}

TEST(RouteFields, TheDocumentIsTheParsersAndTheFieldsTheSameEitherWay) {
  const std::vector<std::string> bodies = {
      R"({"model":"m","prompt":"hello","max_tokens":16,"stream":false})",
      R"({"model":"qwen","user":"u-1","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"},"raw"]}]})",
      R"({"a":1,"a":{"b":[1,2]},"model":"m","prompt":["x","y",[1,2,3]]})",  // a key given twice keeps its last value
      R"({"n":-12,"u":18446744073709551615,"f":1.5e-7,"g":-0.0,"t":true,"z":null,"e":{},"l":[],"ll":[[],[{}]]})",
      R"({"s":"esc \" \\ \/ \n \u00e9 \ud83d\ude00 中文","model":"m"})",
      R"([{"model":"m"},1,"x"])",
      R"({"user":"first","user":"second","model":"m"})",
      R"("just a string")",
      R"({})",
  };
  for (const auto& body : bodies) {
    Pass with, without;
    route(body, with, without);
    ASSERT_TRUE(with.parsed) << body;
    ASSERT_TRUE(without.parsed) << body;
    EXPECT_EQ(with.document, nlohmann::json::parse(body)) << body;
    EXPECT_EQ(with.fields.object, without.fields.object) << body;
    EXPECT_EQ(with.fields.model, without.fields.model) << body;
    EXPECT_EQ(with.fields.user, without.fields.user) << body;
    EXPECT_EQ(with.fields.stream, without.fields.stream) << body;
  }
  Pass with, without;
  route(R"({"user":"first","user":"second","model":"m","x":{"model":"inner"}})", with, without);
  EXPECT_EQ(with.fields.model, "m");
  EXPECT_EQ(with.fields.user, "second");
  EXPECT_TRUE(with.fields.object);
  route(R"([{"model":"m"}])", with, without);
  EXPECT_FALSE(without.fields.object);
  EXPECT_FALSE(without.fields.model);
}

TEST(RouteFields, RefusesAModelThatIsNotOneStringAndDeepNesting) {
  for (const char* body : {R"({"model":"a","model":"b"})", R"({"model":1})", R"({"model":["m"]})", R"({"model":{"id":"m"}})", R"({"model":null})"}) {
    Pass with, without;
    route(body, with, without);
    EXPECT_FALSE(with.parsed) << body;
    EXPECT_FALSE(without.parsed) << body;
    ASSERT_NE(with.fields.refusal, nullptr) << body;
    EXPECT_STREQ(with.fields.refusal, without.fields.refusal) << body;
  }
  const std::string deep = std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  Pass with, without;
  route(deep, with, without);
  EXPECT_FALSE(with.parsed);
  ASSERT_NE(with.fields.refusal, nullptr);
  EXPECT_STREQ(with.fields.refusal, "the request body is nested too deeply");
  route(R"({"model":"m",)", with, without);  // not JSON
  EXPECT_FALSE(with.parsed);
  EXPECT_EQ(with.fields.refusal, nullptr);
}

// scan_route_fields and RouteFields over nlohmann's SAX parser agree on `body`: whether it is
// JSON, the refusal, and the fields of a body that is.
void expect_same_reading(const std::string& body) {
  RouteFields sax;
  const bool sax_parsed = nlohmann::json::sax_parse(body, &sax);
  RouteFieldValues scan;
  const bool scan_parsed = scan_route_fields(body, scan);
  const std::string shown = testing::PrintToString(body);
  ASSERT_EQ(scan_parsed, sax_parsed) << shown;
  ASSERT_EQ(scan.refusal == nullptr, sax.refusal == nullptr) << shown;
  if (sax.refusal) {
    EXPECT_STREQ(scan.refusal, sax.refusal) << shown;
  }
  // The same with the policies' fields, which must be policy_fields()'s of the document.
  RouteFieldValues scan_p;
  PolicyFieldValues policy;
  ASSERT_EQ(scan_route_fields(body, scan_p, &policy), sax_parsed) << shown;
  ASSERT_EQ(scan_p.refusal == nullptr, sax.refusal == nullptr) << shown;
  if (!sax_parsed) return;
  EXPECT_EQ(scan.object, sax.object) << shown;
  EXPECT_EQ(scan.model, sax.model) << shown;
  EXPECT_EQ(scan.user, sax.user) << shown;
  EXPECT_EQ(scan_p.model, sax.model) << shown;
  EXPECT_EQ(scan_p.user, sax.user) << shown;
  EXPECT_EQ(scan.stream, sax.stream) << shown;
  EXPECT_EQ(scan_p.stream, sax.stream) << shown;
  if (sax.refusal) return;
  const auto want = policy_fields(nlohmann::json::parse(body));
  EXPECT_EQ(policy.prompt_texts, want.prompt_texts) << shown;
  EXPECT_EQ(policy.message_texts, want.message_texts) << shown;
  EXPECT_EQ(policy.prompt_bytes, want.prompt_bytes) << shown;
  EXPECT_EQ(policy.message_bytes, want.message_bytes) << shown;
  EXPECT_EQ(policy.max_tokens, want.max_tokens) << shown;
  EXPECT_EQ(policy.max_completion_tokens, want.max_completion_tokens) << shown;
}

TEST(PolicyFields, ReadWhatTheGuardAndTheLimitsNeed) {
  const auto f = policy_fields(nlohmann::json::parse(R"({"model":"m","prompt":["a",[1,2],7,"bc"],"max_tokens":5,"max_completion_tokens":9,
      "messages":[{"role":"system","content":"sys"},{"role":"user","content":[{"type":"text","text":"hi"},"raw",{"text":3}]},
                  {"content":"no role"},{"role":7,"content":"odd role"},"not a message",{"role":"tool"}]})"));
  EXPECT_EQ(f.prompt_texts, (std::vector<std::string>{"a", "bc"}));
  EXPECT_EQ(f.prompt_bytes, 1u + 3 + 2);  // the strings and one token id (the list is not one)
  EXPECT_EQ(f.message_texts, (std::vector<std::string>{"hi", "raw", "no role", "odd role"}));
  EXPECT_EQ(f.message_bytes, 5 * 12u + 3 + 2 + 7 + 8);  // the system message counts, unguarded
  EXPECT_EQ(f.answer_limit(), 5);
  EXPECT_EQ(f.estimated_prompt_tokens(), static_cast<std::int64_t>((6 + 80 + 2) / 3));
  EXPECT_EQ(policy_fields(nlohmann::json::parse(R"({"max_tokens":-1,"max_completion_tokens":9})")).answer_limit(), 9);
  EXPECT_EQ(policy_fields(nlohmann::json::parse(R"({"max_tokens":1.0})")).answer_limit(), std::nullopt);
  EXPECT_EQ(policy_fields(nlohmann::json::parse("[]")).estimated_prompt_tokens(), 1);
}

TEST(ScanRouteFields, ReadsThePoliciesFieldsAsTheDocumentHasThem) {
  const std::vector<std::string> bodies = {
      R"({"model":"m","prompt":"p","max_tokens":16})",
      R"({"prompt":"a","prompt":["b","c",3,-4,1.5,18446744073709551615,18446744073709551616,-9223372036854775808,-9223372036854775809,[5],{"x":"y"},"d"]})",
      R"({"prompt":["a"],"prompt":5})", R"({"prompt":{"text":"x"}})", R"({"prompt":"caf\u00e9 \ud83d\ude00 \"q\""})",
      R"({"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]})",
      R"({"messages":[{"role":"user","content":"a","content":"b"},{"content":"c","role":"system"},{"role":"system","role":"user","content":"d"}]})",
      R"({"messages":[{"role":"user","content":[{"text":"a","text":"b"},{"text":"c","text":1},"e",5,[ "f" ],{"type":"image_url"}]}]})",
      R"({"messages":[{"role":"assistant","content":[{"text":"x"}]},{"role":"function","content":"fn"},{"role":"tool","content":[{"text":"t"}]}]})",
      R"({"messages":[{"role":["user"],"content":"r"},{"role":null,"content":"n"},{"role":{"a":1},"content":"o"},{"role":1.5,"content":"f"}]})",
      R"({"messages":[{"r\u006fle":"system","c\u006fntent":"escaped keys"},{"role":"us\u0065r","content":[{"t\u0065xt":"e"}]}]})",
      R"({"messages":"not a list","prompt":null})", R"({"messages":[1,"x",null,[{"role":"user","content":"nested"}],{}]})",
      R"({"messages":[{"role":"user","content":{"text":"object"}}]})", R"({"messages":[{"role":"user","content":null}]})",
      R"({"max_tokens":0})", R"({"max_tokens":-0})", R"({"max_tokens":-1})", R"({"max_tokens":1e2})", R"({"max_tokens":2.0})",
      R"({"max_tokens":9223372036854775807})", R"({"max_tokens":9223372036854775808})", R"({"max_tokens":"8"})",
      R"({"max_tokens":8,"max_tokens":null})", R"({"max_completion_tokens":4,"max_tokens":[1]})", R"({"max_completion_tokens":4,"max_completion_tokens":3})",
      R"({"x":{"prompt":"inner","messages":[{"role":"user","content":"inner"}],"max_tokens":3}})", R"([{"prompt":"in a list"}])",
      R"({"model":"m","messages":[{"role":"user","content":"a"}],"model":"n"})", R"({"model":1,"prompt":"p"})",
  };
  for (const auto& body : bodies) expect_same_reading(body);
}

// Whether the client asks for a stream decides whether the gateway audits a request's admission
// before it reaches a replica (gateway.cpp): the last top-level "stream", true only as the literal.
TEST(ScanRouteFields, ReadsWhetherAStreamIsAskedFor) {
  const std::vector<std::pair<std::string, bool>> cases = {
      {R"({"model":"m","stream":true})", true},       {R"({"stream":false})", false},
      {R"({"stream":true,"stream":false})", false},   {R"({"stream":false,"stream":true})", true},
      {R"({"stream":"true"})", false},                {R"({"stream":1})", false},
      {R"({"stream":true,"stream":null})", false},    {R"({"str\u0065am":true})", true},
      {R"({"x":{"stream":true}})", false},            {R"({"stream":[true]})", false},
      {R"({"stream":{"stream":true}})", false},       {R"({"model":"m"})", false},
  };
  for (const auto& [body, want] : cases) {
    RouteFieldValues out;
    ASSERT_TRUE(scan_route_fields(body, out)) << body;
    EXPECT_EQ(out.stream, want) << body;
    expect_same_reading(body);
  }
}

TEST(ScanRouteFields, ReadsTheFieldsOfAnOrdinaryRequest) {
  RouteFieldValues out;
  ASSERT_TRUE(scan_route_fields(R"({"model":"q\u00e9n","messages":[{"role":"user","content":"hi","model":"x"}],"user":"u\"1","temperature":0.7})", out));
  EXPECT_TRUE(out.object);
  EXPECT_EQ(out.model, "q\xC3\xA9n");
  EXPECT_EQ(out.user, "u\"1");
  EXPECT_EQ(out.refusal, nullptr);
}

TEST(ScanRouteFields, ReadsEveryBodyAsNlohmannsParserDoes) {
  const std::string deep_ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  const std::string deep = std::string(kMaxJsonDepth + 1, '[') + std::string(kMaxJsonDepth + 1, ']');
  const std::vector<std::string> bodies = {
      // the routing fields and their refusals
      R"({"model":"m"})", R"({"model":"a","model":"b"})", R"({"model":"a","model")", R"({"model":1})", R"({"model":1 2})",
      R"({"model":tru})", R"({"model":true1})", R"({"model":null})", R"({"model":false})", R"({"model":-})", R"({"model":1.5e})",
      R"({"model":[})", R"({"model":{)", R"({"model":1e999})", R"({"mod\u0065l":"x","model":"y"})", R"({"user":"a","user":1})",
      R"({"user":["x"],"model":"m"})", R"({"user":"a","user":"b"})", R"({"x":{"model":1,"user":"in"},"model":"m"})",
      R"([{"model":1}])", R"("model")", R"({"model":"m"} x)", R"({"model":"m",})", R"({,})", R"({"a" 1})", R"({"a":})", "{\"model\":\"m\"",
      "", " ", "{}", "[]", "[1,]", "[,1]", "[1 2]", "null", "nul", "truex", "{\"a\":\fnull}", "{\"a\":\vnull}", " \t\r\n{ } \t\r\n",
      deep_ok, deep, "{\"model\":" + deep, "{\"a\":" + deep_ok + "}",
      // what nlohmann allows besides RFC 8259: a byte order mark first, a NUL byte for the end
      "\xEF\xBB\xBF{}", "\xEF\xBB{}", "\xEF", " \xEF\xBB\xBF{}", std::string("{}\0junk", 7), std::string("{\"model\":\"m\"} \0 [", 17),
      std::string("{\0}", 3), std::string("\0", 1), std::string("{\"a\":\"\0\"}", 9),
      // numbers
      "1", "-", "-0", "01", "1.", "1.e5", ".5", "+1", "1e", "1e+", "1E-5", "-1.25E+3", "1e309", "-1e309", "1e308",
      "1.7976931348623157e308", "1.7976931348623159e308", "1.8e308", "17976931348623157e292", "1e-400", "0.0e999999",
      "0." + std::string(400, '0') + "1e310", "1" + std::string(400, '0'), "1" + std::string(308, '0'), "1" + std::string(307, '0'),
      "18446744073709551616", "-9223372036854775809", "1e99999999999999999999999", "1" + std::string(30, '0') + "e-99999999999999999999999",
      // strings
      R"("\u00e9")", R"("\uD83D\uDE00")", R"("\uD83D")", R"("\uD83Dx")", R"("\uDE00")", R"("\uD83D\u0041")", R"("\u12")", R"("\u12G4")",
      R"("\x")", R"("\/\b\f\n\r\t")", "\"\x01\"", "\"\x7F\"", "\"\xC0\x80\"", "\"\xC2\"", "\"\xC2\xA9\"", "\"\xE0\x80\x80\"",
      "\"\xE0\xA0\x80\"", "\"\xED\xA0\x80\"", "\"\xED\x9F\xBF\"", "\"\xF0\x8F\xBF\xBF\"", "\"\xF0\x90\x80\x80\"", "\"\xF4\x8F\xBF\xBF\"",
      "\"\xF4\x90\x80\x80\"", "\"\xF5\x80\x80\x80\"", "\"\x80\"", "\"abc", R"("\)",
  };
  for (const auto& body : bodies) expect_same_reading(body);
}

// Every prefix of a request, and every byte of it replaced by each of a set of bytes that JSON
// gives meaning to.
TEST(ScanRouteFields, ReadsEveryCutAndEveryChangedByteAsNlohmannsParserDoes) {
  const std::string routing =
      "{\"model\":\"m\\u00e9\",\"user\":\"u\",\"messages\":[{\"role\":\"user\",\"content\":\"h\xC3\xA9 \\\"x\\\"\"}],"
      "\"n\":-1.5e-3,\"s\":true,\"t\":null,\"o\":{\"model\":[0]}}";
  const std::string policies =
      "{\"prompt\":[\"p\",12],\"messages\":[{\"role\":\"user\",\"content\":[{\"text\":\"t\"},\"s\"]},{\"role\":\"tool\",\"content\":\"c\"}],"
      "\"max_tokens\":7,\"max_completion_tokens\":9}";
  const std::string bytes = std::string("{}[]:,\"\\ -+.0123456789eEuntfalsx\x01\x7F\x80\xC3\xED\xF4\xEF") + std::string(1, '\0');
  for (const auto& body : {routing, policies}) {
    for (std::size_t n = 0; n <= body.size(); ++n) expect_same_reading(body.substr(0, n));
    for (std::size_t i = 0; i < body.size(); ++i) {
      for (char b : bytes) {
        std::string changed = body;
        changed[i] = b;
        expect_same_reading(changed);
      }
    }
  }
}

}  // namespace
}  // namespace lmserve::gateway
