// The archetypes of the strategy, pipeline-element and batch-source concepts: types outside the
// library's namespace with exactly the members their concepts list, used through fit, evaluate and
// predict and through the pipeline stages. That this compiles proves the library calls nothing
// beyond the concepts; the runs check that the archetypes give bitwise what the library's own
// strategy and sources give.

#include <doctest/doctest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <span>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/lockstep.hpp>

#include <lockstep/testing/archetypes/data.hpp>
#include <lockstep/testing/archetypes/strategy.hpp>

namespace archetype = lockstep_archetypes;

namespace ls = lockstep;

static_assert(ls::strategy<archetype::strategy> && ls::strategy<archetype::worker_strategy>);
static_assert(ls::strategy_for<archetype::strategy, ls::replicated<ls::sequential<ls::dense<2, 2>>>, ls::sgd,
                               ls::softmax_cross_entropy>);
static_assert(!ls::strategy<int>);
static_assert(ls::data::batchable<archetype::row> && !std::copy_constructible<archetype::row>);
static_assert(ls::batch_source<archetype::batch_list>);
// The library's own types model the same concepts.
static_assert(ls::strategy_for<ls::mirrored<ls::cpus>, ls::replicated<ls::sequential<ls::dense<2, 2>>>, ls::sgd, ls::mse>);
static_assert(ls::data::batchable<ls::data::sample> && ls::data::batchable<ls::data::owned_sample>);

namespace {

using archetype_net = ls::sequential<ls::dense<6, 8>, ls::tanh, ls::dense<8, 3>>;
constexpr std::size_t rows = 53, width = 6;  // a prime: uneven shards and a short last batch

std::vector<float> features() {
  std::vector<float> x(rows * width);
  const ls::counter_rng rng(21, 22);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i) * 2 - 1;
  return x;
}
std::int32_t label_of(std::size_t r) { return static_cast<std::int32_t>((r * 7 + r / 5) % 3); }
std::vector<std::int32_t> labels() {
  std::vector<std::int32_t> y(rows);
  for (std::size_t r = 0; r < rows; ++r) y[r] = label_of(r);
  return y;
}

/// The library's source and stages.
auto library_pipeline() {
  return ls::data::from_memory(features(), width, labels()) | ls::data::shuffle(16, 5) | ls::data::batched(8) |
         ls::data::prefetch(2);
}

/// The same rows as move-only archetype rows from a user factory, through the same stages.
auto archetype_pipeline(std::shared_ptr<std::uint64_t> epochs_made) {
  const auto x = std::make_shared<const std::vector<float>>(features());
  const ls::data::dataset<archetype::row> source{[x, epochs_made](std::uint64_t) {
    ++*epochs_made;
    return [](std::shared_ptr<const std::vector<float>> v) -> ls::data::generator<archetype::row> {
      for (std::size_t r = 0; r < rows; ++r)
        co_yield archetype::row({v->begin() + static_cast<std::ptrdiff_t>(r * width),
                                 v->begin() + static_cast<std::ptrdiff_t>((r + 1) * width)},
                                label_of(r), r);
    }(x);
  }};
  return source | ls::data::shuffle(16, 5) | ls::data::batched(8) | ls::data::prefetch(2);
}

ls::fit_options options() { return {.epochs = 3, .quiet = true}; }

}  // namespace

TEST_CASE("archetypes: a strategy with only the concept's members trains, evaluates and predicts as mirrored does") {
  const auto data = library_pipeline();
  for (const std::size_t n : {1u, 2u, 3u}) {
    CAPTURE(n);
    archetype::strategy mine(n);
    auto a = archetype::make_replicas<archetype_net>(n, ls::seed{4});
    const ls::history ha = ls::fit(mine, a, ls::sgd{.lr = 0.2f}, ls::softmax_cross_entropy{}, data,
                                   {.epochs = 3, .validation = data, .quiet = true});

    ls::mirrored<ls::cpus> library(ls::device_selection::first(n), ls::strategy_options{.flush_denormals = false});
    auto b = library.replicate<archetype_net>(ls::seed{4});
    const ls::history hb = ls::fit(library, b, ls::sgd{.lr = 0.2f}, ls::softmax_cross_entropy{}, data,
                                   {.epochs = 3, .validation = data, .quiet = true});

    CHECK(a.step() == 21);  // 7 batches of at most 8 rows, 3 epochs
    CHECK(a.parameters_to_host() == b.parameters_to_host());  // gradient sums in replica order: bitwise equal
    REQUIRE(ha.epochs.size() == 3);
    CHECK(ha.last().samples == rows);
    CHECK(ha.last().val_samples == rows);
    CHECK(ha.last().train_loss < ha.epochs.front().train_loss);
    CHECK(ha.last().val_loss == doctest::Approx(hb.last().val_loss).epsilon(1e-12));
    CHECK(ha.last().train_accuracy == hb.last().train_accuracy);

    const ls::evaluation ea = ls::evaluate(mine, a, ls::softmax_cross_entropy{}, data, {.top_k = 2});
    const ls::evaluation eb = ls::evaluate(library, b, ls::softmax_cross_entropy{}, data, {.top_k = 2});
    CHECK(ea.samples == rows);
    CHECK(ea.sums.correct == eb.sums.correct);
    CHECK(ea.sums.top_k_correct == eb.sums.top_k_correct);
    CHECK(ea.loss == doctest::Approx(eb.loss).epsilon(1e-12));

    const ls::predictions pa = ls::predict(mine, a, data), pb = ls::predict(library, b, data);
    CHECK(pa.rows() == rows);
    CHECK(pa.indices == pb.indices);
    CHECK(pa.outputs == pb.outputs);
  }
}

TEST_CASE("archetypes: a strategy spanning processes through its world (plan, sum, is_chief, global_replicas)") {
  // Two workers on two threads, one replica each, against one process with two replicas.
  const auto data = library_pipeline();
  archetype::process_group w(2);
  std::vector<float> params[2];
  ls::history hist[2];
  ls::evaluation ev[2];
  {
    std::vector<std::jthread> workers;
    for (std::size_t rank = 0; rank < 2; ++rank)
      workers.emplace_back([&, rank] {
        archetype::worker_strategy s(w, rank, 2);
        auto m = archetype::make_replicas<archetype_net>(1, ls::seed{4});
        hist[rank] = ls::fit(s, m, ls::sgd{.lr = 0.2f}, ls::softmax_cross_entropy{}, data,
                             {.epochs = 3, .validation = data, .quiet = true});
        ev[rank] = ls::evaluate(s, m, ls::softmax_cross_entropy{}, data);
        params[rank] = m.parameters_to_host();
      });
  }
  archetype::strategy one(2);
  auto m = archetype::make_replicas<archetype_net>(2, ls::seed{4});
  const ls::history h = ls::fit(one, m, ls::sgd{.lr = 0.2f}, ls::softmax_cross_entropy{}, data,
                                {.epochs = 3, .validation = data, .quiet = true});
  const ls::evaluation e = ls::evaluate(one, m, ls::softmax_cross_entropy{}, data);

  CHECK(params[0] == m.parameters_to_host());  // rank order is replica order: bitwise equal
  CHECK(params[1] == params[0]);
  for (std::size_t rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    REQUIRE(hist[rank].epochs.size() == 3);
    CHECK(hist[rank].last().samples == rows);      // the global batch's rows, not this worker's
    CHECK(hist[rank].last().val_samples == rows);  // every worker's counts, added
    CHECK(hist[rank].last().train_accuracy == h.last().train_accuracy);
    CHECK(hist[rank].last().val_loss == doctest::Approx(h.last().val_loss).epsilon(1e-12));
    CHECK(ev[rank].samples == rows);
    CHECK(ev[rank].sums.correct == e.sums.correct);
    CHECK(ev[rank].loss == doctest::Approx(e.loss).epsilon(1e-12));
  }
}

TEST_CASE("archetypes: move-only rows from a user factory go through shuffle, batched and prefetch into fit") {
  auto epochs_made = std::make_shared<std::uint64_t>(0);
  const auto mine = archetype_pipeline(epochs_made);
  const auto library = library_pipeline();

  // The same batches, in the same order, as the library's source gives for the same rows.
  for (const std::uint64_t epoch : {0u, 1u, 4u}) {
    std::vector<std::vector<float>> xa, xb;
    std::vector<std::vector<std::uint64_t>> ia, ib;
    for (auto&& b : mine.epoch(epoch)) {
      CHECK(b.labels.size() == b.rows());
      xa.push_back(b.features);
      ia.push_back(b.indices);
    }
    for (auto&& b : library.epoch(epoch)) {
      xb.push_back(b.features);
      ib.push_back(b.indices);
    }
    CHECK(xa == xb);
    CHECK(ia == ib);
  }
  CHECK(*epochs_made == 3);  // one factory call per epoch iterated

  ls::mirrored<ls::cpus> s(ls::device_selection::first(2));
  auto a = s.replicate<archetype_net>(ls::seed{8});
  auto b = s.replicate<archetype_net>(ls::seed{8});
  (void)ls::fit(s, a, ls::sgd{.lr = 0.2f}, ls::softmax_cross_entropy{}, mine, options());
  (void)ls::fit(s, b, ls::sgd{.lr = 0.2f}, ls::softmax_cross_entropy{}, library, options());
  CHECK(a.parameters_to_host() == b.parameters_to_host());
  CHECK(ls::evaluate(s, a, ls::softmax_cross_entropy{}, mine).samples == rows);
}

TEST_CASE("archetypes: a batch source with a hand-written input range trains and evaluates through fit") {
  std::vector<ls::data::batch> batches;
  for (auto&& b : library_pipeline().epoch(0)) batches.push_back(b);  // the pooled batches, copied out
  REQUIRE(batches.size() == 7);
  const archetype::batch_list mine{std::make_shared<const std::vector<ls::data::batch>>(batches)};
  const auto library = ls::data::from_vector(batches);

  ls::mirrored<ls::cpus> s(ls::device_selection::first(3));
  auto a = s.replicate<archetype_net>(ls::seed{6});
  auto b = s.replicate<archetype_net>(ls::seed{6});
  const ls::history ha = ls::fit(s, a, ls::sgd{.lr = 0.2f}, ls::softmax_cross_entropy{}, mine,
                                 {.epochs = 2, .validation = mine, .quiet = true});
  (void)ls::fit(s, b, ls::sgd{.lr = 0.2f}, ls::softmax_cross_entropy{}, library, options());
  CHECK(a.step() == 14);
  CHECK(ha.last().val_samples == rows);
  const ls::evaluation ea = ls::evaluate(s, a, ls::softmax_cross_entropy{}, mine);
  CHECK(ea.samples == rows);
  CHECK(std::isfinite(ea.loss));
  (void)ls::fit(s, a, ls::sgd{.lr = 0.2f}, ls::softmax_cross_entropy{}, mine, {.epochs = 1, .quiet = true});
  CHECK(a.parameters_to_host() == b.parameters_to_host());  // 3 epochs of the same batches either way
  CHECK(ls::predict(s, a, mine).indices == ls::predict(s, b, library).indices);
}
