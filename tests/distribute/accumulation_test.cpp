// Gradient accumulation: an update over k consecutive global batches is the update of one batch
// holding all their rows — bitwise under replica_count_invariant for every split of the same rows
// into replicas × batches (1×1×8, 1×2×4, 1×4×2 here; the MPI splits in tests/mpi), with dropout,
// with clipping, with an uneven last update and with empty shards; under run_to_run bitwise run to
// run and within 1e-5 of the big batch; with batch norm (statistics per batch) equal to one device
// accumulating the same batches. The buckets' all-reduce runs once per update, and the running sum
// of a one-process replica_count_invariant update is one P-float buffer whatever k is.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>
#include <vector>

#include <lockstep/layers/batch_norm.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/testing/recipe.hpp>

#include "distribute/common.hpp"

using namespace dist_test;
namespace ls = lockstep;

namespace {

using invariant = ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus>;
using host = ls::mirrored<ls::cpus>;

/// Rows of a global batch of `rows` rows for update `u` (the same on every call).
ls::data::batch update_batch(std::size_t u, std::size_t rows) { return make_batch(rows, 100 + u); }

/// One update's rows cut into the given batch sizes.
std::vector<ls::data::batch> cut(const ls::data::batch& b, const std::vector<std::size_t>& sizes) {
  std::vector<ls::data::batch> out;
  std::size_t lo = 0;
  for (const std::size_t n : sizes) {
    out.push_back(ls::testing::detail::rows_of(b, lo, lo + n));
    lo += n;
  }
  REQUIRE(lo == b.rows());
  return out;
}

struct run_out {
  std::vector<float> params;
  std::vector<double> losses, norms;
  bool identical = true;
};

/// Trains mlp_dropout on `replicas` replicas of strategy S: update u has the rows of
/// update_batch(u, sum of sizes[u]) cut into the batches sizes[u].
template <class S, class Opt>
run_out train_split(std::size_t replicas, const std::vector<std::vector<std::size_t>>& sizes, const Opt& opt,
                    const ls::update_recipe& recipe = {}, std::size_t micro = 8) {
  S s(ls::device_selection::first(replicas), ls::strategy_options{.micro_shard_rows = micro});
  auto m = s.template replicate<mlp_dropout>(ls::seed{9});
  run_out out;
  for (std::size_t u = 0; u < sizes.size(); ++u) {
    std::size_t rows = 0;
    for (const auto n : sizes[u]) rows += n;
    const auto parts = cut(update_batch(u, rows), sizes[u]);
    for (std::size_t j = 0; j + 1 < parts.size(); ++j)
      (void)ls::accumulate(s, m, ls::softmax_cross_entropy{}, distributed(parts[j], replicas));
    const auto st = ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(parts.back(), replicas), recipe);
    CHECK(st.count == rows);
    out.losses.push_back(st.loss_sum);
    out.norms.push_back(st.grad_norm);
  }
  CHECK(m.step() == sizes.size());
  out.params = m.parameters_to_host();
  for (std::size_t r = 0; r < m.size(); ++r)
    out.identical = out.identical && std::equal(out.params.begin(), out.params.end(), m.replica(r).model().parameters().data());
  return out;
}

/// `updates` updates of `rows` rows each cut into k equal batches; the last update `last` rows in
/// `last_k` batches (an uneven last update).
std::vector<std::vector<std::size_t>> plan(std::size_t updates, std::size_t rows, std::size_t k, std::size_t last = 0,
                                           std::size_t last_k = 0) {
  std::vector<std::vector<std::size_t>> p(updates, std::vector<std::size_t>(k, rows / k));
  if (last) p.push_back(std::vector<std::size_t>(last_k, last / last_k));
  return p;
}

/// The largest |a[i] - ref[i]| / max(|ref[i]|, 1e-3) (parameters near 0 compared absolutely).
double worst_relative(const std::vector<float>& a, const std::vector<float>& ref) {
  REQUIRE(a.size() == ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - ref[i]) / std::max(std::fabs(static_cast<double>(ref[i])), 1e-3));
  return worst;
}

void check_same(const run_out& a, const run_out& b) {
  REQUIRE(a.params.size() == b.params.size());
  CHECK(std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)) == 0);
  CHECK(a.losses == b.losses);
  REQUIRE(a.norms.size() == b.norms.size());
  for (std::size_t i = 0; i < a.norms.size(); ++i)
    CHECK((std::isnan(a.norms[i]) ? std::isnan(b.norms[i]) : a.norms[i] == b.norms[i]));
  CHECK(a.identical);
  CHECK(b.identical);
}

}  // namespace

TEST_CASE("accumulation, replica_count_invariant: 1x1x8, 1x2x4 and 1x4x2 give bitwise the big batch (dropout, Adam)") {
  const ls::adam opt{.lr = 2e-3f};
  // 5 updates of 64 rows, then an uneven last update of 32 rows in fewer batches.
  const auto big = train_split<invariant>(1, plan(5, 64, 1, 32, 1), opt);
  CHECK(big.identical);
  for (const auto& split : std::vector<std::pair<std::size_t, std::size_t>>{{1, 8}, {2, 4}, {4, 2}, {3, 2}}) {
    const std::size_t replicas = split.first, k = split.second;  // named: CAPTURE takes variables, not bindings
    CAPTURE(replicas);
    CAPTURE(k);
    check_same(train_split<invariant>(replicas, plan(5, 64, k, 32, k / 2 ? k / 2 : 1), opt), big);
  }
  // Training moved the parameters.
  host one(ls::device_selection::first(1));
  CHECK(one.replicate<mlp_dropout>(ls::seed{9}).parameters_to_host() != big.params);
}

TEST_CASE("accumulation, replica_count_invariant: with clipping by global norm and per-value clipping, still bitwise") {
  const ls::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  ls::update_recipe recipe;
  recipe.clip_global_norm = 0.05;  // well below the norm of these gradients: every update clips
  recipe.clip_value = 0.01f;
  const auto big = train_split<invariant>(1, plan(4, 64, 1), opt, recipe);
  for (const double n : big.norms) CHECK(n > recipe.clip_global_norm);
  for (const auto& split : std::vector<std::pair<std::size_t, std::size_t>>{{1, 8}, {2, 4}, {4, 2}, {5, 1}}) {
    const std::size_t replicas = split.first, k = split.second;  // named: CAPTURE takes variables, not bindings
    CAPTURE(replicas);
    CAPTURE(k);
    check_same(train_split<invariant>(replicas, plan(4, 64, k), opt, recipe), big);
  }
}

TEST_CASE("accumulation: batches with empty shards and uneven splits (fewer rows than replicas)") {
  const ls::adam opt{.lr = 1e-3f};
  // replica_count_invariant with micro-shards of 1 row: batches of 1, 2 and 3 rows on 4 replicas
  // leave replicas without rows; bitwise the big batch of 6 rows.
  const std::vector<std::vector<std::size_t>> split{{1, 2, 3}, {3, 3}, {2, 1, 1, 2}};
  const std::vector<std::vector<std::size_t>> whole{{6}, {6}, {6}};
  check_same(train_split<invariant>(4, split, opt, {}, 1), train_split<invariant>(1, whole, opt, {}, 1));
  // run_to_run: the same, within float rounding of the sum's order.
  const auto a = train_split<host>(4, split, opt);
  const auto b = train_split<host>(1, whole, opt);
  CHECK(a.identical);
  CHECK(relative_difference(a.params, b.params) <= 1e-5);
}

TEST_CASE("accumulation, run_to_run: bitwise run to run, and within 1e-5 per parameter of the big batch after 10 SGD updates on config M") {
  using config_m = ls::sequential<ls::dense<784, 512>, ls::relu, ls::dense<512, 512>, ls::relu, ls::dense<512, 10>>;
  const ls::sgd opt{.lr = 0.01f};
  const auto train = [&](std::size_t replicas, std::size_t k) {
    host s(ls::device_selection::first(replicas));
    auto m = s.replicate<config_m>(ls::seed{3});
    for (std::size_t u = 0; u < 10; ++u) {
      const auto parts = cut(update_batch(u, 128), std::vector<std::size_t>(k, 128 / k));
      for (std::size_t j = 0; j + 1 < k; ++j) (void)ls::accumulate(s, m, ls::softmax_cross_entropy{}, distributed(parts[j], replicas));
      (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(parts.back(), replicas));
    }
    return m.parameters_to_host();
  };
  const auto big = train(1, 1);
  const auto a = train(2, 4), again = train(2, 4);
  CHECK(a == again);  // run to run
  const double worst = worst_relative(a, big);
  CAPTURE(worst);
  CHECK(worst <= 1e-5);
  CHECK(a != big);  // not bitwise: the sums' order differs
}

TEST_CASE("accumulation, run_to_run: weight gradients formed once per update from the kept rows match adding them batch by batch, bitwise run to run, and a steady state grows nothing") {
  // Two dense layers with weight gradients of 4 MiB or more keep their rows; the last does not.
  using wide = ls::sequential<ls::dense<784, 1344>, ls::relu, ls::dense<1344, 800>, ls::relu, ls::dense<800, 10>>;
  static_assert(784 * 1344 * sizeof(float) >= ls::gradient_deferral::default_min_gradient_bytes);
  static_assert(1344 * 800 * sizeof(float) >= ls::gradient_deferral::default_min_gradient_bytes);
  const ls::sgd opt{.lr = 0.01f, .momentum = 0.9f};
  struct trained {
    std::vector<float> params;
    std::vector<double> losses;
    std::vector<std::size_t> reserved;  // per update, replica 0's kept bytes
    std::size_t rows0 = 0;              // replica 0's rows in the first update
  };
  // 4 updates of 48 rows in batches of 16, 5 and 27 (uneven, and uneven over 2 replicas), then 2
  // updates of 1 batch.
  const auto train = [&](std::size_t replicas, std::size_t budget) {
    host s(ls::device_selection::first(replicas), ls::strategy_options{.deferred_gradient_bytes = budget});
    auto m = s.replicate<wide>(ls::seed{3});
    trained out;
    for (std::size_t u = 0; u < 6; ++u) {
      const std::vector<std::size_t> sizes = u < 4 ? std::vector<std::size_t>{16, 5, 27} : std::vector<std::size_t>{48};
      const auto parts = cut(update_batch(u, 48), sizes);
      if (u == 0)
        for (const auto& p : parts) out.rows0 += distributed(p, replicas).shards[0].size;
      for (std::size_t j = 0; j + 1 < parts.size(); ++j)
        (void)ls::accumulate(s, m, ls::softmax_cross_entropy{}, distributed(parts[j], replicas));
      out.losses.push_back(ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(parts.back(), replicas)).loss_sum);
      out.reserved.push_back(m.replica(0).model().deferral().reserved_bytes());
    }
    out.params = m.parameters_to_host();
    for (std::size_t r = 1; r < m.size(); ++r) {
      const auto& p = m.replica(r).model().parameters();
      CHECK(std::equal(out.params.begin(), out.params.end(), p.data()));
    }
    return out;
  };
  const std::size_t deferred_budget = ls::strategy_options{}.deferred_gradient_bytes;
  for (const std::size_t replicas : {1u, 2u}) {
    CAPTURE(replicas);
    const auto deferred = train(replicas, deferred_budget), again = train(replicas, deferred_budget);
    const auto added = train(replicas, 0);
    CHECK(deferred.params == again.params);  // run to run
    CHECK(deferred.losses == again.losses);
    // Replica 0 keeps all its rows of the two wide layers (inputs and output gradients), grown in
    // the first update and never after.
    CHECK(deferred.rows0 == (replicas == 1 ? 48u : 25u));  // 8 + 3 + 14: replica 0 takes an odd batch's extra row
    CHECK(deferred.reserved.front() == deferred.rows0 * ((784 + 1344) + (1344 + 800)) * sizeof(float));
    CHECK(std::all_of(deferred.reserved.begin(), deferred.reserved.end(), [&](std::size_t b) { return b == deferred.reserved.front(); }));
    CHECK(added.reserved.back() == 0);
    const double worst = worst_relative(deferred.params, added.params);
    CAPTURE(worst);
    CHECK(worst <= 1e-5);
    CHECK(deferred.params != added.params);  // the kept rows were used: one GEMM, not three
  }
}

TEST_CASE("accumulation with batch norm: the statistics are each batch's over all replicas, and N replicas equal one device accumulating the same batches") {
  using bn_net = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<2, 5, 3, 0>, ls::batch_norm<>, ls::relu,
                                ls::max_pool2d<2>, ls::flatten, ls::dense<32, 10>>;
  const ls::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  const auto train = [&](std::size_t replicas) {
    host s(ls::device_selection::first(replicas));
    auto m = s.replicate<bn_net>(ls::seed{2});
    for (std::size_t u = 0; u < 6; ++u) {
      const auto parts = cut(update_batch(u, 40), {16, 16, 8});
      for (std::size_t j = 0; j + 1 < parts.size(); ++j)
        (void)ls::accumulate(s, m, ls::softmax_cross_entropy{}, distributed(parts[j], replicas));
      (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(parts.back(), replicas));
    }
    return m.parameters_to_host();  // parameters, then the running statistics
  };
  const auto one = train(1);
  for (const std::size_t n : {2u, 3u}) {
    CAPTURE(n);
    CHECK(relative_difference(train(n), one) <= 1e-5);
  }
  // ... and not the big batch's update: the statistics differ.
  host s(ls::device_selection::first(1));
  auto m = s.replicate<bn_net>(ls::seed{2});
  for (std::size_t u = 0; u < 6; ++u)
    (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(update_batch(u, 40), 1));
  CHECK(m.parameters_to_host() != one);
}

namespace {
/// host_allreduce that counts the collectives it starts.
class counting_reducer {
public:
  using reducer_concept = ls::reducer_tag;
  template <class... Ds>
  static constexpr bool supports = (ls::is_cpu_v<Ds> && ...);
  explicit counting_reducer(const ls::reducer_config& c) : inner_(c) {}
  std::size_t workspace_bytes(std::size_t b) const { return inner_.workspace_bytes(b); }
  void bind(std::size_t r, void* w, std::size_t b) { inner_.bind(r, w, b); }
  template <class Ctx, class T>
  void start(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t id) {
    if (ls::collective_ids::is_bucket(id)) ++starts;
    inner_.start(r, ctx, data, count, id);
  }
  template <class Ctx>
  void wait(std::size_t r, Ctx& ctx, std::size_t id) {
    inner_.wait(r, ctx, id);
  }
  template <class Ctx, class T>
  void broadcast(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t root) {
    inner_.broadcast(r, ctx, data, count, root);
  }
  void abort() noexcept { inner_.abort(); }
  void reset() noexcept { inner_.reset(); }
  inline static std::atomic<std::size_t> starts{0};

private:
  ls::host_allreduce inner_;
};
}  // namespace

TEST_CASE("accumulation, run_to_run: no collective before an update's last batch, and its buckets are all-reduced once") {
  ls::basic_mirrored<counting_reducer, ls::determinism::run_to_run, ls::cpus> s(
      ls::device_selection::first(2), ls::strategy_options{.bucket_bytes = 0});  // one bucket per layer with parameters
  auto m = s.replicate<mlp>(ls::seed{1});
  const std::size_t buckets = m.buckets().size;
  REQUIRE(buckets > 1);
  counting_reducer::starts = 0;
  for (std::size_t j = 0; j < 3; ++j)
    (void)ls::accumulate(s, m, ls::softmax_cross_entropy{}, distributed(make_batch(16, j), 2));
  CHECK(counting_reducer::starts == 0);
  CHECK(s.pending_batches() == 3);
  const auto st = ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, distributed(make_batch(16, 3), 2));
  CHECK(st.count == 64);
  CHECK(counting_reducer::starts == 2 * buckets);  // each replica starts each bucket once
  CHECK(s.pending_batches() == 0);
  CHECK(m.step() == 1);
}

TEST_CASE("accumulation: an update in progress belongs to one model, and abandon_update starts afresh") {
  host s(ls::device_selection::first(2));
  auto a = s.replicate<mlp>(ls::seed{1});
  auto b = s.replicate<mlp>(ls::seed{1});
  (void)ls::accumulate(s, a, ls::softmax_cross_entropy{}, distributed(make_batch(8, 0), 2));
  CHECK_THROWS_AS((void)ls::train_step(s, b, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, distributed(make_batch(8, 1), 2)),
                  ls::config_error);
  s.abandon_update();
  // After abandoning, an update of b alone equals a fresh model's one-batch update.
  const auto st = ls::train_step(s, b, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, distributed(make_batch(8, 1), 2));
  CHECK(st.count == 8);
  host t(ls::device_selection::first(2));
  auto c = t.replicate<mlp>(ls::seed{1});
  (void)ls::train_step(t, c, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, distributed(make_batch(8, 1), 2));
  CHECK(b.parameters_to_host() == c.parameters_to_host());
  CHECK(a.step() == 0);
}

TEST_CASE("accumulation, replica_count_invariant: one P-float running sum whatever the number of batches") {
  // The step policy alone, in a local world of 2 replicas: micro-shards of 8 rows, batches of 16.
  ls::strategy_options o;
  o.micro_shard_rows = 8;
  ls::local_world world(2);
  ls::micro_shard_step<ls::local_world> step(2, o, world);
  std::vector<ls::host_context> contexts;
  for (int r = 0; r < 2; ++r) contexts.emplace_back(1, false);
  auto m = ls::replicated<mlp>(std::move(contexts), ls::seed{3}, o.bucket_bytes);
  ls::executor ex(2, false, [](void*) noexcept {}, [](void*) noexcept {}, nullptr);
  ls::single_device_reducer unused;
  ls::detail::epilogue_workspace<ls::cpus> ws;
  ws.prepare(2, decltype(m)::param_count);
  ls::detail::accumulate_phase<ls::cpus> phase(ws);
  constexpr std::size_t P = decltype(m)::param_count;
  std::size_t rows = 0;
  for (std::size_t j = 0; j < 6; ++j) {
    const ls::update_part part{rows, j == 0, false};
    (void)step.run(ex, unused, m, ls::softmax_cross_entropy{}, distributed(make_batch(16, j), 2),
                   ls::pass_info::for_training(3, 0), part, phase);
    rows += 16;
    CHECK(step.accumulator_bytes() == P * sizeof(float));
    CHECK(step.slot_bytes() <= 2 * P * sizeof(float) + 64);  // the slots of one batch (2 micro-shards)
  }
}

TEST_CASE("the public recipe suite: accumulation equals the big batch on the library's strategies") {
  const auto batches = [](std::size_t u, std::size_t rows) { return update_batch(u, rows); };
  for (const std::size_t n : {1u, 2u, 3u}) {
    CAPTURE(n);
    invariant s(ls::device_selection::first(n), ls::strategy_options{.micro_shard_rows = 8});
    ls::testing::recipe_check c;
    c.recipe.clip_global_norm = 0.1;
    CHECK(ls::testing::accumulation_equals_big_batch<mlp_dropout>(s, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{},
                                                                  batches, c));
    ls::testing::recipe_check uneven = c;  // batches of 8, 40 and 16 rows (multiples of micro_shard_rows)
    uneven.split = {8, 40, 16};
    CHECK(ls::testing::accumulation_equals_big_batch<mlp_dropout>(s, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{},
                                                                  batches, uneven));
    host h(ls::device_selection::first(n));
    c.bitwise = false;
    CHECK(ls::testing::accumulation_equals_big_batch<mlp>(h, ls::sgd{.lr = 0.01f}, ls::softmax_cross_entropy{}, batches, c));
    uneven.bitwise = false;
    uneven.split = {5, 50, 9};
    CHECK(ls::testing::accumulation_equals_big_batch<mlp>(h, ls::sgd{.lr = 0.01f}, ls::softmax_cross_entropy{}, batches,
                                                          uneven));
  }
}

TEST_CASE("accumulation: an empty batch completes the update in progress, with or without its global batch") {
  const ls::adam opt{.lr = 1e-3f};
  const auto b = make_batch(6, 9);
  const auto check = [&](auto strategy_tag) {
    using S = typename decltype(strategy_tag)::type;
    S direct(ls::device_selection::first(2)), pending(ls::device_selection::first(2));
    auto want = direct.template replicate<mlp>(ls::seed{5});
    (void)ls::train_step(direct, want, opt, ls::softmax_cross_entropy{}, distributed(b, 2));
    for (const bool with_global : {true, false}) {
      CAPTURE(with_global);
      auto got = pending.template replicate<mlp>(ls::seed{5});
      (void)pending.accumulate(got, ls::softmax_cross_entropy{}, distributed(b, 2));
      ls::data::distributed_batch empty = distributed(make_batch(0, 1), 2);
      if (!with_global) empty.global = nullptr;  // as a batch made by hand may come
      const auto st = ls::train_step(pending, got, opt, ls::softmax_cross_entropy{}, empty);
      CHECK(st.count == 6);
      CHECK(got.step() == 1);
      CHECK(got.parameters_to_host() == want.parameters_to_host());
    }
  };
  check(std::type_identity<invariant>{});
  check(std::type_identity<host>{});
}
