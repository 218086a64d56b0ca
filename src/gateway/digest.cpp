// SHA-256 through OpenSSL's low-level functions, deprecated in 3.0 in favour of EVP: they run the
// same code (SHA-NI where the CPU has it), where EVP costs an initialisation of ~460 instructions
// and a context allocated per digest (callgrind, the gateway's audit path: four digests a request).
#define OPENSSL_SUPPRESS_DEPRECATED
#include "gateway/digest.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>

#include <array>
#include <cstring>

namespace lmserve::gateway {

std::string to_hex(const unsigned char* bytes, std::size_t n) {
  // Each byte's two digits at once.
  static constexpr auto kPairs = [] {
    std::array<char, 512> t{};
    constexpr char kDigits[] = "0123456789abcdef";
    for (int b = 0; b < 256; ++b) {
      t[2 * b] = kDigits[b >> 4];
      t[2 * b + 1] = kDigits[b & 15];
    }
    return t;
  }();
  std::string out(2 * n, '0');
  char* o = out.data();
  for (std::size_t i = 0; i < n; ++i) std::memcpy(o + 2 * i, kPairs.data() + 2 * bytes[i], 2);
  return out;
}

std::string sha256_hex(std::string_view data) { return sha256_hex(data, {}); }

std::string sha256_hex(std::string_view a, std::string_view b) {
  SHA256_CTX ctx;
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256_Init(&ctx);
  SHA256_Update(&ctx, a.data(), a.size());
  SHA256_Update(&ctx, b.data(), b.size());
  SHA256_Final(md, &ctx);
  return to_hex(md, sizeof md);
}

std::string sha1_hex(std::string_view data) {
  unsigned char md[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(data.data()), data.size(), md);
  return to_hex(md, sizeof md);
}

std::string hmac_sha256_hex(std::string_view key, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return to_hex(out, len);
}

Sha256::Sha256() { SHA256_Init(&ctx_); }

void Sha256::update(std::string_view data) { SHA256_Update(&ctx_, data.data(), data.size()); }

std::string Sha256::hex() {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256_Final(md, &ctx_);
  SHA256_Init(&ctx_);
  return to_hex(md, sizeof md);
}

}  // namespace lmserve::gateway
