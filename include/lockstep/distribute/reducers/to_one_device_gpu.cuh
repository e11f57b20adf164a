#pragma once
/// @file to_one_device_gpu.cuh
/// `reduce_to_one_device<gpu<K>>` (named explicitly): GPU replicas aggregating on GPU K. Per
/// bucket, the buffers of replicas on other GPUs are copied into staging on GPU K
/// (cudaMemcpyPeerAsync), one kernel sums all replicas in order 0..N-1 into the root replica's
/// buffer, and copies send the sum back; all on the root's communication stream, ordered with
/// events. The host meets the other replicas per bucket (a replica that fails before a bucket
/// releases the others) but never waits for the device. Compile with nvcc.

#if !defined(__CUDACC__)
#error "lockstep/distribute/reducers/to_one_device_gpu.cuh holds CUDA kernels: compile with nvcc"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <lockstep/backend/cuda/context.hpp>
#include <lockstep/backend/cuda/device.hpp>
#include <lockstep/backend/cuda/error.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/detail/cuda_common.hpp>
#include <lockstep/distribute/reducers/detail/kernels.cuh>
#include <lockstep/distribute/reducers/detail/rendezvous.hpp>
#include <lockstep/distribute/reducers/host.hpp>

namespace lockstep {

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
  static constexpr bool supports = all_of_kind_v<gpus, Ds...> && (std::is_same_v<gpu<K>, Ds> || ...);

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
      backend::copy_device_bytes(data, ctx.ordinal(), rv_.pointer(id, root), ordinals_[root], count * sizeof(T),
                                ctx.comm_stream());
      ctx.wait_stream(ctx.comm_stream());
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
    rv_.check_slot(r, id);  // before the tables below are indexed with them
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
          backend::copy_device_bytes(slot, k, p, ordinals_[j], bytes, s);
          p = slot;
        }
        src.p[j] = p;
      }
      const std::size_t blocks = std::min<std::size_t>((count + 255) / 256, 4096);
      detail::sum_replicas_into_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, s>>>(src, n, out, count);
      LOCKSTEP_CUDA_CHECK(cudaGetLastError());
      for (std::size_t j = 0; j < n; ++j)
        if (j != root_) backend::copy_device_bytes(rv_.pointer(id, j), ordinals_[j], out, k, bytes, s);
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

}  // namespace lockstep
