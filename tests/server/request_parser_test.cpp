// server/http/request_parser.h: a whole plain request is read by the parser's own pass, and
// every request reads as Beast reads it. Each case is read twice, by default and with
// Reading::kBeastOnly, and the two readings (requests, keep-alive, the refusal) must be equal;
// the plain pass must have taken the requests it is for and none of the others.
#include "server/http/request_parser.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "parser_readings.h"
#include "test_util.h"

namespace lmserve::server::http {
namespace {

using Reading = lmserve::testing::RequestReading;

// The same requests, versions and end (the plain flags apart).
bool same(const Reading& a, const Reading& b) { return lmserve::testing::same_requests(a, b) && a.versions == b.versions && a.end == b.end; }

Reading read(std::string_view bytes, RequestParser::Reading how, std::size_t cut = 0, std::size_t max_header = 8192,
             std::size_t max_body = 1 << 20) {
  return lmserve::testing::read_requests(bytes, how, cut, max_header, max_body);
}

std::string show(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '\r') {
      out += "\\r";
    } else if (c == '\n') {
      out += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) {
      out += "\\x" + std::to_string(static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out;
}

const std::string kPost =
    "POST /v1/completions?x=1 HTTP/1.1\r\nHost: gw:8080\r\nContent-Type: application/json\r\n"
    "Authorization:  Bearer sk-lms-abc \t\r\nContent-Length: 17\r\n\r\n{\"prompt\":\"hi\"}\r\n";

TEST(RequestParser, APlainRequestIsReadByThePlainPassAsBeastReadsIt) {
  const std::vector<std::string> plain = {
      kPost,
      "GET /health HTTP/1.1\r\nHost: h\r\n\r\n",
      "GET /health HTTP/1.0\r\n\r\n",
      "GET /health HTTP/1.0\r\nConnection: Keep-Alive\r\nHost: h\r\n\r\n",
      "GET / HTTP/1.1\r\nhost: h\r\nCONNECTION: close\r\nX-Empty:\r\nX-Spaces:   \r\n\r\n",
      "POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0003\r\n\r\nabc",
      "DELETE /v1/files/f-1 HTTP/1.1\r\nHost: h\r\nConnection: close\r\nConnection: keep-alive\r\n\r\n",
      "OPTIONS /a~b!$&'()*+,;=:@%20 HTTP/1.1\r\nHost: h\r\nX-Json: {\"a\": [1, 2]}\r\n\r\n",
      "GET /health HTTP/1.0\r\nConnection: close\r\n\r\n",
  };
  for (const auto& bytes : plain) {
    const Reading fast = read(bytes, RequestParser::Reading::kPlainWherePossible);
    const Reading beast = read(bytes, RequestParser::Reading::kBeastOnly);
    EXPECT_TRUE(same(fast, beast)) << show(bytes);
    ASSERT_EQ(fast.requests.size(), 1u) << show(bytes);
    EXPECT_TRUE(fast.plain[0]) << show(bytes);
    EXPECT_FALSE(beast.plain[0]);
  }
  const Reading r = read(kPost, RequestParser::Reading::kPlainWherePossible);
  const Request& q = r.requests.at(0);
  EXPECT_EQ(q.method, "POST");
  EXPECT_EQ(q.path, "/v1/completions");
  EXPECT_EQ(q.header("authorization"), "Bearer sk-lms-abc");
  EXPECT_EQ(q.body, "{\"prompt\":\"hi\"}\r\n");
  EXPECT_TRUE(r.keep_alive[0]);
  // Both DELETE's Connection fields count, as Beast counts them: close wins in HTTP/1.1.
  EXPECT_FALSE(read(plain[6], RequestParser::Reading::kPlainWherePossible).keep_alive.at(0));
  EXPECT_TRUE(read(plain[3], RequestParser::Reading::kPlainWherePossible).keep_alive.at(0));
  EXPECT_FALSE(read(plain[2], RequestParser::Reading::kPlainWherePossible).keep_alive.at(0));
  EXPECT_FALSE(read(plain[8], RequestParser::Reading::kPlainWherePossible).keep_alive.at(0));
}

TEST(RequestParser, WhatThePlainPassDoesNotTakeGoesToBeastWhole) {
  const std::string head = "POST /x HTTP/1.1\r\nHost: h\r\n";
  const std::vector<std::string> others = {
      head + "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",              // chunked: Beast's
      head + "Content-Length: 10\r\n\r\nshort",                                     // the body not all there
      head + "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc",                   // twice (Beast takes equal ones)
      head + "Content-Length: 3, 3\r\n\r\nabc",                                     // a list
      head + "Content-Length: 3\r\nX-Folded: a\r\n b\r\n\r\nabc",                   // a folded line
      head + "Connection: close, upgrade\r\nUpgrade: h2c\r\n\r\n",                  // upgrade
      head + "Proxy-Connection: close\r\n\r\n",                                     // Beast reads it as Connection
      head + "X-Latin: caf\xc3\xa9\r\n\r\n",                                        // obs-text: Beast takes it
      "GET http://h/x HTTP/1.1\r\nHost: h\r\n\r\n",                                 // absolute form
      "GET * HTTP/1.1\r\nHost: h\r\n\r\n",                                          // asterisk form
      "GET /x HTTP/1.1\r\n\r\n",                                                    // no Host: refused
      "GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",                              // two: refused
      "GET /x HTTP/2.0\r\nHost: h\r\n\r\n",                                         // refused
      "GET /x HTTP/1.1\nHost: h\n\n",                                               // bare LF: refused
      "GET /x HTTP/1.1\r\nHost : h\r\n\r\n",                                        // space before the colon
      "GET /x HTTP/1.1\r\nHost: h\r\nX-Bad: a\x01z\r\n\r\n",                        // a control byte
      "GET /x HTTP/1.1\r\nHost: h\r\nX-Big: " + std::string(9000, 'a') + "\r\n\r\n",  // over the limit
      head + "Content-Length: 2000000\r\n\r\n",                                     // over the body limit
      head + "Content-Length: 99999999999999999999\r\n\r\n",                        // past 64 bits
  };
  for (const auto& bytes : others) {
    const Reading fast = read(bytes, RequestParser::Reading::kPlainWherePossible);
    EXPECT_TRUE(same(fast, read(bytes, RequestParser::Reading::kBeastOnly))) << show(bytes);
    for (const bool p : fast.plain) EXPECT_FALSE(p) << show(bytes);
  }
  // More fields than the plain pass keeps: Beast reads them all.
  std::string many = "GET /x HTTP/1.1\r\nHost: h\r\n";
  for (int i = 0; i < 40; ++i) many += "X-" + std::to_string(i) + ": v\r\n";
  many += "\r\n";
  const Reading fast = read(many, RequestParser::Reading::kPlainWherePossible);
  ASSERT_EQ(fast.requests.size(), 1u);
  EXPECT_EQ(fast.requests[0].headers.size(), 41u);
  EXPECT_TRUE(same(fast, read(many, RequestParser::Reading::kBeastOnly)));
}

TEST(RequestParser, PipelinedAndPiecewiseRequestsReadTheSameEitherWay) {
  const std::string bytes = kPost + "GET /a HTTP/1.1\r\nHost: h\r\n\r\n" + kPost + "GET /b HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";
  const Reading whole = read(bytes, RequestParser::Reading::kPlainWherePossible);
  ASSERT_EQ(whole.requests.size(), 4u);
  EXPECT_EQ(whole.plain, (std::vector<bool>{true, true, true, true}));
  for (const std::size_t cut : {1, 2, 7, 40, 100, 333}) {
    EXPECT_TRUE(same(whole, read(bytes, RequestParser::Reading::kPlainWherePossible, cut))) << cut;
    EXPECT_TRUE(same(whole, read(bytes, RequestParser::Reading::kBeastOnly, cut))) << cut;
  }
}

// Seeded mutations of plain requests: a byte replaced, inserted or removed, from the bytes that
// matter to HTTP's syntax. Whatever the plain pass takes, it must read as Beast does, and what it
// does not take Beast reads as before.
TEST(RequestParser, MutatedRequestsReadAsBeastReadsThem) {
  const std::vector<std::string> bases = {kPost, "GET /health HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
                                          "POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"};
  const std::string alphabet = std::string(" \t\r\n:,;/?=\"\x7f\x80\x01\x00" "aZ09-", 20);
  std::mt19937 rng(20261207);
  int taken = 0, left = 0;
  for (int i = 0; i < 30000; ++i) {
    std::string bytes = bases[rng() % bases.size()];
    lmserve::testing::mutate_bytes(bytes, rng, alphabet);
    const Reading fast = read(bytes, RequestParser::Reading::kPlainWherePossible);
    const Reading beast = read(bytes, RequestParser::Reading::kBeastOnly);
    ASSERT_TRUE(same(fast, beast)) << show(bytes);
    (!fast.plain.empty() && fast.plain[0] ? taken : left)++;
  }
  // Both sides of the plain pass were reached: cases it read, and cases it left to Beast.
  EXPECT_GT(taken, 3000);
  EXPECT_GT(left, 3000);
}

}  // namespace
}  // namespace lmserve::server::http
