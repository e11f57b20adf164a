#pragma once
/// @file multi_worker.hpp
/// `multi_worker_mirrored<Kind, Determinism, Reducer>`: synchronous data parallelism over several
/// MPI processes (workers), each driving its own local replicas (link lockstep::mpi). It is the
/// one strategy, `mirrored_strategy`, over an `mpi_world` (mpi_world.hpp): this class only owns
/// the communication thread that every MPI call goes through and hands it to the world and the
/// reducer.
///
/// Every worker runs the same input pipeline and sees the same global batches. A global batch is
/// cut into shards over every replica of every worker (`plan()`); worker w's replica r gets shard
/// o_w + r (o_w: the replicas of the workers of lower rank), so every sample reaches exactly one
/// replica of one worker. The default reducer (reducers/mpi_host.hpp) is hierarchical: the
/// shared-memory all-reduce between local replicas, then the sum across the workers on the
/// communication thread, overlapping the rest of the backward pass; any other reducer of local
/// replicas (a user's) is extended over the workers by over_workers (reducers/over_workers.hpp).
/// Gradients are divided by the GLOBAL sample count.
///
/// Determinism: run_to_run (the summation order is fixed by the replica and worker counts);
/// replica_count_invariant (host memory): fixed micro-shards over every replica of every worker,
/// summed in micro-shard order through an ordered reduce-scatter and one all-gather, so 1×4, 2×2
/// and 4×1 workers × replicas give bitwise the same parameters as one process.
///
/// Failure: a failure on one worker reaches its caller as a replica_error naming the worker's
/// rank; the strategy is unusable afterwards (the workers' collectives no longer match): end the
/// job (mpi_environment::abort_on_exit or abort). A worker that waits for another longer than
/// strategy_options::timeout throws timeout_error naming the missing rank(s) and the bucket.
///
/// GPU replicas (`multi_worker_mirrored<gpus>`): one NCCL communicator over every GPU of every
/// worker, bootstrapped through the communication thread; see multi_worker_nccl.cuh, which this
/// header includes itself when compiled by nvcc with lockstep::nccl (LOCKSTEP_HAS_CUDA and
/// LOCKSTEP_HAS_NCCL).

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <lockstep/core/device.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/device_set.hpp>
#include <lockstep/distribute/mpi.hpp>
#include <lockstep/distribute/mpi_world.hpp>
#include <lockstep/distribute/reducers/mpi_host.hpp>
#include <lockstep/distribute/reducers/over_workers.hpp>
#include <lockstep/distribute/strategy.hpp>

namespace lockstep {

namespace detail {

/// The default reducer of multi_worker_mirrored<Kind>: the hierarchical MPI reducer for kinds
/// with host memory. A backend adds its own by specialising this trait (gpus: one NCCL
/// communicator over every GPU of every worker, in multi_worker_nccl.cuh).
template <class Kind>
struct multi_worker_reducer {
  static constexpr bool available = device_memory<Kind>::host_accessible;  ///< the kind has a multi-worker path
  using type = mpi_host_allreduce;                                         ///< the reducer
};

/// Reducer R as a reducer over the workers of an mpi_world: itself when it spans the workers (it
/// is made from the world), else over_workers<R>.
template <class R>
using across_workers_t = std::conditional_t<constructible_in_world<R, mpi_world>(), R, over_workers<R>>;

/// What a multi-worker strategy owns before its base strategy is made: the local devices and the
/// communication thread.
struct worker_resources {
  std::vector<std::size_t> ordinals;  ///< the local replicas' devices
  mpi_channel channel;                ///< every MPI call of the strategy runs on its thread
  worker_resources(std::vector<std::size_t> o, MPI_Comm comm, const strategy_options& opt)
      : ordinals(std::move(o)), channel(comm, checked_timeout(opt.timeout), opt.bucket_bytes / sizeof(float) + 1) {}
};

}  // namespace detail

/// Synchronous data parallelism over MPI processes, each with local replicas of kind Kind.
/// @tparam Kind        the device kind of the local replicas: cpus, or gpus with
///                     multi_worker_nccl.cuh (nvcc, lockstep::nccl)
/// @tparam Determinism run_to_run, or replica_count_invariant (cpus only)
/// @tparam Reducer     the reducer: the kind's default, or a reducer of local replicas (extended
///                     over the workers by over_workers)
template <class Kind = cpus, determinism Determinism = determinism::run_to_run,
          class Reducer = typename detail::multi_worker_reducer<Kind>::type>
class multi_worker_mirrored
    : private detail::worker_resources,
      public mirrored_strategy<Kind, detail::across_workers_t<Reducer>, Determinism, mpi_world> {
  static_assert(detail::multi_worker_reducer<Kind>::available,
                "lockstep::multi_worker_mirrored: no multi-worker path for this device kind; the MPI path aggregates "
                "host memory (cpus); for gpus compile with nvcc and include <lockstep/distribute/multi_worker_nccl.cuh> "
                "(link lockstep::nccl and lockstep::mpi)");
  using base = mirrored_strategy<Kind, detail::across_workers_t<Reducer>, Determinism, mpi_world>;

public:
  /// A strategy over the local devices `devices` (default: one replica) of every process of
  /// `comm` (default MPI_COMM_WORLD, which is duplicated). MPI must be initialised (see
  /// mpi_environment) with at least MPI_THREAD_SERIALIZED. Collective: every process constructs it.
  /// @throws config_error for a bad option, uninitialised MPI or a low thread level.
  explicit multi_worker_mirrored(const device_selection& devices = device_selection::first(1),
                                 strategy_options options = {}, MPI_Comm comm = MPI_COMM_WORLD)
      : detail::worker_resources(resolve_devices<Kind>(devices, backend_traits<Kind>::device_count(),
                                                       std::string("lockstep::multi_worker_mirrored<") +
                                                           backend_traits<Kind>::name + "s>"),
                                 comm, options),
        base(ordinals, options, mpi_world(channel, ordinals.size())) {}

  /// This worker's rank (world().rank()).
  [[deprecated("use world().rank()")]] [[nodiscard]] std::size_t rank() const noexcept { return this->world().rank(); }
  /// Number of workers (world().size()).
  [[deprecated("use world().size()")]] [[nodiscard]] std::size_t world_size() const noexcept { return this->world().size(); }
  /// True on rank 0 (world().is_chief()).
  [[deprecated("use world().is_chief()")]] [[nodiscard]] bool is_chief() const noexcept { return this->world().is_chief(); }
  /// Replicas over all workers (world().global_replicas()).
  [[deprecated("use world().global_replicas()")]] [[nodiscard]] std::size_t global_replicas() const noexcept {
    return this->world().global_replicas();
  }
  /// The MPI thread level in force (world().thread_level()).
  [[deprecated("use world().thread_level()")]] [[nodiscard]] int mpi_thread_level() const noexcept {
    return this->world().thread_level();
  }
  /// True when the workers' sums run in a shared-memory window (world().shares_memory()).
  [[deprecated("use world().shares_memory()")]] [[nodiscard]] bool workers_share_memory() const noexcept {
    return this->world().shares_memory();
  }
  /// Sums each element of `v` over the workers (world().sum(v)).
  [[deprecated("use world().sum(values)")]] void sum_over_workers(std::span<double> v) { this->world().sum(v); }
};

}  // namespace lockstep

#if defined(__CUDACC__) && defined(LOCKSTEP_HAS_CUDA) && defined(LOCKSTEP_HAS_NCCL)
#include <lockstep/distribute/multi_worker_nccl.cuh>  // multi_worker_mirrored<gpus>
#endif
