// The digests of keys and the audit trail against published test vectors (FIPS 180-4's
// examples, RFC 4231 for HMAC).
#include "gateway/digest.h"

#include <gtest/gtest.h>

#include <string>

namespace lmserve::gateway {
namespace {

constexpr const char* kAbc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr const char* kEmpty = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
constexpr const char* kTwoBlocks = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
constexpr const char* kTwoBlocksText = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";

TEST(Digest, Sha256OfKnownTexts) {
  EXPECT_EQ(sha256_hex("abc"), kAbc);
  EXPECT_EQ(sha256_hex(""), kEmpty);
  EXPECT_EQ(sha256_hex(kTwoBlocksText), kTwoBlocks);
  EXPECT_EQ(sha256_hex("ab", "c"), kAbc);  // of the two, one after the other
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Digest, Sha256InPiecesIsTheWholesAndStartsAgainAfterHex) {
  Sha256 h;
  const std::string text = kTwoBlocksText;
  for (std::size_t i = 0; i < text.size(); i += 5) h.update(std::string_view(text).substr(i, 5));
  EXPECT_EQ(h.hex(), kTwoBlocks);
  h.update("abc");
  EXPECT_EQ(h.hex(), kAbc);
  EXPECT_EQ(h.hex(), kEmpty);
}

TEST(Digest, HexAndHmac) {
  const unsigned char bytes[] = {0x00, 0x0f, 0xa5, 0xff};
  EXPECT_EQ(to_hex(bytes, sizeof bytes), "000fa5ff");
  // RFC 4231, test case 2.
  EXPECT_EQ(hmac_sha256_hex("Jefe", "what do ya want for nothing?"), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

}  // namespace
}  // namespace lmserve::gateway
