#pragma once
/// @file random.hpp
/// A counter-based random number generator (Philox 4x32-10). A draw is a pure function of
/// (seed, stream, index): reproducible, independent of call order and of how work is split
/// across replicas or threads.

#include <cmath>
#include <cstdint>

#include <lockstep/config.hpp>

namespace lockstep {

/// Philox 4x32 with 10 rounds: maps a 128-bit counter and a 64-bit key to 128 random bits.
struct philox4x32 {
  /// Four 32-bit words of output (or of counter).
  struct block {
    std::uint32_t v[4];  ///< the words
  };

  /// Runs the 10 Philox rounds on counter `c` with key (k0, k1).
  LOCKSTEP_HD static constexpr block generate(block c, std::uint32_t k0, std::uint32_t k1) noexcept {
    constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
    constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
    for (int r = 0; r < 10; ++r) {
      const std::uint64_t p0 = std::uint64_t{m0} * c.v[0];
      const std::uint64_t p1 = std::uint64_t{m1} * c.v[2];
      const block n{{static_cast<std::uint32_t>(p1 >> 32) ^ c.v[1] ^ k0, static_cast<std::uint32_t>(p1),
                     static_cast<std::uint32_t>(p0 >> 32) ^ c.v[3] ^ k1, static_cast<std::uint32_t>(p0)}};
      c = n;
      k0 += w0;
      k1 += w1;
    }
    return c;
  }
};

/// A random stream identified by (seed, stream): `bits(i)` is the i-th 128-bit block, so any
/// element can be drawn without drawing the ones before it.
class counter_rng {
public:
  /// A stream of generator `seed`; `stream` separates independent uses (layer, purpose, step).
  LOCKSTEP_HD constexpr counter_rng(std::uint64_t seed, std::uint64_t stream) noexcept
      : seed_(seed), stream_(stream) {}

  /// The 128 random bits at position `index` of the stream.
  LOCKSTEP_HD constexpr philox4x32::block bits(std::uint64_t index) const noexcept {
    const philox4x32::block c{{static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
                               static_cast<std::uint32_t>(stream_), static_cast<std::uint32_t>(stream_ >> 32)}};
    return philox4x32::generate(c, static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32));
  }

  /// A 32-bit random word: word `index % 4` of block `index / 4`.
  LOCKSTEP_HD constexpr std::uint32_t u32(std::uint64_t index) const noexcept {
    return bits(index >> 2).v[index & 3];
  }

  /// A uniform float in [0, 1) with 24 random bits, element `index` of the stream.
  LOCKSTEP_HD constexpr float uniform(std::uint64_t index) const noexcept {
    return static_cast<float>(u32(index) >> 8) * (1.0f / 16777216.0f);
  }

  /// A uniform double in [0, 1) with 53 random bits, element `index` of the stream.
  LOCKSTEP_HD constexpr double uniform_double(std::uint64_t index) const noexcept {
    const philox4x32::block b = bits(index);
    const std::uint64_t w = (std::uint64_t{b.v[0]} << 32 | b.v[1]) >> 11;
    return static_cast<double>(w) * (1.0 / 9007199254740992.0);
  }

  /// A standard normal draw (Box-Muller on one 128-bit block), element `index` of the stream.
  LOCKSTEP_HD double normal(std::uint64_t index) const noexcept {
    const philox4x32::block b = bits(index);
    const double u1 = (static_cast<double>(b.v[0]) + 1.0) * (1.0 / 4294967297.0);  // (0, 1]
    const double u2 = static_cast<double>(b.v[1]) * (1.0 / 4294967296.0);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  /// The seed this stream was made with.
  LOCKSTEP_HD constexpr std::uint64_t seed() const noexcept { return seed_; }
  /// The stream id this stream was made with.
  LOCKSTEP_HD constexpr std::uint64_t stream() const noexcept { return stream_; }

private:
  std::uint64_t seed_;
  std::uint64_t stream_;
};

/// Mixes several 64-bit values into one stream id (splitmix64 finaliser), for keys such as
/// (purpose, layer, step).
LOCKSTEP_HD constexpr std::uint64_t mix_stream(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Strongly typed seed, so a seed is never confused with a size.
struct seed {
  std::uint64_t value = 0;  ///< the seed
};

}  // namespace lockstep
