#pragma once
/// @file context.hpp
/// The registration point of a device kind and the contract its backend meets.
///
/// A backend registers kind `K` by specialising `backend_traits<K>` (its context type, its name,
/// how many devices exist, how a replica's context is made) and `device_memory<K>`
/// (memory/resource.hpp); its kernels are overloads found by argument-dependent lookup on the
/// context type. `device_backend<K>` checks all of it. The host kind (`cpus`) is registered here;
/// the CUDA kind (`gpus`) by <lockstep/backend/cuda.hpp>.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <lockstep/backend/host/context.hpp>
#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/precision.hpp>
#include <lockstep/core/views.hpp>
#include <lockstep/memory/resource.hpp>

namespace lockstep {

namespace backend {

/// Makes the calling thread's device allocations land on `ctx`'s device without changing how the
/// thread computes: `ctx.place_memory()` where the context has one (host_context: nothing;
/// cuda_context: its device made current), else `ctx.activate()`. For the caller's thread, which
/// allocates replicas' buffers (replicate, state loads) but computes for none of them.
template <class Ctx>
void place_memory(const Ctx& ctx) {
  if constexpr (requires { ctx.place_memory(); })
    ctx.place_memory();
  else
    ctx.activate();
}

namespace detail {
/// What caller_scope_t is for contexts without their own: nothing to keep.
struct no_caller_scope {
  no_caller_scope() noexcept = default;
};
template <class Ctx>
struct caller_scope_of {
  using type = no_caller_scope;
};
template <class Ctx>
  requires requires { typename Ctx::caller_scope; }
struct caller_scope_of<Ctx> {
  using type = typename Ctx::caller_scope;
};
}  // namespace detail

/// Keeps the calling thread's device state for contexts of type Ctx as it was when made and
/// restores it when it goes: `Ctx::caller_scope` where the context has one (cuda_context: the
/// current CUDA device), else nothing (host_context: worker_pool keeps the caller's
/// floating-point mode itself). A strategy holds one around the work it does on its caller's
/// thread (replica 0's jobs, placing replicas' memory), so the caller's thread is left as it was.
template <class Ctx>
using caller_scope_t = typename detail::caller_scope_of<Ctx>::type;

}  // namespace backend

/// Run-time settings a strategy hands to backend_traits<K>::make_context for each replica.
struct replica_settings {
  int blas_threads = 1;          ///< host kinds: threads one replica's GEMMs may use
  bool flush_denormals = true;   ///< host kinds: the replica's thread flushes subnormal floats to zero
  bool tf32 = false;             ///< GPU kinds: FP32 GEMMs may use TF32 tensor cores (host kinds refuse it)
  compute_precision precision = compute_precision::fp32;  ///< the model's precision policy (replicate<Net, P>)
};

/// What device kind Kind provides to the library. This primary template is chosen only for a
/// kind no backend registered (`registered` is false).
template <class Kind>
struct backend_traits {
  static constexpr bool registered = false;  ///< no backend for this kind
};

/// The host kind: a replica is a thread with a BLAS thread budget; the ordinal names the replica.
template <>
struct backend_traits<cpus> {
  static constexpr bool registered = true;     ///< a backend exists
  using context_type = host_context;           ///< a replica's execution context
  static constexpr const char* name = "cpu";   ///< the kind's name in messages and options
  /// Host replicas are threads: any ordinal is valid (beyond the allowed cores they share them).
  static constexpr bool ordinals_bounded = false;
  /// A host replica is one core: its worker thread is pinned to it when there are enough cores.
  static constexpr bool replica_owns_core = true;
  /// The number of host devices: the cores this process may run on.
  static std::size_t device_count() { return static_cast<std::size_t>(allowed_cpu_count()); }
  /// The context of the replica on device `ordinal`.
  static context_type make_context(std::size_t, const replica_settings& s) {
    if (s.tf32)
      throw config_error("lockstep: strategy_options::tf32 applies to GPU replicas; cpu replicas compute FP32 GEMMs "
                         "in FP32");
    return context_type(s.blas_threads, s.flush_denormals, s.precision);
  }
};

namespace detail {
template <class Kind>
struct context_of_kind {
  static_assert(!is_gpu_v<Kind> || backend_traits<Kind>::registered,
                "lockstep: no execution context for gpu devices; include <lockstep/backend/cuda.hpp> (a .cu file "
                "compiled by nvcc) and link lockstep::cuda");
  static_assert(is_gpu_v<Kind> || backend_traits<Kind>::registered,
                "lockstep: no backend is registered for this device kind; specialise lockstep::backend_traits<Kind> "
                "(see docs/architecture.md, adding a device kind)");
  using type = typename backend_traits<Kind>::context_type;
};
}  // namespace detail

/// The context type of device D (a tag such as cpu<I>, or a kind).
template <class D>
struct context_of {
  using type = typename detail::context_of_kind<kind_of_t<D>>::type;  ///< the context type
};

/// Shorthand for context_of<D>::type: host_context for every cpu<I>, cuda_context for every gpu<I>.
template <class D>
using context_t = typename context_of<D>::type;

/// Before a strategy allocates its replicas on kind K: throws device_error naming the first
/// replica that does not fit when K's backend can tell (`backend_traits<K>::check_memory(contexts,
/// bytes)`: each replica needs `bytes` on its device, replicas sharing a device add up); does
/// nothing for a kind without such a check (host memory).
template <class K>
void check_replica_memory(const std::vector<context_t<K>>& contexts, std::size_t bytes) {
  if constexpr (requires { backend_traits<K>::check_memory(contexts, bytes); })
    backend_traits<K>::check_memory(contexts, bytes);
}

namespace detail {
/// An elementwise functor shaped like those layers pass to for_each_index (callable on host and device).
struct index_functor_archetype {
  /// Visits index i.
  LOCKSTEP_HD void operator()(std::size_t) const {}
};
}  // namespace detail

/// A device kind with a complete backend: registered traits and memory, a context that names its
/// kind (`using kind_type = K;`, which types the views layers receive) and can be activated on
/// the calling thread and synchronised, and the kernels every layer, loss and
/// optimiser is written in (GEMM, the elementwise launch, fills and copies on the device and
/// between host and device, row broadcast, column sums, sums, scaling), found by
/// argument-dependent lookup on the context type; a kind whose memory the host cannot address
/// also stages shards through its context (stage_shard).
template <class K>
concept device_backend =
    device_kind_tag<K> && backend_traits<K>::registered &&
    requires(typename backend_traits<K>::context_type& ctx, const replica_settings& rs, std::size_t n, float* p,
             const float* cp, double* dp, const double* cdp, const std::int32_t* ip, std::int32_t* wip,
             backend::trans t) {
      requires std::same_as<kind_of_context_t<typename backend_traits<K>::context_type>, K>;
      { backend_traits<K>::name } -> std::convertible_to<const char*>;
      { backend_traits<K>::ordinals_bounded } -> std::convertible_to<bool>;
      { backend_traits<K>::replica_owns_core } -> std::convertible_to<bool>;
      { backend_traits<K>::device_count() } -> std::convertible_to<std::size_t>;
      { backend_traits<K>::make_context(n, rs) } -> std::same_as<typename backend_traits<K>::context_type>;
      { device_memory<K>::host_accessible } -> std::convertible_to<bool>;
      { device_memory<K>::allocate(n) } -> std::same_as<void*>;
      device_memory<K>::deallocate(static_cast<void*>(p), n);
      ctx.activate();
      ctx.synchronize();
      gemm(ctx, t, t, n, n, n, 1.0f, cp, n, cp, n, 0.0f, p, n);
      gemm(ctx, t, t, n, n, n, 1.0, cdp, n, cdp, n, 0.0, dp, n);
      for_each_index(ctx, n, detail::index_functor_archetype{});
      fill(ctx, p, n, 0.0f);
      copy(ctx, p, cp, n);
      copy_from_host(ctx, p, cp, n);
      copy_from_host(ctx, wip, ip, n);
      copy_to_host(ctx, p, cp, n);
      broadcast_rows(ctx, p, cp, n, n);
      column_sums(ctx, cp, n, n, p);
      { sum(ctx, cp, n) } -> std::convertible_to<double>;
      scale(ctx, p, n, 1.0f);
    } &&
    // Device memory the host cannot address: the context stages each shard's features, labels and
    // targets onto the device in one call and says where they landed.
    (device_memory<K>::host_accessible ||
     requires(typename backend_traits<K>::context_type& ctx, const float* f, const std::int32_t* l, std::size_t n) {
       { ctx.stage_shard(f, n, l, n, f, n).features } -> std::convertible_to<const float*>;
       { ctx.stage_shard(f, n, l, n, f, n).labels } -> std::convertible_to<const std::int32_t*>;
       { ctx.stage_shard(f, n, l, n, f, n).targets } -> std::convertible_to<const float*>;
     });

}  // namespace lockstep
