// The routing pass over a request body (gateway/route_fields.h): the fields it reads and refuses,
// and the document it builds on the way, which must be what nlohmann::json::parse makes of the
// same text (the guard and the token limits read it).
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

}  // namespace
}  // namespace lmserve::gateway
