#pragma once
/// @file over_workers.hpp
/// `over_workers<Local>`: any reducer of one process's replicas (a user's, or host_allreduce),
/// extended to the workers of an MPI job (link lockstep::mpi). multi_worker_mirrored wraps a
/// reducer in it when the reducer does not take the world itself. Per bucket: the local reducer
/// sums the local replicas; at wait, local replica 0 sums the bucket across the workers on the
/// world's communication thread (fixed rank order: the same bits on every worker), and the local
/// reducer's broadcast copies it to the other local replicas. Host memory only. The inter-worker
/// sum runs at wait, so unlike mpi_host_allreduce it does not overlap the backward pass.

#include <cstddef>
#include <type_traits>
#include <vector>

#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/mpi_world.hpp>
#include <lockstep/distribute/reducer.hpp>

namespace lockstep {

/// Local reducer `Local` over the workers of an mpi_world (see the file comment).
template <class Local>
class over_workers {
public:
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  using local_type = Local;             ///< the reducer of the local replicas
  /// The device sets the local reducer serves.
  template <class... Ds>
  static constexpr bool supports = Local::template supports<Ds...>;
  /// Serves the kinds whose memory the host reads and writes (the sum across workers reads it).
  template <class Kind>
  static constexpr bool supports_kind = device_memory<Kind>::host_accessible;

  /// `Local` made from `c`, extended over the workers of `world`.
  over_workers(const reducer_config& c, mpi_world& world, const std::vector<std::size_t>& = {})
      : local_(c), channel_(&world.channel()), replicas_(c.replicas), pending_(c.ids * c.replicas) {}

  /// The local reducer's workspace.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t max_bucket_bytes) const {
    return local_.workspace_bytes(max_bucket_bytes);
  }
  /// Binds the local reducer's workspace.
  void bind(std::size_t replica, void* workspace, std::size_t bytes) { local_.bind(replica, workspace, bytes); }
  /// Starts the local sum of the bucket.
  template <class Ctx, class T>
  void start(std::size_t replica, Ctx& ctx, T* data, std::size_t count, std::size_t bucket) {
    static_assert(std::is_same_v<T, float>, "lockstep::over_workers sums float gradients across workers");
    pending_.at(bucket * replicas_ + replica) = {data, count};
    local_.start(replica, ctx, data, count, bucket);
  }
  /// Completes the local sum, then the sum over the workers; every local replica holds it after.
  template <class Ctx>
  void wait(std::size_t replica, Ctx& ctx, std::size_t bucket) {
    local_.wait(replica, ctx, bucket);
    const bucket_data& mine = pending_.at(bucket * replicas_ + replica);
    auto* data = static_cast<float*>(mine.data);
    if (replica == 0) channel_->run(detail::mpi_channel::sum(data, mine.count, bucket));
    local_.broadcast(replica, ctx, data, mine.count, 0);  // replica 0's sum over the workers, to every local replica
  }
  /// Copies `count` elements of local replica `root` on rank 0 to every replica of every worker.
  template <class Ctx, class T>
  void broadcast(std::size_t replica, Ctx& ctx, T* data, std::size_t count, std::size_t root) {
    local_.broadcast(replica, ctx, data, count, root);
    if (replica == 0) channel_->run(detail::mpi_channel::broadcast(data, count * sizeof(T), collective_ids::broadcast));
    local_.broadcast(replica, ctx, data, count, 0);
  }
  /// Releases the local waiters and marks the channel unusable.
  void abort() noexcept {
    local_.abort();
    channel_->abort();
  }
  /// Re-arms the local reducer (the channel stays unusable after a failure).
  void reset() noexcept { local_.reset(); }

private:
  struct bucket_data {
    void* data = nullptr;
    std::size_t count = 0;
  };

  Local local_;
  detail::mpi_channel* channel_;
  std::size_t replicas_;
  std::vector<bucket_data> pending_;  // per (bucket, local replica): the data it started the bucket with
};

}  // namespace lockstep
