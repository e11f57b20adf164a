#pragma once
/// @file multi_worker_nccl.cuh
/// `multi_worker_mirrored<gpus>`: several MPI processes (workers), each driving its local GPU
/// replicas, with ONE NCCL communicator over every GPU of every worker (compile with nvcc; link
/// lockstep::nccl and lockstep::mpi; <lockstep/distribute/multi_worker.hpp> includes this file
/// itself under nvcc when LOCKSTEP_HAS_CUDA and LOCKSTEP_HAS_NCCL are defined).
///
/// Bootstrap (the strategy's constructor, collective): the workers' local GPU counts are gathered
/// (MPI_Iallgather on the strategy's communication thread, so uneven counts are allowed); worker
/// w's GPUs take the NCCL ranks o_w .. o_w + L_w - 1, o_w being the GPUs of the workers of lower
/// rank. Rank 0 creates the ncclUniqueId, which travels to every worker with MPI_Ibcast on the
/// same thread (every MPI call of a strategy is made by its communication thread); then the
/// constructing thread joins each local GPU with ncclCommInitRankConfig inside one NCCL group.
/// The communicators are non-blocking (ncclConfig_t::blocking = 0): no NCCL call waits for a
/// peer, the calling thread polls ncclCommGetAsyncError with a deadline instead.
///
/// Per bucket (the overlapped step: started from the backward hook while lower layers still
/// compute): each local replica queues an in-place ncclAllReduce (sum) on its communication
/// stream after its compute stream's work, and records an event after it. Its wait polls that
/// event and the communicator's asynchronous error until the sum is done, then orders the compute
/// stream after it. The summation order is NCCL's, fixed for a given topology, GPU count and NCCL
/// version: run_to_run only (replica_count_invariant needs host memory).
///
/// Failure: a collective that does not complete within strategy_options::timeout throws
/// timeout_error naming the worker's rank, the local replica, its CUDA device, its NCCL rank and
/// the bucket; an NCCL error names them as well. Either aborts every local communicator
/// (ncclCommAbort, which also stops NCCL kernels still waiting for a peer, so no stream stays
/// blocked) and leaves the strategy unusable, like every multi-worker failure: end the job.

#if !defined(__CUDACC__)
#error "lockstep/distribute/multi_worker_nccl.cuh belongs to the CUDA backend: compile with nvcc"
#endif

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <lockstep/backend/cuda.hpp>
#include <lockstep/distribute/reducers/detail/cuda_common.hpp>
#include <lockstep/distribute/reducers/detail/nccl.hpp>
#include <lockstep/distribute/mpi.hpp>
#include <lockstep/distribute/mpi_world.hpp>
#include <lockstep/distribute/multi_worker.hpp>

#if !defined(LOCKSTEP_HAS_NCCL)
#error "lockstep/distribute/multi_worker_nccl.cuh needs NCCL: link lockstep::nccl (it defines LOCKSTEP_HAS_NCCL)"
#endif
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "lockstep/distribute/multi_worker_nccl.cuh needs NCCL 2.14 or newer (non-blocking communicators)"
#endif

namespace lockstep {

/// All-reduce of the GPU replicas of every worker through one NCCL communicator (see the file
/// comment). Serves multi_worker_mirrored<gpus>; every call on replica r is made from local
/// replica r's worker thread, except the constructor, abort and the destructor.
class mpi_nccl_allreduce {
public:
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  /// Serves GPU replicas (the local GPUs of each worker).
  template <class... Ds>
  static constexpr bool supports = sizeof...(Ds) >= 1 && (is_gpu_v<Ds> && ...);

  /// Joins the local GPUs `ordinals` (one per local replica) to the job's NCCL communicator,
  /// bootstrapped through the world's communication thread; this worker's GPUs take the NCCL
  /// ranks world.plan().first onwards. Collective over the workers.
  /// @throws device_error when NCCL fails (naming the rank), timeout_error when the workers do not
  ///         all join within `c.timeout`.
  mpi_nccl_allreduce(const reducer_config& c, mpi_world& world, const std::vector<std::size_t>& ordinals)
      : channel_(&world.channel()), timeout_(c.timeout), ids_(c.ids), rank_(static_cast<int>(world.rank())),
        offset_(world.plan().first), total_(world.global_replicas()), devices_(ordinals.size()),
        comms_(ordinals.size(), nullptr), done_(ordinals.size() * ids_) {
    if (ordinals.size() != c.replicas)
      throw config_error("lockstep::multi_worker_mirrored<gpus>: " + std::to_string(ordinals.size()) +
                         " device ordinals for " + std::to_string(c.replicas) + " replicas");
    if (total_ > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw config_error("lockstep::multi_worker_mirrored<gpus>: too many GPUs for one NCCL communicator");
    for (std::size_t i = 0; i < ordinals.size(); ++i) devices_[i] = static_cast<int>(ordinals[i]);
    try {
      join(*channel_);
    } catch (...) {
      abort_all();  // the destructor does not run for a constructor that threw
      throw;
    }
  }
  mpi_nccl_allreduce(const mpi_nccl_allreduce&) = delete;
  mpi_nccl_allreduce& operator=(const mpi_nccl_allreduce&) = delete;
  /// Finalizes the communicators (waiting at most the timeout for the other workers), or aborts
  /// them after a failure.
  ~mpi_nccl_allreduce() { destroy(); }

  /// NCCL works in place: no workspace.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  /// Nothing to bind.
  void bind(std::size_t, void*, std::size_t) noexcept {}

  /// Queues replica r's in-place ncclAllReduce (sum) of `count` elements at `data` (device
  /// memory of its GPU) for bucket `bucket` on its communication stream, after the compute work
  /// queued so far. Returns without waiting for the sum.
  template <class Ctx, class T>
  void start(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t bucket) {
    detail::require_cuda_context<Ctx>();
    static_assert(std::is_arithmetic_v<T>, "lockstep::mpi_nccl_allreduce sums arithmetic elements");
    check_bucket(bucket);
    backend::device_guard g(ctx.ordinal());
    ctx.fork_to_comm();
    {
      std::shared_lock<std::shared_timed_mutex> use(use_);
      const ncclResult_t s =
          ncclAllReduce(data, data, count, detail::nccl_type<T>(), ncclSum, usable(r, bucket), ctx.comm_stream());
      if (s != ncclSuccess && s != ncclInProgress) fail(r, bucket, "ncclAllReduce", s);
    }
    settle(r, bucket, "ncclAllReduce");
    record(r, ctx, bucket);
  }

  /// Waits (host, at most the timeout) until replica r's sum of bucket `bucket` is done, then
  /// orders its compute stream after it.
  template <class Ctx>
  void wait(std::size_t r, Ctx& ctx, std::size_t bucket) {
    detail::require_cuda_context<Ctx>();
    check_bucket(bucket);
    backend::device_guard g(ctx.ordinal());
    complete(r, bucket);
    ctx.join_from_comm();
  }

  /// ncclBroadcast of `count` elements from local replica `root` of rank 0 (NCCL rank `root`) to
  /// every GPU of every worker (synchronous).
  template <class Ctx, class T>
  void broadcast(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t root) {
    detail::require_cuda_context<Ctx>();
    if (root >= total_) throw config_error("lockstep::mpi_nccl_allreduce: broadcast root " + std::to_string(root) + " is not a GPU of the job");
    const std::size_t id = collective_ids::broadcast;
    backend::device_guard g(ctx.ordinal());
    ctx.fork_to_comm();
    {
      std::shared_lock<std::shared_timed_mutex> use(use_);
      const ncclResult_t s = ncclBroadcast(data, data, count, detail::nccl_type<T>(), static_cast<int>(root),
                                           usable(r, id), ctx.comm_stream());
      if (s != ncclSuccess && s != ncclInProgress) fail(r, id, "ncclBroadcast", s);
    }
    settle(r, id, "ncclBroadcast");
    record(r, ctx, id);
    complete(r, id);
    ctx.join_from_comm();
    ctx.wait_stream(ctx.compute_stream());
  }

  /// Marks the reducer failed (every current and later wait throws) and the channel unusable (the
  /// workers' collectives no longer match), and aborts the local communicators once no replica is
  /// inside an NCCL call (non-blocking calls return at once; at most the timeout is waited), which
  /// also stops NCCL kernels waiting for a peer. Any thread.
  void abort() noexcept {
    failed_.store(true);
    channel_->abort("an NCCL collective of this worker failed");
    std::unique_lock<std::shared_timed_mutex> use(use_, std::defer_lock);
    if (use.try_lock_for(timeout_)) abort_all();  // otherwise the destructor aborts them
  }
  /// Nothing to re-arm: after a failure the communicators stay aborted (the workers' collectives
  /// no longer match; the strategy is unusable).
  void reset() noexcept {}

private:
  // Rank 0's unique id (and whether it could make one) reaches every worker through MPI; then
  // every local GPU joins the communicator in one NCCL group, and the thread polls until all
  // joined.
  void join(detail::mpi_channel& channel) {
    struct {
      ncclUniqueId id;
      char ok;
      char error[95];
    } boot{};
    if (rank_ == 0) {
      const ncclResult_t s = ncclGetUniqueId(&boot.id);
      boot.ok = s == ncclSuccess ? 1 : 0;
      if (s != ncclSuccess) std::strncpy(boot.error, ncclGetErrorString(s), sizeof boot.error - 1);
    }
    channel.run(detail::mpi_channel::broadcast(&boot, sizeof boot));
    if (!boot.ok)
      throw device_error("lockstep::multi_worker_mirrored<gpus>: rank " + std::to_string(rank_) +
                         ": rank 0 could not create the NCCL unique id (ncclGetUniqueId: " + std::string(boot.error) + ")");
    int previous = 0;
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&previous));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t s = ncclGroupStart();
    for (std::size_t i = 0; i < devices_.size() && s == ncclSuccess; ++i) {
      if (cudaSetDevice(devices_[i]) != cudaSuccess) {
        s = ncclUnhandledCudaError;
        break;
      }
      s = ncclCommInitRankConfig(&comms_[i], static_cast<int>(total_), boot.id, static_cast<int>(offset_ + i), &config);
      if (s == ncclInProgress) s = ncclSuccess;
    }
    const ncclResult_t end = ncclGroupEnd();
    (void)cudaSetDevice(previous);
    if (s == ncclSuccess && end != ncclInProgress) s = end;
    if (s != ncclSuccess) {
      const std::string why = ncclGetErrorString(s);
      abort_all();
      throw device_error("lockstep::multi_worker_mirrored<gpus>: rank " + std::to_string(rank_) +
                         ": joining the NCCL communicator (NCCL ranks " + ranks_text() + ") failed: " + why +
                         " (every GPU may belong to one worker only: give each worker its own GPUs)");
    }
    for (std::size_t i = 0; i < comms_.size(); ++i) settle(i, collective_ids::setup, "ncclCommInitRankConfig");
  }

  // Polls replica r's communicator until its last call is no longer in progress (at most the
  // timeout); throws on an error, a timeout or an abort.
  void settle(std::size_t r, std::size_t bucket, const char* call) {
    const auto start = std::chrono::steady_clock::now();
    for (std::uint32_t polls = 0;; ++polls) {
      ncclResult_t state = ncclSuccess;
      {
        std::shared_lock<std::shared_timed_mutex> use(use_);
        const ncclResult_t s = ncclCommGetAsyncError(usable(r, bucket), &state);
        if (s != ncclSuccess) fail(r, bucket, "ncclCommGetAsyncError", s);
      }
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(r, bucket, call, state);
      pause(r, bucket, start, polls, call);
    }
  }

  // Waits until replica r's event of bucket `bucket` completed, watching the communicator's
  // asynchronous error and the deadline.
  void complete(std::size_t r, std::size_t bucket) {
    const auto& ev = done_[r * ids_ + bucket];
    if (!ev) throw config_error("lockstep::mpi_nccl_allreduce: wait for bucket " + std::to_string(bucket) + " before its start");
    const auto start = std::chrono::steady_clock::now();
    for (std::uint32_t polls = 0;; ++polls) {
      const cudaError_t q = cudaEventQuery(ev->get());
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) LOCKSTEP_CUDA_CHECK(q);
      ncclResult_t state = ncclSuccess;
      {
        std::shared_lock<std::shared_timed_mutex> use(use_);
        const ncclResult_t s = ncclCommGetAsyncError(usable(r, bucket), &state);
        if (s != ncclSuccess) fail(r, bucket, "ncclCommGetAsyncError", s);
      }
      if (state != ncclSuccess && state != ncclInProgress) fail(r, bucket, "ncclAllReduce", state);
      pause(r, bucket, start, polls, "the collective");
    }
  }

  // Between two polls: spins for the first milliseconds (the sum is usually nearly done), then
  // sleeps briefly; past the timeout, aborts and throws timeout_error.
  void pause(std::size_t r, std::size_t bucket, std::chrono::steady_clock::time_point start, std::uint32_t polls,
             const char* what) {
    const auto now = std::chrono::steady_clock::now();
    if (const auto limit = detail::nccl_limit(bucket, timeout_); now - start > limit) {
      abort();
      throw timeout_error("lockstep: collective timed out: rank " + std::to_string(rank_) + " (" + where(r) + ") waited " +
                          std::to_string(limit.count()) + " ms for " + what + " in " + bucket_text(bucket) +
                          "; another worker did not arrive at it or failed (raise strategy_options::timeout if a step "
                          "legitimately takes longer)");
    }
    if (now - start < std::chrono::milliseconds(2) || polls < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  // Replica r's communicator; collective_aborted once the reducer failed. use_ held shared.
  ncclComm_t usable(std::size_t r, std::size_t bucket) const {
    if (failed_.load() || !comms_[r])
      throw detail::collective_aborted("lockstep: rank " + std::to_string(rank_) + " (" + where(r) + ") left " +
                                       bucket_text(bucket) + ": the NCCL communicator was aborted after a failure");
    return comms_[r];
  }

  // Throws device_error for NCCL status `s` of `call` on replica r (use_ may be held: no abort here;
  // the strategy aborts the reducer when the error reaches it).
  [[noreturn]] void fail(std::size_t r, std::size_t bucket, const char* call, ncclResult_t s) const {
    failed_.store(true);
    throw device_error("lockstep: rank " + std::to_string(rank_) + " (" + where(r) + "): " + call + " failed in " +
                       bucket_text(bucket) + ": " + ncclGetErrorString(s) +
                       " (NCCL_DEBUG=WARN prints NCCL's reason)");
  }

  void record(std::size_t r, const backend::cuda_context& ctx, std::size_t id) {
    auto& ev = done_[r * ids_ + id];
    if (!ev) ev = std::make_unique<backend::cuda_event>();  // on replica r's device (device_guard)
    ev->record(ctx.comm_stream());
  }

  void check_bucket(std::size_t bucket) const {
    if (!collective_ids::is_sum(bucket))
      throw config_error("lockstep::mpi_nccl_allreduce: " + collective_ids::name(bucket) + " is not a sum");
  }

  std::string where(std::size_t r) const {
    return "local replica " + std::to_string(r) + " on CUDA device " + std::to_string(devices_[r]) + ", NCCL rank " +
           std::to_string(offset_ + r) + " of " + std::to_string(total_);
  }
  static std::string bucket_text(std::size_t id) { return collective_ids::name(id); }
  std::string ranks_text() const {
    return std::to_string(offset_) + ".." + std::to_string(offset_ + devices_.size() - 1) + " of " + std::to_string(total_);
  }

  // Aborts (and frees) every local communicator; no replica inside an NCCL call.
  void abort_all() noexcept {
    failed_.store(true);
    detail::nccl_abort_all(comms_);
  }

  // Healthy: finalize every communicator (non-blocking: each returns at once), poll until all are
  // quiescent (at most the timeout: a worker that is gone cannot take part), then destroy them.
  // Failed, or not quiescent in time: abort them (detail/nccl.hpp, shared by every NCCL reducer).
  void destroy() noexcept {
    std::unique_lock<std::shared_timed_mutex> use(use_);
    bool any = false;
    for (ncclComm_t c : comms_) any = any || c != nullptr;
    if (!any) return;
    if (failed_.load()) {
      abort_all();
      return;
    }
    if (!detail::nccl_finalize_destroy(comms_, timeout_)) failed_.store(true);
  }

  detail::mpi_channel* channel_;
  std::chrono::milliseconds timeout_;
  std::size_t ids_;                    // collective ids [0, ids_) (collective_ids)
  int rank_;                           // this worker's MPI rank
  std::size_t offset_ = 0, total_ = 0; // this worker's first NCCL rank; GPUs of the job
  std::vector<int> devices_;           // CUDA device of each local replica
  std::vector<ncclComm_t> comms_;      // one per local replica
  std::vector<std::unique_ptr<backend::cuda_event>> done_;  // per (replica, id): after its collective
  mutable std::atomic<bool> failed_{false};  // aborted or failed: every wait throws
  std::shared_timed_mutex use_;        // held shared while a replica is inside an NCCL call
};

namespace detail {
/// multi_worker_mirrored<gpus>: one NCCL communicator over every GPU of every worker.
template <>
struct multi_worker_reducer<gpus> {
  static constexpr bool available = true;  ///< GPUs have a multi-worker path
  using type = mpi_nccl_allreduce;         ///< the reducer
};
}  // namespace detail

}  // namespace lockstep
