#pragma once
/// @file optimizer.hpp
/// The optimizer concept. An optimiser is a small value type of hyper-parameters; its state
/// (momentum, moments) lives in one flat buffer beside the parameters, and an update is one
/// elementwise pass over the flat buffers that also divides the gradient SUM by the global
/// sample count.

#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include <lockstep/backend/epilogue.hpp>
#include <lockstep/config.hpp>

namespace lockstep {

/// Opt-in tag: a type is an optimiser only when it says `using optimizer_concept = lockstep::optimizer_tag;`.
struct optimizer_tag {};

/// What one update needs besides the buffers.
struct update_info {
  float lr = 0;               ///< learning rate for this step (after the schedule)
  std::uint64_t step = 1;     ///< 1-based number of this update
  double grad_scale = 1;      ///< multiplies the gradient first: clip factor / (rows of the update × loss scale)
  /// When > 0, each scaled gradient element (sum × grad_scale) is clamped to [-clip_value,
  /// clip_value] before the optimiser uses it (per-value clipping).
  float clip_value = 0;
  /// Device memory: the epilogue's decision, read by the update kernel in place of grad_scale
  /// (and skipping the update when it says so); null where the decision is a host value.
  const update_decision* decision = nullptr;
  /// The exponential moving average of the same n parameters (elements of the parameter type),
  /// updated after the parameters as ema = ema_decay × ema + (1 - ema_decay) × p; null for none.
  void* ema = nullptr;
  double ema_decay = 0;       ///< the EMA's decay for this update (0: the EMA takes the parameters)

  /// True when the update uses nothing beyond lr, step and grad_scale.
  [[nodiscard]] constexpr bool plain() const noexcept { return clip_value <= 0 && decision == nullptr && ema == nullptr; }
};

/// An optimiser, its device-independent part: a copyable value of hyper-parameters. Required members:
///   - `using optimizer_concept = lockstep::optimizer_tag;` (the opt-in);
///   - `float lr`: the base learning rate, read and assigned (fit copies the optimiser and sets
///     lr to the scheduled rate of each update);
///   - `std::size_t state_size(std::size_t n) const`: elements of state for n parameters (the
///     library zero-initialises them, keeps them beside the parameters and checkpoints them);
///   - optionally `void check() const`, throwing config_error for a hyper-parameter out of range
///     (check_hyperparameters);
///   - optionally `std::string hyperparameters() const`: the values other than lr that change the
///     update, as text (optimizer_hyperparameters); a multi-worker fit refuses workers whose texts differ.
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

/// Checks optimiser `o`'s hyper-parameters when it has the optional member `void check() const`
/// (throwing config_error naming the one out of range); strategies call it before an update, fit
/// before its first.
template <class O>
void check_hyperparameters(const O& o) {
  if constexpr (requires { o.check(); }) o.check();
}

/// The optimiser's hyper-parameters other than lr, as its `hyperparameters()` gives them ("" for
/// an optimiser without that member: nothing to compare).
template <class O>
std::string optimizer_hyperparameters(const O& o) {
  if constexpr (requires { o.hyperparameters(); }) {
    static_assert(std::convertible_to<decltype(o.hyperparameters()), std::string>,
                  "lockstep: an optimizer's hyperparameters() must return text (a std::string)");
    return o.hyperparameters();
  } else {
    return {};
  }
}

namespace detail {
/// The exact bits of `values`, as text (what lockstep's optimisers return from hyperparameters()),
/// with -0 read as +0 (they update alike, so workers holding one and the other agree).
inline std::string hyperparameter_bits(std::initializer_list<float> values) {
  std::string text;
  for (const float v : values) text += std::to_string(std::bit_cast<std::uint32_t>(v == 0.0f ? 0.0f : v)) + ",";
  return text;
}
}  // namespace detail

/// True when optimiser O says `static constexpr bool applies_recipe = true;`: its update applies
/// update_info's clip_value, decision and ema itself, in its one pass over the parameters (the
/// library's optimisers do). For any other optimiser the strategy clips values in a pass of its
/// own, waits for a device decision, and updates the EMA in a separate pass.
template <class O>
inline constexpr bool optimizer_applies_recipe_v = requires { requires O::applies_recipe; };

namespace detail {
/// The clamp of per-value clipping (no std::min/max, so that device code can use it).
template <class T>
LOCKSTEP_HD inline T clip_to(T v, T bound) {
  return v > bound ? bound : (v < -bound ? -bound : v);
}

/// The parts of an update beyond the gradient scale (update_info's clip_value, decision and
/// EMA), as the library's element updates apply them.
template <class T>
struct update_extras {
  T clip = 0;                                ///< per-value clipping bound (0: none)
  const update_decision* decision = nullptr; ///< device decision (scale and skip), or null
  T* ema = nullptr;                          ///< the EMA of the same elements, or null
  T ema_keep = 0, ema_take = 1;              ///< ema = keep × ema + take × p

  /// The extras of update `u` for elements of type T.
  static update_extras of(const update_info& u) {
    return {static_cast<T>(u.clip_value), u.decision, static_cast<T*>(u.ema), static_cast<T>(u.ema_decay),
            static_cast<T>(1.0 - u.ema_decay)};
  }
  /// False when the device decision says to skip the update.
  LOCKSTEP_HD bool applies() const { return decision == nullptr || decision->skip == 0; }
  /// The gradient scale: the device decision's, else `host`.
  LOCKSTEP_HD T scale(T host) const { return decision ? static_cast<T>(decision->scale) : host; }
  /// The scaled gradient element, clipped.
  LOCKSTEP_HD T gradient(T g) const { return clip > T(0) ? clip_to(g, clip) : g; }
  /// Updates the EMA of element i after its parameter became p.
  LOCKSTEP_HD void average(std::size_t i, T p) const {
    if (ema) ema[i] = ema_keep * ema[i] + ema_take * p;
  }
};

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
