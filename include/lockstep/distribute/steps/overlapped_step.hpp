#pragma once
/// @file overlapped_step.hpp
/// The run_to_run training step: every replica runs forward and backward on its own shard; each
/// gradient bucket's all-reduce starts from the backward hook as soon as the bucket's lowest
/// layer is done, while the layers below it still compute; then every replica waits for its
/// buckets and applies the same update (sharded: its slice of it, then copies the others'
/// slices). Summation order is the reducer's (fixed for a given replica count), so repeated runs
/// are bitwise equal.

#include <cstddef>
#include <vector>

#include <lockstep/data/batch.hpp>
#include <lockstep/distribute/buckets.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/detail/row_exchange.hpp>
#include <lockstep/distribute/executor.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

/// Step policy of determinism::run_to_run: bucketed all-reduce overlapped with the backward pass.
class overlapped_step {
public:
  /// The policy of a strategy with `replicas` replicas. A lone replica skips the reducer unless
  /// `reduce_alone` (a replica whose reducer also spans other processes must take part); `span`
  /// extends the row exchange of batch-coupled layers to other processes.
  overlapped_step(std::size_t replicas, const strategy_options& o, bool reduce_alone = false,
                  detail::row_exchange_span* span = nullptr)
      : loss_(replicas), reduce_alone_(reduce_alone), exchange_(replicas, o.timeout, span) {}

  /// One step of `m` on `b` through `ex` and `reducer`; returns the loss summed over the global batch.
  template <class Reducer, class Replicated, class Optimizer, class Loss>
  double run(executor& ex, Reducer& reducer, Replicated& m, const Optimizer& opt, const Loss& loss,
             const data::distributed_batch& b, const pass_info& info, const update_info& update) {
    const std::size_t n = ex.size();
    auto job = [&](std::size_t r) {
      auto& rep = m.replica(r);
      auto& ctx = rep.context();
      pass_info info_r = info;  // layers that couple rows (batch_norm) exchange them through exchange_
      info_r.exchange = &exchange_;
      info_r.rank = r;
      const auto& layout = m.buckets();
      auto* grads = rep.model().gradients().data();
      if (n == 1 && !reduce_alone_) {
        loss_[r] = rep.forward_backward(loss, b.shards[r], info_r);
      } else {
        auto hook = [&](std::size_t layer, std::size_t, std::size_t) {
          if (const std::size_t k = layout.completes[layer]) {
            const gradient_bucket& g = layout.buckets[k - 1];
            // No host wait here: a reducer orders its collective after the compute already
            // queued on ctx (host work is synchronous; GPU reducers wait on an event of the
            // compute stream).
            reducer.start(r, ctx, grads + g.offset, g.count, k - 1);
          }
        };
        loss_[r] = rep.forward_backward(loss, b.shards[r], info_r, hook);
        for (std::size_t k = 0; k < layout.size; ++k) reducer.wait(r, ctx, k);
      }
      const auto [lo, hi] = m.update_slice(r);
      rep.apply(opt, update, lo, hi);
    };
    ex.execute(job, info.step);
    // A sharded update: once every replica has updated its slice, each copies the others' slices.
    if (m.optimizer_sharded()) {
      auto gather = [&](std::size_t r) { m.gather_updated_parameters(r); };
      ex.execute(gather, info.step);
    }
    double total = 0;
    for (const auto& l : loss_) total += l.sum;
    return total;
  }

  /// Releases replicas waiting in the row exchange (the reducer is aborted by the strategy).
  void abort() noexcept { exchange_.abort(); }
  /// Ready again after a failure.
  void reset() noexcept { exchange_.reset(); }

private:
  std::vector<loss_sum> loss_;
  bool reduce_alone_;
  detail::host_row_exchange exchange_;
};

}  // namespace lockstep
