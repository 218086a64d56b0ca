// The usage and text the gateway reads from answers as they pass: JSON answers, and SSE streams
// cut anywhere by the reads.
#include "gateway/answer.h"

#include <gtest/gtest.h>

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
  };
  for (const char* body : bodies) {
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
