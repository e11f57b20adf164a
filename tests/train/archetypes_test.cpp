// The archetypes of the layer, loss, optimiser, learning-rate schedule and callback concepts:
// types outside the library's namespace with exactly the members their concepts list, as
// non-template functions of one element type (float) and one context (host_context), trained with
// fit and evaluated through a strategy. That this compiles proves the library calls nothing
// beyond the concepts; the run checks that it calls what they list, and that the archetypes
// compute what the library's own equivalents (plain SGD, a diagonal scaling) compute.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <lockstep/lockstep.hpp>

#include <lockstep/testing/archetypes/model.hpp>

namespace archetype = lockstep_archetypes;

namespace ls = lockstep;

static_assert(ls::layer<archetype::layer>);
static_assert(ls::bound_layer_for<ls::bind_t<archetype::layer, 5>, float, ls::host_context>);
static_assert(!ls::bound_layer_for<ls::bind_t<archetype::layer, 5>, double, ls::host_context>);  // float only
static_assert(ls::loss_for<archetype::loss, float, ls::host_context>);
static_assert(ls::optimizer_for<archetype::optimizer, float, ls::host_context>);
static_assert(ls::learning_rate_schedule<archetype::schedule>);
static_assert(ls::epoch_callback<archetype::epoch_counter> && ls::step_callback<archetype::step_recorder>);
// The library's own types model the same concepts.
static_assert(ls::bound_layer_for<ls::bind_t<ls::sequential<ls::dense<3, 4>, ls::relu>, 3>, double, ls::host_context>);
static_assert(ls::loss_for<ls::softmax_cross_entropy, float, ls::host_context> && ls::loss_for<ls::mse, double, ls::host_context>);
static_assert(ls::optimizer_for<ls::sgd, float, ls::host_context> && ls::optimizer_for<ls::adamw, double, ls::host_context>);
static_assert(ls::learning_rate_schedule<ls::cosine_schedule> &&
              ls::learning_rate_schedule<ls::warmup_schedule<ls::step_schedule>>);
static_assert(!ls::loss<int> && !ls::optimizer<int> && !ls::learning_rate_schedule<int>);

namespace {

auto archetype_samples() {
  std::vector<float> x(50 * 6);
  std::vector<std::int32_t> y(50);
  const ls::counter_rng rng(11, 12);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i) * 2 - 1;
  for (std::size_t r = 0; r < y.size(); ++r) y[r] = static_cast<std::int32_t>(rng.u32(x.size() + r) % 3);
  return ls::data::from_memory(std::move(x), 6, std::move(y)) | ls::data::batched(11);
}

template <class Net, class Opt, class Sched>
std::vector<float> train(const Opt& opt, const Sched& sched, std::vector<ls::callback> more = {}) {
  ls::mirrored<ls::cpus> s(ls::device_selection::first(2));
  auto m = s.template replicate<Net>(ls::seed{4});
  more.push_back(ls::lr_schedule(sched));
  (void)ls::fit(s, m, opt, archetype::loss{}, archetype_samples(), {.epochs = 3, .callbacks = std::move(more), .quiet = true});
  return m.parameters_to_host();
}

}  // namespace

TEST_CASE("archetypes: a layer, loss, optimiser, schedule and callbacks with only the concepts' members train through fit") {
  using net = ls::sequential<ls::dense<6, 5>, ls::tanh, archetype::layer, ls::dense<5, 3>, archetype::layer>;
  auto epochs = std::make_shared<int>(0);
  auto losses = std::make_shared<std::vector<double>>();
  const auto p = train<net>(archetype::optimizer{.lr = 0.2f}, archetype::schedule{},
                            {ls::on_epoch_end(archetype::epoch_counter{epochs}),
                             ls::on_step_end(archetype::step_recorder{losses})});
  CHECK(*epochs == 3);
  REQUIRE(losses->size() == 15);  // 5 batches of at most 11 rows per epoch
  CHECK(losses->back() < losses->front());

  // The same run with the library's SGD and a library schedule of the same values.
  const auto q = train<net>(ls::sgd{.lr = 0.2f}, ls::step_schedule{.every = 4, .factor = 0.5f});
  REQUIRE(p.size() == q.size());
  double diff = 0;
  for (std::size_t i = 0; i < p.size(); ++i) diff = std::max(diff, std::abs(double(p[i]) - q[i]));
  CHECK(diff < 1e-5);
}

TEST_CASE("archetypes: evaluate runs the archetype loss through a strategy") {
  ls::mirrored<ls::cpus> s(ls::device_selection::first(3));
  auto m = s.replicate<ls::sequential<ls::dense<6, 3>, archetype::layer>>(ls::seed{9});
  const ls::evaluation e = ls::evaluate(s, m, archetype::loss{}, archetype_samples());
  CHECK(e.samples == 50);
  CHECK(std::isfinite(e.loss));
  CHECK(e.loss > 0);
}
