// lmserve::Expected / lmserve::Unexpected: std::expected where the standard library has it
// (g++ 12 in C++23 mode), and a small compatible implementation where it does not (clang 14
// with libstdc++ 12 hides <expected>; the fuzz targets are built with that clang). Only the
// members lmserve uses are provided by the fallback.
#pragma once

#include <version>

#if defined(__cpp_lib_expected) && __cpp_lib_expected >= 202202L
#include <expected>

namespace lmserve {
template <typename T, typename E>
using Expected = std::expected<T, E>;
template <typename E>
using Unexpected = std::unexpected<E>;
}  // namespace lmserve

#else
#include <cassert>
#include <type_traits>
#include <utility>
#include <variant>

namespace lmserve {

template <typename E>
class Unexpected {
 public:
  explicit Unexpected(E e) : e_(std::move(e)) {}
  E& error() & { return e_; }
  const E& error() const& { return e_; }
  E&& error() && { return std::move(e_); }

 private:
  E e_;
};

template <typename T, typename E>
class Expected {
 public:
  Expected() requires std::is_default_constructible_v<T> : v_(std::in_place_index<0>) {}
  template <typename U = T>
    requires std::is_constructible_v<T, U&&> && (!std::is_same_v<std::remove_cvref_t<U>, Expected>) &&
             (!std::is_same_v<std::remove_cvref_t<U>, Unexpected<E>>)
  Expected(U&& v) : v_(std::in_place_index<0>, std::forward<U>(v)) {}  // NOLINT(implicit)
  template <typename G>
  Expected(Unexpected<G> u) : v_(std::in_place_index<1>, std::move(u.error())) {}  // NOLINT(implicit)

  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return std::get<0>(v_); }
  const T& operator*() const& { return std::get<0>(v_); }
  T&& operator*() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  E& error() & { return std::get<1>(v_); }
  const E& error() const& { return std::get<1>(v_); }
  E&& error() && { return std::get<1>(std::move(v_)); }
  template <typename U>
  T value_or(U&& fallback) const& {
    return has_value() ? std::get<0>(v_) : static_cast<T>(std::forward<U>(fallback));
  }

 private:
  std::variant<T, E> v_;
};

}  // namespace lmserve
#endif
