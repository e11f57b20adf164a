#pragma once
/// @file mse.hpp
/// Mean squared error over regression targets.

#include <cstddef>
#include <string>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/losses/loss.hpp>

namespace lockstep {

namespace detail {
/// Row r: loss[r] = mean over columns of (y - t)^2; grad = 2 (y - t) / cols.
template <class T>
struct mse_row_op {
  const T* y;        ///< predictions, rows x cols
  const T* t;        ///< targets, rows x cols
  T* grad;           ///< gradient of the summed loss, or null
  T* loss;           ///< per-row loss
  std::size_t cols;  ///< outputs per row
  /// Computes row r.
  LOCKSTEP_HD void operator()(std::size_t r) const {
    T s = 0;
    const T inv = T(1) / static_cast<T>(cols);
    for (std::size_t c = 0; c < cols; ++c) {
      const T d = y[r * cols + c] - t[r * cols + c];
      s += d * d;
      if (grad) grad[r * cols + c] = T(2) * d * inv;
    }
    loss[r] = s * inv;
  }
};
}  // namespace detail

/// Mean squared error: per-sample loss = mean over outputs of (prediction - target)^2.
struct mse {
  using loss_concept = loss_tag;                    ///< opts in to the loss concept
  static constexpr std::size_t scratch_per_row = 1; ///< one per-row loss value

  /// Sum of the per-sample losses of the rows of a.out; writes the gradient of that sum into
  /// a.grad when it is not empty. The targets must be as wide as the output.
  template <class T, class Ctx, class Shape>
  loss_sum evaluate(Ctx& ctx, const loss_args<T, Ctx, Shape>& a) const {
    constexpr std::size_t cols = Shape::size;
    const std::size_t rows = a.rows();
    if (rows == 0) return {};
    const targets<T>& t = a.target;
    if (!t.values)
      throw shape_error("lockstep::mse: the batch has no regression targets (a dataset of class labels?); mse needs " +
                        std::to_string(cols) + " target values per row, one per model output");
    if (t.width != cols)
      throw shape_error("lockstep::mse: targets have width " + std::to_string(t.width) + " but the model outputs " +
                        std::to_string(cols));
    for_each_index(ctx, rows, detail::mse_row_op<T>{a.out.data(), t.values, a.grad.data(), a.scratch, cols});
    return {sum(ctx, a.scratch, rows), rows};
  }
};

}  // namespace lockstep
