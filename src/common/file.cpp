#include "common/file.h"

#include <fstream>
#include <iterator>

namespace lmserve {

Result<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return error(StatusCode::kNotFound, "cannot read " + path.string());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace lmserve
