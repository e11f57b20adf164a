// index_divider: i / d by multiply-high and shifts equals the division for every 32-bit dividend
// tried, over divisors from 1 to 2^32 - 1: the edges of each (0, 1, d - 1, d, d + 1, multiples
// around 2^31 and 2^32 - 1) and many random dividends.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include <lockstep/core/index_divider.hpp>
#include <lockstep/core/random.hpp>

namespace ls = lockstep;

namespace {

// Every quotient and remainder of `d` over the edge dividends and `randoms` random ones; returns
// the number of mismatches (and reports the first).
std::size_t mismatches(std::uint32_t d, std::size_t randoms) {
  const ls::index_divider div(d);
  std::vector<std::uint32_t> is{0u, 1u, 2u, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0x7fffffffu, 0x80000000u,
                                0xfffffffeu, 0xffffffffu};
  const std::uint64_t near_top = (0xffffffffull / d) * d;  // the largest multiple of d
  is.push_back(static_cast<std::uint32_t>(near_top));
  is.push_back(static_cast<std::uint32_t>(near_top - 1));
  const ls::counter_rng rng(d, 17);
  for (std::size_t k = 0; k < randoms; ++k) is.push_back(rng.u32(k));
  std::size_t bad = 0;
  for (std::uint32_t i : is) {
    std::uint32_t q = 0, r = 0;
    div.divmod(i, q, r);
    if (q != i / d || r != i % d || div.quotient(i) != i / d) {
      if (bad == 0) {
        CAPTURE(d);
        CAPTURE(i);
        CHECK(q == i / d);
        CHECK(r == i % d);
      }
      ++bad;
    }
  }
  return bad;
}

}  // namespace

TEST_CASE("index_divider divides every 32-bit index exactly, for divisors from 1 to 2^32 - 1") {
  static_assert(ls::index_divider(7).quotient(50) == 7 && ls::index_divider().quotient(9) == 9);
  std::size_t bad = 0, divisors = 0;
  for (std::uint32_t d = 1; d <= 4096; ++d, ++divisors) bad += mismatches(d, 64);
  // Powers of two and their neighbours, primes, the shards' widths (batch x positions) and the top.
  for (std::uint32_t p = 12; p < 32; ++p)
    for (std::uint32_t d : {(1u << p) - 1, 1u << p, (1u << p) + 1}) {
      bad += mismatches(d, 256);
      ++divisors;
    }
  for (std::uint32_t d : {50176u, 200704u, 65537u, 1000003u, 2147483647u, 0xfffffffbu, 0xfffffffeu, 0xffffffffu}) {
    bad += mismatches(d, 4096);
    ++divisors;
  }
  const ls::counter_rng rng(3, 4);
  for (std::size_t k = 0; k < 2000; ++k, ++divisors) bad += mismatches(rng.u32(k) | 1u, 32);
  CHECK(divisors > 6000);
  CHECK(bad == 0);
}

TEST_CASE("index_divider takes a divisor of 0 as 1") {
  const ls::index_divider div(0);
  CHECK(div.divisor() == 1);
  CHECK(div.quotient(12345) == 12345);
}
