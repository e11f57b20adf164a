#pragma once
/// @file gpu_selection.cuh
/// The default reducers of GPU replicas, side by side, keyed on the kind type `gpus` (a device of
/// another kind never matches, whatever it resembles):
///  - several gpu<I> naming one GPU: `same_device_allreduce`;
///  - several distinct gpu<I>, with NCCL: `nccl_allreduce`;
///  - `mirrored<gpus>` (replicas listed at run time): `nccl_allreduce` with NCCL, else the host
///    sums the buckets in pinned memory (`reduce_to_one_device<cpu<0>>`).
/// Any other GPU set (a repeated gpu<I> beside other GPUs; distinct GPUs without NCCL) has no
/// default: the primary select_reducer names the cause. Compile with nvcc.

#if !defined(__CUDACC__)
#error "lockstep/distribute/reducers/gpu_selection.cuh selects CUDA reducers: compile with nvcc"
#endif

#include <type_traits>

#include <lockstep/core/device.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/detail/cuda_common.hpp>
#include <lockstep/distribute/reducers/host.hpp>
#include <lockstep/distribute/reducers/host_staged.hpp>
#include <lockstep/distribute/reducers/same_device.cuh>
#if defined(LOCKSTEP_HAS_NCCL)
#include <lockstep/distribute/reducers/nccl.hpp>
#endif

namespace lockstep {

/// The GPU kind's default reducers are defined (the primary select_reducer's diagnosis asks).
template <>
struct default_reducers_for<gpus> : std::true_type {};

/// Several gpu<I> replicas on the same GPU: the on-device reduction.
template <class... Devices>
  requires(sizeof...(Devices) > 1 && all_of_kind_v<gpus, Devices...> && detail::same_gpu<Devices...>())
struct select_reducer<Devices...> {
  using type = same_device_allreduce;  ///< one kernel per bucket on the shared device
};

#if defined(LOCKSTEP_HAS_NCCL)

/// Several distinct gpu<I>: NCCL all-reduce.
template <class... Devices>
  requires(sizeof...(Devices) > 1 && all_of_kind_v<gpus, Devices...> && detail::distinct_gpus<Devices...>())
struct select_reducer<Devices...> {
  using type = nccl_allreduce;  ///< NCCL between the GPUs
};

/// GPU replicas listed at run time (mirrored<gpus>): NCCL between distinct GPUs.
template <>
struct select_kind_reducer<gpus> {
  using type = nccl_allreduce;  ///< NCCL between the GPUs
};

#else

/// GPU replicas listed at run time (mirrored<gpus>) in a build without NCCL: the host sums the
/// buckets of every GPU in pinned memory (reduce_to_one_device<cpu<0>>).
template <>
struct select_kind_reducer<gpus> {
  using type = reduce_to_one_device<cpu<0>>;  ///< aggregation on the host
};

#endif  // LOCKSTEP_HAS_NCCL

}  // namespace lockstep
