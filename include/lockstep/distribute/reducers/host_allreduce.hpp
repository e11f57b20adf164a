#pragma once
/// @file host_allreduce.hpp
/// `host_allreduce`: the all-reduce of host (cpu<I>) replicas over shared memory, reduce-scatter +
/// all-gather. Once every replica has arrived at a bucket, replica r sums slice r (1/N of the
/// bucket) over all replicas in the fixed order 0..N-1 and writes the result into every replica's
/// buffer, so each thread moves the same number of bytes and none is a bottleneck. Bitwise the
/// same sums run after run (run_to_run). The default for all-cpu device sets.
///
/// For an update sharded over the replicas (strategy_options::shard_optimizer) it reduces onto
/// the update's slices instead (reduces_to_slices_v): each replica sums only the elements its own
/// slice holds, into its own buffer (a reduce-scatter, the same sums bit for bit, with no
/// all-gather of sums that nobody reads), and after the update each replica writes its updated
/// slice into the others' parameters.

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/views.hpp>
#include <lockstep/distribute/collective_ids.hpp>
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
  /// Reduces a sharded update's buckets onto its slices and gathers them (reducer.hpp).
  static constexpr bool reduces_to_slices = true;
  /// A reducer for `c.replicas` replicas.
  explicit host_allreduce(const reducer_config& c = {})
      : host_reducer_base(c, 0), replicas_(c.replicas), jobs_(c.ids * c.replicas) {}
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

  /// Replica `replica`'s part of the reduce-scatter of bucket `bucket`, [offset, offset + count) of
  /// `grads`: once every replica has arrived, each sums in order 0..N-1 the part of the bucket its
  /// own slice (`slices`, one per replica, in order) holds, into its own buffer; wait() completes
  /// it. The other elements of the bucket keep this replica's own gradient.
  template <class Ctx, class T>
  void reduce_to_slices(std::size_t replica, Ctx&, T* grads, std::size_t offset, std::size_t count, std::size_t bucket,
                        std::span<const std::pair<std::size_t, std::size_t>> slices) {
    static_assert(std::is_arithmetic_v<T>, "lockstep::host_allreduce sums arithmetic elements");
    static_assert(device_memory<kind_of_context_t<Ctx>>::host_accessible,
                  "lockstep::host_allreduce sums memory the host can read; a reducer derived from it for a kind whose "
                  "memory the host cannot read says `static constexpr bool reduces_to_slices = false;`");
    if (!collective_ids::is_bucket(bucket))
      throw config_error("lockstep::host_allreduce: reduce_to_slices takes a gradient bucket, not " +
                         collective_ids::name(bucket));
    check_slices(slices);
    detail::slice_job& job = jobs_[bucket * replicas_ + replica];
    job = {offset, slices};
    comm_.start(replica, bucket, grads + offset, count, &detail::reduce_to_slices_work<T>, &job);
  }

  /// Sums `count` doubles at `chunks` over the replicas in place, in order 0..N-1 (the epilogue's
  /// chunk sums); returns when every replica has them.
  template <class Ctx>
  void sum_chunks(std::size_t replica, Ctx&, double* chunks, std::size_t count) {
    comm_.start(replica, collective_ids::epilogue_sums, chunks, count, &detail::allreduce_work<double>);
    comm_.wait(replica, collective_ids::epilogue_sums);
  }

  /// Every replica's slice of `params` into every replica's `params`: once every replica has
  /// arrived (so every slice is updated), each writes its own slice into the others'; returns when
  /// every replica has written.
  template <class Ctx, class T>
  void gather_slices(std::size_t replica, Ctx&, T* params, std::span<const std::pair<std::size_t, std::size_t>> slices) {
    check_slices(slices);
    detail::slice_job& job = jobs_[collective_ids::gather_slices * replicas_ + replica];
    job = {0, slices};
    comm_.start(replica, collective_ids::gather_slices, params, 0, &detail::push_slices_work<T>, &job);
    comm_.wait(replica, collective_ids::gather_slices);
  }

private:
  void check_slices(std::span<const std::pair<std::size_t, std::size_t>> slices) const {
    detail::check_reducer_slices(slices, replicas_, "lockstep::host_allreduce");
  }

  std::size_t replicas_;
  std::vector<detail::slice_job> jobs_;  // per collective id and replica: what its slice work reads
};

}  // namespace lockstep
