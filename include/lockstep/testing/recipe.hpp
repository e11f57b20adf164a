#pragma once
/// @file recipe.hpp
/// Public checks of a strategy's training recipe, for doctest, which users run on their own
/// strategies (tests/distribute/accumulation_test.cpp runs them on the library's):
///
///   - `accumulation_equals_big_batch<Net>(s, opt, loss, make_batch, check)`: every update trained
///     as one global batch, and again as `check.accumulate` consecutive batches of its rows (or
///     batches of `check.split` rows) (accumulate() then train_step()), give the same parameters on every replica (of every
///     worker) — bitwise for a strategy under determinism::replica_count_invariant when each
///     batch's rows are a multiple of micro_shard_rows, else within `check.tolerance` relative —
///     and the same loss, norm and clip factor per update;
///   - `skip_decisions_agree<Net>(s, opt, loss, make_batch, bad_update, bad_row, check)`: with the
///     non-finite guard on (nonfinite_policy::skip), a NaN in one row of one update's global batch
///     — so in one replica's shard of one worker — makes every replica of every worker skip that
///     update (its parameters, optimiser state and EMA unchanged, the step counter advanced,
///     the skip counted), while the other updates apply; nothing hangs.
///
/// `make_batch(update, rows)` returns the global batch (data::batch) of update `update` with
/// `rows` rows; the same on every worker. A strategy spanning several processes is given its
/// shards by its world's plan. The skip check needs a loss that returns a non-finite sum for a
/// non-finite output rather than throwing (lockstep::mse). Each returns true when every check
/// held.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <vector>

#include <lockstep/data/batch.hpp>
#include <lockstep/data/shard_batches.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/epilogue.hpp>
#include <lockstep/distribute/world.hpp>
#include <lockstep/core/random.hpp>

namespace lockstep::testing {

/// What the recipe checks train.
struct recipe_check {
  std::size_t updates = 3;      ///< updates trained
  std::size_t rows = 64;        ///< rows of each update's global batch
  std::size_t accumulate = 4;   ///< batches per update in the accumulated run (rows split as evenly as possible)
  /// The rows of each batch of the accumulated run, summing to `rows` (empty: `accumulate`
  /// batches split as evenly as possible). An uneven split catches an accumulation that averages
  /// each batch's mean gradient, which equal batches hide.
  std::vector<std::size_t> split{};
  update_recipe recipe{};       ///< the recipe of every update (clipping, guard, EMA)
  bool bitwise = true;          ///< the two runs must agree bitwise (replica_count_invariant), else within `tolerance`
  double tolerance = 1e-5;      ///< largest relative difference per parameter (|a − b| / max(|b|, 1e-3)) when not bitwise
  std::uint64_t seed = 17;      ///< the model seed
};

namespace detail {

/// Rows [lo, hi) of `b` as a batch of their own.
inline data::batch rows_of(const data::batch& b, std::size_t lo, std::size_t hi) {
  data::batch out;
  out.width = b.width;
  out.target_width = b.target_width;
  out.features.assign(b.features.begin() + static_cast<std::ptrdiff_t>(lo * b.width),
                      b.features.begin() + static_cast<std::ptrdiff_t>(hi * b.width));
  if (!b.labels.empty())
    out.labels.assign(b.labels.begin() + static_cast<std::ptrdiff_t>(lo), b.labels.begin() + static_cast<std::ptrdiff_t>(hi));
  if (!b.targets.empty())
    out.targets.assign(b.targets.begin() + static_cast<std::ptrdiff_t>(lo * b.target_width),
                       b.targets.begin() + static_cast<std::ptrdiff_t>(hi * b.target_width));
  out.indices.assign(b.indices.begin() + static_cast<std::ptrdiff_t>(lo), b.indices.begin() + static_cast<std::ptrdiff_t>(hi));
  return out;
}

/// This process's shards of global batch `b` for strategy `s` (its world's plan).
template <class Strategy>
data::distributed_batch shards_for(Strategy& s, data::batch b) {
  auto&& w = lockstep::detail::world_of(s);
  const shard_plan p = w.plan();
  return data::detail::make_sharded(std::move(b), p.parts, p.first, s.num_replicas());
}

/// True when every replica of `m` holds replica 0's parameters, bitwise.
template <class M>
bool replicas_identical(const M& m, const std::vector<float>& p) {
  for (std::size_t r = 0; r < m.size(); ++r)
    if (std::memcmp(p.data(), m.replica(r).model().parameters().data(), p.size() * sizeof(float)) != 0) return false;
  return true;
}

/// True when every worker of strategy `s` passed the same bits in `v`: each worker puts a 64-bit
/// hash of them, in 22-bit pieces (exact in a double), into its own slots of a sum over the workers.
template <class Strategy>
bool same_on_every_worker(Strategy& s, const std::vector<float>& v) {
  auto&& w = lockstep::detail::world_of(s);
  if (w.size() == 1) return true;
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const float x : v) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &x, sizeof bits);
    h = (h ^ bits) * 0x100000001b3ull;
  }
  constexpr std::size_t pieces = 3;
  std::vector<double> all(pieces * w.size(), 0.0);
  for (std::size_t k = 0; k < pieces; ++k)
    all[pieces * w.rank() + k] = static_cast<double>((h >> (22 * k)) & ((std::uint64_t{1} << 22) - 1));
  w.sum(std::span<double>(all));
  for (std::size_t i = 0; i < all.size(); ++i)
    if (all[i] != all[pieces * w.rank() + i % pieces]) return false;
  return true;
}

}  // namespace detail

/// "Accumulation equals the big batch" (see the file comment).
template <class Net, class Strategy, class Optimizer, class Loss, class MakeBatch>
bool accumulation_equals_big_batch(Strategy& s, const Optimizer& opt, const Loss& loss, MakeBatch&& make_batch,
                                   const recipe_check& c = {}) {
  REQUIRE(c.accumulate >= 1);
  std::vector<std::size_t> bounds{0};  // the accumulated run's batches: rows [bounds[j], bounds[j + 1])
  if (c.split.empty()) {
    for (std::size_t j = 0; j < c.accumulate; ++j) bounds.push_back(c.rows * (j + 1) / c.accumulate);
  } else {
    for (const std::size_t n : c.split) bounds.push_back(bounds.back() + n);
    REQUIRE_MESSAGE(bounds.back() == c.rows, "recipe_check::split must sum to recipe_check::rows");
  }
  const std::size_t batches = bounds.size() - 1;
  auto big = s.template replicate<Net>(seed{c.seed});
  auto acc = s.template replicate<Net>(seed{c.seed});
  bool ok = true;
  for (std::size_t u = 0; u < c.updates; ++u) {
    const data::batch b = make_batch(u, c.rows);
    const step_stats one = s.train_step(big, opt, loss, detail::shards_for(s, b), c.recipe);
    step_stats last;
    for (std::size_t j = 0; j < batches; ++j) {
      const auto part = detail::shards_for(s, detail::rows_of(b, bounds[j], bounds[j + 1]));
      if (j + 1 < batches)
        (void)s.accumulate(acc, loss, part);
      else
        last = s.train_step(acc, opt, loss, part, c.recipe);
    }
    CAPTURE(u);
    CHECK(last.count == one.count);
    CHECK(last.skipped == one.skipped);
    if (c.bitwise) {
      CHECK(last.loss_sum == one.loss_sum);
      CHECK((std::isnan(last.grad_norm) ? std::isnan(one.grad_norm) : last.grad_norm == one.grad_norm));
      CHECK(last.clip_factor == one.clip_factor);
      ok = ok && last.loss_sum == one.loss_sum && last.clip_factor == one.clip_factor;
    } else {
      CHECK(last.loss_sum == doctest::Approx(one.loss_sum).epsilon(1e-5));
    }
  }
  const std::vector<float> p = big.parameters_to_host(), q = acc.parameters_to_host();
  REQUIRE(p.size() == q.size());
  const bool same_replicas = detail::replicas_identical(big, p) && detail::replicas_identical(acc, q);
  CHECK(same_replicas);
  CHECK(detail::same_on_every_worker(s, q));
  CHECK(big.step() == c.updates);
  CHECK(acc.step() == c.updates);
  bool equal = true;
  if (c.bitwise) {
    equal = std::memcmp(p.data(), q.data(), p.size() * sizeof(float)) == 0;
    CHECK(equal);
  } else {
    double worst = 0;
    for (std::size_t i = 0; i < p.size(); ++i)
      worst = std::max(worst, std::fabs(static_cast<double>(q[i]) - p[i]) / std::max(std::fabs(static_cast<double>(p[i])), 1e-3));
    CAPTURE(worst);
    equal = worst <= c.tolerance;
    CHECK(equal);
  }
  return ok && equal && same_replicas;
}

/// "Skip decisions agree" (see the file comment): update `bad_update` has a NaN in row `bad_row`.
template <class Net, class Strategy, class Optimizer, class Loss, class MakeBatch>
bool skip_decisions_agree(Strategy& s, const Optimizer& opt, const Loss& loss, MakeBatch&& make_batch,
                          std::size_t bad_update, std::size_t bad_row, recipe_check c = {}) {
  c.recipe.nonfinite = nonfinite_policy::skip;
  auto m = s.template replicate<Net>(seed{c.seed});
  bool ok = true;
  for (std::size_t u = 0; u < c.updates; ++u) {
    data::batch b = make_batch(u, c.rows);
    if (u == bad_update) {
      REQUIRE(bad_row < b.rows());
      b.features[bad_row * b.width] = std::numeric_limits<float>::quiet_NaN();
    }
    const std::vector<float> before = m.parameters_to_host();
    const std::vector<float> state_before = m.optimizer_state_to_host();
    const std::vector<float> ema_before = m.ema_to_host();
    const std::uint64_t skipped_before = m.skipped_updates();
    const step_stats st = s.train_step(m, opt, loss, detail::shards_for(s, std::move(b)), c.recipe);
    const std::vector<float> after = m.parameters_to_host();
    CAPTURE(u);
    CHECK(m.step() == u + 1);
    const bool replicas = detail::replicas_identical(m, after) && detail::same_on_every_worker(s, after);
    CHECK(replicas);
    ok = ok && replicas;
    if (u == bad_update) {
      const bool skipped = st.skipped && m.skipped_updates() == skipped_before + 1 && after == before &&
                           m.optimizer_state_to_host() == state_before && m.ema_to_host() == ema_before;
      CHECK(st.skipped);
      CHECK(m.skipped_updates() == skipped_before + 1);
      CHECK(after == before);
      CHECK(m.optimizer_state_to_host() == state_before);
      CHECK(m.ema_to_host() == ema_before);
      ok = ok && skipped;
    } else {
      CHECK_FALSE(st.skipped);
      CHECK(after != before);
      ok = ok && !st.skipped && after != before;
    }
  }
  return ok;
}

}  // namespace lockstep::testing
