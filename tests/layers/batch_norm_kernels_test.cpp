// batch_norm's kernels over the index spaces GPUs run them on. The host layer runs the
// per-channel combinations through the very functors a GPU launches; its row sums (over lanes of
// the positions when there are 64 or more) and its elementwise passes (normalisation, the input
// gradients) it runs one row-channel per call, where a GPU runs one lane or one element per call.
// Here: the per-element form gives the bits of the row form, at shapes whose positions per
// channel are 1, primes and a full image, and both match a double reference of the formula.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <lockstep/backend/host/context.hpp>
#include <lockstep/layers/activations.hpp>
#include <lockstep/layers/batch_norm.hpp>
#include <lockstep/testing/report.hpp>

#include "../support/random.hpp"

namespace ls = lockstep;
using test_support::random_vector;

namespace {

// Elementwise pass `make(out)` (an op writing into `out`) run one call per element and one call
// per row-channel over n = rows C P elements: the same bits, and within 1e-6 of want(i).
template <std::size_t C, std::size_t P, class T, class Make, class Want>
void check_forms(const char* what, std::size_t rows, const Make& make, const Want& want) {
  const std::string label(what);  // doctest prints a const char* as an address
  CAPTURE(label);
  const std::size_t n = rows * C * P;
  std::vector<T> by_element(n, T(7)), by_row(n, T(8));
  const auto e = make(by_element.data());
  const auto r = make(by_row.data());
  using Op = std::remove_cv_t<decltype(e)>;
  for (std::size_t i = 0; i < n; ++i) ls::detail::bn_elements_op<Op, C, P>{e}(i);
  for (std::size_t i = 0; i < rows * C; ++i) ls::detail::bn_rows_op<Op, C, P>{r}(i);
  CHECK(std::memcmp(by_element.data(), by_row.data(), n * sizeof(T)) == 0);
  ls::testing::element_report report(label + " vs a double reference", "kernel", "reference");
  for (std::size_t i = 0; i < n; ++i) {
    const double w = want(i, (i / P) % C);
    report.close(i, double(by_element[i]), w, 1e-6 * (1 + std::abs(w)));
  }
  CHECK_MESSAGE(report.ok(), report.text());
}

template <class T, std::size_t C, std::size_t P>
void check_elementwise(std::size_t rows) {
  CAPTURE(C);
  CAPTURE(P);
  CAPTURE(rows);
  const std::size_t n = rows * C * P;
  const auto x = random_vector<T>(n, 91, T(-4), T(6));
  const auto dy = random_vector<T>(n, 92);
  const auto mean = random_vector<T>(C, 93);
  const auto inv = random_vector<T>(C, 94, T(0.2), T(3));
  const auto gamma = random_vector<T>(C, 95, T(-2), T(2));
  const auto beta = random_vector<T>(C, 96);
  const auto var = random_vector<T>(C, 97, T(0.01), T(4));
  const double eps = 1e-5;

  check_forms<C, P, T>(
      "normalised output", rows,
      [&](T* out) { return ls::detail::bn_normalise_op<T>{x.data(), out, mean.data(), inv.data(), gamma.data(), beta.data()}; },
      [&](std::size_t i, std::size_t c) {
        return double(gamma[c]) * (double(x[i]) - double(mean[c])) * double(inv[c]) + double(beta[c]);
      });
  check_forms<C, P, T>(
      "normalised output with relu applied", rows,
      [&](T* out) {
        return ls::detail::bn_normalise_op<T, ls::relu_fn>{x.data(), out, mean.data(), inv.data(), gamma.data(), beta.data()};
      },
      [&](std::size_t i, std::size_t c) {
        return std::max(0.0, double(gamma[c]) * (double(x[i]) - double(mean[c])) * double(inv[c]) + double(beta[c]));
      });
  check_forms<C, P, T>(
      "evaluation-mode input gradient", rows,
      [&](T* out) { return ls::detail::bn_eval_input_grad_op<T>{dy.data(), out, var.data(), gamma.data(), eps}; },
      [&](std::size_t i, std::size_t c) { return double(dy[i]) * double(gamma[c]) / std::sqrt(double(var[c]) + eps); });

  // Training-mode input gradient from the per-channel constants (γ/σ, mean(dy), mean(dy x̂)).
  std::vector<T> grad_k(3 * C);
  for (std::size_t c = 0; c < C; ++c) {
    grad_k[c] = T(double(gamma[c]) * double(inv[c]));
    grad_k[C + c] = mean[c];  // any values: the form, not the statistics, is checked here
    grad_k[2 * C + c] = beta[c];
  }
  check_forms<C, P, T>(
      "training-mode input gradient", rows,
      [&](T* out) {
        return ls::detail::bn_input_grad_op<T, C>{x.data(), dy.data(), out, grad_k.data(), mean.data(), inv.data()};
      },
      [&](std::size_t i, std::size_t c) {
        const double xhat = (double(x[i]) - double(mean[c])) * double(inv[c]);
        return double(grad_k[c]) * (double(dy[i]) - double(grad_k[C + c]) - xhat * double(grad_k[2 * C + c]));
      });
}

// Each row's statistics (one call per row-channel, or lane sums for 64 positions or more) and
// their combination (one call per channel) against two-pass double references of each row and
// of the whole batch.
template <class T, std::size_t C, std::size_t P>
void check_statistics(std::size_t rows) {
  CAPTURE(C);
  CAPTURE(P);
  CAPTURE(rows);
  const auto x = random_vector<T>(rows * C * P, 98, T(-3), T(9));
  std::vector<T> ws(rows * 2 * C), mean(C), inv(C), run_mean(C, T(0.5)), run_var(C, T(2));
  std::vector<T> lanes(2 * rows * C * ls::detail::bn_lanes<P>);
  ls::host_context ctx;
  ls::detail::bn_row_statistics<T, C, P>(ctx, x.data(), rows, ws.data(), lanes.data());
  constexpr std::size_t L = ls::detail::bn_lanes<P>;
  if constexpr (L > 1) {  // the GPU's form, one call per lane, gives the host's bits
    std::vector<T> ws_lanes(ws.size(), T(-1));
    T* const sums = lanes.data();
    T* const devs = lanes.data() + rows * C * L;
    for (std::size_t i = 0; i < rows * C * L; ++i) ls::detail::bn_lane_sum_op<T, P, L>{x.data(), sums}(i);
    for (std::size_t i = 0; i < rows * C * L; ++i) ls::detail::bn_lane_deviation_op<T, P, L>{x.data(), sums, devs}(i);
    for (std::size_t r = 0; r < rows * C; ++r) ls::detail::bn_lane_combine_op<T, C, P, L>{sums, devs, ws_lanes.data(), true}(r);
    CHECK(std::memcmp(ws_lanes.data(), ws.data(), ws.size() * sizeof(T)) == 0);
  }
  // Each row's own statistics against a double reference of that row.
  for (std::size_t r = 0; r < rows * C; ++r) {
    CAPTURE(r);
    double s = 0, q = 0;
    for (std::size_t j = 0; j < P; ++j) s += double(x[r * P + j]);
    const double m = s / double(P);
    for (std::size_t j = 0; j < P; ++j) q += (double(x[r * P + j]) - m) * (double(x[r * P + j]) - m);
    const std::size_t b = r / C, c = r % C;
    CHECK(std::abs(double(ws[b * 2 * C + c]) - m) <= 1e-6 * (1 + std::abs(m)));
    CHECK(std::abs(double(ws[b * 2 * C + C + c]) - q) <= 1e-6 * (1 + q));
  }
  for (std::size_t c = 0; c < C; ++c)
    ls::detail::bn_combine_op<T, C, P>{ws.data(), rows, mean.data(), inv.data(), run_mean.data(), run_var.data(), 0.25, 1e-5}(c);
  for (std::size_t c = 0; c < C; ++c) {
    CAPTURE(c);
    double s = 0, q = 0;
    for (std::size_t b = 0; b < rows; ++b)
      for (std::size_t j = 0; j < P; ++j) s += double(x[(b * C + c) * P + j]);
    const double count = double(rows * P), m = s / count;
    for (std::size_t b = 0; b < rows; ++b)
      for (std::size_t j = 0; j < P; ++j) q += (double(x[(b * C + c) * P + j]) - m) * (double(x[(b * C + c) * P + j]) - m);
    const double var = q / count;
    CHECK(std::abs(double(mean[c]) - m) <= 1e-6 * (1 + std::abs(m)));
    CHECK(std::abs(double(inv[c]) - 1 / std::sqrt(var + 1e-5)) <= 1e-6 / std::sqrt(var + 1e-5));
    CHECK(std::abs(double(run_mean[c]) - (0.75 * 0.5 + 0.25 * m)) <= 1e-6 * (1 + std::abs(m)));
    if (count > 1) {
      const double unbiased = q / (count - 1);
      CHECK(std::abs(double(run_var[c]) - (0.75 * 2 + 0.25 * unbiased)) <= 1e-6 * (1 + unbiased));
    } else {
      CHECK(double(run_var[c]) == 2.0);  // one value has no spread: the running variance stays
    }
  }
}

}  // namespace

TEST_CASE("batch_norm's elementwise kernels: one call per element (GPUs) gives the bits of one call per row (host)") {
  for (std::size_t rows : {1u, 2u, 5u}) {
    check_elementwise<float, 3, 1>(rows);
    check_elementwise<float, 5, 7>(rows);
    check_elementwise<float, 2, 784>(rows);
    check_elementwise<double, 4, 13>(rows);
  }
}

TEST_CASE("batch_norm's row statistics and their combination in row order match a two-pass reference") {
  static_assert(ls::detail::bn_lanes<49> == 1 && ls::detail::bn_lanes<64> == 32 && ls::detail::bn_lanes<784> == 32);
  for (std::size_t rows : {1u, 2u, 3u, 17u}) {
    check_statistics<float, 3, 1>(rows);
    check_statistics<float, 4, 49>(rows);
    check_statistics<double, 2, 13>(rows);
    check_statistics<float, 3, 64>(rows);    // lanes of two positions each
    check_statistics<float, 2, 97>(rows);    // uneven lanes (a prime)
    check_statistics<float, 2, 784>(rows);   // the CNN's first layer
    check_statistics<double, 2, 196>(rows);  // the CNN's second layer
  }
}

namespace {
// Each row's sums of dy and dy x̂ per channel (lanes or not) against a double reference.
template <class T, std::size_t C, std::size_t P>
void check_row_gradients(std::size_t rows) {
  CAPTURE(C);
  CAPTURE(P);
  CAPTURE(rows);
  const auto x = random_vector<T>(rows * C * P, 99, T(-3), T(9));
  const auto dy = random_vector<T>(rows * C * P, 100);
  const auto mean = random_vector<T>(C, 101);
  const auto inv = random_vector<T>(C, 102, T(0.2), T(3));
  std::vector<T> ws(rows * 2 * C), lanes(2 * rows * C * ls::detail::bn_lanes<P>);
  ls::host_context ctx;
  ls::detail::bn_row_gradients<T, C, P>(ctx, x.data(), dy.data(), mean.data(), inv.data(), rows, ws.data(), lanes.data());
  constexpr std::size_t L = ls::detail::bn_lanes<P>;
  if constexpr (L > 1) {  // the GPU's form, one call per lane, gives the host's bits
    std::vector<T> ws_lanes(ws.size(), T(-1));
    T* const dys = lanes.data();
    T* const dyxs = lanes.data() + rows * C * L;
    for (std::size_t i = 0; i < rows * C * L; ++i)
      ls::detail::bn_lane_grad_op<T, C, P, L>{x.data(), dy.data(), mean.data(), inv.data(), dys, dyxs}(i);
    for (std::size_t r = 0; r < rows * C; ++r) ls::detail::bn_lane_combine_op<T, C, P, L>{dys, dyxs, ws_lanes.data(), false}(r);
    CHECK(std::memcmp(ws_lanes.data(), ws.data(), ws.size() * sizeof(T)) == 0);
  }
  for (std::size_t r = 0; r < rows * C; ++r) {
    CAPTURE(r);
    const std::size_t b = r / C, c = r % C;
    double a = 0, q = 0, scale = 0;
    for (std::size_t j = 0; j < P; ++j) {
      const double g = double(dy[r * P + j]), xhat = (double(x[r * P + j]) - double(mean[c])) * double(inv[c]);
      a += g;
      q += g * xhat;
      scale += std::abs(g * xhat) + std::abs(g);
    }
    CHECK(std::abs(double(ws[b * 2 * C + c]) - a) <= 1e-6 * (1 + scale));
    CHECK(std::abs(double(ws[b * 2 * C + C + c]) - q) <= 1e-6 * (1 + scale));
  }
}
}  // namespace

TEST_CASE("batch_norm's row gradient sums, one sum or lanes of positions, match a double reference") {
  for (std::size_t rows : {1u, 3u, 17u}) {
    check_row_gradients<float, 3, 1>(rows);
    check_row_gradients<float, 4, 49>(rows);
    check_row_gradients<float, 3, 64>(rows);
    check_row_gradients<float, 2, 97>(rows);
    check_row_gradients<float, 2, 784>(rows);
    check_row_gradients<double, 2, 196>(rows);
  }
}
