#pragma once
/// @file strategies.hpp
/// Names for GPU strategies with a replica count given as a number, for programs that choose the
/// count at run time from a fixed menu (for example `--device gpu --replicas N`).

#include <cstddef>
#include <utility>

#include <lockstep/core/device.hpp>
#include <lockstep/distribute/mirrored.hpp>

namespace lockstep {

namespace detail {
template <class Seq>
struct distinct_gpu_strategy;
template <std::size_t... I>
struct distinct_gpu_strategy<std::index_sequence<I...>> {
  using type = mirrored<gpu<I>...>;
};
template <class Seq>
struct shared_gpu_strategy;
template <std::size_t... I>
struct shared_gpu_strategy<std::index_sequence<I...>> {
  using type = mirrored<gpu<I * 0>...>;
};
}  // namespace detail

/// mirrored<gpu<0>, gpu<1>, ..., gpu<N-1>>: one replica per GPU (NCCL between them).
template <std::size_t N>
using mirrored_gpus_t = typename detail::distinct_gpu_strategy<std::make_index_sequence<N>>::type;

/// mirrored<gpu<0>, ..., gpu<0>> with N replicas sharing GPU 0 (the on-device reducer).
template <std::size_t N>
using mirrored_on_gpu0_t = typename detail::shared_gpu_strategy<std::make_index_sequence<N>>::type;

}  // namespace lockstep
