#pragma once
/// @file device.hpp
/// Device kinds and device tags. The KIND of a device is a type (`cpus`, `gpus`): everything a
/// replica runs is instantiated once per kind. The ORDINAL is a value: `cpu<I>` and `gpu<I>` are
/// the static spelling of one device (`mirrored<gpu<0>, gpu<1>>`), and a strategy over a kind may
/// take its device list at run time. `kind_of_t<D>` maps a tag (or a kind) to its kind.

#include <concepts>
#include <cstddef>
#include <type_traits>

namespace lockstep {

/// Kinds of device a replica can live on.
enum class device_kind { cpu, gpu };

/// The host device kind: replicas on CPU cores, each driven by its own thread.
struct cpus {
  static constexpr device_kind kind = device_kind::cpu;  ///< always device_kind::cpu
  using kind_type = cpus;                                ///< a kind is its own kind
};

/// The CUDA device kind: one replica per GPU (or several sharing one).
struct gpus {
  static constexpr device_kind kind = device_kind::gpu;  ///< always device_kind::gpu
  using kind_type = gpus;                                ///< a kind is its own kind
};

/// Tag of the I-th host device: a CPU replica driven by its own thread.
template <std::size_t I>
struct cpu {
  static constexpr device_kind kind = device_kind::cpu;  ///< always device_kind::cpu
  static constexpr std::size_t ordinal = I;             ///< index among host replicas
  using kind_type = cpus;                                ///< the device kind
};

/// Tag of CUDA device I (named gpu, not cuda, to avoid the CUDA C++ library's namespace).
template <std::size_t I>
struct gpu {
  static constexpr device_kind kind = device_kind::gpu;  ///< always device_kind::gpu
  static constexpr std::size_t ordinal = I;             ///< CUDA device ordinal
  using kind_type = gpus;                                ///< the device kind
};

/// A device tag: has a kind and an ordinal (cpu<I>, gpu<I>, or a user tag shaped alike).
template <class D>
concept device = requires {
  { D::kind } -> std::convertible_to<device_kind>;
  { D::ordinal } -> std::convertible_to<std::size_t>;
};

/// A device kind: a type that is its own kind (cpus, gpus, or a backend's own kind type).
template <class K>
concept device_kind_tag = requires {
  typename K::kind_type;
  { K::kind } -> std::convertible_to<device_kind>;
} && std::same_as<typename K::kind_type, K>;

namespace detail {
template <class D>
struct kind_of {
  static_assert(device_kind_tag<D> || device<D>, "lockstep: kind_of_t<D> needs a device tag (cpu<I>, gpu<I>) or a kind (cpus, gpus)");
};
template <class D>
  requires requires { typename D::kind_type; }
struct kind_of<D> {
  using type = typename D::kind_type;
};
template <class D>
  requires(!requires { typename D::kind_type; } && device<D>)
struct kind_of<D> {
  using type = std::conditional_t<D::kind == device_kind::cpu, cpus, gpus>;
};
}  // namespace detail

/// The kind of device tag D (cpus for cpu<I>, gpus for gpu<I>); a kind maps to itself.
template <class D>
using kind_of_t = typename detail::kind_of<D>::type;

namespace detail {
/// True when D is a device of kind K (false, not an error, for a type that is no device).
template <class D, device_kind K>
constexpr bool is_device_kind() noexcept {
  if constexpr (device<D> || device_kind_tag<D>) return D::kind == K;
  else return false;
}
}  // namespace detail

/// True when D is a host device (or the host kind).
template <class D>
inline constexpr bool is_cpu_v = detail::is_device_kind<D, device_kind::cpu>();

/// True when D is a CUDA device (or the CUDA kind).
template <class D>
inline constexpr bool is_gpu_v = detail::is_device_kind<D, device_kind::gpu>();

}  // namespace lockstep
