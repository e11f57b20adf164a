#pragma once
/// @file optimizer.hpp
/// The optimizer concept. An optimiser is a small value type of hyper-parameters; its state
/// (momentum, moments) lives in one flat buffer beside the parameters, and an update is one
/// elementwise pass over the flat buffers that also divides the gradient SUM by the global
/// sample count.

#include <concepts>
#include <cstddef>
#include <cstdint>

namespace lockstep {

/// Opt-in tag: a type is an optimiser only when it says `using optimizer_concept = lockstep::optimizer_tag;`.
struct optimizer_tag {};

/// What one update needs besides the buffers.
struct update_info {
  float lr = 0;               ///< learning rate for this step (after the schedule)
  std::uint64_t step = 1;     ///< 1-based number of this update
  double grad_scale = 1;      ///< multiplies the gradient first: 1 / global sample count
};

/// An optimiser: `state_size(n)` elements of state for n parameters and
/// `update(ctx, params, grads, state, n, info)`.
template <class O>
concept optimizer = requires(const O& o, std::size_t n) {
  typename O::optimizer_concept;
  requires std::same_as<typename O::optimizer_concept, optimizer_tag>;
  { o.state_size(n) } -> std::convertible_to<std::size_t>;
  { o.lr } -> std::convertible_to<float>;
};

}  // namespace lockstep
