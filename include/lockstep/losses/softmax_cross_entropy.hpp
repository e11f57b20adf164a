#pragma once
/// @file softmax_cross_entropy.hpp
/// Softmax cross-entropy over integer labels, computed in the shifted space z - max(z) by the
/// backend primitive `softmax_xent` (backend/softmax_xent.hpp).

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
