#pragma once
/// @file layer.hpp
/// The layer concept. A layer type (say `dense<784, 128>`) is unbound: it says which input widths
/// it accepts. Binding it to an input width (`L::template bind<In>`) gives the bound layer, whose
/// static members do the work on flat parameter views. Layers hold no batch state: activations
/// and scratch live in a workspace the caller owns, so replicas and threads stay simple.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <lockstep/core/random.hpp>

namespace lockstep {

/// Opt-in tag: a type is a layer only when it says `using layer_concept = lockstep::layer_tag;`.
struct layer_tag {};

/// What a forward or backward pass needs to know besides tensors: the mode and the keys of
/// its randomness. Keys use the sample's position in the GLOBAL batch, so dropout masks do not
/// depend on how the batch is split across replicas.
struct pass_info {
  bool training = false;             ///< train mode (dropout active) or eval mode
  std::uint64_t seed = 0;            ///< the run's seed
  std::uint64_t step = 0;            ///< global step number (keys dropout masks)
  std::uint64_t sample_offset = 0;   ///< position of this shard's first row in the global batch
  std::uint64_t layer_stream = 0;    ///< identifies the layer (sequential derives it per position)
};

/// Random-stream purposes, mixed into layer streams so that init and dropout never share draws.
enum class rng_purpose : std::uint64_t { init = 1, dropout = 2 };

/// The stream of layer `layer_stream` for `purpose` (and, for per-step draws, `step`).
constexpr std::uint64_t layer_rng_stream(std::uint64_t layer_stream, rng_purpose purpose,
                                         std::uint64_t step = 0) noexcept {
  return mix_stream(mix_stream(layer_stream, static_cast<std::uint64_t>(purpose)), step);
}

/// A bound layer's shape, each a `static constexpr std::size_t`:
///   - `input_size`, `output_size`: features in and out per row;
///   - `param_count`: elements of the layer's slice of the flat parameter (and gradient) buffer;
///   - `workspace_per_sample`: elements of scratch per row that forward keeps for backward.
template <class B>
concept bound_layer = requires {
  { B::input_size } -> std::convertible_to<std::size_t>;
  { B::output_size } -> std::convertible_to<std::size_t>;
  { B::param_count } -> std::convertible_to<std::size_t>;
  { B::workspace_per_sample } -> std::convertible_to<std::size_t>;
};

namespace detail {
/// B has `static void init(T* params, const counter_rng&)`.
template <class B, class T>
concept bound_layer_init = requires(T* p, const counter_rng& rng) {
  { B::init(p, rng) } -> std::same_as<void>;
};
/// B has `static void forward(Ctx&, const T*, const T*, T*, T*, std::size_t, const pass_info&)`.
template <class B, class T, class Ctx>
concept bound_layer_forward = requires(Ctx& ctx, const T* c, T* m, std::size_t n, const pass_info& info) {
  { B::forward(ctx, c, c, m, m, n, info) } -> std::same_as<void>;
};
/// B has `static void backward(Ctx&, const T*, const T*, const T*, const T*, T*, T*, T*,
/// std::size_t, const pass_info&)`.
template <class B, class T, class Ctx>
concept bound_layer_backward = requires(Ctx& ctx, const T* c, T* m, std::size_t n, const pass_info& info) {
  { B::backward(ctx, c, c, c, c, m, m, m, n, info) } -> std::same_as<void>;
};
}  // namespace detail

/// A bound layer the library can run with element type T on contexts of type Ctx: its shape
/// (`bound_layer`) and the three static functions the library calls, exactly:
///   - `static void init(T* params, const counter_rng& rng)`: fills the layer's parameters (host
///     memory) from its own random stream;
///   - `static void forward(Ctx& ctx, const T* params, const T* x, T* y, T* workspace,
///     std::size_t batch, const pass_info& info)`: y (batch x output_size) from x (batch x
///     input_size); may keep up to batch * workspace_per_sample elements in workspace;
///   - `static void backward(Ctx& ctx, const T* params, const T* x, const T* y, const T* dy, T* dx,
///     T* dparams, T* workspace, std::size_t batch, const pass_info& info)`: OVERWRITES dparams
///     with the gradient of the loss sum and, when dx is not null, writes the input gradient.
/// Nothing else of a bound layer is used (an optional `layer_count` marks a nested sequential).
template <class B, class T, class Ctx>
concept bound_layer_for = bound_layer<B> && detail::bound_layer_init<B, T> && detail::bound_layer_forward<B, T, Ctx> &&
                          detail::bound_layer_backward<B, T, Ctx>;

/// An unbound layer. Required members:
///   - `using layer_concept = lockstep::layer_tag;` (the opt-in, so nothing is a layer by accident);
///   - `static constexpr std::size_t expected_input`: the one input width it accepts, or 0 for any;
///   - `template <std::size_t In> struct bind` (or an alias template): the bound layer for input
///     width In, a `bound_layer_for` each element type and context the layer supports;
///   - optionally `template <std::size_t In> static constexpr bool accepts`, which refines the
///     accepted widths (sequential uses it to check a whole nested chain).
template <class L>
concept layer = requires {
  typename L::layer_concept;
  requires std::same_as<typename L::layer_concept, layer_tag>;
  { L::expected_input } -> std::convertible_to<std::size_t>;
};

namespace detail {
/// Checks bound layer B for element type T and context Ctx member by member, so that a layer that
/// lacks one is told which; the library calls it where it first runs a bound layer.
template <class B, class T, class Ctx>
constexpr bool check_bound_layer() {
  if constexpr (std::is_void_v<B>) {
    return true;  // a sequential whose shapes do not chain: reported by layer_shape_mismatch
  } else {
    static_assert(requires { { B::input_size } -> std::convertible_to<std::size_t>; },
                  "lockstep: a bound layer needs `static constexpr std::size_t input_size`");
    static_assert(requires { { B::output_size } -> std::convertible_to<std::size_t>; },
                  "lockstep: a bound layer needs `static constexpr std::size_t output_size`");
    static_assert(requires { { B::param_count } -> std::convertible_to<std::size_t>; },
                  "lockstep: a bound layer needs `static constexpr std::size_t param_count`");
    static_assert(requires { { B::workspace_per_sample } -> std::convertible_to<std::size_t>; },
                  "lockstep: a bound layer needs `static constexpr std::size_t workspace_per_sample`");
    static_assert(bound_layer_init<B, T>,
                  "lockstep: a bound layer needs `static void init(T* params, const lockstep::counter_rng& rng)`");
    static_assert(bound_layer_forward<B, T, Ctx>,
                  "lockstep: a bound layer needs `static void forward(Ctx& ctx, const T* params, const T* x, T* y, "
                  "T* workspace, std::size_t batch, const lockstep::pass_info& info)`");
    static_assert(bound_layer_backward<B, T, Ctx>,
                  "lockstep: a bound layer needs `static void backward(Ctx& ctx, const T* params, const T* x, "
                  "const T* y, const T* dy, T* dx, T* dparams, T* workspace, std::size_t batch, "
                  "const lockstep::pass_info& info)`");
    if constexpr (requires { B::template check_layers<T, Ctx>(); })
      return B::template check_layers<T, Ctx>();  // a sequential: its layers too
    else
      return true;  // each missing member was named above
  }
}
}  // namespace detail

/// True when layer L accepts input width In.
template <class L, std::size_t In>
inline constexpr bool accepts_v = In > 0 && (L::expected_input == 0 || L::expected_input == In);

/// The bound form of layer L at input width In.
template <class L, std::size_t In>
using bind_t = typename L::template bind<In>;

}  // namespace lockstep
