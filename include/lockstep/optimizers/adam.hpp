#pragma once
/// @file adam.hpp
/// Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay).

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

namespace detail {
/// One Adam / AdamW element update; m and v are the first and second moment estimates. With
/// Extras, update_info's clipping, device decision and EMA too.
template <class T, bool Extras = false>
struct adam_op {
  static constexpr bool avx2_copy = true;  ///< one element per call: for_each_index may run its AVX2 copy
  T* p;         ///< parameters
  const T* g;   ///< gradient sums
  T* m;         ///< first moments
  T* v;         ///< second moments
  T lr, beta1, beta2, eps, l2, decoupled, scale;  ///< hyper-parameters
  T step;           ///< lr / (1 - b1^t): the step size with the first bias correction
  T inv_sqrt_c2;    ///< 1 / sqrt(1 - b2^t): the second bias correction, on sqrt(v)
  update_extras<T> x{};  ///< used when Extras
  /// Updates element i: the bias corrections are folded into two constants (as PyTorch does),
  /// leaving one division and one square root per element.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    T gs;
    if constexpr (Extras) {
      if (!x.applies()) return;
      gs = x.gradient(g[i] * x.scale(scale));
    } else {
      gs = g[i] * scale;
    }
    const T gi = gs + l2 * p[i];
    const T mi = beta1 * m[i] + (T(1) - beta1) * gi;
    const T vi = beta2 * v[i] + (T(1) - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= lr * decoupled * p[i] + step * mi / (std::sqrt(vi) * inv_sqrt_c2 + eps);
    if constexpr (Extras) x.average(i, p[i]);
  }
};

/// Throws config_error naming optimiser `name`'s hyper-parameter that is out of range (the
/// moments' decays in [0, 1), the rate and the decay finite and >= 0, eps a finite normal number
/// > 0).
inline void check_adam(const char* name, float lr, float beta1, float beta2, float eps, float weight_decay) {
  require_option(name, "lr", lr, finite_nonnegative(lr), "finite and >= 0");
  require_option(name, "beta1", beta1, beta1 >= 0.0f && beta1 < 1.0f, "in [0, 1)");
  require_option(name, "beta2", beta2, beta2 >= 0.0f && beta2 < 1.0f, "in [0, 1)");
  // eps 0 would divide a parameter's zero moments (a gradient of exactly 0 so far) as 0 / 0, and
  // a subnormal eps is 0 to a replica that treats denormals as zero (the default).
  require_option(name, "eps", eps, eps >= std::numeric_limits<float>::min() && std::isfinite(eps),
                 "finite and at least 1.17549435e-38 (the smallest normal float)");
  require_option(name, "weight_decay", weight_decay, finite_nonnegative(weight_decay), "finite and >= 0");
}

template <class T, class Ctx>
void adam_update(const char* name, Ctx& ctx, T* p, const T* g, T* state, std::size_t n, const update_info& u,
                 float beta1, float beta2, float eps, float l2, float decoupled) {
  if (u.step == 0) throw config_error(std::string(name) + ": update_info::step counts updates from 1, got 0");
  const double c1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(u.step));
  const double c2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(u.step));
  const adam_op<T> op{p, g, state, state + n, static_cast<T>(u.lr), static_cast<T>(beta1), static_cast<T>(beta2),
                      static_cast<T>(eps), static_cast<T>(l2), static_cast<T>(decoupled), static_cast<T>(u.grad_scale),
                      static_cast<T>(static_cast<double>(u.lr) / c1), static_cast<T>(1.0 / std::sqrt(c2))};
  if (u.plain()) {
    for_each_index(ctx, n, op);
  } else {
    adam_op<T, true> with{op.p, op.g, op.m, op.v, op.lr, op.beta1, op.beta2, op.eps, op.l2, op.decoupled, op.scale,
                          op.step, op.inv_sqrt_c2, update_extras<T>::of(u)};
    for_each_index(ctx, n, with);
  }
}
}  // namespace detail

/// Adam: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, p -= lr * m^ / (sqrt(v^) + eps), with bias
/// corrections m^ = m / (1 - b1^t), v^ = v / (1 - b2^t); weight_decay adds an L2 term to g.
struct adam {
  using optimizer_concept = optimizer_tag;  ///< opts in to the optimizer concept
  static constexpr bool elementwise = true;  ///< per-parameter update and state (see optimizer_elementwise_v)
  static constexpr bool applies_recipe = true;  ///< applies clip_value, decision and ema in its pass
  float lr = 1e-3f;           ///< learning rate
  float beta1 = 0.9f;         ///< first-moment decay
  float beta2 = 0.999f;       ///< second-moment decay
  float eps = 1e-8f;          ///< denominator guard
  float weight_decay = 0.0f;  ///< L2 penalty added to the gradient

  /// Two moments per parameter.
  [[nodiscard]] std::size_t state_size(std::size_t n) const noexcept { return 2 * n; }
  /// beta1, beta2, eps and weight_decay, exactly (a multi-worker fit compares them across workers).
  [[nodiscard]] std::string hyperparameters() const { return detail::hyperparameter_bits({beta1, beta2, eps, weight_decay}); }
  /// Throws config_error naming a hyper-parameter out of range (the strategy calls it before an update).
  void check() const { detail::check_adam("lockstep::adam", lr, beta1, beta2, eps, weight_decay); }

  /// Applies update number u.step (1-based) to n parameters.
  template <class T, class Ctx>
  void update(Ctx& ctx, T* p, const T* g, T* state, std::size_t n, const update_info& u) const {
    detail::adam_update("lockstep::adam", ctx, p, g, state, n, u, beta1, beta2, eps, weight_decay, 0.0f);
  }
};

/// AdamW: Adam with decoupled weight decay, p -= lr * (weight_decay * p + m^ / (sqrt(v^) + eps)).
struct adamw {
  using optimizer_concept = optimizer_tag;  ///< opts in to the optimizer concept
  static constexpr bool elementwise = true;  ///< per-parameter update and state (see optimizer_elementwise_v)
  static constexpr bool applies_recipe = true;  ///< applies clip_value, decision and ema in its pass
  float lr = 1e-3f;            ///< learning rate
  float beta1 = 0.9f;          ///< first-moment decay
  float beta2 = 0.999f;        ///< second-moment decay
  float eps = 1e-8f;           ///< denominator guard
  float weight_decay = 0.01f;  ///< decoupled decay rate

  /// Two moments per parameter.
  [[nodiscard]] std::size_t state_size(std::size_t n) const noexcept { return 2 * n; }
  /// beta1, beta2, eps and weight_decay, exactly (a multi-worker fit compares them across workers).
  [[nodiscard]] std::string hyperparameters() const { return detail::hyperparameter_bits({beta1, beta2, eps, weight_decay}); }
  /// Throws config_error naming a hyper-parameter out of range (the strategy calls it before an update).
  void check() const { detail::check_adam("lockstep::adamw", lr, beta1, beta2, eps, weight_decay); }

  /// Applies update number u.step (1-based) to n parameters.
  template <class T, class Ctx>
  void update(Ctx& ctx, T* p, const T* g, T* state, std::size_t n, const update_info& u) const {
    detail::adam_update("lockstep::adamw", ctx, p, g, state, n, u, beta1, beta2, eps, 0.0f, weight_decay);
  }
};

}  // namespace lockstep
