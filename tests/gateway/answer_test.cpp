// The usage and text the gateway reads from answers as they pass: JSON answers, and SSE streams
// cut anywhere by the reads.
#include "gateway/answer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string_view>
#include <utility>

namespace lmserve::gateway {
namespace {

const std::string kStream =
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \\u4f60\"}}]}\r\n\r\n"
    ": a comment line\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\"!\"}]}\n\n"
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,\"total_tokens\":15}}\n\n"
    "data: [DONE]\n\n";

TEST(AnswerReader, AStreamCutAtEveryByteGivesTheSameUsageAndText) {
  for (std::size_t cut = 0; cut <= kStream.size(); ++cut) {
    AnswerReader r(true);
    r.feed_stream(std::string_view(kStream).substr(0, cut));
    r.feed_stream(std::string_view(kStream).substr(cut));
    ASSERT_TRUE(r.usage().known()) << cut;
    EXPECT_EQ(r.usage().prompt_tokens, 12);
    EXPECT_EQ(r.usage().completion_tokens, 3);
    EXPECT_EQ(r.text(), "Hello \xe4\xbd\xa0!") << cut;
  }
  AnswerReader bytewise(false);  // one byte at a time; the text not asked for
  for (char ch : kStream) bytewise.feed_stream(std::string_view(&ch, 1));
  EXPECT_EQ(bytewise.usage().completion_tokens, 3);
  EXPECT_EQ(bytewise.text(), "");
}

TEST(AnswerReader, AJsonAnswerAndWhatIsNotOne) {
  AnswerReader chat(true);
  chat.read_whole(R"({"choices":[{"index":0,"message":{"role":"assistant","content":"Yes."}}],"usage":{"prompt_tokens":5,"completion_tokens":2}})");
  EXPECT_EQ(chat.text(), "Yes.");
  EXPECT_EQ(chat.usage().prompt_tokens, 5);
  AnswerReader broken(true);
  broken.read_whole("{\"choices\": [");
  broken.feed_stream("data: {not json}\n\ndata: {\"usage\":{\"prompt_tokens\":-1,\"completion_tokens\":\"2\"}}\n\n");
  EXPECT_FALSE(broken.usage().known());  // nonsense counts are not taken
  EXPECT_EQ(broken.text(), "");
}

// Without the text, a JSON answer's usage is read without a document; it must read what the
// document gives, whatever the answer holds.
TEST(AnswerReader, TheUsageReadWithoutADocumentIsTheDocumentsUsage) {
  const char* bodies[] = {
      R"({"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}})",
      R"({"usage":{"completion_tokens":3,"prompt_tokens":7}})",
      R"({"usage":{"prompt_tokens":7}})",
      R"({"usage":{"prompt_tokens":-2,"completion_tokens":18446744073709551615}})",
      R"({"usage":{"prompt_tokens":7.0,"completion_tokens":"3"}})",
      R"({"usage":{"prompt_tokens":{"n":7},"completion_tokens":[3]}})",
      R"({"usage":{"prompt_tokens":1,"completion_tokens":2},"usage":{"prompt_tokens":5}})",
      R"({"usage":{"prompt_tokens":1,"completion_tokens":2},"usage":null})",
      R"({"usage":{"prompt_tokens":1,"completion_tokens":2},"usage":[{"prompt_tokens":9}]})",
      R"({"usage":{"prompt_tokens":1,"prompt_tokens":4,"completion_tokens":2}})",
      R"({"x":{"usage":{"prompt_tokens":1,"completion_tokens":2}}})",
      R"({"choices":[{"usage":{"prompt_tokens":1,"completion_tokens":2}}]})",
      R"([{"usage":{"prompt_tokens":1,"completion_tokens":2}}])",
      R"({"usage":{"prompt_tokens":1,"completion_tokens":2},"choices":[)",
      R"({"usage":{"prompt_tokens":1,"extra":{"prompt_tokens":9},"completion_tokens":2}})",
      R"({"usage":{"prompt_tokens":0,"completion_tokens":0}})",
      "",
      "null",
      // The scanner's lexical edges: what the document's parser accepts and refuses.
      R"({"us\u0061ge":{"prompt_\u0074okens":4,"completion_tokens":5}})",
      R"({"usage":{"prompt_tokens":-0,"completion_tokens":1e1}})",
      R"({"usage":{"prompt_tokens":9223372036854775807,"completion_tokens":9223372036854775808}})",
      R"({"usage":{"prompt_tokens":-9223372036854775809,"completion_tokens":2E+0}})",
      R"({"usage":{"prompt_tokens":01,"completion_tokens":2}})",
      R"({"usage":{"prompt_tokens":1.,"completion_tokens":2}})",
      R"({"usage":{"prompt_tokens":+1,"completion_tokens":2}})",
      " \t\r\n{ \"usage\" : { \"prompt_tokens\" : 3 , \"completion_tokens\" : 4 } } \n",
      "\xEF\xBB\xBF{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}",
      "\xEF\xBB{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}",
      R"({"usage":{"prompt_tokens":3,"completion_tokens":4}} x)",
      R"({"usage":{"prompt_tokens":3,"completion_tokens":4}}{})",
      R"({"usage":{"prompt_tokens":3,"completion_tokens":4},})",
      R"({"usage":{"prompt_tokens":3,"completion_tokens":4}],)",
      R"({"t":"\ud83d\ude00 ok \"\\\/\b\f\n\r\t","usage":{"prompt_tokens":3,"completion_tokens":4}})",
      R"({"t":"\ud83d","usage":{"prompt_tokens":3,"completion_tokens":4}})",
      R"({"t":"\ude00","usage":{"prompt_tokens":3,"completion_tokens":4}})",
      R"({"t":"\x","usage":{"prompt_tokens":3,"completion_tokens":4}})",
      R"({"t":"\u12G4","usage":{"prompt_tokens":3,"completion_tokens":4}})",
      "{\"t\":\"\xE4\xBD\xA0\xF0\x9F\x98\x80\",\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}",
      "{\"t\":\"\xC0\xAF\",\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}",
      "{\"t\":\"\xED\xA0\x80\",\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}",
      "{\"t\":\"\xE4\xBD\",\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}",
      "{\"t\":\"a\tb\",\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}",
      R"({"t":[true,false,null,[],{},[[{"a":[1,2.5,-3]}]]],"usage":{"prompt_tokens":3,"completion_tokens":4}})",
      R"({"t":tru,"usage":{"prompt_tokens":3,"completion_tokens":4}})",
      R"({"usage":{"prompt_tokens":3,"completion_tokens":4},"usage":{}})",
      R"({"usage":{"prompt_tokens":true,"completion_tokens":null}})",
      R"({"usage":{}})",
      "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]",
  };
  for (const char* body : bodies) {
    AnswerReader lean(false), full(true);
    lean.read_whole(body);
    full.read_whole(body);
    EXPECT_EQ(lean.usage().prompt_tokens, full.usage().prompt_tokens) << body;
    EXPECT_EQ(lean.usage().completion_tokens, full.usage().completion_tokens) << body;
  }
  // A NUL byte ends the document's input for its parser: after the value it is the end, before
  // or inside it the value is cut short (found by answer_fuzz).
  using namespace std::string_literals;
  for (const std::string& body : {"{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\0\0\0x"s, "{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}} \0"s,
                                 "\0{\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}"s, "{\"usage\":\0{\"prompt_tokens\":5,\"completion_tokens\":7}}"s}) {
    AnswerReader lean(false), full(true);
    lean.read_whole(body);
    full.read_whole(body);
    EXPECT_EQ(lean.usage().prompt_tokens, full.usage().prompt_tokens) << body;
    EXPECT_EQ(lean.usage().completion_tokens, full.usage().completion_tokens) << body;
  }
  AnswerReader r(false);
  r.read_whole(bodies[0]);
  EXPECT_EQ(r.usage().prompt_tokens, 7);
  EXPECT_EQ(r.usage().completion_tokens, 3);
  // Both ways of the edges, spelled out: an escaped key is its text; a broken BOM, a lone
  // surrogate, an overlong UTF-8 form or trailing bytes make the answer no JSON (no usage).
  auto lean = [](std::string_view body) {
    AnswerReader a(false);
    a.read_whole(body);
    return std::pair{a.usage().prompt_tokens, a.usage().completion_tokens};
  };
  using P = std::pair<std::int64_t, std::int64_t>;
  EXPECT_EQ(lean(R"({"us\u0061ge":{"prompt_\u0074okens":4,"completion_tokens":5}})"), (P{4, 5}));
  EXPECT_EQ(lean(R"({"usage":{"prompt_tokens":-0,"completion_tokens":1e1}})"), (P{0, -1}));
  EXPECT_EQ(lean("\xEF\xBB\xBF {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n"), (P{3, 4}));
  EXPECT_EQ(lean(R"({"t":"\ud83d\ude00","usage":{"prompt_tokens":3,"completion_tokens":4}})"), (P{3, 4}));
  EXPECT_EQ(lean("\xEF\xBB{\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}"), (P{-1, -1}));
  EXPECT_EQ(lean(R"({"t":"\ude00","usage":{"prompt_tokens":3,"completion_tokens":4}})"), (P{-1, -1}));
  EXPECT_EQ(lean("{\"t\":\"\xC0\xAF\",\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}"), (P{-1, -1}));
  EXPECT_EQ(lean(R"({"usage":{"prompt_tokens":3,"completion_tokens":4}} x)"), (P{-1, -1}));
  EXPECT_EQ(lean(R"({"usage":{"prompt_tokens":3,"completion_tokens":1e400}})"), (P{-1, -1}));  // overflows a double
  EXPECT_EQ(lean(R"({"usage":{"prompt_tokens":3,"completion_tokens":1e-400}})"), (P{3, -1}));   // underflows to 0: a float
}

TEST(AnswerReader, AnOverlongLineIsSkippedAndTheNextOneRead) {
  AnswerReader r(true);
  r.feed_stream("data: {\"choices\":[{\"text\":\"");
  const std::string chunk(1 << 20, 'x');
  for (int i = 0; i < 5; ++i) r.feed_stream(chunk);  // 5 MiB without an end of line
  r.feed_stream("\"}]}\n\ndata: {\"choices\":[{\"text\":\"after\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n");
  EXPECT_EQ(r.text(), "after");
  EXPECT_TRUE(r.usage().known());
}

}  // namespace
}  // namespace lmserve::gateway
