#pragma once
/// @file micro_shard_step.hpp
/// The replica_count_invariant step policy (see step_policy.hpp): the global batch is cut into
/// micro-shards of strategy_options::micro_shard_rows rows; over all G replicas of all workers,
/// replica g computes the gradient sums of micro-shards [K g / G, K (g + 1) / G) into their slots;
/// then every parameter's K slot values are summed in micro-shard order 0..K-1. The GEMM shapes
/// and the summation order depend only on the batch, so the result is bitwise the same for any
/// number of replicas and workers. Host memory only: the slots are host memory.
///
/// One process: replica r sums its slice of the parameters over the K slots and writes it into
/// every replica. Several workers (an ordered reduce-scatter, then one all-gather): each worker
/// packs its micro-shards' gradients by destination parameter slice, one all-to-all gives each
/// worker every micro-shard's values of its own slice in micro-shard order, its replicas sum that
/// slice in that order, and one all-gather completes the sum everywhere. Memory per worker: its
/// own slots (K·P/W), the K·P/W received values of its slice and a P-float sum, never K·P.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include <lockstep/core/trace.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/distribute/epilogue.hpp>
#include <lockstep/distribute/executor.hpp>
#include <lockstep/distribute/reducers/detail/host_sum.hpp>
#include <lockstep/distribute/steps/step_policy.hpp>
#include <lockstep/distribute/update_phase.hpp>
#include <lockstep/distribute/world.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/memory/buffer.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

namespace detail {

/// Sums elements [lo, hi) over the k_total rows of `slots` (row k at slots + k stride) in row
/// order — after `init` (the running sum of earlier batches of the update) when it is not null —
/// writing each finished chunk through `write(offset, acc, len)`. The chunks are those of the
/// epilogue's grid when lo is on a chunk boundary.
template <class T, class Write>
void sum_rows(const T* slots, std::size_t stride, std::size_t k_total, std::size_t lo, std::size_t hi, const T* init,
              const Write& write) {
  constexpr std::size_t chunk = epilogue_chunk;
  T acc[chunk];
  for (std::size_t c = lo; c < hi; c += chunk) {
    const std::size_t len = std::min(chunk, hi - c);
    std::memcpy(acc, init ? init + c : slots + c, len * sizeof(T));
    for (std::size_t k = init ? 0 : 1; k < k_total; ++k)
      for (std::size_t i = 0; i < len; ++i) acc[i] += slots[k * stride + c + i];
    write(c, acc, len);
  }
}

}  // namespace detail

/// Step policy of determinism::replica_count_invariant: fixed micro-shards summed in a fixed order.
/// @tparam World the strategy's world (local_world, mpi_world)
template <class World>
class micro_shard_step {
public:
  /// The policy of a strategy with `replicas` local replicas in `world`.
  /// @throws config_error when options.micro_shard_rows is 0.
  micro_shard_step(std::size_t replicas, const strategy_options& o, World& world)
      : sync_(replicas, o.timeout), rows_(o.micro_shard_rows), world_(&world) {
    if (rows_ == 0) throw config_error("lockstep: strategy_options::micro_shard_rows must be >= 1");
  }

  /// One batch of an update of `m` on `b` through `ex` (the reducer is not used: the sum runs
  /// over micro-shard slots, not over replicas); see step_policy.hpp. Under gradient
  /// accumulation each batch's slots are added, in micro-shard order, to the running sum of the
  /// update's earlier batches (one process: a P-float accumulator; several workers: each worker's
  /// slice of the sum), so the update is bitwise that of one batch holding all its rows whenever
  /// every batch's rows are a multiple of micro_shard_rows; the all-gather that completes the sum
  /// across workers runs once, on the last batch.
  template <class Reducer, class Replicated, class Loss, class Finish>
  step_stats run(executor& ex, Reducer&, Replicated& m, const Loss& loss, const data::distributed_batch& b,
                 const pass_info& info, const update_part& part, Finish& finish) {
    using T = typename Replicated::value_type;
    constexpr std::size_t P = Replicated::param_count;
    if constexpr (Replicated::model_type::couples_rows)
      throw config_error(
          "lockstep: determinism::replica_count_invariant runs the micro-shards of a replica one after another, "
          "so a layer that couples the rows of the global batch (batch_norm) cannot see them all; use "
          "determinism::run_to_run, under which batch_norm still computes its statistics over the global batch");
    const data::batch none;  // an empty batch may come without its global batch (check_batch)
    const data::batch& g = b.global ? *b.global : none;
    const std::size_t n = ex.size();
    const std::size_t k_total = (g.rows() + rows_ - 1) / rows_;
    const bool spans = world_->size() > 1;
    std::size_t k_first = 0, k_mine = k_total;
    if constexpr (requires { world_->micro_shards(k_total); })
      if (spans) {
        const auto [lo, hi] = world_->micro_shards(k_total);
        k_first = lo;
        k_mine = hi - lo;
      }
    // Slots: one process, K rows of P; several workers, this worker's k_mine slots packed by
    // destination slice, then K rows of this worker's slice received, then the P-vector sum
    // (whose slice of this worker is also the running sum of an update's earlier batches).
    std::size_t m_lo = 0, m_hi = P;
    if constexpr (requires { world_->param_slice(P); })
      if (spans) std::tie(m_lo, m_hi) = world_->param_slice(P);
    // (Three buffers, so MPI never sees a send and a receive buffer at the same address, even
    // when a worker computes no micro-shard.)
    T* slots = grow<T>(slots_, (spans ? k_mine : k_total) * P);
    T* recv = spans ? grow<T>(recv_, k_total * (m_hi - m_lo)) : nullptr;
    T* sum = spans ? grow<T>(sum_, P) : nullptr;
    // One process accumulating over several batches: the running sum of the update so far.
    T* running = !spans && !(part.first && part.last) ? grow<T>(running_, P) : nullptr;
    micro_.assign(3 * k_total, 0.0);
    const auto whole = data::whole(g);
    const std::size_t gn = world_->global_replicas();
    const bool ride = part.last && !spans && finish.wants_chunks();
    double* chunk_sums = finish.wants_chunks() ? finish.chunks() : nullptr;
    pass_info info_b = info;
    info_b.update_offset = part.offset;
    auto job = [&](std::size_t r) {
      auto& rep = m.replica(r);
      const std::size_t gr = world_->plan().first + r;  // this replica among all replicas of all workers
      pass_info info_r = info_b;
      info_r.trace_thread = r;
      begin_device_spans(rep.context(), info.trace);
      for (std::size_t k = k_total * gr / gn; k < k_total * (gr + 1) / gn; ++k) {
        const loss_sum l = rep.forward_backward(loss, data::rows_of(whole, k * rows_, std::min(rows_, g.rows() - k * rows_)), info_r);
        finish.observe(r, l);
        micro_[3 * k] = l.sum;
        micro_[3 * k + 1] = static_cast<double>(l.correct);
        micro_[3 * k + 2] = static_cast<double>(l.labelled);
        const T* grad = rep.model().gradients().data();
        if (!spans) {
          std::memcpy(slots + k * P, grad, P * sizeof(T));
        } else if constexpr (requires { world_->slice_of_worker(P, 0); }) {
          for (std::size_t v = 0; v < world_->size(); ++v) {  // packed by destination slice
            const auto [lo, hi] = world_->slice_of_worker(P, v);
            std::memcpy(slots + World::pack_offset(k_mine, k - k_first, lo, hi), grad + lo, (hi - lo) * sizeof(T));
          }
        }
      }
      std::optional<trace_span> summing;
      summing.emplace(info.trace, r, "sum micro-shards", "communication");
      sync_.barrier(r);
      if (!spans) {
        // Replica r sums its slice (whole chunks of the epilogue's grid) over the slots, after the
        // update's running sum; the last batch writes the sum into every replica (and the
        // epilogue's chunk sums, while each chunk is in L1).
        const auto [lo, hi] = grid_slice(P, r, n);
        const T* init = part.first ? nullptr : running;
        if (!part.last) {
          detail::sum_rows(slots, P, k_total, lo, hi, init, [&](std::size_t c, const T* acc, std::size_t len) {
            std::memcpy(running + c, acc, len * sizeof(T));
          });
        } else {
          detail::sum_rows(slots, P, k_total, lo, hi, init, [&](std::size_t c, const T* acc, std::size_t len) {
            for (std::size_t j = 0; j < n; ++j) std::memcpy(m.replica(j).model().gradients().data() + c, acc, len * sizeof(T));
            if (ride) chunk_sums[c / epilogue_chunk] = chunk_sum_of_squares(acc, len);
          });
        }
      } else if constexpr (requires { world_->exchange_micro_shards(slots, recv, k_total, P); }) {
        static_assert(std::is_same_v<T, float>, "lockstep: replica_count_invariant across workers sums float gradients");
        if (r == 0) {
          world_->exchange_micro_shards(slots, recv, k_total, P);
          world_->gather_micro_values(micro_.data(), k_total, 3);
        }
        sync_.barrier(r);
        const std::size_t width = m_hi - m_lo;
        const auto [lo, hi] = detail::slice_of<T>(width, r, n);  // this replica's part of the worker's slice
        const T* init = part.first ? nullptr : sum + m_lo;
        detail::sum_rows(recv, width, k_total, lo, hi, init, [&](std::size_t c, const T* acc, std::size_t len) {
          std::memcpy(sum + m_lo + c, acc, len * sizeof(T));
        });
        if (part.last) {
          sync_.barrier(r);
          if (r == 0) world_->gather_slices(sum, P);
          sync_.barrier(r);
          std::memcpy(rep.model().gradients().data(), sum, P * sizeof(T));
          if (chunk_sums) {  // one pass over the sum, split over this worker's replicas
            const auto [clo, chi] = grid_slice(P, r, n);
            scan_chunks(sum, P, clo / epilogue_chunk, (chi + epilogue_chunk - 1) / epilogue_chunk, chunk_sums);
          }
        }
      }
      summing.reset();
      if (part.last) {
        sync_.barrier(r);
        {
          const work_span span(rep.context(), info.trace, r, "update", "compute");
          finish.apply(r, chunk_sums != nullptr && (ride || spans));
        }
        if (finish.gathers()) {  // every replica has applied before anyone copies
          sync_.barrier(r);
          const trace_span span(info.trace, r, "gather update", "communication");
          finish.gather(r);
        }
      }
      end_device_spans(rep.context(), info.trace, r);
    };
    ex.execute(job, info.step);
    // The update's sums so far, continued in micro-shard order: the same bits for any split.
    if (part.first) partial_ = {};
    for (std::size_t k = 0; k < k_total; ++k) {
      partial_.loss_sum += micro_[3 * k];
      partial_.correct += static_cast<std::size_t>(micro_[3 * k + 1]);
      partial_.labelled += static_cast<std::size_t>(micro_[3 * k + 2]);
    }
    return partial_;
  }

  /// Releases replicas waiting at the step's barriers.
  void abort() noexcept { sync_.abort(); }
  /// Ready again after a failure.
  void reset() noexcept { sync_.reset(); }
  /// Bytes of the step's gradient slots, received slices and sum (they grow to the largest
  /// batch's need, then stay), and of the running sum of an update accumulated over batches.
  [[nodiscard]] std::size_t slot_bytes() const noexcept { return slots_.size() + recv_.size() + sum_.size(); }
  /// Bytes of the running sum kept while an update accumulates over several batches (one process).
  [[nodiscard]] std::size_t accumulator_bytes() const noexcept { return running_.size(); }

private:
  // `b` as at least `n` elements of T (grown, never shrunk; at least one element, so every
  // buffer has its own address).
  template <class T>
  static T* grow(buffer<std::byte, cpus>& b, std::size_t n) {
    const std::size_t bytes = std::max<std::size_t>(n, 1) * sizeof(T);
    if (b.size() < bytes) b = buffer<std::byte, cpus>(bytes);
    return reinterpret_cast<T*>(b.data());
  }

  detail::host_comm sync_;
  std::size_t rows_;
  World* world_;
  buffer<std::byte, cpus> slots_, recv_, sum_, running_;
  std::vector<double> micro_;  // per micro-shard: loss sum, hits, labelled rows
  step_stats partial_;         // the update's sums so far, in micro-shard order
};

static_assert(detail::check_step_policy_shape<micro_shard_step<local_world>, local_world>());

}  // namespace lockstep
