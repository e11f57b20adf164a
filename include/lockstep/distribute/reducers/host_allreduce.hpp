#pragma once
/// @file host_allreduce.hpp
/// `host_allreduce`: the all-reduce of host (cpu<I>) replicas over shared memory, reduce-scatter +
/// all-gather. Once every replica has arrived at a bucket, replica r sums slice r (1/N of the
/// bucket) over all replicas in the fixed order 0..N-1 and writes the result into every replica's
/// buffer, so each thread moves the same number of bytes and none is a bottleneck. Bitwise the
/// same sums run after run (run_to_run). The default for all-cpu device sets.

#include <cstddef>
#include <type_traits>

#include <lockstep/core/device.hpp>
#include <lockstep/core/views.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/detail/host_sum.hpp>

namespace lockstep {

/// Host all-reduce over shared memory: reduce-scatter + all-gather, each replica reducing its own
/// 1/N of every bucket (summation order 0..N-1 for every element: run-to-run deterministic).
class host_allreduce : public detail::host_reducer_base {
public:
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  /// Serves any set of host devices.
  template <class... Ds>
  static constexpr bool supports = (is_cpu_v<Ds> && ...);
  /// Serves the replicas of a kind whose memory the host reads and writes.
  template <class Kind>
  static constexpr bool supports_kind = device_memory<Kind>::host_accessible;
  /// A reducer for `c.replicas` replicas.
  explicit host_allreduce(const reducer_config& c = {}) : host_reducer_base(c, 0) {}
  /// Replica `replica` contributes `count` elements at `data` to bucket `bucket` (in-place sum).
  template <class Ctx, class T>
  void start(std::size_t replica, Ctx&, T* data, std::size_t count, std::size_t bucket) {
    static_assert(std::is_arithmetic_v<T>, "lockstep::host_allreduce sums arithmetic elements");
    static_assert(device_memory<kind_of_context_t<Ctx>>::host_accessible,
                  "lockstep::host_allreduce sums memory the host can read, and this kind's device_memory says it "
                  "cannot (host_accessible = false): use the reducer its backend provides, or "
                  "reduce_to_one_device<cpu<I>> where its backend stages buckets through host memory");
    comm_.start(replica, bucket, data, count, &detail::allreduce_work<T>);
  }
};

}  // namespace lockstep
