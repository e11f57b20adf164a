#pragma once
/// @file init.hpp
/// Seeded weight initialisers (He / Glorot, uniform / normal). Each fills a weight matrix from a
/// counter-based stream, so the values depend only on (seed, layer, element).

#include <cmath>
#include <cstddef>

#include <lockstep/core/random.hpp>

namespace lockstep {

/// He (Kaiming) uniform: U(-b, b), b = sqrt(6 / fan_in); the default for ReLU networks.
struct he_uniform {
  /// Fills n weights of a layer with the given fans.
  template <class T>
  static void fill(T* w, std::size_t n, std::size_t fan_in, std::size_t, const counter_rng& rng) {
    const double b = std::sqrt(6.0 / static_cast<double>(fan_in));
    for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<T>((2 * rng.uniform_double(i) - 1) * b);
  }
};

/// He (Kaiming) normal: N(0, 2 / fan_in).
struct he_normal {
  /// Fills n weights of a layer with the given fans.
  template <class T>
  static void fill(T* w, std::size_t n, std::size_t fan_in, std::size_t, const counter_rng& rng) {
    const double s = std::sqrt(2.0 / static_cast<double>(fan_in));
    for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<T>(rng.normal(i) * s);
  }
};

/// Glorot (Xavier) uniform: U(-b, b), b = sqrt(6 / (fan_in + fan_out)); for tanh / sigmoid.
struct glorot_uniform {
  /// Fills n weights of a layer with the given fans.
  template <class T>
  static void fill(T* w, std::size_t n, std::size_t fan_in, std::size_t fan_out, const counter_rng& rng) {
    const double b = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
    for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<T>((2 * rng.uniform_double(i) - 1) * b);
  }
};

/// Glorot (Xavier) normal: N(0, 2 / (fan_in + fan_out)).
struct glorot_normal {
  /// Fills n weights of a layer with the given fans.
  template <class T>
  static void fill(T* w, std::size_t n, std::size_t fan_in, std::size_t fan_out, const counter_rng& rng) {
    const double s = std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
    for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<T>(rng.normal(i) * s);
  }
};

}  // namespace lockstep
