#pragma once
/// @file device.hpp
/// Device kinds and device tags. The KIND of a device is a type (`cpus`, `gpus`, or a backend's
/// own kind): everything a replica runs is instantiated once per kind, and everything that
/// depends on the kind (backend, memory, default reducer) is selected by that type, so a new kind
/// is never mistaken for another. The ORDINAL is a value: `cpu<I>` and `gpu<I>` are the static
/// spelling of one device (`mirrored<gpu<0>, gpu<1>>`), and a strategy over a kind may take its
/// device list at run time. `kind_of_t<D>` maps a tag (or a kind) to its kind.

#include <concepts>
#include <cstddef>
#include <type_traits>

namespace lockstep {

/// The host device kind: replicas on CPU cores, each driven by its own thread.
struct cpus {
  using kind_type = cpus;  ///< a kind is its own kind
};

/// The CUDA device kind: one replica per GPU (or several sharing one).
struct gpus {
  using kind_type = gpus;  ///< a kind is its own kind
};

/// Tag of the I-th host device: a CPU replica driven by its own thread.
template <std::size_t I>
struct cpu {
  static constexpr std::size_t ordinal = I;  ///< index among host replicas
  using kind_type = cpus;                    ///< the device kind
};

/// Tag of CUDA device I (named gpu, not cuda, to avoid the CUDA C++ library's namespace).
template <std::size_t I>
struct gpu {
  static constexpr std::size_t ordinal = I;  ///< CUDA device ordinal
  using kind_type = gpus;                    ///< the device kind
};

/// A device kind: a type that is its own kind (cpus, gpus, or a backend's own kind type).
template <class K>
concept device_kind_tag = requires { typename K::kind_type; } && std::same_as<typename K::kind_type, K>;

/// A device tag: names its kind (`using kind_type = ...;`) and has an ordinal (cpu<I>, gpu<I>, or
/// a user tag shaped alike).
template <class D>
concept device = requires {
  typename D::kind_type;
  { D::ordinal } -> std::convertible_to<std::size_t>;
} && device_kind_tag<typename D::kind_type>;

namespace detail {
template <class D>
struct kind_of {
  static_assert(device_kind_tag<D> || device<D>,
                "lockstep: kind_of_t<D> needs a device tag (cpu<I>, gpu<I>: `using kind_type = ...;` and an ordinal) "
                "or a kind (cpus, gpus)");
};
template <class D>
  requires device_kind_tag<D> || device<D>
struct kind_of<D> {
  using type = typename D::kind_type;
};

/// True when D is a device of kind K, or kind K itself (false, not an error, for a type that is neither).
template <class D, class K>
constexpr bool is_of_kind() noexcept {
  if constexpr (device<D> || device_kind_tag<D>) return std::is_same_v<typename D::kind_type, K>;
  else return false;
}
}  // namespace detail

/// The kind of device tag D (cpus for cpu<I>, gpus for gpu<I>); a kind maps to itself.
template <class D>
using kind_of_t = typename detail::kind_of<D>::type;

/// True when D is a host device (or the host kind): its kind is `cpus`.
template <class D>
inline constexpr bool is_cpu_v = detail::is_of_kind<D, cpus>();

/// True when D is a CUDA device (or the CUDA kind): its kind is `gpus` (another accelerator's
/// kind is not, whatever it resembles).
template <class D>
inline constexpr bool is_gpu_v = detail::is_of_kind<D, gpus>();

/// True when every tag of Ds is of kind K (and there is at least one).
template <class K, class... Ds>
inline constexpr bool all_of_kind_v = sizeof...(Ds) > 0 && (detail::is_of_kind<Ds, K>() && ...);

}  // namespace lockstep
