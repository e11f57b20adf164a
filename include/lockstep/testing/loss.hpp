#pragma once
/// @file loss.hpp
/// The public conformance suite of the loss concept, for doctest. Instantiate it for your own loss
/// from your own test binary with one line:
///
///     TEST_CASE_TEMPLATE_INVOKE(lockstep_loss_conformance, my_loss);
///
/// It checks, in double on the host: the gradient of the returned sum against central finite
/// differences over batch sizes 0, 1, 7 and 64; the SUM + count contract (the count is the number
/// of rows, and the sums of two parts of a batch add up to the sum of the batch, for every split);
/// the empty batch (sum 0, count 0, nothing written); that a null gradient changes nothing but the
/// gradient; and, for a loss with `counts_correct`, that `correct` counts the rows whose arg-max is
/// the label. The targets are class labels when the loss counts correct rows, regression values
/// otherwise; specialise `lockstep::testing::loss_uses_labels<L>` to choose. Include it from a
/// doctest test file compiled by a host compiler.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <lockstep/backend/host.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/testing/report.hpp>

namespace lockstep::testing {

/// True when the suite feeds loss L class labels (else regression targets as wide as the output).
template <class L>
inline constexpr bool loss_uses_labels = counts_correct_v<L>;

namespace detail {

/// Outputs per row in the loss suite.
inline constexpr std::size_t loss_cols = 5;

/// A batch of outputs and targets for the loss suite.
struct loss_batch {
  std::size_t rows = 0, cols = loss_cols;
  std::vector<double> out, values;
  std::vector<std::int32_t> labels;

  loss_batch(std::size_t r, bool with_labels) : rows(r), out(r * cols) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = 2.0 * std::sin(0.9 * static_cast<double>(i) + 0.2);
    if (with_labels) {
      labels.resize(r);
      for (std::size_t k = 0; k < r; ++k) labels[k] = static_cast<std::int32_t>((k * 3 + 1) % cols);
    } else {
      values.resize(r * cols);
      for (std::size_t i = 0; i < values.size(); ++i) values[i] = std::cos(0.5 * static_cast<double>(i));
    }
  }
  /// The targets of rows [first, first + n).
  [[nodiscard]] targets<double> targets_from(std::size_t first) const {
    targets<double> t;
    if (!labels.empty()) t.labels = labels.data() + first;
    if (!values.empty()) {
      t.values = values.data() + first * cols;
      t.width = cols;
    }
    return t;
  }
};

template <class L>
loss_sum evaluate_rows(const L& loss, const std::vector<double>& out, const loss_batch& b, std::size_t first,
                       std::size_t n, double* grad) {
  host_context ctx{1};
  std::vector<double> scratch(n * L::scratch_per_row + 1);
  using args = loss_args<double, host_context, shape<loss_cols>>;
  return loss.evaluate(ctx, args{{out.data() + first * b.cols, n}, b.targets_from(first), {grad, n}, scratch.data()});
}

}  // namespace detail
}  // namespace lockstep::testing

/// The conformance suite of a loss L (see this file's comment).
TEST_CASE_TEMPLATE_DEFINE("lockstep loss conformance", L, lockstep_loss_conformance) {
  namespace lt = lockstep::testing;
  static_assert(lockstep::loss_for<L, double, lockstep::host_context, lockstep::shape<lt::detail::loss_cols>>,
                "the loss suite runs the loss in double on the host");
  static_assert(L::scratch_per_row <= 4, "a replica reserves at most 4 scratch elements per row for its loss");
  const L loss{};
  constexpr bool labels = lt::loss_uses_labels<L>;

  SUBCASE("the gradient of the sum matches central finite differences (batch 0, 1, 7, 64)") {
    lt::element_report report("gradient of the loss sum vs central finite differences", "analytic", "numeric");
    for (const std::size_t rows : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{64}}) {
      CAPTURE(rows);
      report.context(std::to_string(rows) + " rows");
      const lt::detail::loss_batch b(rows, labels);
      std::vector<double> grad(rows * b.cols + 1, -9.0);
      const lockstep::loss_sum s = lt::detail::evaluate_rows(loss, b.out, b, 0, rows, grad.data());
      CHECK(grad.back() == -9.0);  // nothing written past the gradient
      const double h = 1e-6;
      for (const std::size_t k : lt::detail::probe_indices(b.out.size())) {  // every column, first and last rows
        auto up = b.out, down = b.out;
        up[k] += h;
        down[k] -= h;
        const double numeric = (lt::detail::evaluate_rows(loss, up, b, 0, rows, nullptr).sum -
                                lt::detail::evaluate_rows(loss, down, b, 0, rows, nullptr).sum) /
                               (2 * h);
        report.close(k, grad[k], numeric, 1e-5 * std::max(1.0, std::abs(numeric)));
      }
      CHECK(std::isfinite(s.sum));
    }
    CHECK_MESSAGE(report.ok(), report.text());
  }

  SUBCASE("SUM + count: the count is the rows, and the sums of the parts of a batch add up") {
    constexpr std::size_t rows = 23;
    const lt::detail::loss_batch b(rows, labels);
    const lockstep::loss_sum whole = lt::detail::evaluate_rows(loss, b.out, b, 0, rows, nullptr);
    CHECK(whole.count == rows);
    for (const std::size_t cut : {std::size_t{0}, std::size_t{1}, std::size_t{11}, std::size_t{22}, rows}) {
      CAPTURE(cut);
      const lockstep::loss_sum a = lt::detail::evaluate_rows(loss, b.out, b, 0, cut, nullptr);
      const lockstep::loss_sum c = lt::detail::evaluate_rows(loss, b.out, b, cut, rows - cut, nullptr);
      CHECK(a.count + c.count == whole.count);
      CHECK(a.sum + c.sum == doctest::Approx(whole.sum).epsilon(1e-12));
      if constexpr (lockstep::counts_correct_v<L>) CHECK(a.correct + c.correct == whole.correct);
    }
  }

  SUBCASE("an empty batch sums to 0 over 0 samples and writes nothing") {
    const lt::detail::loss_batch b(0, labels);
    double sentinel = 5.0;
    const lockstep::loss_sum s = lt::detail::evaluate_rows(loss, b.out, b, 0, 0, &sentinel);
    CHECK(s.sum == 0.0);
    CHECK(s.count == 0);
    CHECK(s.correct == 0);
    CHECK(sentinel == 5.0);
  }

  SUBCASE("a null gradient changes nothing but the gradient; evaluate leaves the outputs alone") {
    const lt::detail::loss_batch b(9, labels);
    const auto out0 = b.out;
    std::vector<double> grad(9 * b.cols);
    const lockstep::loss_sum with = lt::detail::evaluate_rows(loss, b.out, b, 0, 9, grad.data());
    const lockstep::loss_sum without = lt::detail::evaluate_rows(loss, b.out, b, 0, 9, nullptr);
    CHECK(with.sum == without.sum);
    CHECK(with.count == without.count);
    CHECK(b.out == out0);
  }

  if constexpr (lockstep::counts_correct_v<L>) {
    SUBCASE("correct counts the rows whose arg-max output is the label") {
      const lt::detail::loss_batch b(31, true);
      std::size_t expected = 0;
      for (std::size_t r = 0; r < b.rows; ++r) {
        const auto row = b.out.begin() + static_cast<std::ptrdiff_t>(r * b.cols);
        const auto best = static_cast<std::size_t>(std::max_element(row, row + static_cast<std::ptrdiff_t>(b.cols)) - row);
        expected += best == static_cast<std::size_t>(b.labels[r]) ? 1 : 0;
      }
      CHECK(lt::detail::evaluate_rows(loss, b.out, b, 0, b.rows, nullptr).correct == expected);
    }
  }
}
