#pragma once
/// @file reducer.hpp
/// The reducer interface: how replicas aggregate gradient sums. A strategy owns one reducer and
/// calls it from each replica's own worker thread. The interface (documented in
/// docs/distribute.md) fits both the host engine and device libraries (NCCL, CUB):
///
///  - construction from a `reducer_config` (replica count, timeout, bucket ids, root replica);
///  - two-phase workspace: `workspace_bytes(max_bucket_bytes)` first, then `bind(replica, ptr,
///    bytes)` on each replica's thread with memory the strategy allocated on that device; the
///    steady state allocates nothing;
///  - per bucket, `start(replica, ctx, data, count, bucket)` (an in-place SUM all-reduce that may
///    run asynchronously) and `wait(replica, ctx, bucket)` (after which data holds the sum on
///    every replica); buckets start in the same order on every replica;
///  - `broadcast(replica, ctx, data, count, root)`, synchronous;
///  - `abort()` (any thread: every waiter throws) and `reset()` (when no replica is inside).
///
/// `select_reducer_t<Devices...>` picks the default reducer for a device set at compile time;
/// backends add constrained partial specialisations of `select_reducer`.

#include <chrono>
#include <concepts>
#include <cstddef>

#include <lockstep/backend/host/context.hpp>
#include <lockstep/distribute/concepts.hpp>

namespace lockstep {

/// Opt-in tag: a type is a reducer only when it says `using reducer_concept = lockstep::reducer_tag;`.
struct reducer_tag {};

/// What a strategy tells its reducer at construction.
struct reducer_config {
  std::size_t replicas = 1;                    ///< number of replicas taking part
  std::chrono::milliseconds timeout{60'000};   ///< longest wait before timeout_error
  std::size_t max_buckets = 256;               ///< bucket ids 0..max_buckets-1 may be used
  std::size_t root = 0;                        ///< the replica a reduce-to-one scheme aggregates on
};

/// A reducer: opts in with reducer_tag, says which device sets it serves
/// (`template <class... Ds> static constexpr bool supports`), and provides the two-phase
/// workspace, per-bucket start/wait, broadcast, abort and reset (checked here with a host context
/// and float data; device reducers take their own context type).
template <class R>
concept reducer = requires(R& r, const R& cr, std::size_t i, host_context& ctx, float* p) {
  typename R::reducer_concept;
  requires std::same_as<typename R::reducer_concept, reducer_tag>;
  requires std::constructible_from<R, const reducer_config&>;
  { cr.workspace_bytes(i) } -> std::convertible_to<std::size_t>;
  r.bind(i, static_cast<void*>(nullptr), i);
  r.start(i, ctx, p, i, i);
  r.wait(i, ctx, i);
  r.broadcast(i, ctx, p, i, i);
  r.abort();
  r.reset();
};

/// The reducer of a single replica: nothing to aggregate; every call returns at once.
struct single_device_reducer {
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  /// Serves exactly one device of any kind.
  template <class... Ds>
  static constexpr bool supports = sizeof...(Ds) == 1;
  /// Ignores the configuration.
  explicit single_device_reducer(const reducer_config& = {}) noexcept {}
  /// Needs no workspace.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  /// Nothing to bind.
  void bind(std::size_t, void*, std::size_t) noexcept {}
  /// The sum over one replica is the data itself.
  template <class Ctx, class T>
  void start(std::size_t, Ctx&, T*, std::size_t, std::size_t) noexcept {}
  /// Nothing to wait for.
  template <class Ctx>
  void wait(std::size_t, Ctx&, std::size_t) noexcept {}
  /// A broadcast to oneself.
  template <class Ctx, class T>
  void broadcast(std::size_t, Ctx&, T*, std::size_t, std::size_t) noexcept {}
  /// Nothing to release.
  void abort() noexcept {}
  /// Nothing to re-arm.
  void reset() noexcept {}
};

/// The default reducer of a device set. This primary template is chosen only when no path exists.
template <class... Devices>
struct select_reducer {
  static_assert(detail::always_false<Devices...>,
                "lockstep: no reducer for this device set. All cpu<I> devices use host_allreduce; gpu<I> devices "
                "need the CUDA backend (#include <lockstep/backend/cuda.hpp>, built with LOCKSTEP_HAS_CUDA); cpu and "
                "gpu devices cannot share one strategy; or name a reducer explicitly with basic_mirrored<Reducer, ...>");
  using type = void;  ///< no reducer
};

/// One device needs no aggregation.
template <class Device>
struct select_reducer<Device> {
  using type = single_device_reducer;  ///< the no-op reducer
};

/// Shorthand for select_reducer<Devices...>::type.
template <class... Devices>
using select_reducer_t = typename select_reducer<Devices...>::type;

/// The default reducer of a run-time strategy over device kind Kind (any number of replicas of
/// that kind). This primary template is chosen only when the kind's backend offers none.
template <class Kind>
struct select_kind_reducer {
  static_assert(!is_gpu_v<Kind>, "lockstep: no reducer for gpu devices; include <lockstep/backend/cuda.hpp> (a .cu "
                                 "file compiled by nvcc) and link lockstep::cuda");
  static_assert(is_gpu_v<Kind>, "lockstep: no default reducer for this device kind; its backend must specialise "
                                "lockstep::select_kind_reducer<Kind>, or name a reducer with basic_mirrored<Reducer, ...>");
  using type = void;  ///< no reducer
};

/// Shorthand for select_kind_reducer<Kind>::type.
template <class Kind>
using select_kind_reducer_t = typename select_kind_reducer<Kind>::type;

}  // namespace lockstep
