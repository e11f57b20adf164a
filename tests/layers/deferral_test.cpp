// Deferred weight gradients (layers/deferral.hpp): over every way of cutting an update's rows into
// batches (empty ones, primes, uneven), the weight gradient formed once from the kept rows is
// bitwise the one GEMM over all the rows; with a budget that forces the kept rows to be added in
// early, or a batch too big to keep, it is the same sum within rounding; an update without rows
// writes zeros; the first batch of an update drops what an abandoned update kept; a second update
// of the same cut grows nothing.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <numeric>
#include <vector>

#include <lockstep/core/random.hpp>
#include <lockstep/layers/deferral.hpp>

namespace ls = lockstep;

namespace {

// `n` values from a counter stream (uniform in [-1, 1)).
std::vector<float> values(std::size_t n, std::uint64_t stream) {
  const ls::counter_rng rng(5, stream);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 2.0f * rng.uniform(i) - 1.0f;
  return v;
}

// dW = x^T dy over `rows` rows through weight_gradient, as an update cut into `sizes`, with
// deferral `d` (null: batch by batch). dw starts as garbage (the update's first batch overwrites).
std::vector<float> through_batches(const ls::host_context& ctx, ls::gradient_deferral* d, const std::vector<float>& x,
                                   const std::vector<float>& dy, std::size_t in, std::size_t out,
                                   const std::vector<std::size_t>& sizes, const void* key) {
  std::vector<float> dw(in * out, 12345.0f);
  std::size_t lo = 0;
  for (std::size_t j = 0; j < sizes.size(); ++j) {
    ls::pass_info info = ls::pass_info::for_training(1, 1);
    info.accumulate = j > 0;
    info.last_of_update = j + 1 == sizes.size();
    info.deferral = d;
    ls::weight_gradient(ctx, info, key, x.data() + lo * in, dy.data() + lo * out, sizes[j], in, out, dw.data());
    lo += sizes[j];
  }
  return dw;
}

double worst_relative(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]) / std::max(1.0, std::fabs(static_cast<double>(b[i]))));
  return worst;
}

}  // namespace

TEST_CASE("deferred weight gradients: one GEMM over the kept rows, bitwise, for every cut of the rows") {
  const ls::host_context ctx(1);
  const std::vector<std::vector<std::size_t>> cuts = {{37},         {0, 37},       {37, 0},     {1, 36},
                                                      {13, 11, 13}, {5, 0, 7, 25}, {2, 3, 5, 7, 11, 9}};
  for (const std::size_t in : {1u, 3u, 17u})
    for (const std::size_t out : {1u, 8u, 31u})
      for (const auto& sizes : cuts) {
        const std::size_t rows = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
        const auto x = values(rows * in, 1), dy = values(rows * out, 2);
        CAPTURE(in);
        CAPTURE(out);
        CAPTURE(sizes.size());
        CAPTURE(sizes.front());
        // The reference: one GEMM over all the rows.
        const auto one = through_batches(ctx, nullptr, x, dy, in, out, {rows}, &ctx);
        ls::gradient_deferral d;
        d.set_budget(1u << 20);
        d.set_min_gradient_bytes(0);
        const auto deferred = through_batches(ctx, &d, x, dy, in, out, sizes, &ctx);
        CHECK(std::memcmp(deferred.data(), one.data(), one.size() * sizeof(float)) == 0);
        if (sizes.size() > 1) CHECK(d.reserved_bytes() == rows * (in + out) * sizeof(float));
        // Batch by batch (beta = 1 after the first): the same sum, rounded differently.
        const auto added = through_batches(ctx, nullptr, x, dy, in, out, sizes, &ctx);
        CHECK(worst_relative(added, one) <= 1e-5);
        // A second update of the same cut grows nothing and gives the same bits.
        const std::size_t reserved = d.reserved_bytes();
        CHECK(through_batches(ctx, &d, x, dy, in, out, sizes, &ctx) == deferred);
        CHECK(d.reserved_bytes() == reserved);
      }
}

TEST_CASE("deferred weight gradients: a budget too small for the update adds the kept rows in early, within rounding of one GEMM") {
  const ls::host_context ctx(1);
  const std::size_t in = 19, out = 23;
  const std::vector<std::size_t> sizes = {7, 11, 3, 13, 29, 2};  // 65 rows
  const std::size_t rows = 65, row_bytes = (in + out) * sizeof(float);
  const auto x = values(rows * in, 3), dy = values(rows * out, 4);
  const auto one = through_batches(ctx, nullptr, x, dy, in, out, {rows}, &ctx);
  // Budgets of 0 rows (nothing kept: every batch adds), of fewer rows than the largest batch (it
  // is added directly), and of a few batches.
  for (const std::size_t budget_rows : {0u, 1u, 12u, 20u, 30u, 64u, 65u}) {
    CAPTURE(budget_rows);
    ls::gradient_deferral d;
    d.set_budget(budget_rows * row_bytes);
    d.set_min_gradient_bytes(0);
    const auto deferred = through_batches(ctx, &d, x, dy, in, out, sizes, &ctx);
    CHECK(d.reserved_bytes() <= budget_rows * row_bytes);
    CHECK(worst_relative(deferred, one) <= 1e-5);
    if (budget_rows >= rows) CHECK(deferred == one);
  }
}

TEST_CASE("deferred weight gradients: an update without rows writes zeros, and an update's first batch drops what an abandoned one kept") {
  const ls::host_context ctx(1);
  const std::size_t in = 4, out = 5;
  ls::gradient_deferral d;
  d.set_budget(1u << 20);
  d.set_min_gradient_bytes(0);
  const auto x = values(40 * in, 5), dy = values(40 * out, 6);
  const auto zeros = through_batches(ctx, &d, x, dy, in, out, {0, 0, 0}, &ctx);
  CHECK(std::all_of(zeros.begin(), zeros.end(), [](float v) { return v == 0.0f; }));

  // An update abandoned after two batches (its last never came), then a fresh update of 9 rows.
  std::vector<float> dw(in * out, 0.0f);
  for (std::size_t j = 0; j < 2; ++j) {
    ls::pass_info info = ls::pass_info::for_training(1, 1);
    info.accumulate = j > 0;
    info.last_of_update = false;
    info.deferral = &d;
    ls::weight_gradient(ctx, info, &ctx, x.data() + 10 * j * in, dy.data() + 10 * j * out, 10, in, out, dw.data());
  }
  const std::vector<float> x9(x.begin() + 20 * in, x.begin() + 29 * in), dy9(dy.begin() + 20 * out, dy.begin() + 29 * out);
  CHECK(through_batches(ctx, &d, x9, dy9, in, out, {4, 5}, &ctx) == through_batches(ctx, nullptr, x9, dy9, in, out, {9}, &ctx));
  CHECK(d.layers() == 1);
  // The same layer asked for with another shape is an error, not a silent reuse.
  ls::pass_info info = ls::pass_info::for_training(1, 1);
  info.last_of_update = false;
  info.deferral = &d;
  CHECK_THROWS_AS(ls::weight_gradient(ctx, info, &ctx, x.data(), dy.data(), 1, in + 1, out, dw.data()), ls::error);
}

TEST_CASE("deferred weight gradients: a layer below the size threshold adds batch by batch, and one batch per update keeps nothing") {
  const ls::host_context ctx(1);
  const std::size_t in = 16, out = 16;
  const auto x = values(30 * in, 7), dy = values(30 * out, 8);
  ls::gradient_deferral d;
  d.set_budget(1u << 20);
  REQUIRE(d.min_gradient_bytes() == ls::gradient_deferral::default_min_gradient_bytes);
  CHECK(through_batches(ctx, &d, x, dy, in, out, {10, 20}, &ctx) == through_batches(ctx, nullptr, x, dy, in, out, {10, 20}, &ctx));
  d.set_min_gradient_bytes(0);
  (void)through_batches(ctx, &d, x, dy, in, out, {30}, &ctx);
  CHECK(d.layers() == 0);
  CHECK(d.reserved_bytes() == 0);
}
