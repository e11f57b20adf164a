#pragma once
/// @file micro_shard_step.hpp
/// The replica_count_invariant training step: the global batch is cut into micro-shards of
/// strategy_options::micro_shard_rows rows; replica r computes the gradient sums of micro-shards
/// [K r / N, K (r + 1) / N) into their slots; then every replica sums its slice of the parameters
/// over the slots in micro-shard order and writes it to every replica. The GEMM shapes and the
/// summation order depend only on the batch, so the result is bitwise the same for any number of
/// replicas. Host memory only: the slots are shared host memory.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include <lockstep/data/batch.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/distribute/executor.hpp>
#include <lockstep/distribute/reducers/host.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/memory/buffer.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

namespace detail {

/// Micro-shard k of global batch g (rows [k rows, k rows + rows) clipped to the batch), as a
/// shard of `whole` (data::whole(g)).
inline data::shard micro_shard(const data::batch& g, const data::shard& whole, std::size_t k, std::size_t rows) {
  data::shard s = whole;
  const std::size_t lo = k * rows, len = std::min(rows, g.rows() - lo);
  s.features = g.features.data() + lo * g.width;
  s.labels = g.labels.empty() ? nullptr : g.labels.data() + lo;
  s.targets = g.targets.empty() ? nullptr : g.targets.data() + lo * g.target_width;
  s.indices = g.indices.data() + lo;
  s.size = len;
  s.offset = lo;
  return s;
}

/// Replica r of n: sums its slice of the P parameters over the k_total micro-shard gradient slots
/// (slot k at slots + k P) in micro-shard order, and writes the sum into every replica's gradients.
template <class T, class Replicated>
void sum_slots_into_replicas(Replicated& m, const T* slots, std::size_t P, std::size_t k_total, std::size_t r,
                             std::size_t n) {
  const auto [lo, hi] = slice_of<T>(P, r, n);
  constexpr std::size_t chunk = reduce_chunk_bytes / sizeof(T);
  T acc[chunk];
  for (std::size_t c = lo; c < hi; c += chunk) {
    const std::size_t len = std::min(chunk, hi - c);
    std::memcpy(acc, slots + c, len * sizeof(T));
    for (std::size_t k = 1; k < k_total; ++k)
      for (std::size_t i = 0; i < len; ++i) acc[i] += slots[k * P + c + i];
    for (std::size_t j = 0; j < n; ++j) std::memcpy(m.replica(j).model().gradients().data() + c, acc, len * sizeof(T));
  }
}

}  // namespace detail

/// Step policy of determinism::replica_count_invariant: fixed micro-shards summed in a fixed order.
class micro_shard_step {
public:
  /// The policy of a strategy with `replicas` replicas.
  /// @throws config_error when options.micro_shard_rows is 0.
  micro_shard_step(std::size_t replicas, const strategy_options& o)
      : sync_(replicas, o.timeout), rows_(o.micro_shard_rows) {
    if (rows_ == 0) throw config_error("lockstep: strategy_options::micro_shard_rows must be >= 1");
  }

  /// One step of `m` on `b` through `ex` (the reducer is not used: the sum runs over micro-shard
  /// slots, not over replicas); returns the loss summed over the global batch.
  template <class Reducer, class Replicated, class Optimizer, class Loss>
  double run(executor& ex, Reducer&, Replicated& m, const Optimizer& opt, const Loss& loss,
             const data::distributed_batch& b, const pass_info& info, const update_info& update) {
    using T = typename Replicated::value_type;
    constexpr std::size_t P = Replicated::param_count;
    if constexpr (Replicated::model_type::couples_rows)
      throw config_error(
          "lockstep: determinism::replica_count_invariant runs the micro-shards of a replica one after another, "
          "so a layer that couples the rows of the global batch (batch_norm) cannot see them all; use "
          "determinism::run_to_run, under which batch_norm still computes its statistics over the global batch");
    const data::batch& g = *b.global;
    const std::size_t n = ex.size();
    const std::size_t rows = g.rows();
    const std::size_t k_total = (rows + rows_ - 1) / rows_;
    if (slots_.size() < k_total * P * sizeof(T)) slots_ = buffer<std::byte, cpus>(k_total * P * sizeof(T));
    micro_loss_.assign(k_total, loss_sum{});
    T* slots = reinterpret_cast<T*>(slots_.data());
    const auto whole = data::whole(g);
    auto job = [&](std::size_t r) {
      auto& rep = m.replica(r);
      for (std::size_t k = k_total * r / n; k < k_total * (r + 1) / n; ++k) {
        micro_loss_[k] = rep.forward_backward(loss, detail::micro_shard(g, whole, k, rows_), info);
        std::memcpy(slots + k * P, rep.model().gradients().data(), P * sizeof(T));
      }
      sync_.barrier(r);
      detail::sum_slots_into_replicas(m, slots, P, k_total, r, n);
      sync_.barrier(r);
      const auto [lo, hi] = m.update_slice(r);
      rep.apply(opt, update, lo, hi);
      if (m.optimizer_sharded()) {  // every slice is updated before anyone copies it
        sync_.barrier(r);
        m.gather_updated_parameters(r);
      }
    };
    ex.execute(job, info.step);
    double total = 0;
    for (const auto& l : micro_loss_) total += l.sum;
    return total;
  }

  /// Releases replicas waiting at the step's barriers.
  void abort() noexcept { sync_.abort(); }
  /// Ready again after a failure.
  void reset() noexcept { sync_.reset(); }

private:
  detail::host_comm sync_;
  std::size_t rows_;
  buffer<std::byte, cpus> slots_;
  std::vector<loss_sum> micro_loss_;
};

}  // namespace lockstep
