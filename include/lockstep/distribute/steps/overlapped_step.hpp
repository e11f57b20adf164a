#pragma once
/// @file overlapped_step.hpp
/// The run_to_run step policy (see step_policy.hpp): every replica runs forward and backward on
/// its own shard; each gradient bucket's all-reduce starts from the backward hook as soon as the
/// bucket's lowest layer is done, while the layers below it still compute; then every replica
/// waits for its buckets and makes the same update (the strategy's finish: epilogue, optimiser,
/// EMA; sharded, the slices are then gathered in the same job, with no second hand-off to the
/// workers: by the reducer where it reduces onto the slices, else by copies after a barrier). Under gradient accumulation the
/// batches before an update's last one add into each replica's own gradients, with no
/// collective (a host replica's large dense layers keep their rows instead and form their weight
/// gradients at the last batch, within strategy_options::deferred_gradient_bytes). Summation
/// order is the reducer's (fixed for a given replica and worker count), so repeated runs are
/// bitwise equal. A sharded update whose reducer reduces onto the slices (reduces_to_slices_v:
/// NCCL) reduces each bucket only into the replica whose slice holds it (a reduce-scatter), and
/// the reducer then gathers the updated slices (the finish's gather). Across workers the reducer
/// spans every worker, and the step's loss and hits are summed over the workers in rank order.
/// With a trace recording (pass_info::trace), each bucket's reduction is a span from its start to
/// the end of its wait, and the update and its gather are spans of each replica.

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <lockstep/core/trace.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/distribute/buckets.hpp>
#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/distribute/detail/row_exchange.hpp>
#include <lockstep/distribute/executor.hpp>
#include <lockstep/distribute/steps/step_policy.hpp>
#include <lockstep/distribute/update_phase.hpp>
#include <lockstep/distribute/world.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

/// Step policy of determinism::run_to_run: bucketed all-reduce overlapped with the backward pass.
/// @tparam World the strategy's world (local_world, mpi_world)
template <class World>
class overlapped_step {
public:
  /// The policy of a strategy with `replicas` local replicas in `world`. A lone replica of a lone
  /// worker skips the reducer; batch-coupled layers exchange rows through the world's row span.
  overlapped_step(std::size_t replicas, const strategy_options& o, World& world)
      : loss_(replicas), world_(&world), exchange_(replicas, o.timeout, world.row_span()), sync_(replicas, o.timeout),
        deferral_budget_(o.deferred_gradient_bytes) {}

  /// One batch of an update of `m` on `b` through `ex` and `reducer` (see step_policy.hpp).
  /// Before the update's last batch each replica only adds its gradients to its own buffer (no
  /// collective); the last batch's backward starts each bucket's all-reduce as it completes.
  template <class Reducer, class Replicated, class Loss, class Finish>
  step_stats run(executor& ex, Reducer& reducer, Replicated& m, const Loss& loss, const data::distributed_batch& b,
                 const pass_info& info, const update_part& part, Finish& finish) {
    const std::size_t n = ex.size();
    const bool alone = n == 1 && world_->size() == 1;
    // An update sharded on the epilogue's grid for a reducer that reduces onto the slices.
    const bool on_grid = m.update_plan().on_grid();
    if (part.first)
      for (auto& l : loss_) l = {};
    if constexpr (requires { reducer.settle(std::size_t{}); })  // see mpi_host_allreduce::settle
      exchange_.settle_before_crossing(&reducer, [](void* red, std::size_t r) { static_cast<Reducer*>(red)->settle(r); });
    auto job = [&](std::size_t r) {
      auto& rep = m.replica(r);
      auto& ctx = rep.context();
      pass_info info_r = info;  // layers that couple rows (batch_norm) exchange them through exchange_
      info_r.exchange = &exchange_;
      info_r.rank = r;
      info_r.trace_thread = r;
      info_r.update_offset = part.offset;
      info_r.accumulate = !part.first;
      info_r.last_of_update = part.last;
      info_r.deferral_budget = deferral_budget_;  // dense weight gradients once per update (deferral.hpp)
      const auto& layout = m.buckets();
      auto* grads = rep.model().gradients().data();
      begin_device_spans(ctx, info.trace);
      loss_sum l;
      if (alone || !part.last) {
        l = rep.forward_backward(loss, b.shards[r], info_r);
      } else {
        // Each bucket's reduction is one span, from its start to the end of its wait (the recorder's
        // clock; written only while a trace records, so nothing is initialised otherwise).
        std::array<std::int64_t, collective_ids::max_buckets> started;
        trace_recorder* const rec = info.trace != nullptr && info.trace->active() ? info.trace : nullptr;
        auto hook = [&](std::size_t layer, std::size_t, std::size_t) {
          if (const std::size_t k = layout.completes[layer]) {
            if (rec) started[k - 1] = rec->now();
            const gradient_bucket& g = layout.buckets[k - 1];
            // No host wait here: a reducer orders its collective after the compute already
            // queued on ctx (host work is synchronous; GPU reducers wait on an event of the
            // compute stream).
            if constexpr (reduces_to_slices_v<Reducer>) {
              if (on_grid) {  // each replica receives the sums of its slice only (a reduce-scatter)
                reducer.reduce_to_slices(r, ctx, grads, g.offset, g.count, k - 1, m.update_plan().slices());
                return;
              }
            }
            reducer.start(r, ctx, grads + g.offset, g.count, k - 1);
          }
        };
        l = rep.forward_backward(loss, b.shards[r], info_r, hook);
        for (std::size_t k = 0; k < layout.size; ++k) {
          reducer.wait(r, ctx, k);
          if (rec)
            rec->record(r, "reduce bucket", "communication", started[k], rec->now(), "bucket", static_cast<std::int64_t>(k));
        }
      }
      finish.observe(r, l);
      loss_[r].sum += l.sum;
      loss_[r].count += l.count;
      loss_[r].correct += l.correct;
      loss_[r].labelled += l.labelled;
      if (part.last) {
        {
          const work_span span(ctx, info.trace, r, "update", "compute");
          finish.apply(r, false);
        }
        // The sharded update: every replica has applied its slice before anyone copies (the
        // reducer's gather waits for that itself). A barrier within the job, where a second job
        // would hand off to every worker again.
        if (finish.gathers()) {
          if (!on_grid) sync_.barrier(r);
          const trace_span span(info.trace, r, "gather update", "communication");
          finish.gather(r);
        }
      }
      end_device_spans(ctx, info.trace, r);
    };
    ex.execute(job, info.step);
    step_stats out;
    for (const auto& l : loss_) {  // in replica order
      out.loss_sum += l.sum;
      out.correct += l.correct;
      out.labelled += l.labelled;
    }
    if (part.last && world_->size() > 1) {  // every worker's sums, added in rank order
      double v[3] = {out.loss_sum, static_cast<double>(out.correct), static_cast<double>(out.labelled)};
      world_->sum(v);
      out.loss_sum = v[0];
      out.correct = static_cast<std::size_t>(v[1]);
      out.labelled = static_cast<std::size_t>(v[2]);
    }
    return out;
  }

  /// Releases replicas waiting in the row exchange or at the sharded update's barrier (the
  /// reducer is aborted by the strategy).
  void abort() noexcept {
    exchange_.abort();
    sync_.abort();
  }
  /// Ready again after a failure.
  void reset() noexcept {
    exchange_.reset();
    sync_.reset();
  }

private:
  std::vector<loss_sum> loss_;
  World* world_;
  detail::host_row_exchange exchange_;
  detail::host_comm sync_;  // the sharded update's barrier between applying and copying the slices
  std::size_t deferral_budget_;
};

static_assert(detail::check_step_policy_shape<overlapped_step<local_world>, local_world>());

}  // namespace lockstep
