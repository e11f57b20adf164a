#pragma once
/// @file softmax_xent.hpp
/// The softmax cross-entropy primitive every backend provides: `softmax_xent(ctx, z, labels,
/// rows, cols, grad, scratch)` returns the summed loss and the top-1 hits of `rows` rows of
/// logits and writes the gradient of the summed loss. A generic form runs on any context with
/// `for_each_index` and `sum`; a backend may overload it (the CUDA backend runs one fused kernel).
///
/// Every form computes a row from the same `LOCKSTEP_HD` pieces, so the host tests check the
/// formulas the device runs. A row is computed in the shifted space d_c = z_c - max(z), so that no
/// large value is rounded before a subtraction: with t = sum over c != argmax of exp(d_c) (so
/// sum exp(d) = 1 + t), loss = log1p(t) - d_label and grad[c] = exp(d_c) / (1 + t) - [c == label],
/// where the arg-max entry's probability minus one is formed as -t / (1 + t) without cancellation.
/// A row may be split into parts (columns first, first + step, ...: one per GPU lane), whose maxima
/// and partial t are combined in a fixed order.

#include <cmath>
#include <cstddef>
#include <cstdint>

#include <lockstep/config.hpp>

namespace lockstep::backend {

/// What one softmax cross-entropy pass adds up: the summed loss and the number of top-1 hits.
struct softmax_xent_totals {
  double loss = 0;  ///< sum of the rows' losses (NaN when a label is out of range or a logit is not finite)
  double hits = 0;  ///< rows whose first arg-max is the label
};

namespace detail {

/// The largest logit of a row part and its first column.
template <class T>
struct xent_max {
  T value;          ///< the largest logit
  std::size_t arg;  ///< its column (the first on ties)
};

/// True when logit a ranks above logit b: larger, or NaN where b is not (a NaN anywhere in a row
/// then becomes its maximum in every part and every lane, and the row's loss is NaN).
template <class T>
LOCKSTEP_HD bool xent_above(T a, T b) {
  return a > b || (a != a && b == b);
}

/// The largest logit over columns first, first + step, ... < cols and its first column; a part
/// with no column (first >= cols) reports column 0, which every part may name without changing
/// the combined result.
template <class T>
LOCKSTEP_HD xent_max<T> xent_max_part(const T* zr, std::size_t cols, std::size_t first, std::size_t step) {
  xent_max<T> r{zr[first < cols ? first : 0], first < cols ? first : 0};
  for (std::size_t c = first + step; c < cols; c += step)
    if (xent_above(zr[c], r.value)) r = {zr[c], c};
  return r;
}

/// The larger of two parts' maxima, the lower column on ties (the row's first arg-max, whatever
/// the order in which parts are combined).
template <class T>
LOCKSTEP_HD xent_max<T> xent_max_combine(xent_max<T> a, xent_max<T> b) {
  const bool tie = !xent_above(a.value, b.value) && !xent_above(b.value, a.value);
  return (xent_above(b.value, a.value) || (tie && b.arg < a.arg)) ? b : a;
}

/// A part's share of t: the sum of exp(z_c - m) over its columns other than the arg-max.
template <class T>
LOCKSTEP_HD T xent_t_part(const T* zr, std::size_t cols, std::size_t first, std::size_t step, T m, std::size_t arg) {
  T t = 0;
  for (std::size_t c = first; c < cols; c += step)
    if (c != arg) t += std::exp(zr[c] - m);
  return t;
}

/// True when label y names one of the cols columns.
LOCKSTEP_HD inline bool xent_label_valid(std::int32_t y, std::size_t cols) {
  return y >= 0 && static_cast<std::size_t>(y) < cols;
}

/// The row's loss log1p(t) - (z_y - m); NaN for a label outside [0, cols) or a maximum that is
/// not finite.
template <class T>
LOCKSTEP_HD T xent_row_loss(const T* zr, std::size_t cols, std::int32_t y, T m, T t) {
  const bool finite = m - m == T(0);  // false for an infinite or NaN maximum
  return xent_label_valid(y, cols) && finite ? std::log1p(t) - (zr[y] - m) : static_cast<T>(NAN);
}

/// The gradient of a row's loss at one column, inv being 1 / (1 + t): at the arg-max
/// (`is_arg`) 1 / (1 + t), or -t / (1 + t) when it is the label; elsewhere
/// e / (1 + t) - [is_label], e being exp(z_c - m) (not read at the arg-max).
template <class T>
LOCKSTEP_HD T xent_grad_value(bool is_arg, bool is_label, T e, T t, T inv) {
  if (is_arg) return is_label ? -t * inv : inv;
  return e * inv - (is_label ? T(1) : T(0));
}

/// Writes the gradient of the row's loss over the part's columns (xent_grad_value).
template <class T>
LOCKSTEP_HD void xent_grad_part(const T* zr, std::size_t cols, std::size_t first, std::size_t step, std::int32_t y,
                                T m, std::size_t arg, T t, T* gr) {
  const bool valid = xent_label_valid(y, cols);
  const T inv = T(1) / (T(1) + t);
  for (std::size_t c = first; c < cols; c += step) {
    const bool is_label = valid && static_cast<std::size_t>(y) == c;
    gr[c] = xent_grad_value(c == arg, is_label, c == arg ? T(0) : std::exp(zr[c] - m), t, inv);
  }
}

/// xent_t_part and xent_grad_part of a whole row (first 0, step 1) with each exp(z_c - m) computed
/// once: kept in the gradient row while t is summed, then scaled by 1 / (1 + t). The same values
/// in the same order, so the same bits as the two parts. Returns t.
template <class T>
LOCKSTEP_HD T xent_row_t_grad(const T* zr, std::size_t cols, std::int32_t y, T m, std::size_t arg, T* gr) {
  T t = 0;
  for (std::size_t c = 0; c < cols; ++c) {
    if (c == arg) continue;
    gr[c] = std::exp(zr[c] - m);
    t += gr[c];
  }
  const bool valid = xent_label_valid(y, cols);
  const T inv = T(1) / (T(1) + t);
  for (std::size_t c = 0; c < cols; ++c) {
    const bool is_label = valid && static_cast<std::size_t>(y) == c;
    gr[c] = xent_grad_value(c == arg, is_label, c == arg ? T(0) : gr[c], t, inv);
  }
  return t;
}

/// Row r as one part: per-row loss and hit (1 when the first arg-max is the label), and the
/// gradient when `grad` is not null. The generic softmax_xent runs it through for_each_index.
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
    const xent_max<T> mx = xent_max_part(zr, cols, 0, 1);
    const std::int32_t y = labels[r];
    const T t = grad ? xent_row_t_grad(zr, cols, y, mx.value, mx.arg, grad + r * cols)
                     : xent_t_part(zr, cols, 0, 1, mx.value, mx.arg);
    loss[r] = xent_row_loss(zr, cols, y, mx.value, t);
    hit[r] = xent_label_valid(y, cols) && static_cast<std::size_t>(y) == mx.arg ? T(1) : T(0);
  }
};

}  // namespace detail

/// Softmax cross-entropy of `rows` rows on any context with for_each_index and sum: per-row loss
/// and hit into scratch (2 rows), the gradient into grad when not null. The hit count is summed
/// only when the loss is finite (a NaN loss is an error the caller reports).
template <class Ctx, class T>
softmax_xent_totals softmax_xent(const Ctx& ctx, const T* z, const std::int32_t* labels, std::size_t rows,
                                 std::size_t cols, T* grad, T* scratch) {
  for_each_index(ctx, rows, detail::softmax_xent_row_op<T>{z, labels, grad, scratch, scratch + rows, cols});
  const double loss = sum(ctx, scratch, rows);
  return {loss, std::isnan(loss) ? 0.0 : sum(ctx, scratch + rows, rows)};
}

}  // namespace lockstep::backend
