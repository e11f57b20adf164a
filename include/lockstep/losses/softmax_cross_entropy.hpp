#pragma once
/// @file softmax_cross_entropy.hpp
/// Softmax cross-entropy over integer labels, computed in the shifted space z - max(z) by the
/// backend primitive `softmax_xent` (backend/softmax_xent.hpp).

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/backend/softmax_xent.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/losses/loss.hpp>

namespace lockstep {

namespace detail {
/// Row r of softmax cross-entropy with label smoothing ε over C classes: the target is
/// (1 − ε) onehot(label) + ε / C, so, with d and t as in softmax_xent_row_op and lse = log1p(t),
/// loss[r] = lse − (1 − ε) d_label − (ε / C) Σ_c d_c and grad_r[c] = p_c − (1 − ε) onehot[c] − ε / C.
/// hit[r] = 1 when the arg-max (first on ties) equals the label. A label outside [0, cols) or a
/// row whose largest logit is not finite (a NaN, +inf, or every logit −inf) yields a NaN loss; a
/// −inf logit in a row with a finite maximum is a class of probability 0 (with smoothing, or as
/// the label, the loss is +inf).
template <class T>
struct softmax_xent_smoothed_row_op {
  const T* z;                   ///< logits, rows x cols
  const std::int32_t* labels;   ///< labels
  T* grad;                      ///< gradient of the summed loss, or null
  T* loss;                      ///< per-row loss
  T* hit;                       ///< per-row top-1 hit (1 or 0)
  std::size_t cols;             ///< classes
  T smoothing;                  ///< ε
  /// Computes row r: softmax_xent_row_op's maximum, t and gradient (p_c - onehot_c), then the
  /// smoothing's terms.
  LOCKSTEP_HD void operator()(std::size_t r) const {
    const T* zr = z + r * cols;
    const backend::detail::xent_max<T> mx = backend::detail::xent_max_part(zr, cols, 0, 1);
    const T m = mx.value;
    const std::int32_t y = labels[r];
    T* gr = grad ? grad + r * cols : nullptr;
    const T t = gr ? backend::detail::xent_row_t_grad(zr, cols, y, m, mx.arg, gr)
                   : backend::detail::xent_t_part(zr, cols, 0, 1, m, mx.arg);
    T sum_d = 0;
    for (std::size_t c = 0; c < cols; ++c) sum_d += zr[c] - m;
    const bool valid = backend::detail::xent_label_valid(y, cols);
    const bool finite = m - m == T(0);
    const T spread = smoothing / static_cast<T>(cols);
    const T lse = std::log1p(t);
    loss[r] = valid && finite ? lse - (T(1) - smoothing) * (zr[y] - m) - spread * sum_d : static_cast<T>(NAN);
    hit[r] = valid && static_cast<std::size_t>(y) == mx.arg ? T(1) : T(0);
    if (gr)
      for (std::size_t c = 0; c < cols; ++c)
        gr[c] = gr[c] + (valid && static_cast<std::size_t>(y) == c ? smoothing : T(0)) - spread;
  }
};
}  // namespace detail

/// Softmax cross-entropy: per-sample loss = log-sum-exp(logits) - logit[label]; with
/// `label_smoothing` ε, the cross-entropy against the target (1 − ε) onehot(label) + ε / classes
/// (Keras `label_smoothing`, PyTorch `CrossEntropyLoss(label_smoothing=)`).
struct softmax_cross_entropy {
  using loss_concept = loss_tag;                    ///< opts in to the loss concept
  static constexpr std::size_t scratch_per_row = 2; ///< per-row loss and per-row top-1 hit
  static constexpr bool counts_correct = true;      ///< fills loss_sum::correct
  static constexpr std::string_view name = "lockstep::softmax_cross_entropy";  ///< in messages
  /// Labels are classes 0 .. outputs - 1 of a model with `outputs` outputs.
  static constexpr std::size_t label_classes(std::size_t outputs) noexcept { return outputs; }
  float label_smoothing = 0;  ///< ε in [0, 1): the weight moved from the label to all classes evenly

  /// @throws config_error for a label_smoothing outside [0, 1) (fit, evaluate and train_step
  /// call it before any replica runs; evaluate calls it too).
  void check() const {
    if (!(label_smoothing >= 0.0f && label_smoothing < 1.0f))
      throw config_error("lockstep::softmax_cross_entropy: label_smoothing must be in [0, 1), got " +
                         detail::option_value(label_smoothing));
  }
  /// The exact bits of label_smoothing, as text (compared across the workers of a fit; -0 as +0).
  [[nodiscard]] std::string hyperparameters() const {
    return "label_smoothing=" + std::to_string(std::bit_cast<std::uint32_t>(label_smoothing == 0.0f ? 0.0f : label_smoothing));
  }

  /// Sum of the losses of the rows of logits a.out against a.target.labels and the number of
  /// top-1 hits; writes the gradient of that sum into a.grad when it is not empty.
  /// @throws data_error for a label outside [0, cols) (check_labels' message) or a row whose
  ///         largest logit is not finite (a NaN, +inf, or every logit −inf; naming the first such
  ///         row and its column; on a device whose memory the host cannot read, one message names
  ///         both causes: a replica checks the labels before this runs).
  template <class T, class Ctx, class Shape>
  loss_sum evaluate(Ctx& ctx, const loss_args<T, Ctx, Shape>& a) const {
    constexpr std::size_t cols = Shape::size;
    const std::size_t rows = a.rows();
    if (rows == 0) return {};
    if (!a.target.labels) throw shape_error("lockstep::softmax_cross_entropy: the batch has no labels");
    check();
    backend::softmax_xent_totals r;
    if (label_smoothing == 0.0f) {
      using backend::softmax_xent;  // the generic form; a backend's own overload is found by ADL
      r = softmax_xent(ctx, a.out.data(), a.target.labels, rows, cols, a.grad.data(), a.scratch);
    } else {  // through the elementwise primitive and sums, on any device
      T* per_row = a.scratch;
      for_each_index(ctx, rows,
                     detail::softmax_xent_smoothed_row_op<T>{a.out.data(), a.target.labels, a.grad.data(), per_row,
                                                             per_row + rows, cols, static_cast<T>(label_smoothing)});
      r.loss = sum(ctx, per_row, rows);
      r.hits = std::isnan(r.loss) ? 0.0 : sum(ctx, per_row + rows, rows);
    }
    if (std::isnan(r.loss)) explain_nan<T, Ctx>(a.out.data(), a.target.labels, rows, cols);
    return {r.loss, rows, static_cast<std::size_t>(r.hits + 0.5)};
  }

private:
  /// Throws the message of a NaN loss: the bad label, or the first row whose largest logit is not
  /// finite and that logit's column, when the host can read them.
  template <class T, class Ctx>
  [[noreturn]] static void explain_nan(const T* z, const std::int32_t* labels, std::size_t rows, std::size_t cols) {
    if constexpr (std::is_same_v<std::remove_cv_t<Ctx>, backend::host_context>) {
      check_labels(name, labels, rows, cols, cols);
      for (std::size_t r = 0; r < rows; ++r) {
        const auto mx = backend::detail::xent_max_part(z + r * cols, cols, 0, 1);  // the loss's own maximum
        if (mx.value - mx.value == T(0)) continue;  // finite: −inf logits beside it are classes of probability 0
        const std::string what = std::isnan(mx.value) ? "is NaN"
                                 : mx.value > 0       ? "is +inf"
                                                      : "is -inf, as is every logit of the row";
        throw data_error(std::string(name) + ": logit " + std::to_string(mx.arg) + " of row " + std::to_string(r) +
                         " " + what +
                         ": the model's outputs are not finite (a learning rate too large, or input values "
                         "that are not finite)");
      }
    }
    throw data_error(std::string(name) + ": a label is outside [0, " + std::to_string(cols) +
                     ") or a logit is not finite");
  }
};

}  // namespace lockstep
