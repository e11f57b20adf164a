#pragma once
/// @file step_policy.hpp
/// The step policy: how one synchronous training step runs on the replicas of a strategy. The
/// strategy (mirrored_strategy) owns one policy, chosen at compile time from its determinism
/// level; the policies are siblings with one interface:
///
///   - `P(std::size_t replicas, const strategy_options& options, World& world)`: the policy of a
///     strategy with `replicas` local replicas in `world`;
///   - `template <class Reducer, class Model, class Loss, class Finish>
///      step_stats run(executor& ex, Reducer& reducer, Model& m, const Loss& loss,
///                     const data::distributed_batch& b, const pass_info& info,
///                     const update_part& part, Finish& finish)`:
///     forward and backward of every local replica on its shard of `b`, one batch of an update
///     (`part`: its rows' offset in the update, whether it is the update's first and last batch).
///     The first batch's gradients overwrite the replicas' gradient buffers, later ones are added
///     to them (gradient accumulation; pass_info::accumulate, update_offset). On the update's
///     last batch the gradient sums are aggregated over every replica of every worker, and then,
///     on each replica's worker, `finish.apply(r, chunks_ready)` makes the update (the strategy's
///     epilogue and optimiser, written once for every policy); when `finish.gathers()`, every
///     replica then runs `finish.gather(r)` once every replica has applied. A policy that touches
///     every element of the reduced sums may fill `finish.chunks()` with the epilogue's chunk
///     sums as it goes (when `finish.wants_chunks()`) and says so with chunks_ready; every
///     (micro-)shard's loss is shown to `finish.observe(r, loss_sum)`. No collective
///     runs before the update's last batch that the policy can avoid. Returns the update's loss
///     sum and top-1 hits so far (`correct`, `labelled`): over the GLOBAL batches on the last
///     batch (identical on every worker), this process's before it; the strategy fills in the
///     count and advances the step counter;
///   - `abort()` (releases replicas waiting inside the step; any thread) and `reset()` (ready
///     again after a failure, called when no replica is inside).
///
/// The policies: `overlapped_step` (determinism::run_to_run: bucketed all-reduce overlapped with
/// the backward pass) and `micro_shard_step` (determinism::replica_count_invariant: fixed
/// micro-shards summed in a fixed order, bitwise the same for any number of replicas and
/// workers). `check_step_policy` names a missing member.

#include <concepts>
#include <cstddef>

#include <lockstep/data/batch.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/executor.hpp>
#include <lockstep/distribute/update_phase.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

/// Where a global batch stands in its update (gradient accumulation: an update covers one or
/// more consecutive global batches).
struct update_part {
  std::size_t offset = 0;  ///< rows of the update in its earlier batches
  bool first = true;       ///< the update's first batch: the gradients start from it
  bool last = true;        ///< the update's last batch: aggregate, then update
};

/// One whole update of `m` on `b` through step policy `step` (one batch, no recipe): the batch's
/// forward and backward and the aggregation, then `opt` with `update` on every replica (and the
/// gather of a sharded optimiser). What a strategy's step does without its epilogue.
template <class Policy, class Reducer, class Replicated, class Optimizer, class Loss>
  requires optimizer<Optimizer>
step_stats run_update(Policy& step, executor& ex, Reducer& reducer, Replicated& m, const Optimizer& opt,
                      const Loss& loss, const data::distributed_batch& b, const pass_info& info,
                      const update_info& update) {
  detail::plain_update_phase<Replicated, Optimizer, Reducer> finish{&m, &opt, update, &reducer};
  return step.run(ex, reducer, m, loss, b, info, update_part{}, finish);
}

}  // namespace lockstep

namespace lockstep::detail {

/// Checks step policy P of world World member by member (construction, abort, reset), so that a
/// policy that lacks one is told which.
template <class P, class World>
constexpr bool check_step_policy_shape() {
  static_assert(std::constructible_from<P, std::size_t, const strategy_options&, World&>,
                "lockstep: a step policy needs a constructor `P(std::size_t replicas, const strategy_options& options, "
                "World& world)`");
  static_assert(requires(P& p) { p.abort(); }, "lockstep: a step policy needs `void abort() noexcept`");
  static_assert(requires(P& p) { p.reset(); }, "lockstep: a step policy needs `void reset() noexcept`");
  return true;
}

/// What a step policy hands the update to (see the file comment); `check_step_policy_run`
/// checks a policy against it.
struct finish_archetype {
  /// Sees replica r's loss of each (micro-)shard it ran.
  void observe(std::size_t, const loss_sum&) {}
  /// Whether the epilogue wants chunk sums.
  [[nodiscard]] bool wants_chunks() const { return false; }
  /// Where chunk sums go.
  [[nodiscard]] double* chunks() { return nullptr; }
  /// The update of replica r.
  void apply(std::size_t, bool) {}
  /// Whether a second phase follows the update.
  [[nodiscard]] bool gathers() const { return false; }
  /// The second phase of replica r.
  void gather(std::size_t) {}
};

/// Checks that step policy P runs a batch of model M with reducer R and loss L.
template <class P, class R, class M, class L>
constexpr bool check_step_policy_run() {
  static_assert(requires(P& p, executor& ex, R& r, M& m, const L& l, const data::distributed_batch& b,
                         const pass_info& i, const update_part& u, finish_archetype& f) {
                  { p.run(ex, r, m, l, b, i, u, f) } -> std::same_as<step_stats>;
                },
                "lockstep: a step policy needs `template <class Reducer, class Model, class Loss, class Finish> "
                "lockstep::step_stats run(lockstep::executor&, Reducer&, Model&, const Loss&, const "
                "lockstep::data::distributed_batch&, const lockstep::pass_info&, const lockstep::update_part&, Finish&)`");
  return true;
}

}  // namespace lockstep::detail
