#pragma once
/// @file mpi_host.hpp
/// `mpi_host_allreduce`: the hierarchical reducer of host replicas across the workers of an MPI
/// job (link lockstep::mpi). The shared-memory all-reduce between the local replicas of a bucket
/// first; then — as soon as the last local replica finished its part — the bucket is handed to
/// the worker's communication thread, which sums it across the workers (a fixed-order
/// reduce-scatter + all-gather over MPI, or over a shared-memory window when every worker runs on
/// one machine) while the backward pass of the layers below continues. On one machine local replica
/// 0's gradients live in the shared window themselves (gradient_storage), so that sum reads and
/// writes them where they are. The default reducer of multi_worker_mirrored<cpus>.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include <lockstep/core/device.hpp>
#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/distribute/mpi_world.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/detail/host_sum.hpp>

namespace lockstep {

/// Hierarchical host reducer over the workers of an mpi_world (see the file comment).
class mpi_host_allreduce {
  struct engine : detail::host_comm {
    using detail::host_comm::host_comm;
    mpi_host_allreduce* self = nullptr;
  };

public:
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  /// Serves host device sets (the local replicas of each worker).
  template <class... Ds>
  static constexpr bool supports = (is_cpu_v<Ds> && ...);
  /// Serves the replicas of a kind whose memory the host reads and writes.
  template <class Kind>
  static constexpr bool supports_kind = device_memory<Kind>::host_accessible;

  /// A reducer for `c.replicas` local replicas whose inter-worker part runs on the world's
  /// communication thread (host replicas need nothing of their ordinals).
  mpi_host_allreduce(const reducer_config& c, mpi_world& world, const std::vector<std::size_t>& = {})
      : comm_(c.replicas, c.timeout, c.ids, 0),
        channel_(&world.channel()),
        arrived_(new std::atomic<std::uint64_t>[c.ids]),
        tickets_(c.ids, 0),
        counts_(c.ids, 0) {
    comm_.self = this;
    for (std::size_t i = 0; i < c.ids; ++i) arrived_[i].store(0);
  }

  /// Memory for local replica `replica`'s `count` gradients that the workers' sum reads and writes
  /// in place (a shared window: local replica 0's, when every worker runs on this machine), so
  /// nothing is copied into or out of a window; null otherwise (the strategy keeps the model's own
  /// buffer). Collective (the strategy asks for every replica on every worker alike).
  [[nodiscard]] std::shared_ptr<float> gradient_storage(std::size_t replica, std::size_t count) {
    if (replica != 0 || count == 0 || !channel_->shared_memory()) return {};
    std::shared_ptr<detail::mpi_gradient_window> window = channel_->allocate_gradient_window(count);
    float* local = window->local();
    return {std::move(window), local};
  }
  /// Host memory needs no workspace.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  /// Nothing to bind.
  void bind(std::size_t, void*, std::size_t) noexcept {}
  /// Local replica `replica` contributes `count` elements at `data` to bucket `bucket`.
  template <class Ctx, class T>
  void start(std::size_t replica, Ctx&, T* data, std::size_t count, std::size_t bucket) {
    static_assert(std::is_same_v<T, float>, "lockstep::mpi_host_allreduce sums float gradients");
    comm_.start(replica, bucket, data, count, &work);
  }
  /// Completes the bucket: every local replica holds the sum over all replicas of all workers
  /// (the others copy local replica 0's; all return once every copy is made).
  template <class Ctx>
  void wait(std::size_t replica, Ctx&, std::size_t bucket) {
    comm_.wait(replica, bucket);
    channel_->wait(tickets_[bucket]);
    if (comm_.replicas() == 1) return;
    if (replica != 0) {
      const std::size_t n = counts_[bucket];
      if (n) std::memcpy(comm_.pointer(bucket, replica), comm_.pointer(bucket, 0), n * sizeof(float));
    }
    // Replica 0 may change its sums once this returns (a per-value clamp in place, the next
    // step's backward pass): not before every other local replica has copied them.
    comm_.barrier(replica);
  }
  /// Hands every bucket local replica `replica` started to the communication thread before the
  /// caller queues other work there (a row exchange across the workers inside the backward pass):
  /// a bucket is handed over by the last local replica to finish its local part, which may
  /// otherwise come after the exchange on one worker and before it on another, so that the
  /// workers' collectives would not match. Every local replica calls it at the same point.
  void settle(std::size_t replica) { comm_.settle(replica); }
  /// Copies `count` elements of local replica `root` on rank 0 to every replica of every worker.
  template <class Ctx, class T>
  void broadcast(std::size_t replica, Ctx&, T* data, std::size_t count, std::size_t root) {
    comm_.broadcast(replica, data, count, sizeof(T), root);
    if (replica == 0) channel_->run(detail::mpi_channel::broadcast(data, count * sizeof(T), collective_ids::broadcast));
    comm_.broadcast(replica, data, count, sizeof(T), 0);
  }
  /// Releases local waiters and marks the channel unusable.
  void abort() noexcept {
    comm_.abort();
    channel_->abort();
  }
  /// Re-arms the local engine (the channel stays unusable after a failure).
  void reset() noexcept { comm_.reset(); }

private:
  // The local all-reduce of replica r's slice; the last local replica to finish posts the
  // bucket's sum across the workers.
  static void work(detail::host_comm& c, std::size_t r, std::size_t bucket, std::size_t count, std::uint64_t seq) {
    detail::allreduce_work<float>(c, r, bucket, count, seq);
    mpi_host_allreduce& self = *static_cast<engine&>(c).self;
    if ((self.arrived_[bucket].fetch_add(1) + 1) % c.replicas() == 0) {
      self.counts_[bucket] = count;
      self.tickets_[bucket] = self.channel_->post(detail::mpi_channel::sum(c.pointer(bucket, 0), count, bucket));
    }
  }

  engine comm_;
  detail::mpi_channel* channel_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> arrived_;
  std::vector<std::uint64_t> tickets_;
  std::vector<std::size_t> counts_;
};

}  // namespace lockstep
