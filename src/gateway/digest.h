// gateway/digest: the hashes keys and the audit trail are written with, as hex text.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace lmserve::gateway {

std::string to_hex(const unsigned char* bytes, std::size_t n);
// SHA-256 of `data`, 64 hex digits.
std::string sha256_hex(std::string_view data);
// HMAC-SHA-256 of `data` under `key`, 64 hex digits.
std::string hmac_sha256_hex(std::string_view key, std::string_view data);

}  // namespace lmserve::gateway
