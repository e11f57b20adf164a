#pragma once
/// @file cuda_common.hpp
/// Internal: what the GPU reducers share besides kernels — how many replicas one GPU may hold, the
/// replica pointer table kernels take by value, the GPU sets each reducer serves (same ordinal,
/// distinct ordinals) and the check that a reducer is given GPU replicas' contexts. Host code:
/// compiles with g++ where the CUDA headers are present.

#include <array>
#include <cstddef>
#include <type_traits>

#include <lockstep/backend/cuda/context.hpp>
#include <lockstep/core/device.hpp>

namespace lockstep::detail {

/// Most replicas one GPU may hold under same_device_allreduce (and reduce_to_one_device<gpu<K>>).
inline constexpr std::size_t max_replicas_per_gpu = 16;

/// The data pointers of every replica, passed to a kernel by value.
template <class T>
struct replica_pointers {
  T* p[max_replicas_per_gpu];  ///< replica j's data
};

/// All GPU tags of Ds name the same ordinal.
template <class D0, class... Ds>
constexpr bool same_gpu() {
  return ((static_cast<std::size_t>(Ds::ordinal) == static_cast<std::size_t>(D0::ordinal)) && ...);
}

/// No two GPU tags of Ds name the same ordinal.
template <class... Ds>
constexpr bool distinct_gpus() {
  constexpr std::array<std::size_t, sizeof...(Ds)> ord{static_cast<std::size_t>(Ds::ordinal)...};
  for (std::size_t i = 0; i < ord.size(); ++i)
    for (std::size_t j = i + 1; j < ord.size(); ++j)
      if (ord[i] == ord[j]) return false;
  return true;
}

/// Refuses, at compile time, a context that is not a GPU replica's.
template <class Ctx>
constexpr void require_cuda_context() {
  static_assert(std::is_same_v<std::remove_const_t<Ctx>, backend::cuda_context>,
                "lockstep: this GPU reducer serves gpu<I> replicas (their context is cuda_context)");
}

}  // namespace lockstep::detail
