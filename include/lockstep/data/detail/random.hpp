#pragma once
/// @file random.hpp
/// Internal: the small deterministic RNG behind shuffle (a splitmix64 stream keyed by seed and epoch).

#include <cstddef>
#include <cstdint>

namespace lockstep::data::detail {

/// One splitmix64 finalisation step (a bijective 64-bit mixer).
constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// A splitmix64 stream whose state is derived from (seed, epoch): the same pair always gives the
/// same stream, another epoch another stream.
class stream_rng {
public:
  /// Starts the stream of (seed, epoch).
  constexpr stream_rng(std::uint64_t seed, std::uint64_t epoch) noexcept
      : state_(mix64(seed ^ mix64(epoch ^ 0x6a09e667f3bcc909ULL))) {}
  /// The next 64 random bits.
  constexpr std::uint64_t next() noexcept {
    state_ += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// A uniform integer in [0, n) without modulo bias; n >= 1.
  constexpr std::uint64_t below(std::uint64_t n) noexcept {
    const std::uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    while (true) {
      const std::uint64_t r = next();
      if (r >= threshold) return r % n;
    }
  }

private:
  std::uint64_t state_;
};

}  // namespace lockstep::data::detail
