#pragma once
/// @file shard_batches.hpp
/// From global batches to per-replica shards: `shard_batches` cuts every global batch into N shards
/// (`split` from batch.hpp: contiguous, sizes differing by at most one, the first rows % N shards one
/// row larger, empty shards allowed), and `shard_by_worker` gives each process of a multi-process
/// job its own disjoint part of every global batch.
///
/// Exactly-once: every row of a global batch lies in exactly one shard, and every shard carries
/// the dataset indices of its rows; so if the pipeline yields each sample of an epoch once, each
/// sample reaches exactly one replica once.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ranges>
#include <string>
#include <type_traits>
#include <utility>

#include <lockstep/core/error.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/data/batch_pool.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/generator.hpp>
#include <lockstep/data/indexed.hpp>

namespace lockstep::data {

/// A global batch type: `batch` or a type derived from it (such as `pooled_batch`).
template <class B>
concept global_batch = std::derived_from<std::remove_cvref_t<B>, batch>;

namespace detail {

inline void check_replicas(std::size_t replicas) {
  if (replicas == 0) throw config_error("lockstep::data::shard_batches: replicas must be >= 1");
}

/// Refuses shards [first, first + count) that are not among `parts` or a count of 0 (config_error
/// naming them; no overflow for any values).
inline void check_part(std::size_t parts, std::size_t first, std::size_t count) {
  if (count == 0 || first > parts || count > parts - first)
    throw config_error("lockstep::data: cannot take " + std::to_string(count) + " shards from shard " +
                       std::to_string(first) + " of " + std::to_string(parts));
}

/// Moves (or copies, for a const or lvalue source) a global batch into shared ownership, cuts it
/// into `parts` shards and keeps `count` of them from `first` (one process's shards of a global
/// batch shared by several processes). An index_batch loads, decodes and stages the rows of those
/// shards only (index_batch::load_shards).
template <class B>
distributed_batch make_sharded(B&& b, std::size_t parts, std::size_t first, std::size_t count) {
  using D = std::remove_cvref_t<B>;
  check_part(parts, first, count);
  if constexpr (deferred_batch<D>) {
    return b.load_shards(parts, first, count);
  } else {
    auto owned = std::make_shared<const D>(std::forward<B>(b));
    distributed_batch out;
    out.shards = split(*owned, parts);
    if (count != parts) {
      out.shards.erase(out.shards.begin() + static_cast<std::ptrdiff_t>(first + count), out.shards.end());
      out.shards.erase(out.shards.begin(), out.shards.begin() + static_cast<std::ptrdiff_t>(first));
    }
    out.global = std::move(owned);
    return out;
  }
}

/// As make_sharded(b, replicas, 0, replicas): every shard of the batch.
template <class B>
distributed_batch make_sharded(B&& b, std::size_t replicas) {
  check_replicas(replicas);
  return make_sharded(std::forward<B>(b), replicas, 0, replicas);
}

template <class R>
generator<distributed_batch> shard_owned(R range, std::size_t parts, std::size_t first, std::size_t count) {
  for (auto&& b : range) co_yield make_sharded(std::move(b), parts, first, count);
}

template <class R>
generator<distributed_batch> shard_borrowed(R* range, std::size_t parts, std::size_t first, std::size_t count) {
  for (const auto& b : *range) co_yield make_sharded(b, parts, first, count);
}

/// The rows [offset, offset + size) that part `rank` of `parts` gets from `rows` rows (as split()).
inline std::pair<std::size_t, std::size_t> part_of(std::size_t rows, std::size_t rank, std::size_t parts) noexcept {
  const std::size_t base = rows / parts, extra = rows % parts;
  return {rank * base + std::min(rank, extra), base + (rank < extra ? 1 : 0)};
}

/// Copies `size` rows of `per_row` values from row `offset` of `from` into `to` (emptied when
/// `from` is empty). A function rather than a lambda in the coroutine below, which nvcc rejects.
template <class From, class To>
void copy_rows(const From& from, To& to, std::size_t offset, std::size_t size, std::size_t per_row) {
  to.resize(size * per_row);
  if (!from.empty())
    std::copy_n(from.begin() + static_cast<std::ptrdiff_t>(offset * per_row), size * per_row, to.begin());
  else
    to.clear();
}

template <class B>
generator<index_batch> worker_index_gen(generator<B> up, std::size_t rank, std::size_t world) {
  for (auto&& g : up) {
    const std::pair<std::size_t, std::size_t> part = part_of(g.rows(), rank, world);
    co_yield g.slice(part.first, part.second);
  }
}

template <class B>
generator<pooled_batch> worker_gen(generator<B> up, std::size_t rank, std::size_t world,
                                   std::shared_ptr<batch_pool> pool) {
  for (auto&& g : up) {
    const batch& global = g;
    require_every_row(global, "shard_by_worker");
    require_consistent(global, "shard_by_worker");  // rows are cut through indices: no row dropped, none read past
    // No structured binding: nvcc rejects one inside a coroutine body.
    const std::pair<std::size_t, std::size_t> part = part_of(global.rows(), rank, world);
    const std::size_t offset = part.first, size = part.second;
    pooled_batch b(pool->acquire(), pool);
    b.width = global.width;
    b.target_width = global.target_width;
    copy_rows(global.features, b.features, offset, size, global.width);
    copy_rows(global.labels, b.labels, offset, size, 1);
    copy_rows(global.targets, b.targets, offset, size, global.target_width);
    copy_rows(global.indices, b.indices, offset, size, 1);
    co_yield pooled_batch(std::move(b));
  }
}

}  // namespace detail

/// Cuts every global batch of `batches` into `parts` shards and keeps the `count` from shard
/// `first` (one process's shards of global batches shared by several processes: a strategy's
/// plan()); an index batch loads the rows of those shards only. An rvalue range (a generator, a
/// container moved in) is consumed and its batches are moved into shared ownership; an lvalue
/// range is read and copied, and must outlive the result.
/// @throws config_error when the shards [first, first + count) are not among `parts` or count is 0.
template <std::ranges::input_range R>
  requires global_batch<std::ranges::range_value_t<R>>
generator<distributed_batch> shard_batches(R&& batches, std::size_t parts, std::size_t first, std::size_t count) {
  detail::check_part(parts, first, count);
  if constexpr (std::is_lvalue_reference_v<R>)
    return detail::shard_borrowed(std::addressof(batches), parts, first, count);
  else
    return detail::shard_owned(std::move(batches), parts, first, count);
}

/// Cuts every global batch of `batches` into `replicas` shards and keeps them all (ranges as above).
/// @throws config_error when replicas is 0.
template <std::ranges::input_range R>
  requires global_batch<std::ranges::range_value_t<R>>
generator<distributed_batch> shard_batches(R&& batches, std::size_t replicas) {
  detail::check_replicas(replicas);
  return shard_batches(std::forward<R>(batches), replicas, 0, replicas);
}

/// Stage: cuts each global batch into shards (see shard_batches(replicas)).
struct shard_batches_closure : closure<shard_batches_closure> {
  std::size_t replicas = 1;  ///< number of shards per batch
  /// Applies the stage to a dataset of global batches.
  template <global_batch B>
  dataset<distributed_batch> operator()(dataset<B> d) const {
    return dataset<distributed_batch>{
        [d = std::move(d), n = replicas](std::uint64_t e) { return shard_batches(d.epoch(e), n); }};
  }
};
/// Pipeline stage form: `... | batched(256) | shard_batches(2) | prefetch(2)` yields
/// `distributed_batch`es with 2 shards. @throws config_error when replicas is 0.
inline shard_batches_closure shard_batches(std::size_t replicas) {
  detail::check_replicas(replicas);
  return {{}, replicas};
}

/// Stage: this worker's part of each global batch (see shard_by_worker()).
struct worker_closure : closure<worker_closure> {
  std::size_t rank = 0;   ///< this worker
  std::size_t world = 1;  ///< number of workers
  /// Applies the stage to a dataset of global batches (index batches stay index batches: the
  /// part's rows are loaded when it is cut).
  template <global_batch B>
  auto operator()(dataset<B> d) const {
    if constexpr (deferred_batch<B>) {
      return dataset<index_batch>{[d = std::move(d), r = rank, w = world](std::uint64_t e) {
        return detail::worker_index_gen<B>(d.epoch(e), r, w);
      }};
    } else {
      auto pool = std::make_shared<batch_pool>();
      return dataset<pooled_batch>{[d = std::move(d), r = rank, w = world, pool](std::uint64_t e) {
        return detail::worker_gen<B>(d.epoch(e), r, w, pool);
      }};
    }
  }
};
/// Multi-process data: every worker runs the same pipeline (same sources, seeds and batch size),
/// so all workers see the same sequence of global batches; worker `rank` of `world` keeps the
/// contiguous rows `split(global, world)[rank]` of each global batch (indices stay global).
/// The parts of one global batch are disjoint and cover it, so across all workers every sample
/// of an epoch is seen exactly once, and global batch k is the same set of samples whatever the
/// number of workers. Every worker gets one (possibly empty) batch per global batch, so all
/// workers take the same number of steps. Compose with `shard_batches(local_replicas)`.
/// @throws config_error when world is 0 or rank >= world.
inline worker_closure shard_by_worker(std::size_t rank, std::size_t world) {
  if (world == 0 || rank >= world)
    throw config_error("lockstep::data::shard_by_worker: need rank < world, got rank " + std::to_string(rank) +
                       " and world " + std::to_string(world));
  return {{}, rank, world};
}

}  // namespace lockstep::data
