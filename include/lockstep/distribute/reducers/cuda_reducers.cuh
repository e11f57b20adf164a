#pragma once
/// @file cuda_reducers.cuh
/// Gradient reducers of GPU replicas in one process, and their static selection:
///  - `same_device_allreduce`: replicas that share one GPU (mirrored<gpu<0>, gpu<0>>). When the
///    last replica arrives at a bucket, one kernel sums the bucket over the replicas in the fixed
///    order 0..N-1 (the host reducers' order: run-to-run deterministic) and writes the sum into
///    every replica's buffer. Replicas order their streams with events; no host synchronisation.
///  - `nccl_allreduce` (with LOCKSTEP_HAS_NCCL): distinct GPUs. On first use, one non-blocking
///    communicator per GPU (ncclCommInitRankConfig in one NCCL group); each bucket is one in-place
///    ncclAllReduce on the replica's communication stream, started from the backward hook so it
///    overlaps the rest of backward. No NCCL call blocks: a replica polls its communicator until
///    NCCL has taken the call (the first collective connects the peers), watching for an abort and
///    the timeout, so a failing replica stops the others instead of leaving them hanging; abort
///    takes the communicators exclusively and revokes them (ncclCommRevoke, when the NCCL loaded
///    at run time has it) or aborts them. One replica makes no communicator and calls no NCCL.
///  - `reduce_to_one_device<gpu<K>>` (named explicitly): aggregation on GPU K. Per bucket, the
///    buffers of replicas on other GPUs are copied into staging on GPU K (cudaMemcpyPeerAsync),
///    one kernel sums all replicas in order 0..N-1 into the root replica's buffer, and copies send
///    the sum back; all on the root's communication stream, ordered with events.
///  - `reduce_to_one_device<cpu<I>>` with gpu<I> replicas (named explicitly): aggregation on the
///    host. Each replica copies its bucket into pinned memory, each sums its 1/N slice over the
///    replicas in order 0..N-1 (the host_allreduce engine), then copies the result back.
/// All keep a host-side rendezvous per bucket, so a replica that fails before reaching a bucket
/// releases the others with collective_aborted (or timeout_error) rather than a hang.
/// Compile with nvcc.

#if !defined(__CUDACC__)
#error "lockstep/distribute/reducers/cuda_reducers.cuh holds CUDA kernels: compile with nvcc"
#endif

#include <cuda_runtime.h>

#include <array>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <lockstep/backend/cuda/context.hpp>
#include <lockstep/backend/cuda/device.hpp>
#include <lockstep/backend/cuda/error.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/distribute/reducers/host.hpp>
#include <lockstep/distribute/reducer.hpp>

#if defined(LOCKSTEP_HAS_NCCL)
#include <lockstep/distribute/reducers/detail/nccl.hpp>
#endif

namespace lockstep {

namespace detail {

/// Most replicas one GPU may hold under same_device_allreduce.
inline constexpr std::size_t max_replicas_per_gpu = 16;

/// The data pointers of every replica, passed to a kernel by value.
template <class T>
struct replica_pointers {
  T* p[max_replicas_per_gpu];  ///< replica j's data
};

/// For every element: the sum over replicas 0..n-1 in order, written back to every replica.
template <class T>
__global__ void sum_across_replicas_kernel(replica_pointers<T> ptrs, std::size_t n, std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    T acc = ptrs.p[0][i];
    for (std::size_t j = 1; j < n; ++j) acc += ptrs.p[j][i];
    for (std::size_t j = 0; j < n; ++j) ptrs.p[j][i] = acc;
  }
}

/// All GPU tags of Ds name the same ordinal.
template <class D0, class... Ds>
constexpr bool same_gpu() {
  return ((static_cast<std::size_t>(Ds::ordinal) == static_cast<std::size_t>(D0::ordinal)) && ...);
}

/// No two GPU tags of Ds name the same ordinal.
template <class... Ds>
constexpr bool distinct_gpus() {
  constexpr std::array<std::size_t, sizeof...(Ds)> ord{static_cast<std::size_t>(Ds::ordinal)...};
  for (std::size_t i = 0; i < ord.size(); ++i)
    for (std::size_t j = i + 1; j < ord.size(); ++j)
      if (ord[i] == ord[j]) return false;
  return true;
}

/// Host-side meeting point of device collectives: collective `id` completes generation g once
/// every replica has arrived for the g-th time; the last arriver runs the launch action. Waits are
/// bounded by the timeout and released by abort().
class device_rendezvous {
public:
  /// A meeting point for `replicas` replicas and collective ids [0, ids).
  device_rendezvous(std::size_t replicas, std::chrono::milliseconds timeout, std::size_t ids)
      : n_(replicas), timeout_(timeout), ids_(ids), arrivals_(ids, 0), completed_(ids, 0),
        generation_(replicas * ids, 0), ptrs_(replicas * ids, nullptr), counts_(replicas * ids, 0) {
    if (replicas == 0) throw config_error("lockstep: a reducer needs at least one replica");
  }

  /// Number of replicas.
  [[nodiscard]] std::size_t replicas() const noexcept { return n_; }
  /// Replica j's data at collective id (valid inside the launch action).
  [[nodiscard]] void* pointer(std::size_t id, std::size_t j) const noexcept { return ptrs_[id * n_ + j]; }

  /// Replica r arrives at collective `id` with `count` elements at `data`; the last arriver runs
  /// launch() under the lock, which completes the generation.
  template <class Launch>
  void arrive(std::size_t r, std::size_t id, void* data, std::size_t count, const Launch& launch) {
    check_id(id);
    std::unique_lock<std::mutex> lock(m_);
    throw_if_aborted(r, id);
    const std::uint64_t g = ++generation_[id * n_ + r];
    ptrs_[id * n_ + r] = data;
    counts_[id * n_ + r] = count;
    if (++arrivals_[id] == g * n_) {
      for (std::size_t j = 0; j < n_; ++j)
        if (counts_[id * n_ + j] != count) {
          aborted_ = true;
          cv_.notify_all();
          throw shape_error("lockstep: replicas disagree on the length of bucket " + std::to_string(id) + ": " +
                            std::to_string(count) + " on replica " + std::to_string(r) + ", " +
                            std::to_string(counts_[id * n_ + j]) + " on replica " + std::to_string(j));
        }
      try {
        launch();
      } catch (...) {
        aborted_ = true;
        cv_.notify_all();
        throw;
      }
      completed_[id] = g;
      cv_.notify_all();
    }
  }

  /// Blocks replica r until the collective it last arrived at on `id` has been launched.
  void await(std::size_t r, std::size_t id) {
    check_id(id);
    std::unique_lock<std::mutex> lock(m_);
    const std::uint64_t g = generation_[id * n_ + r];
    const bool ok = cv_.wait_for(lock, timeout_, [&] { return aborted_ || completed_[id] >= g; });
    throw_if_aborted(r, id);
    if (!ok) {
      std::string missing;
      for (std::size_t j = 0; j < n_; ++j)
        if (generation_[id * n_ + j] < g) missing += (missing.empty() ? "" : ", ") + std::to_string(j);
      aborted_ = true;
      cv_.notify_all();
      throw timeout_error("lockstep: collective timed out: replica " + std::to_string(r) + " waited " +
                          std::to_string(timeout_.count()) + " ms in bucket " + std::to_string(id) + "; replica(s) " +
                          missing + " did not arrive (raise strategy_options::timeout if a step legitimately takes longer)");
    }
  }

  /// Releases every waiter (they throw collective_aborted); callable from any thread.
  void abort() noexcept {
    std::lock_guard<std::mutex> lock(m_);
    aborted_ = true;
    cv_.notify_all();
  }

  /// Ready again after a failure; call only while no replica is inside.
  void reset() noexcept {
    std::lock_guard<std::mutex> lock(m_);
    std::fill(arrivals_.begin(), arrivals_.end(), 0);
    std::fill(completed_.begin(), completed_.end(), 0);
    std::fill(generation_.begin(), generation_.end(), 0);
    aborted_ = false;
  }

private:
  void check_id(std::size_t id) const {
    if (id >= ids_)
      throw config_error("lockstep: bucket id " + std::to_string(id) + " is beyond the reducer's " +
                         std::to_string(ids_) + " collective ids");
  }
  void throw_if_aborted(std::size_t r, std::size_t id) const {
    if (aborted_)
      throw collective_aborted("lockstep: replica " + std::to_string(r) + " left bucket " + std::to_string(id) +
                               " because another replica failed");
  }

  std::size_t n_;
  std::chrono::milliseconds timeout_;
  std::size_t ids_;
  std::vector<std::uint64_t> arrivals_, completed_, generation_;
  std::vector<void*> ptrs_;
  std::vector<std::size_t> counts_;
  bool aborted_ = false;
  std::mutex m_;
  std::condition_variable cv_;
};

template <class Ctx>
constexpr void require_cuda_context() {
  static_assert(std::is_same_v<std::remove_const_t<Ctx>, backend::cuda_context>,
                "lockstep: this GPU reducer serves gpu<I> replicas (their context is cuda_context)");
}

}  // namespace detail

/// All-reduce of replicas sharing one GPU: one kernel per bucket sums the replicas' buffers in
/// order 0..N-1 and writes the sum to all of them (see the file comment).
class same_device_allreduce {
public:
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  /// Serves gpu<I> sets that all name the same device.
  template <class... Ds>
  static constexpr bool supports = sizeof...(Ds) >= 1 && (is_gpu_v<Ds> && ...) && detail::same_gpu<Ds...>();

  /// A reducer for `c.replicas` replicas (at most 16 on one GPU).
  explicit same_device_allreduce(const reducer_config& c = {})
      : rv_(c.replicas, c.timeout, c.ids), ids_(c.ids), ready_(c.replicas * ids_),
        done_(ids_), contexts_(c.replicas, nullptr) {
    if (c.replicas > detail::max_replicas_per_gpu)
      throw config_error("lockstep::same_device_allreduce: at most " + std::to_string(detail::max_replicas_per_gpu) +
                         " replicas may share one GPU, got " + std::to_string(c.replicas));
  }
  /// Works in place: no workspace.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  /// Nothing to bind.
  void bind(std::size_t, void*, std::size_t) noexcept {}

  /// Replica r's `count` gradient sums at `data` (device memory) join bucket `bucket`; the sum
  /// is launched once every replica has joined. Asynchronous: wait() orders the compute stream after it.
  template <class Ctx, class T>
  void start(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t bucket) {
    detail::require_cuda_context<Ctx>();
    static_assert(std::is_arithmetic_v<T>, "lockstep::same_device_allreduce sums arithmetic elements");
    if (!collective_ids::is_sum(bucket))
      throw config_error("lockstep::same_device_allreduce: " + collective_ids::name(bucket) + " is not a sum");
    collective(r, ctx, data, count, bucket, [&] { launch_sum<T>(ctx, bucket, count); });
  }

  /// Makes replica r's compute stream wait for bucket `bucket`'s sum (host waits only for the
  /// other replicas to have joined the bucket).
  template <class Ctx>
  void wait(std::size_t r, Ctx& ctx, std::size_t bucket) {
    detail::require_cuda_context<Ctx>();
    rv_.await(r, bucket);
    backend::device_guard g(ctx.ordinal());
    done_[bucket]->wait_on(ctx.compute_stream());
  }

  /// Copies `count` elements of the root replica's `data` to every replica's (synchronous).
  template <class Ctx, class T>
  void broadcast(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t root) {
    detail::require_cuda_context<Ctx>();
    if (root >= rv_.replicas()) throw config_error("lockstep: broadcast root " + std::to_string(root) + " is not a replica");
    const std::size_t id = collective_ids::broadcast;
    collective(r, ctx, data, count, id, [&] {
      const cudaStream_t s = ctx.comm_stream();
      for (std::size_t j = 0; j < rv_.replicas(); ++j)
        if (j != root && count)
          LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(rv_.pointer(id, j), rv_.pointer(id, root), count * sizeof(T),
                                              cudaMemcpyDeviceToDevice, s));
      record_done(ctx, id);
    });
    wait(r, ctx, id);
    backend::device_guard g(ctx.ordinal());
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(ctx.compute_stream()));
  }

  /// Releases every replica waiting in a collective.
  void abort() noexcept { rv_.abort(); }
  /// Ready again after a failure.
  void reset() noexcept { rv_.reset(); }

private:
  // Records replica r's "data ready" event on its compute stream, then arrives; the last arriver
  // makes its communication stream wait for every replica's event and runs `launch`.
  template <class Launch>
  void collective(std::size_t r, const backend::cuda_context& ctx, void* data, std::size_t count, std::size_t id,
                  const Launch& launch) {
    backend::device_guard g(ctx.ordinal());
    auto& ev = ready_[r * ids_ + id];
    if (!ev) ev = std::make_unique<backend::cuda_event>();
    ev->record(ctx.compute_stream());
    contexts_[r] = &ctx;
    rv_.arrive(r, id, data, count, [&] {
      for (std::size_t j = 0; j < rv_.replicas(); ++j) ready_[j * ids_ + id]->wait_on(ctx.comm_stream());
      launch();
    });
  }

  template <class T>
  void launch_sum(const backend::cuda_context& ctx, std::size_t bucket, std::size_t count) {
    const std::size_t n = rv_.replicas();
    if (count > 0 && n > 1) {
      detail::replica_pointers<T> ptrs{};
      for (std::size_t j = 0; j < n; ++j) ptrs.p[j] = static_cast<T*>(rv_.pointer(bucket, j));
      const std::size_t blocks = std::min<std::size_t>((count + 255) / 256, 4096);
      detail::sum_across_replicas_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, ctx.comm_stream()>>>(ptrs, n, count);
      LOCKSTEP_CUDA_CHECK(cudaGetLastError());
    }
    record_done(ctx, bucket);
  }

  void record_done(const backend::cuda_context& ctx, std::size_t id) {
    auto& d = done_[id];
    if (!d) d = std::make_unique<backend::cuda_event>();
    d->record(ctx.comm_stream());
  }

  detail::device_rendezvous rv_;
  std::size_t ids_;
  std::vector<std::unique_ptr<backend::cuda_event>> ready_;
  std::vector<std::unique_ptr<backend::cuda_event>> done_;
  std::vector<const backend::cuda_context*> contexts_;
};

/// Several gpu<I> replicas on the same GPU: the on-device reduction.
template <class... Devices>
  requires(sizeof...(Devices) > 1 && (is_gpu_v<Devices> && ...) && detail::same_gpu<Devices...>())
struct select_reducer<Devices...> {
  using type = same_device_allreduce;  ///< one kernel per bucket on the shared device
};

namespace detail {

/// For every element: the sum over src[0..n-1] in that order, written to `out` (which may be one
/// of the sources: each element is read before it is written, by the same thread).
template <class T>
__global__ void sum_replicas_into_kernel(replica_pointers<T> src, std::size_t n, T* out, std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    T acc = src.p[0][i];
    for (std::size_t j = 1; j < n; ++j) acc += src.p[j][i];
    out[i] = acc;
  }
}

/// Queues a copy of `bytes` bytes from `src` on device `src_dev` to `dst` on device `dst_dev` on
/// stream `s`: a device-to-device copy on one GPU, a peer copy between GPUs (CUDA routes it
/// through the host when peer access is not enabled).
inline void copy_device_bytes(void* dst, int dst_dev, const void* src, int src_dev, std::size_t bytes, cudaStream_t s) {
  if (bytes == 0) return;
  if (dst_dev == src_dev)
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  else
    LOCKSTEP_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, bytes, s));
}

/// Page-locked host memory in which reduce_to_one_device<cpu<I>> stages a GPU replica's buckets.
class pinned_staging final : public host_staging {
public:
  /// `bytes` bytes of pinned memory.
  explicit pinned_staging(std::size_t bytes) : mem_(bytes) {}
  /// The memory.
  [[nodiscard]] void* data() noexcept override { return mem_.data(); }
  /// Its size in bytes.
  [[nodiscard]] std::size_t size() const noexcept override { return mem_.size(); }

private:
  backend::pinned_buffer<std::byte> mem_;
};

/// GPU replicas aggregating on the host (reduce_to_one_device<cpu<I>>): a bucket is copied into
/// the replica's pinned staging and the host waits for that copy; the shared-memory engine then
/// sums every replica's staging, each replica its 1/N slice in replica order 0..N-1, and writes
/// the sums into every staging; finally each replica queues the copy back to its buffer on its
/// communication stream, which its compute stream waits for in wait().
template <>
struct host_aggregation<backend::cuda_context> {
  static constexpr bool enabled = true;  ///< GPU replicas stage through pinned memory

  /// Replica r's pinned staging (`st`), grown to at least `bytes` bytes. Grows only while the
  /// first buckets arrive; before it does, the communication stream has finished with the old one.
  static void* staging(std::unique_ptr<host_staging>& st, const backend::cuda_context& ctx, std::size_t bytes) {
    if (!st || st->size() < bytes) {
      backend::device_guard g(ctx.ordinal());
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(ctx.comm_stream()));
      st.reset();
      st = std::make_unique<pinned_staging>(bytes);
    }
    return st->data();
  }

  /// Sums `count` elements of every replica's `data` (device memory) into all of them.
  template <class T>
  static void start(host_comm& c, std::unique_ptr<host_staging>& st, std::size_t r, const backend::cuda_context& ctx,
                    T* data, std::size_t count, std::size_t bucket) {
    const std::size_t bytes = count * sizeof(T);
    void* host = staging(st, ctx, bytes);
    backend::device_guard g(ctx.ordinal());
    if (bytes) {
      ctx.fork_to_comm();
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(host, data, bytes, cudaMemcpyDeviceToHost, ctx.comm_stream()));
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(ctx.comm_stream()));
    }
    c.start(r, bucket, host, count, &allreduce_work<T>);
    c.wait(r, bucket);  // every slice of every staging holds the sum
    if (bytes) LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(data, host, bytes, cudaMemcpyHostToDevice, ctx.comm_stream()));
  }

  /// Orders the compute stream after the copy back.
  static void wait(const backend::cuda_context& ctx) { ctx.join_from_comm(); }

  /// Copies `count` elements of replica `root`'s `data` to every replica's (synchronous).
  template <class T>
  static void broadcast(host_comm& c, std::unique_ptr<host_staging>& st, std::size_t r,
                        const backend::cuda_context& ctx, T* data, std::size_t count, std::size_t root) {
    const std::size_t bytes = count * sizeof(T);
    void* host = staging(st, ctx, bytes);
    backend::device_guard g(ctx.ordinal());
    if (r == root && bytes) {
      ctx.fork_to_comm();
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(host, data, bytes, cudaMemcpyDeviceToHost, ctx.comm_stream()));
    }
    // The host writes into every staging next, and the copy back of this replica's last bucket
    // (queued by start without a wait) may still be reading its staging: wait for the stream.
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(ctx.comm_stream()));
    c.broadcast(r, host, count, sizeof(T), root);  // host copies of the root's staging
    if (r != root && bytes) {
      ctx.fork_to_comm();
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(data, host, bytes, cudaMemcpyHostToDevice, ctx.comm_stream()));
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(ctx.comm_stream()));
    }
  }
};

/// gpu<I> replicas may aggregate on the host (reduce_to_one_device<cpu<J>>).
template <std::size_t I>
inline constexpr bool host_aggregation_serves<gpu<I>> = true;

}  // namespace detail

/// Aggregation on GPU K for gpu<I> replicas (repeated or distinct ordinals). Per bucket, once
/// every replica has joined: the root replica's communication stream (on GPU K) waits for every
/// replica's "gradients ready" event, copies the buffers of replicas on other GPUs into their
/// staging slots on GPU K (cudaMemcpyPeerAsync; buffers on GPU K are read in place), sums all
/// replicas in order 0..N-1 into the root's buffer with one kernel (run-to-run deterministic),
/// and copies the sum back to every other replica. Each replica's compute stream waits for that
/// with an event; the host waits only for the other replicas to join the bucket.
/// Staging: the root replica's workspace, N-1 slots of the largest bucket (the strategy sizes it
/// for the whole parameter vector; a larger all_reduce across GPUs is a config_error).
template <std::size_t K>
class reduce_to_one_device<gpu<K>> {
public:
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  using aggregation_device = gpu<K>;    ///< where the sum is formed
  /// Serves gpu<I> sets that contain gpu<K>.
  template <class... Ds>
  static constexpr bool supports = sizeof...(Ds) >= 1 && (is_gpu_v<Ds> && ...) && (std::is_same_v<gpu<K>, Ds> || ...);

  /// A reducer aggregating on replica `c.root` (the strategy sets it to gpu<K>'s position; at most 16 replicas).
  explicit reduce_to_one_device(const reducer_config& c = {})
      : rv_(c.replicas, c.timeout, c.ids), ids_(c.ids), root_(c.root),
        ready_(c.replicas * ids_), done_(ids_), ordinals_(c.replicas, -1), streams_(c.replicas, nullptr) {
    if (c.replicas > detail::max_replicas_per_gpu)
      throw config_error("lockstep::reduce_to_one_device<gpu<" + std::to_string(K) + ">>: at most " +
                         std::to_string(detail::max_replicas_per_gpu) + " replicas, got " + std::to_string(c.replicas));
    if (c.root >= c.replicas)
      throw config_error("lockstep::reduce_to_one_device<gpu<" + std::to_string(K) + ">>: root replica " +
                         std::to_string(c.root) + " is not below the replica count " + std::to_string(c.replicas));
  }

  /// Staging for the other replicas' buckets on GPU K: N-1 slots of `max_bucket_bytes` (256-byte aligned).
  [[nodiscard]] std::size_t workspace_bytes(std::size_t max_bucket_bytes) const noexcept {
    return (rv_.replicas() - 1) * backend::detail::align256(max_bucket_bytes);
  }

  /// The root replica's workspace (memory of GPU K) becomes the staging; the others' is not used.
  void bind(std::size_t r, void* workspace, std::size_t bytes) {
    if (r != root_) return;
    if (bytes > 0) {
      cudaPointerAttributes a{};
      LOCKSTEP_CUDA_CHECK(cudaPointerGetAttributes(&a, workspace));
      if (a.type != cudaMemoryTypeDevice || a.device != static_cast<int>(K))
        throw config_error("lockstep::reduce_to_one_device<gpu<" + std::to_string(K) +
                           ">>: the root replica's workspace is not device memory of CUDA device " + std::to_string(K));
    }
    staging_ = static_cast<std::byte*>(workspace);
    slot_bytes_ = rv_.replicas() > 1 ? bytes / (rv_.replicas() - 1) : 0;
  }

  /// Replica r's `count` gradient sums at `data` (device memory) join bucket `bucket`; the last
  /// replica to join queues the reduction on the root's communication stream. Asynchronous.
  template <class Ctx, class T>
  void start(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t bucket) {
    detail::require_cuda_context<Ctx>();
    static_assert(std::is_arithmetic_v<T>, "lockstep::reduce_to_one_device sums arithmetic elements");
    if (!collective_ids::is_sum(bucket))
      throw config_error("lockstep::reduce_to_one_device<gpu<" + std::to_string(K) + ">>: " +
                         collective_ids::name(bucket) + " is not a sum");
    join(r, ctx, data, count, bucket, [&] { launch_sum<T>(bucket, count); });
  }

  /// Makes replica r's compute stream wait for bucket `bucket`'s sum (host waits only for the
  /// other replicas to have joined the bucket).
  template <class Ctx>
  void wait(std::size_t r, Ctx& ctx, std::size_t bucket) {
    detail::require_cuda_context<Ctx>();
    rv_.await(r, bucket);
    backend::device_guard g(ctx.ordinal());
    done_[bucket]->wait_on(ctx.compute_stream());
  }

  /// Copies `count` elements of replica `root`'s `data` to every replica's (synchronous): each
  /// replica copies from the root on its own communication stream, then all meet again so that
  /// the root's buffer is not changed while others still read it.
  template <class Ctx, class T>
  void broadcast(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t root) {
    detail::require_cuda_context<Ctx>();
    if (root >= rv_.replicas()) throw config_error("lockstep: broadcast root " + std::to_string(root) + " is not a replica");
    const std::size_t id = collective_ids::broadcast, done = collective_ids::broadcast_done;
    join(r, ctx, data, count, id, [] {});
    rv_.await(r, id);
    backend::device_guard g(ctx.ordinal());
    if (r != root && count) {
      ctx.fork_to_comm();
      ready_[root * ids_ + id]->wait_on(ctx.comm_stream());
      detail::copy_device_bytes(data, ctx.ordinal(), rv_.pointer(id, root), ordinals_[root], count * sizeof(T),
                                ctx.comm_stream());
      LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(ctx.comm_stream()));
    }
    rv_.arrive(r, done, nullptr, 0, [] {});
    rv_.await(r, done);
  }

  /// Releases every replica waiting in a collective.
  void abort() noexcept { rv_.abort(); }
  /// Ready again after a failure.
  void reset() noexcept { rv_.reset(); }

private:
  // Records replica r's "data ready" event on its compute stream, then arrives at collective
  // `id`; the last replica to arrive runs `launch` (with GPU K current).
  template <class Launch>
  void join(std::size_t r, const backend::cuda_context& ctx, void* data, std::size_t count, std::size_t id,
            const Launch& launch) {
    if (r == root_ && ctx.ordinal() != static_cast<int>(K))
      throw config_error("lockstep::reduce_to_one_device<gpu<" + std::to_string(K) + ">>: the root replica " +
                         std::to_string(r) + " runs on CUDA device " + std::to_string(ctx.ordinal()));
    backend::device_guard g(ctx.ordinal());
    auto& ev = ready_[r * ids_ + id];
    if (!ev) ev = std::make_unique<backend::cuda_event>();
    ev->record(ctx.compute_stream());
    // Written only when they change (a new context), never while a launch may read them.
    if (ordinals_[r] != ctx.ordinal()) ordinals_[r] = ctx.ordinal();
    if (streams_[r] != ctx.comm_stream()) streams_[r] = ctx.comm_stream();
    rv_.arrive(r, id, data, count, [&] {
      backend::device_guard root_device(static_cast<int>(K));
      launch();
    });
  }

  // Queues bucket `id`'s reduction on the root's communication stream (see the class comment).
  template <class T>
  void launch_sum(std::size_t id, std::size_t count) {
    const std::size_t n = rv_.replicas();
    const int k = static_cast<int>(K);
    const std::size_t bytes = count * sizeof(T);
    const cudaStream_t s = streams_[root_];
    if (n > 1 && count > 0) {
      for (std::size_t j = 0; j < n; ++j)
        if (j != root_ && ordinals_[j] != k && bytes > slot_bytes_)
          throw config_error("lockstep::reduce_to_one_device<gpu<" + std::to_string(K) + ">>: bucket " +
                             std::to_string(id) + " of " + std::to_string(bytes) +
                             " bytes exceeds the staging slot of " + std::to_string(slot_bytes_) +
                             " bytes (the workspace holds buckets up to the model's parameter count)");
      for (std::size_t j = 0; j < n; ++j) ready_[j * ids_ + id]->wait_on(s);
      T* out = static_cast<T*>(rv_.pointer(id, root_));
      detail::replica_pointers<T> src{};
      for (std::size_t j = 0; j < n; ++j) {
        T* p = static_cast<T*>(rv_.pointer(id, j));
        if (j != root_ && ordinals_[j] != k) {
          T* slot = reinterpret_cast<T*>(staging_ + (j < root_ ? j : j - 1) * slot_bytes_);
          detail::copy_device_bytes(slot, k, p, ordinals_[j], bytes, s);
          p = slot;
        }
        src.p[j] = p;
      }
      const std::size_t blocks = std::min<std::size_t>((count + 255) / 256, 4096);
      detail::sum_replicas_into_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, s>>>(src, n, out, count);
      LOCKSTEP_CUDA_CHECK(cudaGetLastError());
      for (std::size_t j = 0; j < n; ++j)
        if (j != root_) detail::copy_device_bytes(rv_.pointer(id, j), ordinals_[j], out, k, bytes, s);
    }
    auto& d = done_[id];
    if (!d) d = std::make_unique<backend::cuda_event>();
    d->record(s);
  }

  detail::device_rendezvous rv_;
  std::size_t ids_;
  std::size_t root_;
  std::vector<std::unique_ptr<backend::cuda_event>> ready_;  // per (replica, id), on the replica's GPU
  std::vector<std::unique_ptr<backend::cuda_event>> done_;   // per id, on GPU K
  std::vector<int> ordinals_;                                 // each replica's CUDA device
  std::vector<cudaStream_t> streams_;                         // each replica's communication stream
  std::byte* staging_ = nullptr;                              // N-1 slots on GPU K
  std::size_t slot_bytes_ = 0;
};

#if defined(LOCKSTEP_HAS_NCCL)

/// All-reduce between distinct GPUs of one process through NCCL (see the file comment).
class nccl_allreduce {
public:
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  /// Serves sets of distinct gpu<I>.
  template <class... Ds>
  static constexpr bool supports = sizeof...(Ds) >= 1 && (is_gpu_v<Ds> && ...) && detail::distinct_gpus<Ds...>();

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
    communicator(r, ctx);
    rv_.arrive(r, bucket, data, count, [] {});
    backend::device_guard g(ctx.ordinal());
    ctx.fork_to_comm();
    call(r, bucket, "ncclAllReduce", [&](ncclComm_t comm) {
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

  /// ncclBroadcast of `count` elements from replica `root` (synchronous). One replica: nothing to copy.
  template <class Ctx, class T>
  void broadcast(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t root) {
    detail::require_cuda_context<Ctx>();
    if (root >= rv_.replicas()) throw config_error("lockstep: broadcast root " + std::to_string(root) + " is not a replica");
    if (rv_.replicas() == 1) return;
    communicator(r, ctx);
    const std::size_t id = collective_ids::broadcast;
    rv_.arrive(r, id, data, count, [] {});
    backend::device_guard g(ctx.ordinal());
    ctx.fork_to_comm();
    call(r, id, "ncclBroadcast", [&](ncclComm_t comm) {
      return ncclBroadcast(data, data, count, detail::nccl_type<T>(), static_cast<int>(root), comm, ctx.comm_stream());
    });
    rv_.await(r, id);
    ctx.join_from_comm();
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(ctx.compute_stream()));
  }

  /// Releases the replicas and stops the communicators' in-flight work, so no GPU waits for a
  /// failed peer; callable from any thread. The communicators are non-blocking, so no replica
  /// stays inside an NCCL call: abort takes them exclusively (waiting at most the timeout) and
  /// revokes them when the NCCL loaded at run time has ncclCommRevoke (2.28 or newer; they are
  /// aborted in reset()), else aborts them at once.
  void abort() noexcept {
    rv_.abort();
    {
      std::lock_guard<std::mutex> lock(m_);
      failed_ = true;
    }
    std::unique_lock<std::shared_timed_mutex> use(use_, std::defer_lock);
    if (!use.try_lock_for(timeout_)) return;  // a replica is still inside an NCCL call: reset() aborts
    std::lock_guard<std::mutex> lock(m_);
    if (!detail::nccl_revoke_all(comms_, revoke_)) detail::nccl_abort_all(comms_);
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
      if (waited > timeout_) {
        abort();
        throw timeout_error("lockstep: collective timed out: replica " + std::to_string(r) + " (CUDA device " +
                            std::to_string(devices_[r]) + ") waited " + std::to_string(timeout_.count()) + " ms for " +
                            what + " in " + collective_ids::name(id) +
                            " (raise strategy_options::timeout if a step legitimately takes longer)");
      }
      if (waited < std::chrono::milliseconds(2) || polls < 64) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
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
  }

  detail::device_rendezvous rv_;
  std::chrono::milliseconds timeout_;
  std::vector<ncclComm_t> comms_;
  std::vector<int> devices_;
  detail::nccl_revoke_fn revoke_;  // ncclCommRevoke when the NCCL loaded at run time has it
  bool failed_ = false;            // aborted: communicators unusable until reset()
  std::mutex m_;                   // guards comms_ and failed_
  std::shared_timed_mutex use_;    // held shared while a replica is inside an NCCL call
};

/// Several distinct gpu<I>: NCCL all-reduce.
template <class... Devices>
  requires(sizeof...(Devices) > 1 && (is_gpu_v<Devices> && ...) && detail::distinct_gpus<Devices...>())
struct select_reducer<Devices...> {
  using type = nccl_allreduce;  ///< NCCL between the GPUs
};

/// GPU replicas listed at run time (mirrored<gpus>): NCCL between distinct GPUs.
template <>
struct select_kind_reducer<gpus> {
  using type = nccl_allreduce;  ///< NCCL between the GPUs
};

#else

/// GPU replicas listed at run time (mirrored<gpus>) in a build without NCCL: the host sums the
/// buckets of every GPU in pinned memory (reduce_to_one_device<cpu<0>>).
template <>
struct select_kind_reducer<gpus> {
  using type = reduce_to_one_device<cpu<0>>;  ///< aggregation on the host
};

#endif  // LOCKSTEP_HAS_NCCL

}  // namespace lockstep
