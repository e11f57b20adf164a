#pragma once
/// @file host_staged.hpp
/// The host-staged path of `reduce_to_one_device<cpu<I>>` for GPU replicas (named explicitly, and
/// the default of `mirrored<gpus>` in a build without NCCL): each replica copies its bucket into
/// pinned memory, each sums its 1/N slice over the replicas in order 0..N-1 (the host_allreduce
/// engine), then copies the result back. Host code: compiles with g++ where the CUDA headers are
/// present (no kernels).

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>

#include <lockstep/backend/cuda/context.hpp>
#include <lockstep/backend/cuda/device.hpp>
#include <lockstep/backend/cuda/error.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/distribute/reducers/host.hpp>

namespace lockstep::detail {

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
      ctx.wait_stream(ctx.comm_stream());
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
      ctx.wait_stream(ctx.comm_stream());
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
    ctx.wait_stream(ctx.comm_stream());
    c.broadcast(r, host, count, sizeof(T), root);  // host copies of the root's staging
    if (r != root && bytes) {
      ctx.fork_to_comm();
      LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(data, host, bytes, cudaMemcpyHostToDevice, ctx.comm_stream()));
      ctx.wait_stream(ctx.comm_stream());
    }
  }
};

/// gpu<I> replicas may aggregate on the host (reduce_to_one_device<cpu<J>>).
template <std::size_t I>
inline constexpr bool host_aggregation_serves<gpu<I>> = true;

}  // namespace lockstep::detail
