#pragma once
/// @file executor.hpp
/// The executor of a strategy: replica 0 runs on the caller's thread and every other replica on a
/// persistent worker thread of its own, running per-replica jobs and combining per-replica values.
/// It knows nothing of models, kinds or reducers, so it is compiled once.
///
/// Failure: the first exception of a job reaches the caller as a replica_error naming the
/// replica (and the step), with the original nested; the owner's abort hook runs at once on the
/// failing thread (it releases replicas blocked in collectives) and its reset hook after every
/// worker has returned, so the executor is usable again.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/detail/worker_pool.hpp>
#include <lockstep/losses/loss.hpp>

namespace lockstep {

/// Persistent per-replica workers: runs jobs on every replica and reduces per-replica values.
class executor {
public:
  /// A hook of the owner: `abort` releases blocked collectives, `reset` re-arms them.
  using hook = void (*)(void*) noexcept;

  /// Starts the workers of replicas 1 to `replicas` - 1 (replica 0 runs on the caller's thread),
  /// worker r pinned to the r-th allowed CPU when `pin`; `abort(owner)` runs when a job fails,
  /// `reset(owner)` once every worker has returned.
  executor(std::size_t replicas, bool pin, hook abort, hook reset, void* owner)
      : abort_(abort), reset_(reset), owner_(owner), pool_(replicas, &on_abort, this, pin) {}
  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;

  /// Number of replicas.
  [[nodiscard]] std::size_t size() const noexcept { return pool_.size(); }

  /// Runs job(r) for every replica r and waits for all; `step` names the training step in a
  /// failure's replica_error (replica_error::no_step outside training).
  template <class Job>
  void execute(Job& job, std::uint64_t step = replica_error::no_step) {
    try {
      pool_.run(job, step);
    } catch (...) {
      reset_(owner_);
      throw;
    }
  }

  /// Runs fn(replica_index, shard) on every replica's worker with its shard of `b`; returns the
  /// per-replica results in replica order (nothing for a void fn).
  /// @throws config_error when `b` has another number of shards than there are replicas.
  template <class F>
  auto run(F&& fn, const data::distributed_batch& b) {
    check_batch(b);
    using R = std::invoke_result_t<F&, std::size_t, const data::shard&>;
    if constexpr (std::is_void_v<R>) {
      auto job = [&](std::size_t r) { fn(r, b.shards[r]); };
      execute(job);
    } else {
      std::vector<std::optional<R>> out(size());
      auto job = [&](std::size_t r) { out[r].emplace(fn(r, b.shards[r])); };
      execute(job);
      std::vector<R> values;
      values.reserve(size());
      for (auto& o : out) values.push_back(std::move(*o));
      return values;
    }
  }

  /// Runs fn(replica_index) on every replica's worker and waits for all.
  template <class F>
  void run_each(F&& fn) {
    auto job = [&](std::size_t r) { fn(r); };
    execute(job);
  }

  /// Combines per-replica values in replica order (sum, mean, min or max).
  template <class V>
    requires std::is_arithmetic_v<V>
  [[nodiscard]] V reduce(reduce_op op, const std::vector<V>& values) const {
    if (values.empty()) throw config_error("lockstep::executor::reduce: no values to reduce");
    V acc = values.front();
    for (std::size_t i = 1; i < values.size(); ++i) {
      switch (op) {
        case reduce_op::sum:
        case reduce_op::mean: acc = static_cast<V>(acc + values[i]); break;
        case reduce_op::min: acc = std::min(acc, values[i]); break;
        case reduce_op::max: acc = std::max(acc, values[i]); break;
      }
    }
    if (op == reduce_op::mean) acc = static_cast<V>(acc / static_cast<V>(values.size()));
    return acc;
  }

  /// Combines per-replica loss sums: sums, counts and hits add up (sum), or the mean loss per sample
  /// (mean: sum / count, counts kept); min and max pick the replica with the smallest or largest sum.
  [[nodiscard]] loss_sum reduce(reduce_op op, const std::vector<loss_sum>& values) const {
    if (values.empty()) throw config_error("lockstep::executor::reduce: no values to reduce");
    loss_sum t;
    std::size_t lo = 0, hi = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const auto& v = values[i];
      t.sum += v.sum;
      t.count += v.count;
      t.correct += v.correct;
      t.labelled += v.labelled;
      if (v.sum < values[lo].sum) lo = i;
      if (v.sum > values[hi].sum) hi = i;
    }
    if (op == reduce_op::min) return values[lo];
    if (op == reduce_op::max) return values[hi];
    if (op == reduce_op::mean) t.sum = t.count ? t.sum / static_cast<double>(t.count) : 0.0;
    return t;
  }

  /// Checks that `b` has one shard per replica and, when it has rows, its global batch.
  void check_batch(const data::distributed_batch& b) const {
    if (b.shards.size() != size())
      throw config_error("lockstep::mirrored: the distributed batch has " + std::to_string(b.shards.size()) +
                         " shards but the strategy has " + std::to_string(size()) + " replicas");
    if (!b.global && !b.shards.empty() && b.shards.front().global_size != 0)
      throw config_error("lockstep::mirrored: the distributed batch has shards but no global batch");
  }

private:
  static void on_abort(void* self) noexcept {
    auto* e = static_cast<executor*>(self);
    e->abort_(e->owner_);
  }

  hook abort_;
  hook reset_;
  void* owner_;
  detail::worker_pool pool_;
};

}  // namespace lockstep
