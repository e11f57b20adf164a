#pragma once
/// @file device.hpp
/// Device tags `cpu<I>` and `gpu<I>` and the `device` concept.

#include <concepts>
#include <cstddef>
#include <type_traits>

namespace lockstep {

/// Kinds of device a replica can live on.
enum class device_kind { cpu, gpu };

/// Tag of the I-th host device: a CPU replica driven by its own thread.
template <std::size_t I>
struct cpu {
  static constexpr device_kind kind = device_kind::cpu;  ///< always device_kind::cpu
  static constexpr std::size_t ordinal = I;             ///< index among host replicas
};

/// Tag of CUDA device I (named gpu, not cuda, to avoid the CUDA C++ library's namespace).
template <std::size_t I>
struct gpu {
  static constexpr device_kind kind = device_kind::gpu;  ///< always device_kind::gpu
  static constexpr std::size_t ordinal = I;             ///< CUDA device ordinal
};

/// A device tag: has a kind and an ordinal (cpu<I>, gpu<I>, or a user tag shaped alike).
template <class D>
concept device = requires {
  { D::kind } -> std::convertible_to<device_kind>;
  { D::ordinal } -> std::convertible_to<std::size_t>;
};

namespace detail {
/// True when D is a device of kind K (false, not an error, for a type that is no device).
template <class D, device_kind K>
constexpr bool is_device_kind() noexcept {
  if constexpr (device<D>) return D::kind == K;
  else return false;
}
}  // namespace detail

/// True when D is a host device.
template <class D>
inline constexpr bool is_cpu_v = detail::is_device_kind<D, device_kind::cpu>();

/// True when D is a CUDA device.
template <class D>
inline constexpr bool is_gpu_v = detail::is_device_kind<D, device_kind::gpu>();

}  // namespace lockstep
