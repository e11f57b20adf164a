#pragma once
/// @file index_divider.hpp
/// `index_divider`: division of 32-bit indices by a divisor known only at run time as one
/// multiply-high, an add and two shifts (Granlund and Montgomery, "Division by invariant integers
/// using multiplication", 1994, figure 4.1). A GPU has no integer divider: a 64-bit `i / n` costs
/// tens of instructions, which dominates a kernel that only splits a flat index and copies one
/// value (im2col over a shard whose width depends on the batch).

#include <cstdint>

#include <lockstep/config.hpp>

namespace lockstep {

/// Divides unsigned 32-bit dividends by a fixed divisor d, 1 <= d <= 2^32 - 1: quotient(i) is
/// exactly i / d for every 32-bit i (checked over the edge values of many divisors in
/// tests/core/index_divider_test.cpp). Built on the host, used in host loops and kernels alike.
class index_divider {
public:
  /// Division by 1.
  constexpr index_divider() noexcept = default;
  /// Division by d (0 is taken as 1: callers divide by extents they have checked to be non-zero).
  constexpr explicit index_divider(std::uint32_t d) noexcept : d_(d == 0 ? 1 : d) {
    std::uint32_t l = 0;  // ceil(log2 d)
    while (l < 32 && (std::uint64_t{1} << l) < d_) ++l;
    // m' = floor(2^32 (2^l - d) / d) + 1 fits in 32 bits because d > 2^(l-1).
    mul_ = static_cast<std::uint32_t>((std::uint64_t{1} << 32) * ((std::uint64_t{1} << l) - d_) / d_ + 1);
    shift1_ = l < 1 ? l : 1;
    shift2_ = l > 1 ? l - 1 : 0;
  }

  /// The divisor.
  [[nodiscard]] LOCKSTEP_HD constexpr std::uint32_t divisor() const noexcept { return d_; }

  /// i / d.
  [[nodiscard]] LOCKSTEP_HD constexpr std::uint32_t quotient(std::uint32_t i) const noexcept {
    const std::uint32_t t = mul_high(mul_, i);
    return (t + ((i - t) >> shift1_)) >> shift2_;
  }

  /// i / d into q and i % d into r.
  LOCKSTEP_HD constexpr void divmod(std::uint32_t i, std::uint32_t& q, std::uint32_t& r) const noexcept {
    q = quotient(i);
    r = i - q * d_;
  }

private:
  [[nodiscard]] LOCKSTEP_HD static constexpr std::uint32_t mul_high(std::uint32_t a, std::uint32_t b) noexcept {
#if defined(__CUDA_ARCH__)
    return __umulhi(a, b);
#else
    return static_cast<std::uint32_t>((static_cast<std::uint64_t>(a) * b) >> 32);
#endif
  }

  std::uint32_t d_ = 1;       ///< the divisor
  std::uint32_t mul_ = 1;     ///< m'
  std::uint32_t shift1_ = 0;  ///< min(l, 1)
  std::uint32_t shift2_ = 0;  ///< max(l - 1, 0)
};

}  // namespace lockstep
