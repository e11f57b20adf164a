#pragma once
/// @file same_device.cuh
/// `same_device_allreduce`: the reducer of GPU replicas that share one GPU
/// (mirrored<gpu<0>, gpu<0>>, the default for such sets). When the last replica arrives at a
/// bucket, one kernel sums the bucket over the replicas in the fixed order 0..N-1 (the host
/// reducers' order: run-to-run deterministic) and writes the sum into every replica's buffer.
/// Replicas order their streams with events; the host meets the other replicas per bucket (a
/// replica that fails before a bucket releases the others with collective_aborted or
/// timeout_error) but never waits for the device. Compile with nvcc.

#if !defined(__CUDACC__)
#error "lockstep/distribute/reducers/same_device.cuh holds CUDA kernels: compile with nvcc"
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

namespace lockstep {

/// All-reduce of replicas sharing one GPU: one kernel per bucket sums the replicas' buffers in
/// order 0..N-1 and writes the sum to all of them (see the file comment).
class same_device_allreduce {
public:
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  /// Serves gpu<I> sets that all name the same device.
  template <class... Ds>
  static constexpr bool supports = all_of_kind_v<gpus, Ds...> && detail::same_gpu<Ds...>();

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
    ctx.wait_stream(ctx.compute_stream());
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
    rv_.check_slot(r, id);  // before the tables below are indexed with them
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
      ctx.count_launches();
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

}  // namespace lockstep
