#pragma once
/// @file reducer.hpp
/// The reducer interface: how replicas aggregate gradient sums. A strategy owns one reducer and
/// calls it from each replica's own worker thread. The interface (documented in
/// docs/distribute.md) fits both the host engine and device libraries (NCCL, CUB):
///
///  - construction from a `reducer_config` (replica count, timeout, the collective ids it serves, root replica);
///  - two-phase workspace: `workspace_bytes(max_bucket_bytes)` first, then `bind(replica, ptr,
///    bytes)` on each replica's thread with memory the strategy allocated on that device; the
///    steady state allocates nothing;
///  - per bucket, `start(replica, ctx, data, count, bucket)` (an in-place SUM all-reduce that may
///    run asynchronously) and `wait(replica, ctx, bucket)` (after which data holds the sum on
///    every replica, and no other replica reads or writes this replica's data in that collective
///    any more); buckets start in the same order on every replica;
///  - `broadcast(replica, ctx, data, count, root)`, synchronous;
///  - `abort()` (any thread: every waiter throws) and `reset()` (when no replica is inside);
///  - optionally `std::shared_ptr<float> gradient_storage(replica, count)`: memory the reducer
///    wants a replica's float gradients kept in (mpi_host_allreduce's shared window), or null;
///    asked for every replica at replicate(), collectively;
///  - optionally `settle(replica)`: hands every bucket the replica started to whatever thread
///    carries it across the workers, before a row exchange across the workers (batch_norm's, in
///    forward and backward) queues work there, so every worker queues the same collectives in
///    the same order (mpi_host_allreduce::settle); every local replica calls it at the same point;
///  - optionally, for an optimiser update sharded over the replicas (strategy_options::
///    shard_optimizer), a reduce-scatter and an all-gather in place of the all-reduce and the
///    copies: `static constexpr bool reduces_to_slices = true` and
///    `reduce_to_slices(replica, ctx, grads, offset, count, bucket, slices)` (bucket [offset,
///    offset + count) of `grads` summed only into the replica whose slice holds each element;
///    `wait` completes it), `sum_chunks(replica, ctx, chunks, count)` (an in-place sum of doubles
///    over the replicas: the epilogue's chunk sums) and `gather_slices(replica, ctx, params,
///    slices)` (every replica's slice of `params` copied to every replica); each ordered on the
///    replica's context without a host wait. The slices are then the epilogue's grid
///    (grid_slice), so each chunk sum has exactly one replica that computes it.
///
/// The reducers themselves live in distribute/reducers/, one per file; the default reducer of a
/// device set, `select_reducer_t<Devices...>`, is chosen in distribute/reducers/select.hpp.

#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/backend/context.hpp>
#include <lockstep/backend/host/context.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/concepts.hpp>

namespace lockstep {

/// Opt-in tag: a type is a reducer only when it says `using reducer_concept = lockstep::reducer_tag;`.
struct reducer_tag {};

/// What a strategy tells its reducer at construction.
struct reducer_config {
  std::size_t replicas = 1;                    ///< number of replicas taking part
  std::chrono::milliseconds timeout{60'000};   ///< longest wait before timeout_error
  std::size_t ids = collective_ids::count;     ///< collective ids [0, ids) may be used (see collective_ids)
  std::size_t root = 0;                        ///< the replica a reduce-to-one scheme aggregates on
};

/// A reducer: opts in with reducer_tag, says which device sets it serves
/// (`template <class... Ds> static constexpr bool supports`), and provides the two-phase
/// workspace, per-bucket start/wait, broadcast, abort and reset (checked here with a host context
/// and float data; device reducers take their own context type).
template <class R>
concept reducer = requires(R& r, const R& cr, std::size_t i, host_context& ctx, float* p) {
  typename R::reducer_concept;
  requires std::same_as<typename R::reducer_concept, reducer_tag>;
  requires std::constructible_from<R, const reducer_config&>;
  { cr.workspace_bytes(i) } -> std::convertible_to<std::size_t>;
  r.bind(i, static_cast<void*>(nullptr), i);
  r.start(i, ctx, p, i, i);
  r.wait(i, ctx, i);
  r.broadcast(i, ctx, p, i, i);
  r.abort();
  r.reset();
};

/// True when reducer R reduces a sharded update's buckets onto their slices and gathers the
/// slices itself (the optional `reduces_to_slices` members above).
template <class R>
inline constexpr bool reduces_to_slices_v = requires { requires R::reduces_to_slices; };

namespace detail {
/// Checks the slices a reducer that reduces onto them is given (reduces_to_slices_v): one per
/// replica of `replicas`, in order, without overlap; `who` names the reducer in the config_error.
inline void check_reducer_slices(std::span<const std::pair<std::size_t, std::size_t>> slices, std::size_t replicas,
                                 const char* who) {
  bool ok = slices.size() == replicas;
  for (std::size_t k = 0; ok && k < slices.size(); ++k)
    ok = slices[k].first <= slices[k].second && (k == 0 || slices[k - 1].second <= slices[k].first);
  if (!ok)
    throw config_error(std::string(who) + ": " + std::to_string(slices.size()) + " slices for " + std::to_string(replicas) +
                       " replicas; the slices must be one per replica, in order, without overlap");
}

/// True when reducer R is made for a world W: `R(const reducer_config&, W&, const
/// std::vector<std::size_t>& ordinals)` (a reducer that spans the workers itself).
template <class R, class World>
constexpr bool constructible_in_world() {
  if constexpr (std::is_void_v<World>)
    return false;
  else
    return std::is_constructible_v<R, const reducer_config&, World&, const std::vector<std::size_t>&>;
}

/// Checks reducer R with context Ctx and float data member by member, so that a reducer that
/// lacks one is told which (the members of the `reducer` concept, and `supports`). A reducer of
/// a strategy in world World may instead be made from the world (constructible_in_world).
template <class R, class Ctx = host_context, class World = void>
constexpr bool check_reducer() {
  static_assert(requires { requires std::same_as<typename R::reducer_concept, reducer_tag>; },
                "lockstep: a reducer opts in with `using reducer_concept = lockstep::reducer_tag;`");
  static_assert(requires { { R::template supports<cpu<0>> } -> std::convertible_to<bool>; },
                "lockstep: a reducer needs `template <class... Devices> static constexpr bool supports` (the device "
                "sets it serves)");
  static_assert(std::constructible_from<R, const reducer_config&> || constructible_in_world<R, World>(),
                "lockstep: a reducer needs a constructor `explicit R(const lockstep::reducer_config& config)` (or, to "
                "span the workers of a world itself, `R(const lockstep::reducer_config&, World&, const "
                "std::vector<std::size_t>& ordinals)`)");
  static_assert(requires(const R& r, std::size_t n) { { r.workspace_bytes(n) } -> std::convertible_to<std::size_t>; },
                "lockstep: a reducer needs `std::size_t workspace_bytes(std::size_t max_bucket_bytes) const`");
  static_assert(requires(R& r, std::size_t i, void* p) { r.bind(i, p, i); },
                "lockstep: a reducer needs `void bind(std::size_t replica, void* workspace, std::size_t bytes)`");
  static_assert(requires(R& r, std::size_t i, Ctx& ctx, float* p) { r.start(i, ctx, p, i, i); },
                "lockstep: a reducer needs `template <class Ctx, class T> void start(std::size_t replica, Ctx& ctx, T* "
                "data, std::size_t count, std::size_t bucket)`");
  static_assert(requires(R& r, std::size_t i, Ctx& ctx) { r.wait(i, ctx, i); },
                "lockstep: a reducer needs `template <class Ctx> void wait(std::size_t replica, Ctx& ctx, std::size_t "
                "bucket)`");
  static_assert(requires(R& r, std::size_t i, Ctx& ctx, float* p) { r.broadcast(i, ctx, p, i, i); },
                "lockstep: a reducer needs `template <class Ctx, class T> void broadcast(std::size_t replica, Ctx& ctx, "
                "T* data, std::size_t count, std::size_t root)`");
  static_assert(requires(R& r) { r.abort(); }, "lockstep: a reducer needs `void abort()` (callable from any thread)");
  static_assert(requires(R& r) { r.reset(); }, "lockstep: a reducer needs `void reset()`");
  return true;  // each missing member was named above
}
}  // namespace detail

}  // namespace lockstep
