#pragma once
/// @file softmax_cross_entropy.hpp
/// Softmax cross-entropy over integer labels, computed in the shifted space z - max(z) by the
/// backend primitive `softmax_xent` (backend/softmax_xent.hpp).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/backend/softmax_xent.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/losses/loss.hpp>

namespace lockstep {

/// Softmax cross-entropy: per-sample loss = log-sum-exp(logits) - logit[label].
struct softmax_cross_entropy {
  using loss_concept = loss_tag;                    ///< opts in to the loss concept
  static constexpr std::size_t scratch_per_row = 2; ///< per-row loss and per-row top-1 hit
  static constexpr bool counts_correct = true;      ///< fills loss_sum::correct

  /// Sum of the losses of the rows of logits a.out against a.target.labels and the number of
  /// top-1 hits; writes the gradient of that sum into a.grad when it is not empty. A label
  /// outside [0, cols) is an error.
  template <class T, class Ctx, class Shape>
  loss_sum evaluate(Ctx& ctx, const loss_args<T, Ctx, Shape>& a) const {
    constexpr std::size_t cols = Shape::size;
    const std::size_t rows = a.rows();
    if (rows == 0) return {};
    if (!a.target.labels) throw shape_error("lockstep::softmax_cross_entropy: the batch has no labels");
    using backend::softmax_xent;  // the generic form; a backend's own overload is found by ADL
    const backend::softmax_xent_totals r =
        softmax_xent(ctx, a.out.data(), a.target.labels, rows, cols, a.grad.data(), a.scratch);
    if (std::isnan(r.loss))
      throw data_error("lockstep::softmax_cross_entropy: a label is outside [0, " + std::to_string(cols) +
                       ") or a logit is not finite");
    return {r.loss, rows, static_cast<std::size_t>(r.hits + 0.5)};
  }
};

}  // namespace lockstep
