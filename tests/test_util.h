// Small helpers shared by the test suites: JSON fixtures, fixture listings, test names, seeded
// byte edits.
#pragma once

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace lmserve::testing {

template <typename Json = nlohmann::json>
Json read_json(const std::filesystem::path& p) {
  std::ifstream in(p);
  return Json::parse(in);
}

// File names without extension in `dir`, sorted.
inline std::vector<std::string> stems_in(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A parameterised test's name from a fixture name: letters and digits kept, the rest '_'.
inline std::string param_name(std::string s) {
  for (char& c : s) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return s;
}

// For INSTANTIATE_TEST_SUITE_P's name generator over string parameters.
struct ParamName {
  template <typename Info>
  std::string operator()(const Info& info) const {
    return param_name(std::filesystem::path(info.param).filename().string());
  }
};

// One to three seeded edits of `bytes`, each a byte replaced, inserted or removed, the byte drawn
// from `alphabet` (the parsers' differential tests: the bytes that matter to a syntax).
inline void mutate_bytes(std::string& bytes, std::mt19937& rng, std::string_view alphabet) {
  for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
    const std::size_t at = rng() % bytes.size();
    const char c = alphabet[rng() % alphabet.size()];
    switch (rng() % 3) {
      case 0: bytes[at] = c; break;
      case 1: bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at), c); break;
      default: bytes.erase(at, 1); break;
    }
  }
}

}  // namespace lmserve::testing
