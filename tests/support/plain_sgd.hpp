#pragma once
// An elementwise SGD of a user's: it applies neither clipping nor the EMA itself (no
// `applies_recipe`), so a strategy clips the reduced gradient for it and updates the EMA after it.

#include <cstddef>

#include <lockstep/optimizers/optimizer.hpp>

namespace user {

/// p -= lr * g * grad_scale, with no state.
struct plain_sgd {
  using optimizer_concept = lockstep::optimizer_tag;  ///< opts in to the optimizer concept
  static constexpr bool elementwise = true;           ///< per-parameter update
  float lr = 0.1f;                                    ///< learning rate
  /// No state.
  std::size_t state_size(std::size_t) const { return 0; }
  /// One update of n parameters from the gradient sums g.
  template <class T, class Ctx>
  void update(Ctx&, T* p, const T* g, T*, std::size_t n, const lockstep::update_info& u) const {
    const T s = static_cast<T>(u.grad_scale), r = static_cast<T>(u.lr);
    for (std::size_t i = 0; i < n; ++i) p[i] -= r * (g[i] * s);
  }
};

}  // namespace user
