// Tests of backend/host: every kernel against a naive host reference over edge sizes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <lockstep/backend/host.hpp>
#include <lockstep/core/random.hpp>

#include "support/random.hpp"

namespace ls = lockstep;
using ls::backend::trans;

static_assert(std::is_same_v<ls::context_t<ls::cpu<0>>, ls::host_context>);
static_assert(std::is_same_v<ls::context_t<ls::cpu<3>>, ls::host_context>);

namespace {
using test_support::random_vector;
template <class T>
T ref_at(const std::vector<T>& x, std::size_t ld, trans t, std::size_t r, std::size_t c) {
  return test_support::op_at(x, ld, t, r, c);
}

const std::size_t sizes[] = {0, 1, 2, 3, 7, 13};
}  // namespace

TEST_CASE_TEMPLATE("gemm matches the naive product for all transpositions and edge sizes", T, float, double) {
  const ls::host_context ctx(1);
  ctx.activate();
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-13;
  std::uint64_t stream = 0;
  for (trans ta : {trans::no, trans::yes})
    for (trans tb : {trans::no, trans::yes})
      for (std::size_t m : sizes)
        for (std::size_t n : sizes)
          for (std::size_t k : sizes)
            for (std::size_t pad : {0u, 3u}) {
              CAPTURE(static_cast<int>(ta));
              CAPTURE(static_cast<int>(tb));
              CAPTURE(m);
              CAPTURE(n);
              CAPTURE(k);
              CAPTURE(pad);
              // stored shapes (row-major): A is m x k or k x m, B is k x n or n x k
              const std::size_t a_rows = ta == trans::no ? m : k, a_cols = ta == trans::no ? k : m;
              const std::size_t b_rows = tb == trans::no ? k : n, b_cols = tb == trans::no ? n : k;
              const std::size_t lda = std::max<std::size_t>(1, a_cols + pad);
              const std::size_t ldb = std::max<std::size_t>(1, b_cols + pad);
              const std::size_t ldc = std::max<std::size_t>(1, n + pad);
              const auto a = random_vector<T>(a_rows * lda + 1, ++stream);
              const auto b = random_vector<T>(b_rows * ldb + 1, ++stream);
              auto c = random_vector<T>(m * ldc + 1, ++stream);
              const auto c0 = c;
              const T alpha = T(0.75), beta = T(-0.5);
              gemm(ctx, ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
              for (std::size_t r = 0; r < m; ++r)
                for (std::size_t col = 0; col < ldc; ++col) {
                  if (col >= n) {  // padding between rows is left alone
                    CHECK(c[r * ldc + col] == c0[r * ldc + col]);
                    continue;
                  }
                  double ref = 0;
                  for (std::size_t i = 0; i < k; ++i)
                    ref += double(ref_at(a, lda, ta, r, i)) * double(ref_at(b, ldb, tb, i, col));
                  ref = double(alpha) * ref + double(beta) * double(c0[r * ldc + col]);
                  CHECK(std::abs(double(c[r * ldc + col]) - ref) <= tol * (1 + double(k)));
                }
              CHECK(c[m * ldc] == c0[m * ldc]);  // nothing written past the end
            }
}

TEST_CASE_TEMPLATE("column_sums, broadcast_rows and sum match naive loops", T, float, double) {
  const ls::host_context ctx;
  for (std::size_t rows : {0u, 1u, 2u, 5u, 31u})
    for (std::size_t cols : {1u, 3u, 17u}) {
      CAPTURE(rows);
      CAPTURE(cols);
      const auto x = random_vector<T>(rows * cols, rows * 100 + cols);
      std::vector<T> out(32, T(42));  // fixed size: sidesteps a g++ 12 -Wstringop-overflow false positive
      column_sums(ctx, x.data(), rows, cols, out.data());
      for (std::size_t c = 0; c < cols; ++c) {
        T ref = 0;  // rows added in order: the same rounding as the kernel promises
        for (std::size_t r = 0; r < rows; ++r) ref += x[r * cols + c];
        CHECK(out[c] == ref);
      }
      CHECK(out[cols] == T(42));

      const auto v = random_vector<T>(cols, 7);
      std::vector<T> y(rows * cols + 1, T(-3));
      broadcast_rows(ctx, y.data(), v.data(), rows, cols);
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) CHECK(y[r * cols + c] == v[c]);
      CHECK(y[rows * cols] == T(-3));
    }
  for (std::size_t n : {0u, 1u, 2u, 3u, 97u, 1009u}) {
    CAPTURE(n);
    const auto x = random_vector<T>(n, n);
    double ref = 0;
    for (T v : x) ref += double(v);
    CHECK(sum(ctx, x.data(), n) == doctest::Approx(ref).epsilon(1e-12));
  }
}

TEST_CASE("fill, copy, scale and for_each_index touch exactly the requested range") {
  const ls::host_context ctx;
  for (std::size_t n : {0u, 1u, 2u, 13u, 257u}) {
    CAPTURE(n);
    std::vector<float> a(n + 1, 9.0f), b(n + 1, -1.0f);
    fill(ctx, a.data(), n, 2.5f);
    for (std::size_t i = 0; i < n; ++i) CHECK(a[i] == 2.5f);
    CHECK(a[n] == 9.0f);
    scale(ctx, a.data(), n, 4.0f);
    for (std::size_t i = 0; i < n; ++i) CHECK(a[i] == 10.0f);
    CHECK(a[n] == 9.0f);
    copy(ctx, b.data(), a.data(), n);
    for (std::size_t i = 0; i < n; ++i) CHECK(b[i] == 10.0f);
    CHECK(b[n] == -1.0f);
    std::vector<double> h(n + 1, 0.0), d(n + 1, 0.0);
    for (std::size_t i = 0; i < n; ++i) h[i] = double(i) * 0.5;
    copy_from_host(ctx, d.data(), h.data(), n);
    std::vector<double> back(n + 1, -7.0);
    copy_to_host(ctx, back.data(), d.data(), n);
    for (std::size_t i = 0; i < n; ++i) CHECK(back[i] == double(i) * 0.5);
    CHECK(back[n] == -7.0);
    std::vector<int> hits(n + 1, 0);
    for_each_index(ctx, n, [&](std::size_t i) { ++hits[i]; });
    for (std::size_t i = 0; i < n; ++i) CHECK(hits[i] == 1);
    CHECK(hits[n] == 0);
  }
}

TEST_CASE("host_context validates its thread budget and applies it") {
  CHECK_THROWS_AS(ls::host_context(0), ls::config_error);
  CHECK_THROWS_AS(ls::host_context(-2), ls::config_error);
  const ls::host_context two(2);
  CHECK(two.blas_threads() == 2);
  two.activate();
  CHECK(openblas_get_num_threads() <= 2);  // OpenBLAS caps the request at its build limit
  const ls::host_context one(1);
  one.activate();
  CHECK(openblas_get_num_threads() == 1);
  one.synchronize();
  CHECK(ls::hardware_threads() >= 1);
  CHECK(!ls::blas_core_name().empty());
}
