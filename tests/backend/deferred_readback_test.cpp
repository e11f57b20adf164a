// strategy_options::defer_readback on the archetype device kind, whose context defers readback
// as the CUDA context does (its memory is the host's, so these run everywhere): train_step
// returns the previous update's statistics, bitwise those an undeferred run returned one step
// earlier, flush_stats returns the last, the parameters are the same bits, and what cannot be
// deferred is refused with a message that names the option.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <lockstep/lockstep.hpp>

#include <lockstep/testing/archetypes/kind.hpp>

namespace archetype = lockstep_archetypes;
namespace ls = lockstep;

static_assert(ls::backend::deferring_context<archetype::context>);
static_assert(!ls::backend::deferring_context<ls::backend::host_context>);

namespace deferred_readback_test {

using net = ls::sequential<ls::dense<9, 12>, ls::tanh, ls::dropout<1, 4>, ls::dense<12, 5>>;
using on_cells = ls::mirrored<archetype::cells>;

// Global batch `k` of `rows` rows (labels in [0, 5)), cut into `parts` shards.
ls::data::distributed_batch batch_of(std::size_t k, std::size_t rows, std::size_t parts, float poison = 0) {
  auto b = std::make_shared<ls::data::batch>();
  b->width = 9;
  b->features.resize(rows * 9);
  b->labels.resize(rows);
  b->indices.resize(rows);
  const ls::counter_rng rng(11, k);
  for (std::size_t i = 0; i < b->features.size(); ++i) b->features[i] = rng.uniform(i) * 2 - 1 + poison;
  for (std::size_t r = 0; r < rows; ++r) {
    b->labels[r] = static_cast<std::int32_t>(rng.u32(1000 + r) % 5);
    b->indices[r] = k * 100 + r;
  }
  return {b, ls::data::split(*b, parts)};
}

bool same_bits(const ls::step_stats& a, const ls::step_stats& b) {
  const auto same = [](double x, double y) { return (std::isnan(x) && std::isnan(y)) || x == y; };
  return same(a.loss_sum, b.loss_sum) && a.count == b.count && a.correct == b.correct && a.labelled == b.labelled &&
         same(a.grad_norm, b.grad_norm) && same(a.clip_factor, b.clip_factor) && a.skipped == b.skipped &&
         a.loss_scale == b.loss_scale;
}

struct run_result {
  std::vector<ls::step_stats> stats;  // what each train_step returned, then flush_stats
  std::vector<float> params;
};

// Ten updates on `replicas` replicas with batches of uneven sizes (some updates of two batches
// through accumulate), deferred or not, with the given recipe.
run_result run(std::size_t replicas, bool defer, const ls::update_recipe& recipe) {
  on_cells s(ls::device_selection::first(replicas), ls::strategy_options{.defer_readback = defer});
  auto m = s.replicate<net>(ls::seed{4});
  const ls::adam opt{.lr = 2e-2f};
  const ls::softmax_cross_entropy loss;
  const std::size_t sizes[] = {1, 7, 13, 2, 11, 5, 17, 3, 8, 6};
  run_result out;
  for (std::size_t k = 0; k < 10; ++k) {
    if (k % 3 == 1) {
      const ls::step_stats a = s.accumulate(m, loss, batch_of(50 + k, sizes[(k + 3) % 10], replicas));
      CHECK(a.count == sizes[(k + 3) % 10]);
    }
    out.stats.push_back(s.train_step(m, opt, loss, batch_of(k, sizes[k], replicas), recipe));
  }
  out.stats.push_back(s.flush_stats(m));
  out.stats.push_back(s.flush_stats(m));  // nothing left
  out.params = m.parameters_to_host();
  return out;
}

}  // namespace deferred_readback_test

using namespace deferred_readback_test;

TEST_CASE("defer_readback: train_step returns the previous update's statistics, bitwise the undeferred run's, and "
          "the parameters are the same bits") {
  for (std::size_t replicas : {1u, 2u, 3u})
    for (double clip : {0.0, 0.5}) {
      CAPTURE(replicas);
      CAPTURE(clip);
      const ls::update_recipe recipe{.clip_global_norm = clip};
      const run_result eager = run(replicas, false, recipe);
      const run_result late = run(replicas, true, recipe);
      REQUIRE(late.stats.size() == 12);
      CHECK(late.stats[0].count == 0);  // nothing before the first update
      for (std::size_t k = 1; k <= 10; ++k) {
        CAPTURE(k);
        CHECK(eager.stats[k - 1].count > 0);
        CHECK(same_bits(late.stats[k], eager.stats[k - 1]));
      }
      CHECK(late.stats[11].count == 0);
      CHECK(eager.stats[10].count == 0);  // undeferred: nothing is ever pending
      CHECK(late.params == eager.params);
    }
}

TEST_CASE("defer_readback: fit's epoch statistics and the parameters equal a run without it") {
  const auto train = [](bool defer) {
    on_cells s(ls::device_selection::first(2), ls::strategy_options{.defer_readback = defer});
    auto m = s.replicate<net>(ls::seed{3});
    std::vector<float> x(47 * 9);
    std::vector<std::int32_t> y(47);
    const ls::counter_rng rng(5, 6);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i) * 2 - 1;
    for (std::size_t r = 0; r < y.size(); ++r) y[r] = static_cast<std::int32_t>(rng.u32(x.size() + r) % 5);
    const auto data = ls::data::from_memory(std::move(x), 9, std::move(y)) | ls::data::batched(10);
    const ls::history h =
        ls::fit(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, data, {.epochs = 2, .quiet = true, .accumulate = 2});
    return std::pair{h, m.parameters_to_host()};
  };
  const auto [h_eager, p_eager] = train(false);
  const auto [h_late, p_late] = train(true);
  CHECK(p_late == p_eager);
  REQUIRE(h_late.epochs.size() == 2);
  REQUIRE(h_eager.epochs.size() == 2);
  for (std::size_t e = 0; e < 2; ++e) {
    CHECK(h_late.epochs[e].samples == 47);
    CHECK(h_late.epochs[e].samples == h_eager.epochs[e].samples);
    CHECK(h_late.epochs[e].steps == h_eager.epochs[e].steps);
    CHECK(h_late.epochs[e].train_loss == h_eager.epochs[e].train_loss);
    CHECK(h_late.epochs[e].train_accuracy == h_eager.epochs[e].train_accuracy);
  }
}

TEST_CASE("defer_readback: an abandoned update's losses are dropped, and the next update's statistics are its own") {
  const ls::sgd opt{.lr = 0.05f};
  const ls::softmax_cross_entropy loss;
  on_cells eager(ls::device_selection::first(2));
  on_cells late(ls::device_selection::first(2), ls::strategy_options{.defer_readback = true});
  auto me = eager.replicate<net>(ls::seed{8});
  auto ml = late.replicate<net>(ls::seed{8});
  (void)late.accumulate(ml, loss, batch_of(1, 9, 2));
  late.abandon_update();
  const ls::step_stats e = eager.train_step(me, opt, loss, batch_of(2, 6, 2));
  CHECK(late.train_step(ml, opt, loss, batch_of(2, 6, 2)).count == 0);
  CHECK(same_bits(late.flush_stats(ml), e));
  CHECK(ml.parameters_to_host() == me.parameters_to_host());
}

TEST_CASE("defer_readback: a NaN loss is reported by the next step as a numerics_error naming its update") {
  on_cells s(ls::device_selection::first(2), ls::strategy_options{.defer_readback = true});
  auto m = s.replicate<net>(ls::seed{8});
  const ls::sgd opt{.lr = 0.05f};
  const ls::softmax_cross_entropy loss;
  (void)s.train_step(m, opt, loss, batch_of(0, 6, 2));
  (void)s.train_step(m, opt, loss, batch_of(1, 6, 2, std::numeric_limits<float>::quiet_NaN()));  // update 2
  std::string what;
  try {
    (void)s.train_step(m, opt, loss, batch_of(2, 6, 2));
  } catch (const ls::numerics_error& e) {
    what = e.what();
  }
  CHECK(what.find("update 2 (step 1)") != std::string::npos);
  CHECK(what.find("defer_readback") != std::string::npos);
  CHECK(s.flush_stats(m).count == 0);  // the failure dropped what was pending
}

TEST_CASE("defer_readback: refused on host replicas and with a recipe that decides on the host") {
  const auto message = [](auto&& f) {
    try {
      f();
    } catch (const ls::config_error& e) {
      return std::string(e.what());
    }
    return std::string("no config_error");
  };
  const std::string host = message([] { ls::mirrored<ls::cpus> s(ls::strategy_options{.defer_readback = true}); });
  CHECK(host.find("defer_readback") != std::string::npos);
  CHECK(host.find("cpu") != std::string::npos);

  on_cells s(ls::device_selection::first(2), ls::strategy_options{.defer_readback = true});
  auto m = s.replicate<net>(ls::seed{8});
  for (auto policy : {ls::nonfinite_policy::skip, ls::nonfinite_policy::raise}) {
    const std::string guard = message(
        [&] { (void)s.train_step(m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, batch_of(0, 4, 2), {.nonfinite = policy}); });
    CHECK(guard.find("update_recipe::nonfinite") != std::string::npos);
  }
  CHECK(m.step() == 0);
}

TEST_CASE("defer_readback: a loss that reads its totals back in the step (mse) keeps them, one step late") {
  const auto run_mse = [](bool defer) {
    on_cells s(ls::device_selection::first(2), ls::strategy_options{.defer_readback = defer});
    auto m = s.replicate<net>(ls::seed{6});
    std::vector<ls::step_stats> out;
    for (std::size_t k = 0; k < 4; ++k) {
      auto b = std::make_shared<ls::data::batch>(*batch_of(k, 5 + k, 2).global);
      b->target_width = 5;
      b->targets.resize(b->rows() * 5);
      const ls::counter_rng rng(21, k);
      for (std::size_t i = 0; i < b->targets.size(); ++i) b->targets[i] = rng.uniform(i);
      out.push_back(s.train_step(m, ls::sgd{.lr = 0.05f}, ls::mse{}, ls::data::distributed_batch{b, ls::data::split(*b, 2)}));
    }
    out.push_back(s.flush_stats(m));
    return out;
  };
  const auto eager = run_mse(false);
  const auto late = run_mse(true);
  CHECK(late[0].count == 0);
  for (std::size_t k = 1; k <= 4; ++k) {
    CAPTURE(k);
    CHECK(eager[k - 1].loss_sum > 0);
    CHECK(same_bits(late[k], eager[k - 1]));
  }
}
