#pragma once
/// @file nccl.hpp
/// `nccl_allreduce`: the reducer of GPU replicas on distinct GPUs of one process (the default of
/// mirrored<gpu<0>, gpu<1>> and mirrored<gpus> in a build with NCCL). On first use, one
/// non-blocking communicator per GPU (ncclCommInitRankConfig in one NCCL group); each bucket is
/// one in-place ncclAllReduce on the replica's communication stream, started from the backward
/// hook so it overlaps the rest of backward. An optimiser update sharded over the replicas
/// (strategy_options::shard_optimizer) is sharded on the epilogue's grid instead: each bucket is
/// reduced only onto the replica whose slice holds it (ncclReduce per slice, one NCCL group: a
/// reduce-scatter), the epilogue's chunk sums are summed over the replicas (ncclAllReduce of
/// doubles), and the updated slices are gathered (ncclBroadcast per slice: an all-gather), so the
/// bytes sent equal one all-reduce's. No NCCL call blocks: a replica polls its communicator
/// until NCCL has taken the call (the first collective connects the peers), watching for an abort
/// and the timeout, so a failing replica stops the others instead of leaving them hanging; abort
/// takes the communicators exclusively and revokes them (ncclCommRevoke, when the NCCL loaded at
/// run time has it) or aborts them. One replica makes no communicator and calls no NCCL. Host
/// code (no kernels): compiles with g++ where the CUDA and NCCL headers are present
/// (LOCKSTEP_HAS_NCCL, from lockstep::nccl).

#if !defined(LOCKSTEP_HAS_NCCL)
#error "lockstep/distribute/reducers/nccl.hpp needs NCCL: link lockstep::nccl (it defines LOCKSTEP_HAS_NCCL)"
#endif

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <lockstep/backend/cuda/context.hpp>
#include <lockstep/backend/cuda/device.hpp>
#include <lockstep/backend/cuda/error.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/distribute/buckets.hpp>
#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/detail/cuda_common.hpp>
#include <lockstep/distribute/reducers/detail/nccl.hpp>
#include <lockstep/distribute/reducers/detail/rendezvous.hpp>

namespace lockstep {

/// All-reduce between distinct GPUs of one process through NCCL (see the file comment).
class nccl_allreduce {
public:
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  /// Serves sets of distinct gpu<I>.
  template <class... Ds>
  static constexpr bool supports = all_of_kind_v<gpus, Ds...> && detail::distinct_gpus<Ds...>();

  /// A reducer for `c.replicas` replicas (communicators are made on first use; one replica needs none).
  explicit nccl_allreduce(const reducer_config& c = {})
      : rv_(c.replicas, c.timeout, c.ids), timeout_(c.timeout), comms_(c.replicas, nullptr),
        devices_(c.replicas, -1), revoke_(detail::nccl_revoke_function()) {}
  nccl_allreduce(const nccl_allreduce&) = delete;
  nccl_allreduce& operator=(const nccl_allreduce&) = delete;
  ~nccl_allreduce() { destroy(); }

  /// NCCL works in place: no workspace.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  /// Nothing to bind.
  void bind(std::size_t, void*, std::size_t) noexcept {}
  /// True once the communicators exist (never with one replica, whose sums and broadcasts are no-ops).
  [[nodiscard]] bool has_communicators() {
    std::lock_guard<std::mutex> lock(m_);
    for (ncclComm_t c : comms_)
      if (c) return true;
    return false;
  }

  /// Queues replica r's in-place ncclAllReduce (sum) of bucket `bucket` on its communication
  /// stream, after the compute work queued so far. One replica: nothing to sum, no NCCL call.
  template <class Ctx, class T>
  void start(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t bucket) {
    detail::require_cuda_context<Ctx>();
    if (!collective_ids::is_sum(bucket))
      throw config_error("lockstep::nccl_allreduce: " + collective_ids::name(bucket) + " is not a sum");
    if (rv_.replicas() == 1) return;
    enqueue(r, ctx, bucket, data, count, "ncclAllReduce", false, [&](ncclComm_t comm) {
      return ncclAllReduce(data, data, count, detail::nccl_type<T>(), ncclSum, comm, ctx.comm_stream());
    });
  }

  /// Waits (host) until every replica has queued the bucket, then orders the compute stream after it.
  template <class Ctx>
  void wait(std::size_t r, Ctx& ctx, std::size_t bucket) {
    detail::require_cuda_context<Ctx>();
    if (rv_.replicas() == 1) return;
    rv_.await(r, bucket);
    ctx.join_from_comm();
  }

  /// Reduces a sharded update's buckets onto the slices and gathers the slices (reducer.hpp).
  static constexpr bool reduces_to_slices = true;

  /// Queues replica r's part of the reduce-scatter of bucket `bucket`, [offset, offset + count) of
  /// `grads`, on its communication stream after the compute work queued so far: for every slice the
  /// bucket meets (bucket_part), one in-place ncclReduce rooted at the slice's replica, all in one
  /// NCCL group. The slices may differ in length (they follow the epilogue's chunks), so no bucket
  /// is padded. wait() completes it: replica r's slice of the bucket then holds the sums (its other
  /// gradients keep its own values). One replica: nothing to sum.
  template <class Ctx, class T>
  void reduce_to_slices(std::size_t r, Ctx& ctx, T* grads, std::size_t offset, std::size_t count, std::size_t bucket,
                        std::span<const std::pair<std::size_t, std::size_t>> slices) {
    detail::require_cuda_context<Ctx>();
    if (!collective_ids::is_bucket(bucket))
      throw config_error("lockstep::nccl_allreduce: reduce_to_slices takes a gradient bucket, not " +
                         collective_ids::name(bucket));
    check_slices(slices);
    if (rv_.replicas() == 1) return;
    enqueue(r, ctx, bucket, grads + offset, count, "ncclReduce", false, [&](ncclComm_t comm) {
      return grouped(slices.size(), [&](std::size_t root) {
        const auto [lo, hi] = bucket_part(offset, count, slices[root]);
        if (hi == lo) return ncclSuccess;
        return ncclReduce(grads + lo, grads + lo, hi - lo, detail::nccl_type<T>(), ncclSum, static_cast<int>(root), comm,
                          ctx.comm_stream());
      });
    });
    slice_reductions_.fetch_add(1, std::memory_order_relaxed);
  }

  /// Sums `count` doubles (the epilogue's chunk sums) in place over the replicas: an ncclAllReduce
  /// on replica r's communication stream, ordered after its compute stream and before what it
  /// queues next there. No host wait for the device's work. One replica: nothing to sum.
  template <class Ctx>
  void sum_chunks(std::size_t r, Ctx& ctx, double* chunks, std::size_t count) {
    detail::require_cuda_context<Ctx>();
    if (rv_.replicas() == 1) return;
    enqueue(r, ctx, collective_ids::epilogue_sums, chunks, count, "ncclAllReduce", true, [&](ncclComm_t comm) {
      return ncclAllReduce(chunks, chunks, count, ncclFloat64, ncclSum, comm, ctx.comm_stream());
    });
  }

  /// Copies every replica's slice of `params` into replica r's (an all-gather): one in-place
  /// ncclBroadcast per non-empty slice, rooted at its replica, in one NCCL group on replica r's
  /// communication stream, ordered after its compute stream (the update of its own slice) and
  /// before what it queues next there. One replica: nothing to copy.
  template <class Ctx, class T>
  void gather_slices(std::size_t r, Ctx& ctx, T* params, std::span<const std::pair<std::size_t, std::size_t>> slices) {
    detail::require_cuda_context<Ctx>();
    check_slices(slices);
    if (rv_.replicas() == 1) return;
    enqueue(r, ctx, collective_ids::gather_slices, params, 0, "ncclBroadcast", true, [&](ncclComm_t comm) {
      return grouped(slices.size(), [&](std::size_t root) {
        const auto [lo, hi] = slices[root];
        if (hi <= lo) return ncclSuccess;
        return ncclBroadcast(params + lo, params + lo, hi - lo, detail::nccl_type<T>(), static_cast<int>(root), comm,
                             ctx.comm_stream());
      });
    });
  }

  /// Buckets reduced onto the slices so far (reduce_to_slices calls, over all replicas).
  [[nodiscard]] std::uint64_t slice_reductions() const noexcept { return slice_reductions_.load(std::memory_order_relaxed); }

  /// ncclBroadcast of `count` elements from replica `root` (synchronous). One replica: nothing to copy.
  template <class Ctx, class T>
  void broadcast(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t root) {
    detail::require_cuda_context<Ctx>();
    if (root >= rv_.replicas()) throw config_error("lockstep: broadcast root " + std::to_string(root) + " is not a replica");
    if (rv_.replicas() == 1) return;
    enqueue(r, ctx, collective_ids::broadcast, data, count, "ncclBroadcast", true, [&](ncclComm_t comm) {
      return ncclBroadcast(data, data, count, detail::nccl_type<T>(), static_cast<int>(root), comm, ctx.comm_stream());
    });
    ctx.wait_stream(ctx.compute_stream());
  }

  /// Releases the replicas and stops the communicators' in-flight work, so no GPU waits for a
  /// failed peer; callable from any thread. The communicators are non-blocking, so no replica
  /// stays inside an NCCL call: abort takes them exclusively (waiting at most the timeout) and
  /// revokes the ready ones when the NCCL loaded at run time has ncclCommRevoke (2.28 or newer;
  /// they are aborted in reset()), and aborts the others at once (detail::nccl_stop_all).
  void abort() noexcept {
    rv_.abort();
    {
      std::lock_guard<std::mutex> lock(m_);
      failed_ = true;
    }
    std::unique_lock<std::shared_timed_mutex> use(use_, std::defer_lock);
    if (!use.try_lock_for(timeout_)) return;  // a replica is still inside an NCCL call: reset() aborts
    std::lock_guard<std::mutex> lock(m_);
    if (stopped_) return;  // another replica's abort got here first
    stopped_ = true;
    detail::nccl_stop_all(comms_, revoke_);
  }
  /// Ready again after a failure (no replica may be inside): the communicators are aborted and
  /// made again on next use.
  void reset() noexcept {
    destroy();
    rv_.reset();
  }

private:
  // Makes sure replica r's communicator exists: the first collective makes all of them (by the
  // last replica to arrive: one non-blocking communicator per device, joined in one NCCL group),
  // then each replica waits until its own is ready.
  void communicator(std::size_t r, const backend::cuda_context& ctx) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (comms_[r] && !failed_) return;
    }
    const std::size_t id = collective_ids::setup;
    devices_[r] = ctx.ordinal();
    rv_.arrive(r, id, nullptr, 0, [&] {
      std::lock_guard<std::mutex> lock(m_);
      comms_ = make_communicators();
      failed_ = false;
    });
    rv_.await(r, id);
    settle(r, id, "ncclCommInitRankConfig");
  }

  // One non-blocking communicator per replica's device (ncclCommInitAll's job, without blocking).
  std::vector<ncclComm_t> make_communicators() const {
    std::vector<ncclComm_t> made(devices_.size(), nullptr);
    ncclUniqueId uid;
    LOCKSTEP_NCCL_CHECK(ncclGetUniqueId(&uid));
    int previous = 0;
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&previous));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t s = ncclGroupStart();
    for (std::size_t i = 0; i < made.size() && s == ncclSuccess; ++i) {
      if (cudaSetDevice(devices_[i]) != cudaSuccess) {
        s = ncclUnhandledCudaError;
        break;
      }
      s = ncclCommInitRankConfig(&made[i], static_cast<int>(made.size()), uid, static_cast<int>(i), &config);
      if (s == ncclInProgress) s = ncclSuccess;
    }
    const ncclResult_t end = ncclGroupEnd();
    (void)cudaSetDevice(previous);
    if (s == ncclSuccess && end != ncclInProgress) s = end;
    if (s != ncclSuccess) {
      detail::nccl_abort_all(made);
      detail::check_nccl(s, "ncclCommInitRankConfig");
    }
    return made;
  }

  // Issues replica r's NCCL call f(communicator) (collective `id`) and waits until NCCL has taken
  // it (a non-blocking call may still be connecting to its peers, which a failed peer never does).
  template <class F>
  void call(std::size_t r, std::size_t id, const char* what, const F& f) {
    {
      std::shared_lock<std::shared_timed_mutex> use(use_);  // abort() does not stop it meanwhile
      const ncclResult_t s = f(usable(r, id));
      if (s != ncclSuccess && s != ncclInProgress) fail(r, id, what, s);
    }
    settle(r, id, what);
  }

  // Polls replica r's communicator until its last call is no longer in progress: at most the
  // timeout (then timeout_error, and every replica is released); collective_aborted as soon as
  // another replica failed.
  void settle(std::size_t r, std::size_t id, const char* what) {
    const auto start = std::chrono::steady_clock::now();
    for (std::uint32_t polls = 0;; ++polls) {
      ncclResult_t state = ncclSuccess;
      {
        std::shared_lock<std::shared_timed_mutex> use(use_);
        const ncclResult_t s = ncclCommGetAsyncError(usable(r, id), &state);
        if (s != ncclSuccess) fail(r, id, "ncclCommGetAsyncError", s);
      }
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(r, id, what, state);
      const auto waited = std::chrono::steady_clock::now() - start;
      if (const auto limit = detail::nccl_limit(id, timeout_); waited > limit) {
        abort();
        throw timeout_error("lockstep: collective timed out: replica " + std::to_string(r) + " (CUDA device " +
                            std::to_string(devices_[r]) + ") waited " + std::to_string(limit.count()) + " ms for " +
                            what + " in " + collective_ids::name(id) +
                            " (raise strategy_options::timeout if a step legitimately takes longer)");
      }
      if (waited < std::chrono::milliseconds(2) || polls < 64) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Queues replica r's NCCL call f(communicator), collective `id` named `what` over `count`
  // elements at `data`, on its communication stream after the work queued on its compute stream;
  // `complete`: then waits (host) until every replica has queued it and orders the compute stream
  // after it (else wait() does).
  template <class F>
  void enqueue(std::size_t r, const backend::cuda_context& ctx, std::size_t id, void* data, std::size_t count,
               const char* what, bool complete, const F& f) {
    rv_.check_slot(r, id);  // before communicator() indexes its tables with r
    communicator(r, ctx);
    rv_.arrive(r, id, data, count, [] {});
    backend::device_guard g(ctx.ordinal());
    ctx.fork_to_comm();
    call(r, id, what, f);
    if (!complete) return;
    rv_.await(r, id);
    ctx.join_from_comm();
  }

  // One slice per replica, in order and without overlap (sharded_update::slices()).
  void check_slices(std::span<const std::pair<std::size_t, std::size_t>> slices) const {
    detail::check_reducer_slices(slices, rv_.replicas(), "lockstep::nccl_allreduce");
  }

  // Issues f(k) for k in [0, n) inside one NCCL group (non-blocking communicators: the group's end
  // may say ncclInProgress, which call() settles); the first failure, after the group is closed.
  template <class F>
  static ncclResult_t grouped(std::size_t n, const F& f) {
    ncclResult_t s = ncclGroupStart();
    if (s != ncclSuccess) return s;
    for (std::size_t k = 0; k < n; ++k) {
      const ncclResult_t c = f(k);
      if (c != ncclSuccess && c != ncclInProgress) {
        s = c;
        break;
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    return s != ncclSuccess ? s : end;
  }

  // Replica r's communicator, or collective_aborted once the reducer was aborted. use_ held.
  ncclComm_t usable(std::size_t r, std::size_t id) {
    std::lock_guard<std::mutex> lock(m_);
    if (!comms_[r] || failed_)
      throw detail::collective_aborted("lockstep: replica " + std::to_string(r) + " left " + collective_ids::name(id) +
                                       ": NCCL was stopped because another replica failed");
    return comms_[r];
  }

  // device_error for NCCL status `s` of call `what` on replica r (the strategy then aborts).
  [[noreturn]] void fail(std::size_t r, std::size_t id, const char* what, ncclResult_t s) const {
    throw device_error("lockstep::nccl_allreduce: replica " + std::to_string(r) + " (CUDA device " +
                       std::to_string(devices_[r]) + "): " + what + " failed in " + collective_ids::name(id) + ": " +
                       ncclGetErrorString(s) + " (NCCL_DEBUG=WARN prints NCCL's reason)");
  }

  // After a failure the communicators are aborted; otherwise finalized and destroyed (shared
  // with every NCCL reducer: detail/nccl.hpp).
  void destroy() noexcept {
    std::unique_lock<std::shared_timed_mutex> use(use_);
    std::lock_guard<std::mutex> lock(m_);
    if (failed_) detail::nccl_abort_all(comms_);
    else (void)detail::nccl_finalize_destroy(comms_, timeout_);
    failed_ = false;
    stopped_ = false;
  }

  detail::device_rendezvous rv_;
  std::chrono::milliseconds timeout_;
  std::vector<ncclComm_t> comms_;
  std::vector<int> devices_;
  detail::nccl_revoke_fn revoke_;  // ncclCommRevoke when the NCCL loaded at run time has it
  bool failed_ = false;            // aborted: communicators unusable until reset()
  bool stopped_ = false;           // their in-flight work was stopped (revoked or aborted) once
  std::atomic<std::uint64_t> slice_reductions_{0};  // reduce_to_slices calls
  std::mutex m_;                   // guards comms_ and failed_
  std::shared_timed_mutex use_;    // held shared while a replica is inside an NCCL call
};

}  // namespace lockstep
