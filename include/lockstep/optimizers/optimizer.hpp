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

/// An optimiser, its device-independent part: a copyable value of hyper-parameters. Required members:
///   - `using optimizer_concept = lockstep::optimizer_tag;` (the opt-in);
///   - `float lr`: the base learning rate, read and assigned (fit copies the optimiser and sets
///     lr to the scheduled rate of each update);
///   - `std::size_t state_size(std::size_t n) const`: elements of state for n parameters (the
///     library zero-initialises them, keeps them beside the parameters and checkpoints them).
/// Which element types and contexts it runs on is `optimizer_for<O, T, Ctx>`.
template <class O>
concept optimizer = std::copy_constructible<O> && requires(const O& o, O& m, std::size_t n, float f) {
  typename O::optimizer_concept;
  requires std::same_as<typename O::optimizer_concept, optimizer_tag>;
  { o.state_size(n) } -> std::convertible_to<std::size_t>;
  { o.lr } -> std::convertible_to<float>;
  m.lr = f;
};

namespace detail {
/// O has `void update(Ctx&, T*, const T*, T*, std::size_t, const update_info&) const`.
template <class O, class T, class Ctx>
concept optimizer_update = requires(const O& o, Ctx& ctx, T* p, const T* g, std::size_t n, const update_info& u) {
  { o.update(ctx, p, g, p, n, u) } -> std::same_as<void>;
};
}  // namespace detail

/// An optimiser the library can apply with element type T on contexts of type Ctx: `optimizer<O>`
/// and the one member function the library calls, on a const optimiser:
///   - `void update(Ctx& ctx, T* params, const T* grads, T* state, std::size_t n,
///     const update_info& info) const`: one update of the n parameters from the gradient SUMS
///     (multiply them by info.grad_scale first) with learning rate info.lr at 1-based step
///     info.step; state holds state_size(n) elements, zero before the first update.
template <class O, class T, class Ctx>
concept optimizer_for = optimizer<O> && detail::optimizer_update<O, T, Ctx>;

/// True when optimiser O says `static constexpr bool elementwise = true;`: the update of each
/// parameter reads only that parameter, its gradient and its own state, and the state of n
/// parameters is k arrays of n elements (state_size(n) == k n). Then any slice of the parameters
/// can be updated on its own with a state of state_size(slice) elements, with the same bits as
/// the whole update — what strategy_options::shard_optimizer needs.
template <class O>
inline constexpr bool optimizer_elementwise_v = requires { requires O::elementwise; };

namespace detail {
/// Checks optimiser O for element type T and context Ctx member by member, so that an optimiser
/// that lacks one is told which.
template <class O, class T, class Ctx>
constexpr bool check_optimizer() {
  static_assert(requires { requires std::same_as<typename O::optimizer_concept, optimizer_tag>; },
                "lockstep: an optimiser opts in with `using optimizer_concept = lockstep::optimizer_tag;`");
  static_assert(requires(O& o, float f) { { o.lr } -> std::convertible_to<float>; o.lr = f; },
                "lockstep: an optimiser needs a public `float lr` member (the base learning rate)");
  static_assert(requires(const O& o, std::size_t n) { { o.state_size(n) } -> std::convertible_to<std::size_t>; },
                "lockstep: an optimiser needs `std::size_t state_size(std::size_t n) const`");
  static_assert(std::copy_constructible<O>, "lockstep: an optimiser must be copyable");
  static_assert(optimizer_update<O, T, Ctx>,
                "lockstep: an optimiser needs `void update(Ctx& ctx, T* params, const T* grads, T* state, "
                "std::size_t n, const lockstep::update_info& info) const` (note the const)");
  return true;  // each missing member was named above
}
}  // namespace detail

}  // namespace lockstep
