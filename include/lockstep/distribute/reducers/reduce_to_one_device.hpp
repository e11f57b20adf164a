#pragma once
/// @file reduce_to_one_device.hpp
/// `reduce_to_one_device<D>`: the replica on D sums the whole bucket (order 0..N-1) and writes the
/// result into every replica's buffer ("aggregate on one device, then broadcast"). The same sums as
/// host_allreduce, bitwise. A backend may let `reduce_to_one_device<cpu<I>>` aggregate its own
/// replicas on the host (detail/host_aggregation.hpp); `reduce_to_one_device<gpu<K>>` is the
/// CUDA reducers' specialisation.

#include <cstddef>
#include <memory>
#include <type_traits>
#include <vector>

#include <lockstep/core/device.hpp>
#include <lockstep/core/views.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/detail/host_aggregation.hpp>
#include <lockstep/distribute/reducers/detail/host_sum.hpp>

namespace lockstep {

/// Aggregation on one designated device D: the replica on D sums every bucket (order 0..N-1) and
/// writes the result into every replica's buffer. Simple, but the aggregating thread does N times
/// the work.
/// With the CUDA backend, `reduce_to_one_device<cpu<I>>` also serves gpu<I> replicas (the host
/// sums their buckets in pinned memory) and `reduce_to_one_device<gpu<K>>` is specialised for
/// GPU replicas (lockstep/distribute/reducers/to_one_device_gpu.cuh).
template <class D>
class reduce_to_one_device : public detail::host_reducer_base {
public:
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  using aggregation_device = D;         ///< where the sum is formed
  /// Serves host device sets that contain D, and (D a host device) device sets whose backend
  /// aggregates on the host.
  template <class... Ds>
  static constexpr bool supports = ((is_cpu_v<Ds> && ...) && (std::is_same_v<D, Ds> || ...)) ||
                                   (is_cpu_v<D> && sizeof...(Ds) >= 1 && (detail::host_aggregation_serves<Ds> && ...));
  /// Serves the replicas of kind Kind: host memory, or (D a host device) a kind whose backend
  /// aggregates on the host.
  template <class Kind>
  static constexpr bool supports_kind =
      device_memory<Kind>::host_accessible ||
      (is_cpu_v<D> && detail::host_aggregation<std::remove_const_t<context_t<Kind>>>::enabled);
  /// A reducer aggregating on replica `c.root` (the strategy sets it to D's position).
  explicit reduce_to_one_device(const reducer_config& c = {}) : host_reducer_base(c, c.root), staging_(c.replicas) {}
  /// Replica `replica` contributes `count` elements at `data` to bucket `bucket` (in-place sum).
  template <class Ctx, class T>
  void start(std::size_t replica, Ctx& ctx, T* data, std::size_t count, std::size_t bucket) {
    static_assert(std::is_arithmetic_v<T>, "lockstep::reduce_to_one_device sums arithmetic elements");
    using path = detail::host_aggregation<std::remove_const_t<Ctx>>;
    static_assert(path::enabled || device_memory<kind_of_context_t<Ctx>>::host_accessible,
                  "lockstep::reduce_to_one_device sums memory the host can read, and this kind's device_memory says "
                  "it cannot (host_accessible = false) while its backend does not stage buckets through host memory "
                  "(detail::host_aggregation): use the reducer its backend provides");
    if constexpr (path::enabled)
      path::start(comm_, staging_.at(replica), replica, ctx, data, count, bucket);
    else
      comm_.start(replica, bucket, data, count, &detail::reduce_to_root_work<T>);
  }
  /// Completes the bucket on every replica.
  template <class Ctx>
  void wait(std::size_t replica, Ctx& ctx, std::size_t bucket) {
    comm_.wait(replica, bucket);
    using path = detail::host_aggregation<std::remove_const_t<Ctx>>;
    if constexpr (path::enabled) path::wait(ctx);
  }
  /// Copies `count` elements of the root's data to every replica (synchronous).
  template <class Ctx, class T>
  void broadcast(std::size_t replica, Ctx& ctx, T* data, std::size_t count, std::size_t root) {
    using path = detail::host_aggregation<std::remove_const_t<Ctx>>;
    if constexpr (path::enabled)
      path::broadcast(comm_, staging_.at(replica), replica, ctx, data, count, root);
    else
      comm_.broadcast(replica, data, count, sizeof(T), root);
  }

private:
  std::vector<std::unique_ptr<detail::host_staging>> staging_;  // per replica; used by backend paths only
};

}  // namespace lockstep
