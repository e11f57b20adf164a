#pragma once
/// @file host.hpp
/// The reducers of host (cpu<I>) replicas over shared memory, and their default selection:
///  - `host_allreduce` (host_allreduce.hpp): reduce-scatter + all-gather; the default for
///    all-cpu device sets;
///  - `reduce_to_one_device<D>` (reduce_to_one_device.hpp): the replica on D sums, the others copy.
/// Both give bitwise-identical sums, which do not depend on thread timing (run_to_run).

#include <cstddef>

#include <lockstep/core/device.hpp>
#include <lockstep/distribute/reducers/host_allreduce.hpp>
#include <lockstep/distribute/reducers/reduce_to_one_device.hpp>
#include <lockstep/distribute/reducers/select.hpp>

namespace lockstep {

/// Host replicas listed at run time: the shared-memory all-reduce (any number of replicas).
template <>
struct select_kind_reducer<cpus> {
  using type = host_allreduce;  ///< reduce-scatter + all-gather over shared memory
};

/// Several host devices: the shared-memory all-reduce.
template <class... Devices>
  requires(sizeof...(Devices) > 1 && (is_cpu_v<Devices> && ...))
struct select_reducer<Devices...> {
  using type = host_allreduce;  ///< reduce-scatter + all-gather over shared memory
};

}  // namespace lockstep
