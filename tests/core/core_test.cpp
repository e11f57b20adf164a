// Tests of core/: the counter-based RNG, the error hierarchy and the device tags.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <set>
#include <type_traits>
#include <vector>

#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/random.hpp>

namespace ls = lockstep;

// A user-defined device tag outside the library's namespace.
struct my_device {
  using kind_type = ls::cpus;
  static constexpr std::size_t ordinal = 7;
};
// A kind of the user's own, and a tag of it: neither a cpu nor a gpu, whatever it resembles.
struct my_kind {
  using kind_type = my_kind;
};
template <std::size_t I>
struct my_accel {
  using kind_type = my_kind;
  static constexpr std::size_t ordinal = I;
};

static_assert(ls::device<ls::cpu<0>> && ls::device<ls::gpu<3>> && ls::device<my_device>);
static_assert(!ls::device<int>);
static_assert(ls::is_cpu_v<ls::cpu<2>> && !ls::is_gpu_v<ls::cpu<2>>);
static_assert(ls::is_gpu_v<ls::gpu<1>> && !ls::is_cpu_v<ls::gpu<1>>);
static_assert(ls::is_cpu_v<my_device> && !ls::is_cpu_v<int>);
static_assert(ls::cpu<5>::ordinal == 5 && ls::gpu<2>::ordinal == 2);
static_assert(ls::device<my_accel<1>> && ls::device_kind_tag<my_kind> && !ls::device<my_kind>);
static_assert(std::is_same_v<ls::kind_of_t<my_accel<1>>, my_kind> && std::is_same_v<ls::kind_of_t<ls::gpus>, ls::gpus>);
static_assert(!ls::is_gpu_v<my_accel<0>> && !ls::is_cpu_v<my_accel<0>> && !ls::is_gpu_v<my_kind>);
static_assert(ls::all_of_kind_v<ls::gpus, ls::gpu<0>, ls::gpu<1>> && !ls::all_of_kind_v<ls::gpus, ls::gpu<0>, my_accel<1>>);
static_assert(!ls::all_of_kind_v<ls::gpus> && ls::all_of_kind_v<my_kind, my_accel<0>, my_accel<3>>);
// A tag that names no kind is no device.
struct no_kind {
  static constexpr std::size_t ordinal = 0;
};
static_assert(!ls::device<no_kind> && !ls::is_cpu_v<no_kind>);

// A draw is a constant expression: the generator is a pure function.
static_assert(ls::counter_rng(1, 2).u32(3) == ls::counter_rng(1, 2).u32(3));
static_assert(ls::mix_stream(1, 2) != ls::mix_stream(2, 1));

TEST_CASE("philox4x32-10 matches the published known-answer vectors") {
  using ls::philox4x32;
  struct kat {
    philox4x32::block ctr;
    std::uint32_t k0, k1;
    philox4x32::block expect;
  };
  const kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  for (const kat& k : kats) {
    const auto out = philox4x32::generate(k.ctr, k.k0, k.k1);
    for (int w = 0; w < 4; ++w) CHECK(out.v[w] == k.expect.v[w]);
  }
}

TEST_CASE("counter_rng: a draw depends only on (seed, stream, index)") {
  for (std::uint64_t seed : {0ull, 1ull, 42ull, 0xDEADBEEFCAFEull}) {
    for (std::uint64_t stream : {0ull, 3ull, ~0ull}) {
      const ls::counter_rng a(seed, stream), b(seed, stream);
      CHECK(a.seed() == seed);
      CHECK(a.stream() == stream);
      for (std::uint64_t i : {0ull, 1ull, 2ull, 3ull, 4ull, 1000ull, (1ull << 33) + 5}) {
        CHECK(a.u32(i) == b.u32(i));
        CHECK(a.uniform(i) == b.uniform(i));
        CHECK(a.uniform_double(i) == b.uniform_double(i));
        CHECK(a.normal(i) == b.normal(i));
      }
    }
  }
}

TEST_CASE("counter_rng: draws do not depend on the order they are made in") {
  const ls::counter_rng rng(7, 11);
  const std::size_t n = 4096;
  std::vector<std::uint32_t> forward(n), backward(n), shuffled(n);
  for (std::size_t i = 0; i < n; ++i) forward[i] = rng.u32(i);
  for (std::size_t i = n; i-- > 0;) backward[i] = rng.u32(i);
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  // a fixed permutation made from another stream
  const ls::counter_rng perm(99, 0);
  for (std::size_t i = n - 1; i > 0; --i) std::swap(order[i], order[perm.u32(i) % (i + 1)]);
  for (std::size_t i : order) shuffled[i] = rng.u32(i);
  CHECK(forward == backward);
  CHECK(forward == shuffled);
  // u32 words are the words of the 128-bit blocks
  for (std::uint64_t b = 0; b < 16; ++b)
    for (std::uint64_t w = 0; w < 4; ++w) CHECK(rng.u32(4 * b + w) == rng.bits(b).v[w]);
}

TEST_CASE("counter_rng: distinct streams and seeds give distinct sequences") {
  const std::size_t n = 2000;
  std::vector<std::vector<std::uint32_t>> seqs;
  for (std::uint64_t seed : {1ull, 2ull, 1ull << 32})
    for (std::uint64_t stream : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{1} << 32, ls::mix_stream(5, 6)}) {
      std::vector<std::uint32_t> s(n);
      const ls::counter_rng rng(seed, stream);
      for (std::size_t i = 0; i < n; ++i) s[i] = rng.u32(i);
      seqs.push_back(std::move(s));
    }
  for (std::size_t a = 0; a < seqs.size(); ++a)
    for (std::size_t b = a + 1; b < seqs.size(); ++b) {
      std::size_t equal = 0;
      for (std::size_t i = 0; i < n; ++i) equal += seqs[a][i] == seqs[b][i];
      CAPTURE(a);
      CAPTURE(b);
      CHECK(equal <= 1);  // 32-bit collisions at the same index: expected 2000 / 2^32
    }
}

TEST_CASE("counter_rng: uniform draws have the moments of a uniform distribution on the unit interval") {
  const ls::counter_rng rng(2024, 3);
  const std::size_t n = 100'000;
  double s = 0, s2 = 0, sd = 0, sd2 = 0;
  float lo = 1, hi = 0;
  std::size_t low_half = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float u = rng.uniform(i);
    const double d = rng.uniform_double(i);
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    REQUIRE(d >= 0.0);
    REQUIRE(d < 1.0);
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    s += u;
    s2 += double(u) * u;
    sd += d;
    sd2 += d * d;
    low_half += u < 0.5f;
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  const double dmean = sd / n, dvar = sd2 / n - dmean * dmean;
  // standard error of the mean: sqrt(1/12 / 1e5) ~ 9.1e-4; allow 5 of them
  CHECK(std::abs(mean - 0.5) < 5e-3);
  CHECK(std::abs(dmean - 0.5) < 5e-3);
  CHECK(std::abs(var - 1.0 / 12) < 2e-3);
  CHECK(std::abs(dvar - 1.0 / 12) < 2e-3);
  CHECK(lo < 1e-3f);
  CHECK(hi > 0.999f);
  CHECK(std::abs(double(low_half) / n - 0.5) < 5e-3);
}

TEST_CASE("counter_rng: every bit of u32 is balanced") {
  const ls::counter_rng rng(5, 5);
  const std::size_t n = 100'000;
  std::size_t ones[32] = {};
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t w = rng.u32(i);
    for (int b = 0; b < 32; ++b) ones[b] += (w >> b) & 1u;
  }
  for (int b = 0; b < 32; ++b) {
    CAPTURE(b);
    CHECK(std::abs(double(ones[b]) / n - 0.5) < 8e-3);  // sigma = 1.6e-3
  }
}

TEST_CASE("counter_rng: normal draws have mean 0 and variance 1") {
  const ls::counter_rng rng(77, 1);
  const std::size_t n = 100'000;
  double s = 0, s2 = 0, s4 = 0;
  std::size_t within1 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double z = rng.normal(i);
    REQUIRE(std::isfinite(z));
    s += z;
    s2 += z * z;
    s4 += z * z * z * z;
    within1 += std::abs(z) < 1.0;
  }
  const double mean = s / n, var = s2 / n - mean * mean;
  CHECK(std::abs(mean) < 0.016);        // sigma 3.2e-3
  CHECK(std::abs(var - 1.0) < 0.03);    // sigma ~4.5e-3
  CHECK(std::abs(s4 / n - 3.0) < 0.15); // kurtosis of a normal
  CHECK(std::abs(double(within1) / n - 0.6827) < 0.01);
}

TEST_CASE("mix_stream separates keys") {
  std::set<std::uint64_t> seen;
  for (std::uint64_t a = 0; a < 64; ++a)
    for (std::uint64_t b = 0; b < 64; ++b) seen.insert(ls::mix_stream(a, b));
  CHECK(seen.size() == 64u * 64u);
}

TEST_CASE("every error type derives from lockstep::error and keeps its message") {
  auto check = []<class E>(std::type_identity<E>) {
    static_assert(std::is_base_of_v<ls::error, E>);
    static_assert(std::is_base_of_v<std::runtime_error, E>);
    try {
      throw E("file x.idx offset 12");
    } catch (const ls::error& e) {
      CHECK(std::string(e.what()) == "file x.idx offset 12");
      CHECK(dynamic_cast<const E*>(&e) != nullptr);
    }
  };
  check(std::type_identity<ls::data_error>{});
  check(std::type_identity<ls::shape_error>{});
  check(std::type_identity<ls::config_error>{});
  check(std::type_identity<ls::device_error>{});
  check(std::type_identity<ls::timeout_error>{});
  check(std::type_identity<ls::replica_error>{});
  check(std::type_identity<ls::checkpoint_error>{});
  static_assert(!std::is_base_of_v<ls::data_error, ls::shape_error>);
}
