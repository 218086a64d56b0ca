// gateway/upstream_parser.h: a replica's plain answer with a length or chunks is read by the
// parser's own pass (the chunks by Beast after it), and every answer reads as Beast reads it. Each case is read by default and with
// Reading::kBeastOnly, as the proxy feeds its parser (the head, then the body, from what each
// read brought), and the two readings must be equal.
#include "gateway/upstream_parser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "parser_readings.h"
#include "test_util.h"

namespace lmserve::gateway {
namespace {

using Reading = lmserve::testing::AnswerReading;
using lmserve::testing::same_but_plain;

Reading read(std::string_view bytes, UpstreamParser::Reading how, std::size_t cut = 0, std::size_t give_up_after = SIZE_MAX) {
  return lmserve::testing::read_answer(bytes, how, cut, give_up_after);
}

const std::string kStream =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nX-Request-Id: s-1\r\n\r\n"
    "f\r\ndata: {\"a\":1}\n\n\r\nc\r\ndata: [DONE]\r\n0\r\n\r\n";

const std::string kAnswer =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-Id: r-1 \r\nServer: lmserve\r\nDate: today\r\n"
    "Connection: keep-alive\r\nRetry-After: 3\r\nContent-Length: 27\r\n\r\n{\"choices\":[{\"text\":\"hi\"}]}";

TEST(UpstreamParser, APlainAnswerIsReadByThePlainPassAsBeastReadsIt) {
  const std::vector<std::string> plain = {
      kAnswer,
      "HTTP/1.1 200 \r\ncontent-length: 0\r\n\r\n",
      "HTTP/1.0 404 Not Found\r\nContent-Length: 2\r\nConnection: Keep-Alive\r\n\r\n{}",
      "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}",
      "HTTP/1.1 429 Too Many Requests\r\nRetry-After:  7\t\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
      "HTTP/1.0 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
      kStream,
      "HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\nConnection: close\r\n\r\n3;ext=1\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n",
  };
  for (const auto& bytes : plain) {
    for (const std::size_t cut : {0, 1, 5, 64}) {
      const Reading fast = read(bytes, UpstreamParser::Reading::kPlainWherePossible, cut);
      const Reading beast = read(bytes, UpstreamParser::Reading::kBeastOnly, cut);
      EXPECT_TRUE(same_but_plain(fast, beast)) << bytes << " cut " << cut;
      EXPECT_TRUE(fast.done) << bytes;
      EXPECT_FALSE(beast.plain);
      if (cut == 0) {
        EXPECT_TRUE(fast.plain) << bytes;
      }
    }
  }
  const Reading r = read(kAnswer, UpstreamParser::Reading::kPlainWherePossible);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.content_type, "application/json");
  EXPECT_EQ(r.retry_after, "3");
  EXPECT_EQ(r.pass_lines, "X-Request-Id: r-1\r\nRetry-After: 3\r\n");  // not Server, Date, Connection, the length
  EXPECT_EQ(r.body, "{\"choices\":[{\"text\":\"hi\"}]}");
  EXPECT_TRUE(r.keep_alive);
  EXPECT_FALSE(read(plain[4], UpstreamParser::Reading::kPlainWherePossible).keep_alive);
  EXPECT_TRUE(read(plain[2], UpstreamParser::Reading::kPlainWherePossible).keep_alive);
  EXPECT_FALSE(read(plain[3], UpstreamParser::Reading::kPlainWherePossible).keep_alive);
  EXPECT_FALSE(read(plain[5], UpstreamParser::Reading::kPlainWherePossible).keep_alive);
}

TEST(UpstreamParser, WhatThePlainPassDoesNotTakeIsBeasts) {
  const std::vector<std::string> others = {
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\ndata:\r\n0\r\n\r\n",  // a coding before the chunks
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
      "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\ndata:\r\n0\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"to\":\"the end\"}",  // a body to the connection's end
      "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",                           // no body whatever the length
      "HTTP/1.1 100 Continue\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Folded: a\r\n b\r\n\r\nbody",
      "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nbody",
      "HTTP/1.1 200 OK\r\nContent-Length: 4\r\nX-Latin: caf\xc3\xa9\r\n\r\nbody",
      "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",                             // cut short: partial_message
      "HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",                                      // no SP after the status
      "HTTP/2.0 200 OK\r\nContent-Length: 0\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: h\r\n\r\n",
  };
  for (const auto& bytes : others) {
    const Reading fast = read(bytes, UpstreamParser::Reading::kPlainWherePossible);
    const Reading beast = read(bytes, UpstreamParser::Reading::kBeastOnly);
    EXPECT_TRUE(same_but_plain(fast, beast)) << bytes;
    if (bytes.find("short") == std::string::npos) {
      EXPECT_FALSE(fast.plain) << bytes;
    }
  }
  const std::string cut_short = *std::find_if(others.begin(), others.end(), [](const std::string& o) { return o.ends_with("short"); });
  EXPECT_FALSE(read(cut_short, UpstreamParser::Reading::kPlainWherePossible).error.empty());  // partial_message either way
}

TEST(UpstreamParser, AnAnswerGivenUpStopsTheBodyEitherWay) {
  const Reading fast = read(kAnswer, UpstreamParser::Reading::kPlainWherePossible, 0, 5);
  EXPECT_TRUE(fast.plain);
  EXPECT_FALSE(fast.error.empty());
  EXPECT_TRUE(same_but_plain(fast, read(kAnswer, UpstreamParser::Reading::kBeastOnly, 0, 5)));
}

TEST(UpstreamParser, HopByHopNamesAreTheGatewaysOwnInAnyCase) {
  for (const char* name : {"Connection", "keep-alive", "TRANSFER-ENCODING", "TE", "Trailer", "Upgrade", "Proxy-Connection",
                           "Proxy-Authorization", "proxy-authenticate", "Host", "Content-Length", "content-type", "Server", "Date"}) {
    EXPECT_TRUE(hop_by_hop(name)) << name;
  }
  for (const char* name : {"X-Host", "Dates", "Content-Types", "Tf", "Authorization", "Retry-After", "X-Request-Id", ""}) {
    EXPECT_FALSE(hop_by_hop(name)) << name;
  }
}

// Seeded mutations of plain answers: whatever the plain pass takes it must read as Beast does.
TEST(UpstreamParser, MutatedAnswersReadAsBeastReadsThem) {
  const std::vector<std::string> bases = {kAnswer, kStream, "HTTP/1.0 503 Busy\r\nRetry-After: 1\r\nContent-Length: 2\r\n\r\n{}"};
  const std::string alphabet = std::string(" \t\r\n:,;\"\x7f\x80\x01\x00" "aZ09-", 17);
  std::mt19937 rng(20261207);
  int taken = 0, left = 0;
  for (int i = 0; i < 30000; ++i) {
    std::string bytes = bases[rng() % bases.size()];
    lmserve::testing::mutate_bytes(bytes, rng, alphabet);
    const Reading fast = read(bytes, UpstreamParser::Reading::kPlainWherePossible);
    ASSERT_TRUE(same_but_plain(fast, read(bytes, UpstreamParser::Reading::kBeastOnly))) << bytes;
    (fast.plain ? taken : left)++;
  }
  EXPECT_GT(taken, 3000);
  EXPECT_GT(left, 3000);
}

}  // namespace
}  // namespace lmserve::gateway
