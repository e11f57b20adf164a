#pragma once
/// @file sgd.hpp
/// Stochastic gradient descent with optional momentum, Nesterov momentum and L2 weight decay
/// (PyTorch's formulation: the decay is added to the gradient).

#include <cmath>
#include <cstddef>
#include <string>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

namespace detail {
/// One SGD element update; with Extras, update_info's clipping, device decision and EMA too.
template <class T, bool Extras = false>
struct sgd_op {
  static constexpr bool avx2_copy = true;  ///< one element per call: for_each_index may run its AVX2 copy
  T* p;            ///< parameters
  const T* g;      ///< gradient sums
  T* v;            ///< momentum buffer (null without momentum)
  T lr, momentum, decay, scale;  ///< hyper-parameters and the gradient scale
  bool nesterov;   ///< Nesterov momentum
  update_extras<T> x{};  ///< used when Extras
  /// Updates element i.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    T gi;
    if constexpr (Extras) {
      if (!x.applies()) return;
      gi = x.gradient(g[i] * x.scale(scale));
    } else {
      gi = g[i] * scale;
    }
    T d = gi + decay * p[i];
    if (v) {
      const T vi = momentum * v[i] + d;
      v[i] = vi;
      d = nesterov ? d + momentum * vi : vi;
    }
    p[i] -= lr * d;
    if constexpr (Extras) x.average(i, p[i]);
  }
};
}  // namespace detail

/// SGD: d = g + weight_decay * p; with momentum v = momentum * v + d and d = v (or d + momentum * v
/// for Nesterov); p -= lr * d.
struct sgd {
  using optimizer_concept = optimizer_tag;  ///< opts in to the optimizer concept
  static constexpr bool elementwise = true;  ///< per-parameter update and state (see optimizer_elementwise_v)
  static constexpr bool applies_recipe = true;  ///< applies clip_value, decision and ema in its pass
  float lr = 0.01f;           ///< learning rate
  float momentum = 0.0f;      ///< momentum factor (0: plain SGD)
  bool nesterov = false;      ///< Nesterov momentum (needs momentum > 0)
  float weight_decay = 0.0f;  ///< L2 penalty added to the gradient

  /// State elements for n parameters: a momentum buffer when momentum is used.
  [[nodiscard]] std::size_t state_size(std::size_t n) const noexcept { return momentum != 0.0f ? n : 0; }
  /// momentum, nesterov and weight_decay, exactly (a multi-worker fit compares them across workers).
  [[nodiscard]] std::string hyperparameters() const {
    return detail::hyperparameter_bits({momentum, nesterov ? 1.0f : 0.0f, weight_decay});
  }

  /// Throws config_error naming a hyper-parameter out of range (the strategy calls it before an
  /// update): lr and weight_decay finite and >= 0, momentum in [0, 1] (above 1 the velocity grows
  /// geometrically), nesterov with momentum > 0.
  void check() const {
    constexpr const char* who = "lockstep::sgd";
    detail::require_option(who, "lr", lr, detail::finite_nonnegative(lr), "finite and >= 0");
    detail::require_option(who, "momentum", momentum, momentum >= 0.0f && momentum <= 1.0f, "in [0, 1]");
    detail::require_option(who, "weight_decay", weight_decay, detail::finite_nonnegative(weight_decay),
                           "finite and >= 0");
    if (nesterov && !(momentum > 0.0f)) throw config_error("lockstep::sgd: nesterov needs momentum > 0");
  }

  /// Applies one update to n parameters (state must hold state_size(n) zero-initialised elements).
  template <class T, class Ctx>
  void update(Ctx& ctx, T* p, const T* g, T* state, std::size_t n, const update_info& u) const {
    if (u.plain())
      for_each_index(ctx, n, op<T, false>(p, g, state, u));
    else
      for_each_index(ctx, n, op<T, true>(p, g, state, u));
  }

private:
  template <class T, bool Extras>
  detail::sgd_op<T, Extras> op(T* p, const T* g, T* state, const update_info& u) const {
    detail::sgd_op<T, Extras> o{p, g, momentum != 0.0f ? state : nullptr, static_cast<T>(u.lr), static_cast<T>(momentum),
                                static_cast<T>(weight_decay), static_cast<T>(u.grad_scale), nesterov};
    if constexpr (Extras) o.x = detail::update_extras<T>::of(u);
    return o;
  }
};

}  // namespace lockstep
