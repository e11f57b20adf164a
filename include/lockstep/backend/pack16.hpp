#pragma once
/// @file pack16.hpp
/// 16-bit GEMM operands: the fp16 encodings beside core/precision.hpp's bf16 ones, and the
/// per-element body that packs an fp32 matrix into a dense bf16 or fp16 matrix. The GPU's
/// mixed-precision GEMMs (backend/cuda/ops.cuh) run this body in a kernel before cuBLAS reads the
/// packed operands with fp32 accumulation; host code runs the same body (for_each_index on a
/// host_context) to check it. Host and device code (LOCKSTEP_HD).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/precision.hpp>

namespace lockstep::backend {

/// The IEEE binary16 encoding of round_to_fp16(x): NaN stays a (quiet) NaN, values from 65520 on
/// become infinity, values below 2^-14 become fp16 subnormals.
LOCKSTEP_HD inline std::uint16_t to_fp16_bits(float x) noexcept {
  const float r = round_to_fp16(x);
  std::uint32_t u;
  std::memcpy(&u, &r, sizeof u);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  if (magnitude == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
  if (magnitude >= 0x38800000u)  // a normal fp16: rebias the exponent (127 - 15), keep 10 fraction bits
    return static_cast<std::uint16_t>(sign | (((magnitude >> 23) - 112u) << 10) | ((magnitude >> 13) & 0x3ffu));
  float a;  // a multiple of 2^-24 below 2^-14: its count of 2^-24 is the subnormal's fraction
  std::memcpy(&a, &magnitude, sizeof a);
  return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(a * 16777216.0f));
}

/// The fp32 value of binary16 encoding `bits` (exact; a NaN keeps its payload's top bits).
LOCKSTEP_HD inline float from_fp16_bits(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu, fraction = bits & 0x3ffu;
  std::uint32_t u;
  if (exponent == 0x1fu) {
    u = sign | 0x7f800000u | (fraction << 13);
  } else if (exponent == 0) {
    const float a = static_cast<float>(fraction) * 5.9604644775390625e-8f;  // fraction x 2^-24, exact
    std::memcpy(&u, &a, sizeof u);
    u |= sign;
  } else {
    u = sign | ((exponent + 112u) << 23) | (fraction << 13);
  }
  float out;
  std::memcpy(&out, &u, sizeof out);
  return out;
}

/// The 16-bit encoding of `x` rounded to compute type P (bf16 or fp16).
template <compute_precision P>
LOCKSTEP_HD inline std::uint16_t to_bits16(float x) noexcept {
  static_assert(P == compute_precision::bf16 || P == compute_precision::fp16, "a 16-bit compute type");
  if constexpr (P == compute_precision::bf16)
    return to_bf16_bits(x);
  else
    return to_fp16_bits(x);
}

/// The fp32 value of the 16-bit encoding `bits` of compute type P (exact).
template <compute_precision P>
LOCKSTEP_HD inline float from_bits16(std::uint16_t bits) noexcept {
  static_assert(P == compute_precision::bf16 || P == compute_precision::fp16, "a 16-bit compute type");
  if constexpr (P == compute_precision::bf16)
    return from_bf16_bits(bits);
  else
    return from_fp16_bits(bits);
}

/// Packs a rows x cols fp32 matrix `src` with row stride `ld` into the dense 16-bit matrix `dst`
/// (row stride cols) of compute type P: call i writes packed element i (row i / cols, column
/// i % cols), so a grid over rows x cols indices packs the whole matrix. Trivially copyable, for
/// for_each_index on either backend.
template <compute_precision P>
struct pack16_op {
  const float* src;    ///< the fp32 matrix
  std::size_t cols;    ///< its columns (> 0)
  std::size_t ld;      ///< its row stride (>= cols)
  std::uint16_t* dst;  ///< rows x cols encodings, row-major
  /// Packs element i.
  LOCKSTEP_HD void operator()(std::size_t i) const noexcept { dst[i] = to_bits16<P>(src[(i / cols) * ld + i % cols]); }
};

/// dst[i] = the bf16 encoding of src[i], rounded as pack16_op<bf16> rounds (to_bf16_bits): what
/// a GPU model's bf16 weight copy is written with, so a GEMM reading the copy multiplies the
/// values it would have packed. Trivially copyable, for for_each_index on either backend.
struct bf16_encode_op {
  const float* src;    ///< the fp32 values
  std::uint16_t* dst;  ///< their encodings
  /// Encodes element i.
  LOCKSTEP_HD void operator()(std::size_t i) const noexcept { dst[i] = to_bf16_bits(src[i]); }
};

/// Where a packed GEMM keeps its operands: op(A) is m x k and op(B) k x n, each packed densely as
/// stored (A: m x k, or k x m when transposed; its row stride becomes its column count), B
/// starting at the 256-byte boundary after A.
struct packed_layout {
  std::size_t a_cols = 0;    ///< columns (and packed row stride) of A as stored
  std::size_t a_count = 0;   ///< elements of A (m k)
  std::size_t b_cols = 0;    ///< columns (and packed row stride) of B as stored
  std::size_t b_count = 0;   ///< elements of B (k n)
  std::size_t b_offset = 0;  ///< where B starts, in elements: a_count rounded up to 128
  /// Elements of the whole packed area.
  [[nodiscard]] constexpr std::size_t total() const noexcept { return b_offset + b_count; }
};

/// The packed layout of a GEMM C = op(A) op(B) with op(A) m x k and op(B) k x n.
constexpr packed_layout packed_layout_of(trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k) noexcept {
  packed_layout l;
  l.a_cols = ta == trans::no ? k : m;
  l.a_count = m * k;
  l.b_cols = tb == trans::no ? n : k;
  l.b_count = k * n;
  l.b_offset = (l.a_count + 127) / 128 * 128;
  return l;
}

}  // namespace lockstep::backend
