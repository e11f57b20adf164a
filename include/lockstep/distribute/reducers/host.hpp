#pragma once
/// @file host.hpp
/// The reducers of host (cpu<I>) replicas, over shared memory:
///  - `host_allreduce`: reduce-scatter + all-gather. Once every replica has arrived at a bucket,
///    replica r sums slice r (1/N of the bucket) over all replicas in the fixed order 0..N-1 and
///    writes the result into every replica's buffer, so each thread moves the same number of
///    bytes and none is a bottleneck. The default for all-cpu device sets.
///  - `reduce_to_one_device<D>`: the replica on D sums the whole bucket (same order), then every
///    other replica copies the result ("aggregate on one device, then broadcast").
/// Both give bitwise-identical sums, which do not depend on thread timing (run_to_run).
/// A backend may let `reduce_to_one_device<cpu<I>>` aggregate its own replicas on the host (GPU
/// replicas through pinned memory: lockstep/distribute/reducers/host_staged.hpp) by
/// specialising `detail::host_aggregation` for its context type; host builds never see it.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/core/device.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/memory/resource.hpp>
#include <lockstep/distribute/reducer.hpp>

namespace lockstep {

namespace detail {

/// Elements per chunk of the host reduction loops (the accumulator stays in L1).
inline constexpr std::size_t reduce_chunk_bytes = 4096;

/// Sums elements [lo, hi) of the n buffers ptrs[0..n) in order 0..n-1 into `out` pointers.
template <class T, class Write>
void sum_range(const host_comm& c, std::size_t bucket, std::size_t lo, std::size_t hi, const Write& write) {
  constexpr std::size_t chunk = reduce_chunk_bytes / sizeof(T);
  T acc[chunk];
  const std::size_t n = c.replicas();
  for (std::size_t b = lo; b < hi; b += chunk) {
    const std::size_t m = std::min(chunk, hi - b);
    std::memcpy(acc, static_cast<const T*>(c.pointer(bucket, 0)) + b, m * sizeof(T));
    for (std::size_t j = 1; j < n; ++j) {
      const T* p = static_cast<const T*>(c.pointer(bucket, j)) + b;
      for (std::size_t i = 0; i < m; ++i) acc[i] += p[i];
    }
    write(b, acc, m);
  }
}

/// Replica r's slice of `count` elements, with boundaries on 64-byte multiples.
template <class T>
std::pair<std::size_t, std::size_t> slice_of(std::size_t count, std::size_t r, std::size_t n) noexcept {
  constexpr std::size_t align = std::max<std::size_t>(1, 64 / sizeof(T));
  const std::size_t units = (count + align - 1) / align;
  const std::size_t lo = std::min(count, units * r / n * align);
  const std::size_t hi = std::min(count, units * (r + 1) / n * align);
  return {lo, hi};
}

template <class T>
void allreduce_work(host_comm& c, std::size_t r, std::size_t bucket, std::size_t count, std::uint64_t) {
  const std::size_t n = c.replicas();
  if (n == 1) return;
  const auto [lo, hi] = slice_of<T>(count, r, n);
  sum_range<T>(c, bucket, lo, hi, [&](std::size_t b, const T* acc, std::size_t m) {
    for (std::size_t j = 0; j < n; ++j) std::memcpy(static_cast<T*>(c.pointer(bucket, j)) + b, acc, m * sizeof(T));
  });
}

template <class T>
void reduce_to_root_work(host_comm& c, std::size_t r, std::size_t bucket, std::size_t count, std::uint64_t seq) {
  const std::size_t root = c.root();
  if (c.replicas() == 1) return;
  if (r == root) {
    sum_range<T>(c, bucket, 0, count, [&](std::size_t b, const T* acc, std::size_t m) {
      std::memcpy(static_cast<T*>(c.pointer(bucket, root)) + b, acc, m * sizeof(T));
    });
    c.publish_stage(r, seq);
  } else {
    c.await_stage(root, seq, r, bucket);
    if (count) std::memcpy(c.pointer(bucket, r), c.pointer(bucket, root), count * sizeof(T));
  }
}

/// True when the replicas whose context is Ctx keep their data in memory the host can read (the
/// kind's device_memory says host_accessible).
template <class Ctx>
inline constexpr bool host_readable_context_v =
    device_memory<typename std::remove_cvref_t<Ctx>::device_kind>::host_accessible;

/// Host memory in which a backend stages device data for reduce_to_one_device<cpu<I>>
/// (type-erased, so host builds need no backend headers).
class host_staging {
public:
  virtual ~host_staging() = default;
  /// The memory.
  [[nodiscard]] virtual void* data() noexcept = 0;
  /// Its size in bytes.
  [[nodiscard]] virtual std::size_t size() const noexcept = 0;
};

/// How reduce_to_one_device<cpu<I>> serves replicas whose context is Ctx. This primary template
/// is host memory (the shared-memory engine); a backend specialises it for its context type with
/// `enabled = true` and static `start`, `wait` and `broadcast` that stage through host_staging.
template <class Ctx>
struct host_aggregation {
  static constexpr bool enabled = false;  ///< no backend path: the data is host memory
};

/// Whether replicas on device Dv may aggregate on the host (a backend specialises it to true).
template <class Dv>
inline constexpr bool host_aggregation_serves = false;

/// What both host reducers share: the engine, broadcast, abort and reset.
class host_reducer_base {
public:
  explicit host_reducer_base(const reducer_config& c, std::size_t root)
      : comm_(c.replicas, c.timeout, c.ids, root) {}
  /// Host memory needs no workspace.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  /// Nothing to bind.
  void bind(std::size_t, void*, std::size_t) noexcept {}
  /// Completes the bucket on every replica.
  template <class Ctx>
  void wait(std::size_t replica, Ctx&, std::size_t bucket) {
    comm_.wait(replica, bucket);
  }
  /// Copies `count` elements of the root's data to every replica (synchronous).
  template <class Ctx, class T>
  void broadcast(std::size_t replica, Ctx&, T* data, std::size_t count, std::size_t root) {
    comm_.broadcast(replica, data, count, sizeof(T), root);
  }
  /// Releases every waiter.
  void abort() noexcept { comm_.abort(); }
  /// Ready again after a failure.
  void reset() noexcept { comm_.reset(); }

protected:
  host_comm comm_;
};

}  // namespace detail

/// Host all-reduce over shared memory: reduce-scatter + all-gather, each replica reducing its own
/// 1/N of every bucket (summation order 0..N-1 for every element: run-to-run deterministic).
class host_allreduce : public detail::host_reducer_base {
public:
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  /// Serves any set of host devices.
  template <class... Ds>
  static constexpr bool supports = (is_cpu_v<Ds> && ...);
  /// A reducer for `c.replicas` replicas.
  explicit host_allreduce(const reducer_config& c = {}) : host_reducer_base(c, 0) {}
  /// Replica `replica` contributes `count` elements at `data` to bucket `bucket` (in-place sum).
  template <class Ctx, class T>
  void start(std::size_t replica, Ctx&, T* data, std::size_t count, std::size_t bucket) {
    static_assert(std::is_arithmetic_v<T>, "lockstep::host_allreduce sums arithmetic elements");
    static_assert(detail::host_readable_context_v<Ctx>,
                  "lockstep::host_allreduce sums memory the host can read, and this kind's device_memory says it "
                  "cannot (host_accessible = false): use the reducer its backend provides, or "
                  "reduce_to_one_device<cpu<I>> where its backend stages buckets through host memory");
    comm_.start(replica, bucket, data, count, &detail::allreduce_work<T>);
  }
};

/// Aggregation on one designated device D: the replica on D sums every bucket (order 0..N-1),
/// then the others copy the result. Simple, but the aggregating thread does N times the work.
/// With the CUDA backend, `reduce_to_one_device<cpu<I>>` also serves gpu<I> replicas (the host
/// sums their buckets in pinned memory) and `reduce_to_one_device<gpu<K>>` is specialised for
/// GPU replicas (lockstep/distribute/reducers/host_staged.hpp and to_one_device_gpu.cuh).
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
  /// A reducer aggregating on replica `c.root` (the strategy sets it to D's position).
  explicit reduce_to_one_device(const reducer_config& c = {}) : host_reducer_base(c, c.root), staging_(c.replicas) {}
  /// Replica `replica` contributes `count` elements at `data` to bucket `bucket` (in-place sum).
  template <class Ctx, class T>
  void start(std::size_t replica, Ctx& ctx, T* data, std::size_t count, std::size_t bucket) {
    static_assert(std::is_arithmetic_v<T>, "lockstep::reduce_to_one_device sums arithmetic elements");
    using path = detail::host_aggregation<std::remove_const_t<Ctx>>;
    static_assert(path::enabled || detail::host_readable_context_v<Ctx>,
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
