// dropout's host path (detail::dropout_host: Philox blocks drawn per chunk, then a vectorised mask
// and scale) against the per-block operation the other devices run: the same bits for every start
// offset, length and rate, in float and double, with infinities and NaNs in the input. The bulk
// Philox generator it draws with (backend::philox_words) against counter_rng::bits, and the
// backward mask against its definition.
#include <doctest/doctest.h>

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <lockstep/backend/host/philox.hpp>
#include <lockstep/layers/dropout.hpp>

namespace ls = lockstep;

namespace {

/// Input element i: ordinary values with an infinity, a NaN and a negative zero among them.
template <class T>
T dropout_input(std::size_t i) {
  switch (i % 11) {
    case 3: return std::numeric_limits<T>::infinity();
    case 7: return std::numeric_limits<T>::quiet_NaN();
    case 9: return T(-0.0);
    default: return static_cast<T>(static_cast<double>(i) * 0.37 - 5.0);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("dropout's host path draws the masks of one dropout_op call per Philox block, bit for bit", T, float,
                   double) {
  const ls::counter_rng rng(1234, 77);
  std::size_t cases = 0;
  // The last start puts a carry into the high word of the block index inside the first chunk.
  for (const std::uint64_t first : {0ull, 1ull, 2ull, 3ull, 5ull, 1021ull, (1ull << 34) + 3, 0xFFFFFFF9ull * 4 + 1})
    for (const std::size_t n : {0, 1, 2, 3, 4, 5, 7, 255, 256, 257, 1021, 4099})
      for (const float rate : {0.1f, 0.2f, 1.0f / 3.0f, 0.5f, 0.9f}) {
        CAPTURE(first);
        CAPTURE(n);
        CAPTURE(rate);
        std::vector<T> x(n), y_ref(n, T(-7)), y(n, T(-7));
        std::vector<std::uint8_t> keep_ref(n, 0xEE), keep(n, 0xEE);
        for (std::size_t i = 0; i < n; ++i) x[i] = dropout_input<T>(i);
        const T scale = static_cast<T>(1.0 / (1.0 - static_cast<double>(rate)));
        const ls::detail::dropout_op<T> ref{x.data(), y_ref.data(), keep_ref.data(), rng, first, n, rate, scale};
        for (std::uint64_t b = 0; b < ref.blocks(); ++b) ref(b);
        ls::detail::dropout_host(ls::detail::dropout_op<T>{x.data(), y.data(), keep.data(), rng, first, n, rate, scale});
        CHECK((n == 0 || std::memcmp(y.data(), y_ref.data(), n * sizeof(T)) == 0));
        CHECK(keep == keep_ref);
        CHECK(std::all_of(keep.begin(), keep.end(), [](std::uint8_t k) { return k <= 1; }));
        ++cases;
      }
  CHECK(cases == 8 * 12 * 5);
}

TEST_CASE("philox_words writes the words of counter_rng::bits for every start and count") {
  INFO("philox_words runs with ", ls::backend::philox_words_isa());
  std::size_t cases = 0;
  for (const auto& key : {std::pair{0ull, 0ull}, std::pair{1234ull, 77ull},
                          std::pair{0xFEDCBA9876543210ull, 0x0123456789ABCDEFull}}) {
    const std::uint64_t seed = key.first;  // plain variables: CAPTURE's lambda cannot name a structured binding
    const std::uint64_t stream = key.second;
    for (const std::uint64_t first : {0ull, 1ull, 7ull, 0xFFFFFFFFull - 16, 0xFFFFFFFFull - 2, 0xFFFFFFFFull,
                                      (1ull << 40) + 5, ~0ull - 20})
      for (const std::size_t blocks : {0, 1, 2, 15, 16, 17, 31, 32, 33, 100}) {
        CAPTURE(seed);
        CAPTURE(stream);
        CAPTURE(first);
        CAPTURE(blocks);
        const ls::counter_rng rng(seed, stream);
        std::vector<std::uint32_t> words(4 * blocks + 1, 0xDEADBEEFu);  // one past the end stays untouched
        ls::backend::philox_words(rng, first, blocks, words.data());
        bool same = true;
        for (std::size_t b = 0; b < blocks; ++b) {
          const ls::philox4x32::block bits = rng.bits(first + b);  // the index wraps modulo 2^64, as in bits()
          for (std::size_t w = 0; w < 4; ++w) same = same && words[4 * b + w] == bits.v[w];
        }
        CHECK(same);
        CHECK(words[4 * blocks] == 0xDEADBEEFu);
        ++cases;
      }
  }
  CHECK(cases == 3 * 8 * 10);
}

TEST_CASE_TEMPLATE("dropout's backward mask gives dy times the scale where kept and +0 where dropped", T, float, double) {
  const std::size_t n = 1031;
  std::vector<T> dy(n), dx(n, T(-7));
  std::vector<std::uint8_t> keep(n);
  for (std::size_t i = 0; i < n; ++i) {
    dy[i] = dropout_input<T>(i);
    keep[i] = (i * 5) % 7 < 2 ? 0 : 1;
  }
  const T scale = T(1.25);
  ls::backend::host_context ctx;
  ls::backend::for_each_index(ctx, n, ls::detail::dropout_mask_op<T>{dy.data(), keep.data(), dx.data(), scale});
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    if (keep[i] == 0) {
      CHECK(dx[i] == T(0));
      CHECK(!std::signbit(dx[i]));  // +0 even where dy is negative, infinite or NaN
    } else {
      const T want = static_cast<T>(dy[i] * scale);
      CHECK(std::memcmp(&dx[i], &want, sizeof(T)) == 0);
    }
  }
}

TEST_CASE("dropout's host path keeps about 1 - rate of the elements and writes +0 where it drops") {
  const std::size_t n = 100003;
  std::vector<float> x(n, -2.0f), y(n);
  std::vector<std::uint8_t> keep(n);
  for (const float rate : {0.05f, 0.2f, 0.5f, 0.95f}) {
    CAPTURE(rate);
    ls::detail::dropout_host(ls::detail::dropout_op<float>{x.data(), y.data(), keep.data(), ls::counter_rng(9, 3), 12,
                                                            n, rate, 1.0f / (1.0f - rate)});
    std::size_t kept = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (keep[i] == 1) {
        ++kept;
        CHECK(y[i] == -2.0f * (1.0f / (1.0f - rate)));
      } else {
        REQUIRE(keep[i] == 0);
        CHECK(!std::signbit(y[i]));
        CHECK(y[i] == 0.0f);
      }
    }
    // Binomial(n, 1 - rate): within 5 standard deviations.
    const double mean = static_cast<double>(n) * (1.0 - rate);
    const double sd = std::sqrt(static_cast<double>(n) * rate * (1.0 - rate));
    CHECK(std::abs(static_cast<double>(kept) - mean) < 5 * sd);
  }
}
