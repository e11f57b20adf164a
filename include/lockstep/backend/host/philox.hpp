#pragma once
/// @file philox.hpp
/// Philox blocks drawn in bulk on the host: `philox_words` writes the words of consecutive blocks
/// of a counter_rng stream, bit for bit those of counter_rng::bits, eight blocks per AVX2 vector
/// (chosen at run time) where the CPU has AVX2, one block at a time elsewhere. Dropout's host path
/// draws its masks through it.

#include <cstddef>
#include <cstdint>

#include <lockstep/config.hpp>
#include <lockstep/core/random.hpp>

/// 1 where philox_words carries a copy compiled for AVX2 and picks it at run time: x86-64 under
/// g++ or clang++ (not nvcc) unless LOCKSTEP_NO_AVX2_LOOPS is defined.
#if !defined(LOCKSTEP_HOST_PHILOX_AVX2)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(LOCKSTEP_NO_AVX2_LOOPS)
#define LOCKSTEP_HOST_PHILOX_AVX2 1
#else
#define LOCKSTEP_HOST_PHILOX_AVX2 0
#endif
#endif

#if LOCKSTEP_HOST_PHILOX_AVX2
#include <immintrin.h>
#endif

namespace lockstep::backend {

namespace detail {
/// philox_words one block at a time (any CPU).
inline void philox_words_scalar(const counter_rng& rng, std::uint64_t first, std::size_t blocks,
                                std::uint32_t* words) noexcept {
  for (std::size_t b = 0; b < blocks; ++b) {
    const philox4x32::block bits = rng.bits(first + b);
    for (std::size_t w = 0; w < 4; ++w) words[4 * b + w] = bits.v[w];
  }
}

#if LOCKSTEP_HOST_PHILOX_AVX2
/// The four words of one Philox round's state for eight blocks, one block per 32-bit lane.
struct philox_lanes {
  __m256i c0, c1, c2, c3;  ///< counter words 0-3 of each block
};

/// One Philox round on eight blocks with round keys (k0, k1) broadcast in `key0`, `key1`: the
/// products m0·c0 and m1·c2 as 64-bit values, from the even lanes and (shifted down) the odd ones.
[[gnu::target("avx2")]] inline philox_lanes philox_round_avx2(const philox_lanes& s, __m256i key0, __m256i key1) noexcept {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(0xD2511F53u));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(0xCD9E8D57u));
  const __m256i even0 = _mm256_mul_epu32(s.c0, m0), odd0 = _mm256_mul_epu32(_mm256_srli_epi64(s.c0, 32), m0);
  const __m256i even1 = _mm256_mul_epu32(s.c2, m1), odd1 = _mm256_mul_epu32(_mm256_srli_epi64(s.c2, 32), m1);
  const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(even0, 32), odd0, 0xAA);
  const __m256i lo0 = _mm256_blend_epi32(even0, _mm256_slli_epi64(odd0, 32), 0xAA);
  const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(even1, 32), odd1, 0xAA);
  const __m256i lo1 = _mm256_blend_epi32(even1, _mm256_slli_epi64(odd1, 32), 0xAA);
  return {_mm256_xor_si256(_mm256_xor_si256(hi1, s.c1), key0), lo1,
          _mm256_xor_si256(_mm256_xor_si256(hi0, s.c3), key1), lo0};
}

/// philox_words sixteen blocks at a time (two independent vectors of eight, so that one's
/// multiplications overlap the other's), the rest one at a time; call only where the CPU has AVX2.
[[gnu::target("avx2")]] inline void philox_words_avx2(const counter_rng& rng, std::uint64_t first, std::size_t blocks,
                                                      std::uint32_t* words) noexcept {
  constexpr std::size_t group = 16;
  const std::uint64_t stream = rng.stream(), seed = rng.seed();
  const __m256i stream_lo = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(stream)));
  const __m256i stream_hi = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(stream >> 32)));
  std::size_t b = 0;
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (; b + group <= blocks; b += group) {
    // The counters: the block index (low and high word), then the stream.
    const std::uint64_t index = first + b;
    philox_lanes s[2];
    if (static_cast<std::uint32_t>(index) <= 0xFFFFFFFFu - (group - 1)) {  // no carry into the high word
      const __m256i lo = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(index))), iota);
      const __m256i hi = _mm256_set1_epi32(static_cast<int>(static_cast<std::uint32_t>(index >> 32)));
      s[0] = {lo, hi, stream_lo, stream_hi};
      s[1] = {_mm256_add_epi32(lo, _mm256_set1_epi32(8)), hi, stream_lo, stream_hi};
    } else {
      alignas(32) std::uint32_t lo[group], hi[group];
      for (std::size_t l = 0; l < group; ++l) {
        lo[l] = static_cast<std::uint32_t>(index + l);
        hi[l] = static_cast<std::uint32_t>((index + l) >> 32);
      }
      for (int v = 0; v < 2; ++v)
        s[v] = {_mm256_load_si256(reinterpret_cast<const __m256i*>(lo + 8 * v)),
                _mm256_load_si256(reinterpret_cast<const __m256i*>(hi + 8 * v)), stream_lo, stream_hi};
    }
    auto k0 = static_cast<std::uint32_t>(seed), k1 = static_cast<std::uint32_t>(seed >> 32);
    for (int r = 0; r < 10; ++r) {
      const __m256i key0 = _mm256_set1_epi32(static_cast<int>(k0)), key1 = _mm256_set1_epi32(static_cast<int>(k1));
      s[0] = philox_round_avx2(s[0], key0, key1);
      s[1] = philox_round_avx2(s[1], key0, key1);
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    for (int v = 0; v < 2; ++v) {  // eight blocks from one word per vector to one block per 128 bits
      const __m256i t0 = _mm256_unpacklo_epi32(s[v].c0, s[v].c1), t1 = _mm256_unpackhi_epi32(s[v].c0, s[v].c1);
      const __m256i t2 = _mm256_unpacklo_epi32(s[v].c2, s[v].c3), t3 = _mm256_unpackhi_epi32(s[v].c2, s[v].c3);
      const __m256i b04 = _mm256_unpacklo_epi64(t0, t2), b15 = _mm256_unpackhi_epi64(t0, t2);
      const __m256i b26 = _mm256_unpacklo_epi64(t1, t3), b37 = _mm256_unpackhi_epi64(t1, t3);
      auto* out = reinterpret_cast<__m256i*>(words + 4 * (b + 8 * static_cast<std::size_t>(v)));
      _mm256_storeu_si256(out + 0, _mm256_permute2x128_si256(b04, b15, 0x20));
      _mm256_storeu_si256(out + 1, _mm256_permute2x128_si256(b26, b37, 0x20));
      _mm256_storeu_si256(out + 2, _mm256_permute2x128_si256(b04, b15, 0x31));
      _mm256_storeu_si256(out + 3, _mm256_permute2x128_si256(b26, b37, 0x31));
    }
  }
  philox_words_scalar(rng, first + b, blocks - b, words + 4 * b);
}
#endif
}  // namespace detail

/// Writes the four words of blocks first, first + 1, ..., first + blocks - 1 of stream `rng` to
/// words[0 .. 4 blocks) (block b's word w at 4 b + w): the bits of counter_rng::bits.
inline void philox_words(const counter_rng& rng, std::uint64_t first, std::size_t blocks, std::uint32_t* words) noexcept {
#if LOCKSTEP_HOST_PHILOX_AVX2
  if (__builtin_cpu_supports("avx2")) return detail::philox_words_avx2(rng, first, blocks, words);
#endif
  detail::philox_words_scalar(rng, first, blocks, words);
}

/// The instruction set philox_words runs with here: "avx2 (chosen at run time)" or "scalar".
inline const char* philox_words_isa() noexcept {
#if LOCKSTEP_HOST_PHILOX_AVX2
  if (__builtin_cpu_supports("avx2")) return "avx2 (chosen at run time)";
#endif
  return "scalar";
}

}  // namespace lockstep::backend
