// gateway/digest: the hashes keys and the audit trail are written with, as hex text.
#pragma once

#include <openssl/sha.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace lmserve::gateway {

std::string to_hex(const unsigned char* bytes, std::size_t n);
// SHA-256 of `data`, 64 hex digits.
std::string sha256_hex(std::string_view data);
std::string sha256_hex(std::string_view a, std::string_view b);  // of a followed by b
// SHA-1 of `data`, 40 hex digits (Redis names scripts by it; not for security).
std::string sha1_hex(std::string_view data);
// HMAC-SHA-256 of `data` under `key`, 64 hex digits.
std::string hmac_sha256_hex(std::string_view key, std::string_view data);

// SHA-256 over data given in pieces (an answer as it streams). Its state is its own: no
// allocation.
class Sha256 {
 public:
  Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(std::string_view data);
  std::string hex();  // of everything given; then the hash starts again

 private:
  SHA256_CTX ctx_;
};

}  // namespace lmserve::gateway
