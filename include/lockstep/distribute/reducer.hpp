#pragma once
/// @file reducer.hpp
/// The reducer interface: how replicas aggregate gradient sums. A strategy owns one reducer and
/// calls it from each replica's own worker thread. The interface (documented in
/// docs/distribute.md) fits both the host engine and device libraries (NCCL, CUB):
///
///  - construction from a `reducer_config` (replica count, timeout, the collective ids it serves, root replica);
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
#include <type_traits>

#include <lockstep/backend/context.hpp>
#include <lockstep/backend/host/context.hpp>
#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/concepts.hpp>

namespace lockstep {

/// Opt-in tag: a type is a reducer only when it says `using reducer_concept = lockstep::reducer_tag;`.
struct reducer_tag {};

/// What a strategy tells its reducer at construction.
struct reducer_config {
  std::size_t replicas = 1;                    ///< number of replicas taking part
  std::chrono::milliseconds timeout{60'000};   ///< longest wait before timeout_error
  std::size_t ids = collective_ids::count;     ///< collective ids [0, ids) may be used (see collective_ids)
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

namespace detail {
/// Checks reducer R with context Ctx and float data member by member, so that a reducer that
/// lacks one is told which (the members of the `reducer` concept, and `supports`).
template <class R, class Ctx = host_context>
constexpr bool check_reducer() {
  static_assert(requires { requires std::same_as<typename R::reducer_concept, reducer_tag>; },
                "lockstep: a reducer opts in with `using reducer_concept = lockstep::reducer_tag;`");
  static_assert(requires { { R::template supports<cpu<0>> } -> std::convertible_to<bool>; },
                "lockstep: a reducer needs `template <class... Devices> static constexpr bool supports` (the device "
                "sets it serves)");
  static_assert(std::constructible_from<R, const reducer_config&>,
                "lockstep: a reducer needs a constructor `explicit R(const lockstep::reducer_config& config)`");
  static_assert(requires(const R& r, std::size_t n) { { r.workspace_bytes(n) } -> std::convertible_to<std::size_t>; },
                "lockstep: a reducer needs `std::size_t workspace_bytes(std::size_t max_bucket_bytes) const`");
  static_assert(requires(R& r, std::size_t i, void* p) { r.bind(i, p, i); },
                "lockstep: a reducer needs `void bind(std::size_t replica, void* workspace, std::size_t bytes)`");
  static_assert(requires(R& r, std::size_t i, Ctx& ctx, float* p) { r.start(i, ctx, p, i, i); },
                "lockstep: a reducer needs `template <class Ctx, class T> void start(std::size_t replica, Ctx& ctx, T* "
                "data, std::size_t count, std::size_t bucket)`");
  static_assert(requires(R& r, std::size_t i, Ctx& ctx) { r.wait(i, ctx, i); },
                "lockstep: a reducer needs `template <class Ctx> void wait(std::size_t replica, Ctx& ctx, std::size_t "
                "bucket)`");
  static_assert(requires(R& r, std::size_t i, Ctx& ctx, float* p) { r.broadcast(i, ctx, p, i, i); },
                "lockstep: a reducer needs `template <class Ctx, class T> void broadcast(std::size_t replica, Ctx& ctx, "
                "T* data, std::size_t count, std::size_t root)`");
  static_assert(requires(R& r) { r.abort(); }, "lockstep: a reducer needs `void abort()` (callable from any thread)");
  static_assert(requires(R& r) { r.reset(); }, "lockstep: a reducer needs `void reset()`");
  return true;  // each missing member was named above
}
}  // namespace detail

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

/// True when the reducers and default selections of device kind Kind are defined in this
/// translation unit: a backend's reducer headers specialise it (the GPU kind's:
/// <lockstep/cuda.hpp>), so the primary select_reducer can tell a missing include from a device set
/// that has no path.
template <class Kind>
struct default_reducers_for : std::false_type {};

namespace detail {
/// T, as a type that depends on Ts (so a backend may still specialise templates of T before use).
template <class T, class... Ts>
struct dependent_type {
  using type = T;  ///< T
};

/// Why Devices... (several of them) have no default reducer; each diagnosis names one cause.
template <class... Devices>
struct no_reducer_diagnosis {
  static constexpr bool all_cpu = (is_cpu_v<Devices> && ...);
  static constexpr bool all_gpu = (is_gpu_v<Devices> && ...);
  static constexpr bool mixed = !all_cpu && !all_gpu && ((is_cpu_v<Devices> || is_gpu_v<Devices>) && ...);
  static constexpr bool gpu_backend = backend_traits<typename dependent_type<gpus, Devices...>::type>::registered &&
                                      default_reducers_for<typename dependent_type<gpus, Devices...>::type>::value;
  static constexpr bool distinct_gpus = [] {
    if constexpr (!all_gpu) {
      return false;
    } else {
      constexpr std::size_t ord[] = {static_cast<std::size_t>(Devices::ordinal)...};
      for (std::size_t i = 0; i < sizeof...(Devices); ++i)
        for (std::size_t j = i + 1; j < sizeof...(Devices); ++j)
          if (ord[i] == ord[j]) return false;
      return true;
    }
  }();
#if defined(LOCKSTEP_HAS_NCCL)
  static constexpr bool nccl = true;
#else
  static constexpr bool nccl = false;
#endif
};
}  // namespace detail

/// The default reducer of a device set. This primary template is chosen only when no path exists;
/// its message names the one cause that applies.
template <class... Devices>
struct select_reducer {
  using why = detail::no_reducer_diagnosis<Devices...>;  ///< the diagnosis
  static_assert(!why::mixed, "lockstep: no reducer for this device set: cpu<I> and gpu<I> devices cannot share one "
                             "strategy; use one strategy per device kind");
  static_assert(!(why::all_gpu && !why::gpu_backend),
                "lockstep: no reducer for this device set: gpu<I> devices need the CUDA backend and its reducers; "
                "#include <lockstep/cuda.hpp> in a .cu file compiled by nvcc and link lockstep::cuda");
  static_assert(!(why::all_gpu && why::gpu_backend && why::distinct_gpus && !why::nccl),
                "lockstep: no reducer for this device set: several distinct gpu<I> need NCCL; install NCCL where "
                "CMake finds it (cmake/FindNCCL.cmake, NCCL_ROOT) with LOCKSTEP_CUDA=AUTO or ON and link lockstep::nccl "
                "(which defines LOCKSTEP_HAS_NCCL)");
  static_assert(!(why::all_gpu && why::gpu_backend && !why::distinct_gpus),
                "lockstep: no reducer for this device set: a gpu<I> listed more than once next to other GPUs has no "
                "default reducer (all on one GPU, or all distinct, have one); name a reducer with "
                "basic_mirrored<Reducer, ...>");
  static_assert(why::mixed || why::all_gpu,
                "lockstep: no reducer for this device set: its device kind's backend offers no default reducer; "
                "specialise lockstep::select_reducer for it, or name a reducer with basic_mirrored<Reducer, ...>");
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
  static_assert(!is_gpu_v<Kind>, "lockstep: no reducer for gpu devices; include <lockstep/cuda.hpp> (a .cu file "
                                 "compiled by nvcc) and link lockstep::cuda");
  static_assert(is_gpu_v<Kind>, "lockstep: no default reducer for this device kind; its backend must specialise "
                                "lockstep::select_kind_reducer<Kind>, or name a reducer with basic_mirrored<Reducer, ...>");
  using type = void;  ///< no reducer
};

/// Shorthand for select_kind_reducer<Kind>::type.
template <class Kind>
using select_kind_reducer_t = typename select_kind_reducer<Kind>::type;

}  // namespace lockstep
