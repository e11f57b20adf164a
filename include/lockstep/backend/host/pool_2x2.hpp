#pragma once
/// @file pool_2x2.hpp
/// Max and average pooling over 2 x 2 windows moved by 2, without padding (the pooling of the
/// tutorials' CNNs), on the host: eight windows per AVX2 vector where the CPU has AVX2 (chosen at
/// run time). The values are those of the layers' row loops (detail::max_pool_rows_op,
/// max_pool_grad_rows_op, avg_pool_rows_op and avg_pool_grad_rows_op in layers/conv.hpp) bit for
/// bit: for max pooling the window's first maximum in row-major order (a NaN in the window's first
/// cell stays its maximum), its cell in the window (0-3, a byte), and the gradient 0 + dy at that
/// cell and +0 elsewhere; for average pooling the cells summed row by row from 0 and divided by 4, and the
/// gradient (0 + dy) / 4. Rows and columns that fill no window (an odd H or W) are dropped by the
/// forward pass and get a zero gradient.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <lockstep/config.hpp>

/// 1 where max_pool2d and avg_pool2d carry a copy of their 2 x 2, stride-2 loops written for AVX2
/// and pick it at run time: x86-64 under g++ or clang++ (not nvcc) unless LOCKSTEP_NO_AVX2_LOOPS
/// is defined.
#if !defined(LOCKSTEP_HOST_POOL_AVX2)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && \
    !defined(LOCKSTEP_NO_AVX2_LOOPS)
#define LOCKSTEP_HOST_POOL_AVX2 1
#else
#define LOCKSTEP_HOST_POOL_AVX2 0
#endif
#endif

#if LOCKSTEP_HOST_POOL_AVX2
#include <immintrin.h>
#endif

namespace lockstep::backend {

/// True where the 2 x 2 pooling loops below can run: x86-64 builds that carry the AVX2 copy, on a
/// CPU with AVX2.
inline bool host_pool_avx2() noexcept {
#if LOCKSTEP_HOST_POOL_AVX2
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

#if LOCKSTEP_HOST_POOL_AVX2
namespace detail {
/// Lanes [0, n) of a mask for maskload/maskstore (none for n <= 0, all for n >= 8).
[[gnu::target("avx2")]] inline __m256i pool_lanes(int n) noexcept {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/// The even (Odd false) or odd (Odd true) elements of the 16 floats lo, hi, in order.
template <bool Odd>
[[gnu::target("avx2")]] inline __m256 pool_deinterleave(__m256 lo, __m256 hi) noexcept {
  const __m256 s = Odd ? _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1)) : _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
  return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(s), _MM_SHUFFLE(3, 1, 2, 0)));
}

/// The four cells of eight windows side by side, in the window's row-major order.
struct pool_cells {
  __m256 a, b, c, d;  ///< cells (0, 0), (0, 1), (1, 0) and (1, 1)
};

/// The cells of windows [0, Count) whose top-left cells are r0[0], r0[2], ... in rows of W floats
/// (reading only the 2 Count floats of each of the two input rows that they cover).
template <std::size_t W, int Count>
[[gnu::target("avx2")]] inline pool_cells pool_load(const float* r0) noexcept {
  const float* r1 = r0 + W;
  __m256 lo0, hi0, lo1, hi1;
  if constexpr (Count == 8) {
    lo0 = _mm256_loadu_ps(r0);
    hi0 = _mm256_loadu_ps(r0 + 8);
    lo1 = _mm256_loadu_ps(r1);
    hi1 = _mm256_loadu_ps(r1 + 8);
  } else {
    const __m256i mlo = pool_lanes(2 * Count);
    lo0 = _mm256_maskload_ps(r0, mlo);
    lo1 = _mm256_maskload_ps(r1, mlo);
    if constexpr (2 * Count > 8) {
      const __m256i mhi = pool_lanes(2 * Count - 8);
      hi0 = _mm256_maskload_ps(r0 + 8, mhi);
      hi1 = _mm256_maskload_ps(r1 + 8, mhi);
    } else {  // no pointer past the windows' cells is formed
      hi0 = hi1 = _mm256_setzero_ps();
    }
  }
  return {pool_deinterleave<false>(lo0, hi0), pool_deinterleave<true>(lo0, hi0), pool_deinterleave<false>(lo1, hi1),
          pool_deinterleave<true>(lo1, hi1)};
}

/// Stores lanes [0, Count) of v at p.
template <int Count>
[[gnu::target("avx2")]] inline void pool_store(float* p, __m256 v) noexcept {
  if constexpr (Count == 8)
    _mm256_storeu_ps(p, v);
  else
    _mm256_maskstore_ps(p, pool_lanes(Count), v);
}

/// Loads lanes [0, Count) at p (the others 0).
template <int Count>
[[gnu::target("avx2")]] inline __m256 pool_load_windows(const float* p) noexcept {
  if constexpr (Count == 8)
    return _mm256_loadu_ps(p);
  else
    return _mm256_maskload_ps(p, pool_lanes(Count));
}

/// Each of eight windows' values for both of its columns: [v0 v0 v1 v1 v2 v2 v3 v3] (lo) and
/// [v4 v4 ... v7 v7] (hi).
struct pool_spread {
  __m256 lo, hi;  ///< columns 0-7 and 8-15
};

/// v spread over the 16 columns of its eight windows.
[[gnu::target("avx2")]] inline pool_spread pool_spread_of(__m256 v) noexcept {
  const __m256 l = _mm256_unpacklo_ps(v, v), h = _mm256_unpackhi_ps(v, v);
  return {_mm256_permute2f128_ps(l, h, 0x20), _mm256_permute2f128_ps(l, h, 0x31)};
}

/// Stores the 2 Count columns of windows [0, Count) at p.
template <int Count>
[[gnu::target("avx2")]] inline void pool_store_columns(float* p, pool_spread v) noexcept {
  if constexpr (Count == 8) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  } else {
    _mm256_maskstore_ps(p, pool_lanes(2 * Count), v.lo);
    if constexpr (2 * Count > 8) _mm256_maskstore_ps(p + 8, pool_lanes(2 * Count - 8), v.hi);
  }
}

/// One more cell v (cell index `cell`, as a float) of eight windows: where v > best, or v is a
/// NaN and best is not (a window's first NaN is its maximum), best and where take v and its cell;
/// ties keep the earlier cell.
[[gnu::target("avx2")]] inline void pool_take(__m256 v, float cell, __m256& best, __m256& where) noexcept {
  const __m256 gt = _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ),
                                 _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), _mm256_cmp_ps(best, best, _CMP_ORD_Q)));
  where = _mm256_blendv_ps(where, _mm256_set1_ps(cell), gt);
  best = _mm256_blendv_ps(best, v, gt);
}

/// The Count (at most 8) bytes at p, little-endian in a register (the others 0): in loads of 4, 2
/// and 1 bytes, never touching a byte past them nor going through memory (a narrower store
/// followed by a wider load stalls).
template <int Count>
inline std::uint64_t pool_load_bytes(const std::uint8_t* p) noexcept {
  std::uint64_t v = 0;
  int at = 0;
  if constexpr ((Count & 4) != 0) {
    std::uint32_t t;
    std::memcpy(&t, p, 4);
    v = t;
    at = 4;
  }
  if constexpr ((Count & 2) != 0) {
    std::uint16_t t;
    std::memcpy(&t, p + at, 2);
    v |= std::uint64_t{t} << (8 * at);
    at += 2;
  }
  if constexpr ((Count & 1) != 0) v |= std::uint64_t{p[at]} << (8 * at);
  return v;
}

/// Stores the low Count (less than 8) bytes of v at p, in stores of 4, 2 and 1 bytes.
template <int Count>
inline void pool_store_bytes(std::uint8_t* p, std::uint64_t v) noexcept {
  int at = 0;
  if constexpr ((Count & 4) != 0) {
    const auto t = static_cast<std::uint32_t>(v);
    std::memcpy(p, &t, 4);
    at = 4;
  }
  if constexpr ((Count & 2) != 0) {
    const auto t = static_cast<std::uint16_t>(v >> (8 * at));
    std::memcpy(p + at, &t, 2);
    at += 2;
  }
  if constexpr ((Count & 1) != 0) p[at] = static_cast<std::uint8_t>(v >> (8 * at));
}

/// Stores the cells (0-3, as floats) of windows [0, Count) as bytes at p.
template <int Count>
[[gnu::target("avx2")]] inline void pool_store_cells(std::uint8_t* p, __m256 cells) noexcept {
  const __m256i c = _mm256_cvtps_epi32(cells);
  const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
  const __m128i bytes = _mm_packus_epi16(words, words);
  if constexpr (Count == 8)
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), bytes);
  else
    pool_store_bytes<Count>(p, static_cast<std::uint64_t>(_mm_cvtsi128_si64(bytes)));
}

/// The cells of windows [0, Count) stored at p (bytes), as floats (the others 0).
template <int Count>
[[gnu::target("avx2")]] inline __m256 pool_load_cells(const std::uint8_t* p) noexcept {
  __m128i bytes;
  if constexpr (Count == 8)
    bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  else
    bytes = _mm_cvtsi64_si128(static_cast<long long>(pool_load_bytes<Count>(p)));
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
}

/// Max pooling of windows [ox, ox + Count) of output row oy of channel `in`: y and the cells `at`.
template <std::size_t W, int Count>
[[gnu::target("avx2")]] inline void max_pool_2x2_windows(const float* in, float* y, std::uint8_t* at, std::int32_t oy,
                                                         std::int32_t ox) noexcept {
  const pool_cells cells = pool_load<W, Count>(in + 2 * oy * static_cast<std::int32_t>(W) + 2 * ox);
  __m256 best = cells.a, where = _mm256_setzero_ps();
  pool_take(cells.b, 1.0f, best, where);
  pool_take(cells.c, 2.0f, best, where);
  pool_take(cells.d, 3.0f, best, where);
  pool_store<Count>(y, best);
  pool_store_cells<Count>(at, where);
}

/// Max pooling's gradient at input columns [2 ox, 2 ox + 2 Count) of input row yy, from windows
/// [ox, ox + Count) of its output row (dy, at): 0 + dy where the column is its window's argmax,
/// +0 elsewhere.
template <int Count>
[[gnu::target("avx2")]] inline void max_pool_2x2_grad_windows(const float* dy, const std::uint8_t* at, float* dx,
                                                              std::int32_t yy) noexcept {
  const pool_spread d = pool_spread_of(_mm256_add_ps(_mm256_setzero_ps(), pool_load_windows<Count>(dy)));
  const pool_spread a = pool_spread_of(pool_load_cells<Count>(at));
  // The cell of each column in its window: 2 (yy mod 2) for the left column, one more for the right.
  const float r = static_cast<float>(2 * (yy % 2));
  const __m256 cell = _mm256_setr_ps(r, r + 1, r, r + 1, r, r + 1, r, r + 1);
  pool_store_columns<Count>(dx, {_mm256_and_ps(_mm256_cmp_ps(a.lo, cell, _CMP_EQ_OQ), d.lo),
                                 _mm256_and_ps(_mm256_cmp_ps(a.hi, cell, _CMP_EQ_OQ), d.hi)});
}

/// Average pooling of windows [ox, ox + Count) of output row oy of channel `in`.
template <std::size_t W, int Count>
[[gnu::target("avx2")]] inline void avg_pool_2x2_windows(const float* in, float* y, std::int32_t oy,
                                                         std::int32_t ox) noexcept {
  const pool_cells cells = pool_load<W, Count>(in + 2 * oy * static_cast<std::int32_t>(W) + 2 * ox);
  __m256 s = _mm256_add_ps(_mm256_setzero_ps(), cells.a);
  s = _mm256_add_ps(s, cells.b);
  s = _mm256_add_ps(s, cells.c);
  s = _mm256_add_ps(s, cells.d);
  pool_store<Count>(y, _mm256_div_ps(s, _mm256_set1_ps(4.0f)));
}

/// Average pooling's gradient at the input columns of windows [0, Count) of dy: (0 + dy) / 4.
template <int Count>
[[gnu::target("avx2")]] inline void avg_pool_2x2_grad_windows(const float* dy, float* dx) noexcept {
  const __m256 g = _mm256_div_ps(_mm256_add_ps(_mm256_setzero_ps(), pool_load_windows<Count>(dy)), _mm256_set1_ps(4.0f));
  pool_store_columns<Count>(dx, pool_spread_of(g));
}

/// The forward pass of max (Max) or average pooling over `channels` channels of H x W floats x:
/// y and, for max pooling, argmax (cells) are channels x (H / 2) x (W / 2); each output row in
/// runs of eight windows, then its last OW mod 8.
template <bool Max, std::size_t H, std::size_t W>
[[gnu::target("avx2")]] inline void pool_2x2_forward_avx2(const float* x, float* y, std::uint8_t* argmax,
                                                     std::size_t channels) noexcept {
  constexpr std::size_t OH = H / 2, OW = W / 2, full = OW / 8 * 8;
  for (std::size_t c = 0; c < channels; ++c) {
    const float* in = x + c * H * W;
    for (std::size_t oy = 0; oy < OH; ++oy) {
      const std::size_t out = (c * OH + oy) * OW;
      const auto row = static_cast<std::int32_t>(oy);
      for (std::size_t ox = 0; ox < full; ox += 8)
        if constexpr (Max)
          max_pool_2x2_windows<W, 8>(in, y + out + ox, argmax + out + ox, row, static_cast<std::int32_t>(ox));
        else
          avg_pool_2x2_windows<W, 8>(in, y + out + ox, row, static_cast<std::int32_t>(ox));
      constexpr int tail = static_cast<int>(OW % 8);
      if constexpr (tail != 0 && Max)
        max_pool_2x2_windows<W, tail>(in, y + out + full, argmax + out + full, row, static_cast<std::int32_t>(full));
      else if constexpr (tail != 0)
        avg_pool_2x2_windows<W, tail>(in, y + out + full, row, static_cast<std::int32_t>(full));
    }
  }
}

/// The backward pass of max (Max) or average pooling: dx (channels x H x W) from dy and, for max
/// pooling, argmax (channels x (H / 2) x (W / 2)), every element written once; the rows and
/// columns no window reads get +0.
template <bool Max, std::size_t H, std::size_t W>
[[gnu::target("avx2")]] inline void pool_2x2_backward_avx2(const float* dy, const std::uint8_t* argmax, float* dx,
                                                      std::size_t channels) noexcept {
  constexpr std::size_t OH = H / 2, OW = W / 2, full = OW / 8 * 8;
  for (std::size_t c = 0; c < channels; ++c)
    for (std::size_t yy = 0; yy < H; ++yy) {
      float* out = dx + (c * H + yy) * W;
      if (yy / 2 >= OH) {  // the last row of an odd H: no window reads it
        for (std::size_t xx = 0; xx < W; ++xx) out[xx] = 0.0f;
        continue;
      }
      const std::size_t window = (c * OH + yy / 2) * OW;
      const auto row = static_cast<std::int32_t>(yy);
      for (std::size_t ox = 0; ox < full; ox += 8)
        if constexpr (Max)
          max_pool_2x2_grad_windows<8>(dy + window + ox, argmax + window + ox, out + 2 * ox, row);
        else
          avg_pool_2x2_grad_windows<8>(dy + window + ox, out + 2 * ox);
      constexpr int tail = static_cast<int>(OW % 8);
      if constexpr (tail != 0 && Max)
        max_pool_2x2_grad_windows<tail>(dy + window + full, argmax + window + full, out + 2 * full, row);
      else if constexpr (tail != 0)
        avg_pool_2x2_grad_windows<tail>(dy + window + full, out + 2 * full);
      if constexpr (W % 2 != 0) out[W - 1] = 0.0f;  // the last column of an odd W
    }
}
}  // namespace detail
#endif

/// Max (Max true) or average pooling forward over `channels` channels of H x W floats (x), 2 x 2
/// windows moved by 2 without padding, where host_pool_avx2(): y and, for max pooling, argmax
/// (each maximum's cell in its window, 0-3) are channels x (H / 2) x (W / 2). False, and nothing
/// written, elsewhere.
template <bool Max, std::size_t H, std::size_t W>
inline bool pool_2x2_forward([[maybe_unused]] const float* x, [[maybe_unused]] float* y,
                             [[maybe_unused]] std::uint8_t* argmax, [[maybe_unused]] std::size_t channels) noexcept {
  static_assert(H >= 2 && W >= 2, "pool_2x2: 2 <= H, W");
#if LOCKSTEP_HOST_POOL_AVX2
  if (!host_pool_avx2()) return false;
  detail::pool_2x2_forward_avx2<Max, H, W>(x, y, argmax, channels);
  return true;
#else
  return false;
#endif
}

/// Its gradient, where host_pool_avx2(): dx (channels x H x W) from dy and, for max pooling,
/// argmax (channels x (H / 2) x (W / 2)), every element written once (+0 where no window reads
/// it). False, and nothing written, elsewhere.
template <bool Max, std::size_t H, std::size_t W>
inline bool pool_2x2_backward([[maybe_unused]] const float* dy, [[maybe_unused]] const std::uint8_t* argmax,
                              [[maybe_unused]] float* dx, [[maybe_unused]] std::size_t channels) noexcept {
  static_assert(H >= 2 && W >= 2, "pool_2x2: 2 <= H, W");
#if LOCKSTEP_HOST_POOL_AVX2
  if (!host_pool_avx2()) return false;
  detail::pool_2x2_backward_avx2<Max, H, W>(dy, argmax, dx, channels);
  return true;
#else
  return false;
#endif
}

}  // namespace lockstep::backend
