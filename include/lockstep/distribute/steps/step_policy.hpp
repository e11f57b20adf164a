#pragma once
/// @file step_policy.hpp
/// The step policy: how one synchronous training step runs on the replicas of a strategy. The
/// strategy (mirrored_strategy) owns one policy, chosen at compile time from its determinism
/// level; the policies are siblings with one interface:
///
///   - `P(std::size_t replicas, const strategy_options& options, World& world)`: the policy of a
///     strategy with `replicas` local replicas in `world`;
///   - `template <class Reducer, class Model, class Optimizer, class Loss>
///      step_stats run(executor& ex, Reducer& reducer, Model& m, const Optimizer& opt,
///                     const Loss& loss, const data::distributed_batch& b, const pass_info& info,
///                     const update_info& update)`:
///     forward and backward of every local replica on its shard of `b`, the gradient sums
///     aggregated over every replica of every worker, and the same update applied everywhere.
///     Returns the step's loss sum and top-1 hits (`correct`, `labelled`) over the GLOBAL batch
///     (every worker's rows), identical on every worker; the strategy fills in the count and
///     advances the step counter;
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
#include <lockstep/layers/layer.hpp>
#include <lockstep/optimizers/optimizer.hpp>

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

/// Checks that step policy P runs a step of model M with reducer R, optimiser O and loss L.
template <class P, class R, class M, class O, class L>
constexpr bool check_step_policy_run() {
  static_assert(requires(P& p, executor& ex, R& r, M& m, const O& o, const L& l, const data::distributed_batch& b,
                         const pass_info& i, const update_info& u) {
                  { p.run(ex, r, m, o, l, b, i, u) } -> std::same_as<step_stats>;
                },
                "lockstep: a step policy needs `template <class Reducer, class Model, class Optimizer, class Loss> "
                "lockstep::step_stats run(lockstep::executor&, Reducer&, Model&, const Optimizer&, const Loss&, const "
                "lockstep::data::distributed_batch&, const lockstep::pass_info&, const lockstep::update_info&)`");
  return true;
}

}  // namespace lockstep::detail
