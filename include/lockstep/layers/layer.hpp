#pragma once
/// @file layer.hpp
/// The layer concept. A layer type (say `dense<784, 128>`) is unbound: it says which input widths
/// it accepts. Binding it to an input width (`L::template bind<In>`) gives the bound layer, whose
/// static members do the work on flat parameter views. Layers hold no batch state: activations
/// and scratch live in a workspace the caller owns, so replicas and threads stay simple.

#include <concepts>
#include <cstddef>
#include <cstdint>

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

/// A bound layer: fixed input and output widths, a parameter count, a per-sample workspace, and
/// static init / forward / backward over flat arrays (see dense.hpp for the reference shape).
template <class B>
concept bound_layer = requires {
  { B::input_size } -> std::convertible_to<std::size_t>;
  { B::output_size } -> std::convertible_to<std::size_t>;
  { B::param_count } -> std::convertible_to<std::size_t>;
  { B::workspace_per_sample } -> std::convertible_to<std::size_t>;
};

/// An unbound layer: opts in with layer_tag, names the input width it expects (0 when it takes
/// any width, as activations do) and can be bound to an accepted width.
template <class L>
concept layer = requires {
  typename L::layer_concept;
  requires std::same_as<typename L::layer_concept, layer_tag>;
  { L::expected_input } -> std::convertible_to<std::size_t>;
};

/// True when layer L accepts input width In.
template <class L, std::size_t In>
inline constexpr bool accepts_v = In > 0 && (L::expected_input == 0 || L::expected_input == In);

/// The bound form of layer L at input width In.
template <class L, std::size_t In>
using bind_t = typename L::template bind<In>;

}  // namespace lockstep
