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
    for_each_index(ctx, rows, detail::softmax_xent_row_op<T>{logits, t.labels, grad, scratch, scratch + rows, cols});
    const double s = sum(ctx, scratch, rows);
    if (std::isnan(s))
      throw data_error("lockstep::softmax_cross_entropy: a label is outside [0, " + std::to_string(cols) +
                       ") or a logit is not finite");
    const double hits = sum(ctx, scratch + rows, rows);
    return {s, rows, static_cast<std::size_t>(hits + 0.5)};
  }
};

}  // namespace lockstep
