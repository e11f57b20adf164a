#pragma once
/// @file softmax_cross_entropy.hpp
/// Softmax cross-entropy over integer labels, computed in the shifted space z - max(z).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/losses/loss.hpp>

namespace lockstep {

namespace detail {
/// Row r, computed in the shifted space d_c = z_c - max(z) so that no large value is ever rounded
/// before a subtraction: with t = sum over c != argmax of exp(d_c) (so sum exp(d) = 1 + t),
/// loss[r] = log1p(t) - d_label and grad_r[c] = exp(d_c) / (1 + t) - onehot(label)[c], where the
/// arg-max entry's probability minus one is formed as -t / (1 + t) without cancellation.
/// hit[r] = 1 when the arg-max (first on ties) equals the label. A label outside [0, cols) or a
/// logit that is not finite yields a NaN loss.
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
    T t = 0;  // sum of exp(z_c - m) over every c but the arg-max (whose term is exactly 1)
    for (std::size_t c = 0; c < cols; ++c)
      if (c != arg) t += std::exp(zr[c] - m);
    const std::int32_t y = labels[r];
    const bool valid = y >= 0 && static_cast<std::size_t>(y) < cols;
    const bool finite = m - m == T(0);  // false for an infinite or NaN maximum
    loss[r] = valid && finite ? std::log1p(t) - (zr[y] - m) : static_cast<T>(NAN);
    hit[r] = valid && static_cast<std::size_t>(y) == arg ? T(1) : T(0);
    if (grad) {
      T* gr = grad + r * cols;
      const T inv = T(1) / (T(1) + t);
      for (std::size_t c = 0; c < cols; ++c) {
        const bool is_label = valid && static_cast<std::size_t>(y) == c;
        if (c == arg) gr[c] = is_label ? -t * inv : inv;
        else gr[c] = std::exp(zr[c] - m) * inv - (is_label ? T(1) : T(0));
      }
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
  static constexpr std::string_view name = "lockstep::softmax_cross_entropy";  ///< in messages
  /// Labels are classes 0 .. outputs - 1 of a model with `outputs` outputs.
  static constexpr std::size_t label_classes(std::size_t outputs) noexcept { return outputs; }

  /// Sum of the losses of the rows of logits a.out against a.target.labels and the number of
  /// top-1 hits; writes the gradient of that sum into a.grad when it is not empty.
  /// @throws data_error for a label outside [0, cols) (check_labels' message) or a logit that is
  ///         not finite (naming its row and column; on a device whose memory the host cannot
  ///         read, one message names both causes: a replica checks the labels before this runs).
  template <class T, class Ctx, class Shape>
  loss_sum evaluate(Ctx& ctx, const loss_args<T, Ctx, Shape>& a) const {
    constexpr std::size_t cols = Shape::size;
    const std::size_t rows = a.rows();
    if (rows == 0) return {};
    if (!a.target.labels) throw shape_error("lockstep::softmax_cross_entropy: the batch has no labels");
    using backend::softmax_xent;  // the generic form; a backend's own overload is found by ADL
    const backend::softmax_xent_totals r =
        softmax_xent(ctx, a.out.data(), a.target.labels, rows, cols, a.grad.data(), a.scratch);
    if (std::isnan(r.loss)) explain_nan<T, Ctx>(a.out.data(), a.target.labels, rows, cols);
    return {r.loss, rows, static_cast<std::size_t>(r.hits + 0.5)};
  }

private:
  /// Throws the message of a NaN loss: the bad label or the first logit that is not finite, when
  /// the host can read them.
  template <class T, class Ctx>
  [[noreturn]] static void explain_nan(const T* z, const std::int32_t* labels, std::size_t rows, std::size_t cols) {
    if constexpr (std::is_same_v<std::remove_cv_t<Ctx>, backend::host_context>) {
      check_labels(name, labels, rows, cols, cols);
      for (std::size_t i = 0; i < rows * cols; ++i)
        if (!std::isfinite(z[i]))
          throw data_error(std::string(name) + ": logit " + std::to_string(i % cols) + " of row " +
                           std::to_string(i / cols) + " is " + (std::isnan(z[i]) ? "NaN" : "infinite") +
                           ": the model's outputs are not finite (a learning rate too large, or input values "
                           "that are not finite)");
    }
    throw data_error(std::string(name) + ": a label is outside [0, " + std::to_string(cols) +
                     ") or a logit is not finite");
  }
};

}  // namespace lockstep
