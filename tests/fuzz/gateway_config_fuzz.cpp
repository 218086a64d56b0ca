// libFuzzer target: any bytes as the gateway's YAML configuration (gateway/config.h,
// parse_config), as `lmserve gateway --config` and a reload read it. Every input gives a config or
// an error naming what is wrong; nothing may crash or throw.
#include <cstdint>
#include <string>

#include "gateway/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto config = lmserve::gateway::parse_config(std::string(reinterpret_cast<const char*>(data), size));
  if (!config && config.error().message().empty()) __builtin_trap();
  return 0;
}
