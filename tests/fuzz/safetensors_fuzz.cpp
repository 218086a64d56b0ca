// libFuzzer target: any bytes as a safetensors file. The parser must reject or accept without
// crashing, and every accepted tensor must lie inside the input.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto f = lmserve::model::SafetensorsFile::from_memory(bytes, "fuzz.safetensors");
  if (!f) return 0;
  for (const auto& [name, t] : (*f)->tensors()) {
    auto begin = reinterpret_cast<const std::uint8_t*>(t.data);
    if (begin < data || begin + t.nbytes > data + size) std::abort();
  }
  return 0;
}
