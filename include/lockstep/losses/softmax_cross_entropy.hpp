#pragma once
/// @file softmax_cross_entropy.hpp
/// Softmax cross-entropy over integer labels, with a stable log-sum-exp.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/losses/loss.hpp>

namespace lockstep {

namespace detail {
/// Row r: loss[r] = logsumexp(z_r) - z_r[label]; grad_r = softmax(z_r) - onehot(label);
/// hit[r] = 1 when the arg-max (first on ties) equals the label. A label outside [0, cols)
/// yields a NaN loss.
template <class T>
struct softmax_xent_row_op {
  const T* z;                   ///< logits, rows x cols
  const std::int32_t* labels;   ///< labels
  T* grad;                      ///< gradient of the summed loss, or null
  T* loss;                      ///< per-row loss
  T* hit;                       ///< per-row top-1 hit (1 or 0)
  std::size_t cols;             ///< classes
  /// Computes row r.
  LOCKSTEP_HD void operator()(std::size_t r) const {
    const T* zr = z + r * cols;
    T m = zr[0];
    std::size_t arg = 0;
    for (std::size_t c = 1; c < cols; ++c)
      if (zr[c] > m) {
        m = zr[c];
        arg = c;
      }
    T s = 0;
    for (std::size_t c = 0; c < cols; ++c) s += std::exp(zr[c] - m);
    const T lse = m + std::log(s);
    const std::int32_t y = labels[r];
    const bool valid = y >= 0 && static_cast<std::size_t>(y) < cols;
    loss[r] = valid ? lse - zr[y] : static_cast<T>(NAN);
    hit[r] = valid && static_cast<std::size_t>(y) == arg ? T(1) : T(0);
    if (grad) {
      T* gr = grad + r * cols;
      for (std::size_t c = 0; c < cols; ++c)
        gr[c] = std::exp(zr[c] - lse) - (valid && static_cast<std::size_t>(y) == c ? T(1) : T(0));
    }
  }
};
}  // namespace detail

namespace backend {

/// What one softmax cross-entropy pass adds up: the summed loss and the number of top-1 hits.
struct softmax_xent_totals {
  double loss = 0;  ///< sum of the rows' losses (NaN when a label is out of range or a logit is not finite)
  double hits = 0;  ///< rows whose first arg-max is the label
};

/// Softmax cross-entropy of `rows` rows on any context with for_each_index and sum: per-row loss
/// and hit into scratch (2 rows), the gradient into grad when not null. The CUDA backend
/// overloads it with one fused kernel.
template <class Ctx, class T>
softmax_xent_totals softmax_xent(const Ctx& ctx, const T* z, const std::int32_t* labels, std::size_t rows,
                                 std::size_t cols, T* grad, T* scratch) {
  for_each_index(ctx, rows, lockstep::detail::softmax_xent_row_op<T>{z, labels, grad, scratch, scratch + rows, cols});
  const double loss = sum(ctx, scratch, rows);
  return {loss, std::isnan(loss) ? 0.0 : sum(ctx, scratch + rows, rows)};
}

}  // namespace backend

/// Softmax cross-entropy: per-sample loss = log-sum-exp(logits) - logit[label].
struct softmax_cross_entropy {
  using loss_concept = loss_tag;                    ///< opts in to the loss concept
  static constexpr std::size_t scratch_per_row = 2; ///< per-row loss and per-row top-1 hit
  static constexpr bool counts_correct = true;      ///< fills loss_sum::correct

  /// Sum of the losses of `rows` rows of logits (rows x cols) against t.labels and the number of
  /// top-1 hits; writes the gradient of that sum into grad when it is not null. A label outside
  /// [0, cols) is an error.
  template <class T, class Ctx>
  loss_sum evaluate(Ctx& ctx, const T* logits, std::size_t rows, std::size_t cols, const targets<T>& t, T* grad,
                    T* scratch) const {
    if (rows == 0) return {};
    if (!t.labels) throw shape_error("lockstep::softmax_cross_entropy: the batch has no labels");
    using backend::softmax_xent;  // the generic form; a backend's own overload is found by ADL
    const backend::softmax_xent_totals r = softmax_xent(ctx, logits, t.labels, rows, cols, grad, scratch);
    if (std::isnan(r.loss))
      throw data_error("lockstep::softmax_cross_entropy: a label is outside [0, " + std::to_string(cols) +
                       ") or a logit is not finite");
    return {r.loss, rows, static_cast<std::size_t>(r.hits + 0.5)};
  }
};

}  // namespace lockstep
