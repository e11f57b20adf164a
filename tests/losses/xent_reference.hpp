#pragma once
// The double reference of softmax cross-entropy for rows of float logits, and the confident
// (large-margin) rows every backend's loss is checked on (tests/losses, tests/cuda).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include <lockstep/core/random.hpp>
#include <lockstep/core/shape.hpp>
#include <lockstep/losses/loss.hpp>

namespace xent_ref {

/// loss.evaluate on `rows` rows of `cols` outputs, with cols (1..16, 37 or a width of wide_rows()) known here only at run time
/// (a loss sees the model's output shape at compile time).
template <class Loss, class Ctx, class T>
lockstep::loss_sum evaluate_cols(const Loss& loss, Ctx& ctx, const T* z, std::size_t rows, std::size_t cols,
                                 const lockstep::targets<T>& t, T* grad, T* scratch) {
  lockstep::loss_sum r;
  bool done = false;
  [&]<std::size_t... C>(std::index_sequence<C...>) {
    ((cols == C + 1 ? (r = loss.evaluate(ctx, lockstep::loss_args<T, Ctx, lockstep::shape<C + 1>>{
                                                  {z, rows}, t, {grad, rows}, scratch}),
                       done = true)
                    : false),
     ...);
  }(std::make_index_sequence<16>{});
  [&]<std::size_t... C>(std::index_sequence<C...>) {  // the widths of wide_rows(), and 37 (tests/cuda)
    ((!done && cols == C ? (r = loss.evaluate(ctx, lockstep::loss_args<T, Ctx, lockstep::shape<C>>{
                                                        {z, rows}, t, {grad, rows}, scratch}),
                             done = true)
                          : false),
     ...);
  }(std::index_sequence<31, 32, 33, 37, 70, 129>{});
  if (!done) throw std::invalid_argument("evaluate_cols: cols must be 1..16, 31, 32, 33, 37, 70 or 129");
  return r;
}

/// Loss and gradient of one row.
struct row {
  double loss = 0;
  std::vector<double> grad;
};

/// The loss and gradient of row `z` with label `label`, in double from the same float values.
inline row in_double(const std::vector<float>& z, std::int32_t label) {
  double m = z[0];
  for (float v : z) m = std::max(m, double(v));
  double s = 0;
  for (float v : z) s += std::exp(double(v) - m);
  row r;
  r.loss = std::log(s) - (double(z[std::size_t(label)]) - m);
  for (std::size_t c = 0; c < z.size(); ++c)
    r.grad.push_back(std::exp(double(z[c]) - m) / s - (c == std::size_t(label) ? 1.0 : 0.0));
  return r;
}

/// |got - want| within `rel` of |want|, give or take 1e-12 (where the double reference itself,
/// which rounds 1 + t, stops being exact).
inline bool close(double got, double want, double rel) { return std::abs(got - want) <= rel * std::abs(want) + 1e-12; }

/// Checks a backend's loss sum and gradient (copied to the host) of row `z` with label `y`
/// against the double reference, to `rel`.
inline void check_row(double loss, const std::vector<float>& grad, const std::vector<float>& z, std::int32_t y,
                      double rel = 1e-5) {
  const row want = in_double(z, y);
  CAPTURE(loss);
  CAPTURE(want.loss);
  CHECK(close(loss, want.loss, rel));
  for (std::size_t c = 0; c < z.size(); ++c) {
    CAPTURE(c);
    CAPTURE(grad[c]);
    CAPTURE(want.grad[c]);
    CHECK(close(grad[c], want.grad[c], rel));
  }
}

/// Rows whose log-sum-exp is close to their largest logit, fixed and random (1..13 classes,
/// margins up to about 400).
inline std::vector<std::vector<float>> confident_rows() {
  std::vector<std::vector<float>> rows = {{1000, 990, 0, 0, 0}, {10, 0, 0, 0, 0, 0, 0, 0, 0, 0},
                                          {-1000, -990, -2000}, {88, 87.5f, -88}, {1e4f, 0}, {3, 3, 3},
                                          {0.5f}, {20, 0, 20, 0}};
  const lockstep::counter_rng rng(17, 0);
  for (std::size_t k = 0; k < 40; ++k) {
    const std::size_t cols = 1 + rng.u32(k) % 13;
    const double spread = 1.0 + 200.0 * rng.uniform_double(100 + k);
    std::vector<float> z(cols);
    for (std::size_t c = 0; c < cols; ++c) z[c] = float((rng.uniform_double(1000 + 50 * k + c) * 2 - 1) * spread);
    rows.push_back(z);
  }
  return rows;
}

/// Rows wider than a GPU warp (several columns per lane): random, with one confident class in the
/// last lane, and with a tie for the maximum (the first column wins).
inline std::vector<std::vector<float>> wide_rows() {
  std::vector<std::vector<float>> rows;
  const lockstep::counter_rng rng(5, 1);
  for (std::size_t cols : {31u, 32u, 33u, 70u, 129u}) {
    std::vector<float> z(cols);
    for (std::size_t c = 0; c < cols; ++c) z[c] = 8.0f * (2.0f * rng.uniform(cols * 1000 + c) - 1.0f);
    rows.push_back(z);
    z[cols - 1] = 40.0f;
    rows.push_back(z);
    z[3] = 40.0f;
    rows.push_back(z);
  }
  return rows;
}

}  // namespace xent_ref
