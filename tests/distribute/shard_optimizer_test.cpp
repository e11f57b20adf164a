// strategy_options::shard_optimizer (ZeRO stage 1): each replica updates its 1/N of the
// parameters with its 1/N of the optimiser state, then the slices are gathered. The update is
// elementwise, so sharded training must give the very same bits as unsharded training, for every
// optimiser, replica count, determinism level and parameter count (also fewer parameters than
// replicas), and its state — put together for a checkpoint — must be the unsharded state.

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/lockstep.hpp>

#include <lockstep/testing/reducer.hpp>

#include "common.hpp"

namespace {

namespace ls = lockstep;
using dist_test::distributed;
using dist_test::make_batch;
using dist_test::step_sizes;

using host = ls::mirrored<ls::cpus>;
using invariant = ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus>;

// 784-13-10: 10 205 + 140 parameters, divisible by none of 2, 3, 4 (the slices are uneven).
using net = ls::sequential<ls::dense<784, 13>, ls::relu, ls::dropout<1, 4>, ls::dense<13, 10>>;

struct run_result {
  std::vector<float> params, state;
  std::vector<std::size_t> state_sizes;  // per replica
  bool replicas_identical = true;
};

// What a trained replicated model `m` holds: replica 0's parameters, the optimiser state put
// together, each replica's state size, and whether every replica holds replica 0's parameters.
template <class Model>
run_result result_of(const Model& m) {
  run_result r;
  r.params = m.parameters_to_host();
  r.state = m.optimizer_state_to_host();
  for (std::size_t k = 0; k < m.size(); ++k) {
    r.state_sizes.push_back(m.replica(k).optimizer_state().size());
    r.replicas_identical = r.replicas_identical &&
                           std::equal(r.params.begin(), r.params.end(), m.replica(k).model().parameters().data());
  }
  return r;
}

template <class Strategy, class Opt>
run_result train_sharded(std::size_t replicas, bool shard, const Opt& opt, std::size_t steps = 12) {
  Strategy s(ls::device_selection::first(replicas), ls::strategy_options{.micro_shard_rows = 8, .shard_optimizer = shard});
  auto m = s.template replicate<net>(ls::seed{5});
  CHECK(m.optimizer_sharded() == (shard && replicas > 1));
  for (std::size_t i = 0; i < steps; ++i) {
    const auto b = make_batch(step_sizes()[i], i);
    (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(b, replicas));
  }
  return result_of(m);
}

template <class Strategy, class Opt>
void check_sharded_is_unsharded(const Opt& opt, std::size_t arrays) {
  for (const std::size_t n : {2u, 3u, 4u}) {
    CAPTURE(n);
    const run_result plain = train_sharded<Strategy>(n, false, opt);
    const run_result sharded = train_sharded<Strategy>(n, true, opt);
    CHECK(sharded.replicas_identical);
    CHECK(sharded.params == plain.params);  // bitwise
    CHECK(sharded.state == plain.state);    // the checkpointed state does not depend on sharding
    REQUIRE(sharded.state.size() == arrays * ls::model<net>::param_count);
    // each replica keeps only its slice's state: arrays x (its share of the parameters)
    std::size_t total = 0;
    for (std::size_t r = 0; r < n; ++r) {
      // slices on the epilogue's grid where the reducer reduces onto them (host_allreduce)
      const auto [lo, hi] = Strategy::shards_on_grid ? ls::grid_slice(ls::model<net>::param_count, r, n)
                                                     : std::pair<std::size_t, std::size_t>{ls::model<net>::param_count * r / n,
                                                                                           ls::model<net>::param_count * (r + 1) / n};
      const std::size_t share = hi - lo;
      CHECK(sharded.state_sizes[r] == arrays * share);
      CHECK(plain.state_sizes[r] == arrays * ls::model<net>::param_count);
      total += sharded.state_sizes[r];
    }
    CHECK(total == sharded.state.size());
  }
}

}  // namespace

TEST_CASE("shard_optimizer: the same bits as the unsharded update, with 1/N of the state per replica") {
  SUBCASE("Adam, run_to_run") { check_sharded_is_unsharded<host>(ls::adam{.lr = 1e-3f}, 2); }
  SUBCASE("AdamW, run_to_run") { check_sharded_is_unsharded<host>(ls::adamw{.lr = 1e-3f, .weight_decay = 0.1f}, 2); }
  SUBCASE("SGD with Nesterov momentum, run_to_run") {
    check_sharded_is_unsharded<host>(ls::sgd{.lr = 0.05f, .momentum = 0.9f, .nesterov = true}, 1);
  }
  SUBCASE("Adam, replica_count_invariant") { check_sharded_is_unsharded<invariant>(ls::adam{.lr = 1e-3f}, 2); }
  SUBCASE("plain SGD keeps no state at all") { check_sharded_is_unsharded<host>(ls::sgd{.lr = 0.05f}, 0); }
}

TEST_CASE("shard_optimizer: replica_count_invariant stays invariant across replica counts and sharding") {
  const ls::adam opt{.lr = 1e-3f};
  const run_result one = train_sharded<invariant>(1, false, opt);
  for (const std::size_t n : {2u, 3u, 4u}) {
    CAPTURE(n);
    CHECK(train_sharded<invariant>(n, true, opt).params == one.params);
  }
}

TEST_CASE("shard_optimizer: fewer parameters than replicas (empty slices)") {
  using tiny = ls::sequential<ls::dense<1, 1>>;  // 2 parameters on 3 replicas: slices of 0, 1 and 1
  auto run = [](bool shard) {
    host s(ls::device_selection::first(3), ls::strategy_options{.shard_optimizer = shard});
    auto m = s.replicate<tiny>(ls::seed{3});
    for (std::size_t i = 0; i < 5; ++i) {
      ls::data::batch b;
      b.width = 1;
      b.target_width = 1;
      for (std::size_t r = 0; r < 4; ++r) {
        b.features.push_back(static_cast<float>(r + i) * 0.25f);
        b.targets.push_back(1.0f - static_cast<float>(r) * 0.5f);
        b.indices.push_back(i * 10 + r);
      }
      (void)ls::train_step(s, m, ls::adam{.lr = 0.1f}, ls::mse{}, distributed(b, 3));
    }
    CHECK(m.optimizer_sharded() == shard);
    if (shard) CHECK(m.replica(0).optimizer_state().size() == 0);
    return std::make_pair(m.parameters_to_host(), m.optimizer_state_to_host());
  };
  const auto plain = run(false);
  const auto sharded = run(true);
  CHECK(sharded.first == plain.first);
  CHECK(sharded.second == plain.second);
  CHECK(plain.first != std::vector<float>{0.0f, 0.0f});  // it trained
}

TEST_CASE("shard_optimizer: a checkpointed state resumes on another replica count, sharded or not, bitwise") {
  // replica_count_invariant, so that the replica count does not change the sums: any difference
  // would come from the state moving between shardings.
  const ls::adamw opt{.lr = 1e-3f, .weight_decay = 0.05f};
  const run_result ref = train_sharded<invariant>(2, false, opt, 12);
  // 6 steps sharded on 3 replicas; its parameters and state (put together, as a checkpoint holds
  // them) loaded into a sharded 4-replica model and an unsharded 1-replica one; 6 more steps each.
  const ls::strategy_options sharded{.micro_shard_rows = 8, .shard_optimizer = true};
  invariant three(ls::device_selection::first(3), sharded);
  auto a = three.replicate<net>(ls::seed{5});
  for (std::size_t i = 0; i < 6; ++i)
    (void)ls::train_step(three, a, opt, ls::softmax_cross_entropy{}, distributed(make_batch(step_sizes()[i], i), 3));
  const auto params = a.parameters_to_host();
  const auto state = a.optimizer_state_to_host();
  for (const bool shard : {true, false}) {
    CAPTURE(shard);
    const std::size_t n = shard ? 4 : 1;
    invariant s(ls::device_selection::first(n), ls::strategy_options{.micro_shard_rows = 8, .shard_optimizer = shard});
    auto b = s.replicate<net>(ls::seed{5});  // the seed keys dropout: a checkpoint restores it too
    b.load_parameters(params);
    b.load_optimizer_state(state);
    b.set_step(a.step());
    for (std::size_t i = 6; i < 12; ++i)
      (void)ls::train_step(s, b, opt, ls::softmax_cross_entropy{}, distributed(make_batch(step_sizes()[i], i), n));
    CHECK(b.parameters_to_host() == ref.params);
    CHECK(b.optimizer_state_to_host() == ref.state);
  }
}

namespace grid {
// A host reducer that reduces a sharded update's buckets onto the slices (reduces_to_slices_v),
// built on host_allreduce: each bucket is all-reduced, then wait() overwrites the part of the
// bucket outside the replica's own slice with NaN (the sums a reduce-scatter would not deliver
// there), so that any read of them — by the optimiser, the epilogue or the gather — shows in the
// parameters. The epilogue's chunk sums are summed with the same all-reduce, and the slices are
// gathered with one broadcast per slice.
class poisoning_slice_reducer {
public:
  using reducer_concept = ls::reducer_tag;
  template <class... Ds>
  static constexpr bool supports = ls::host_allreduce::supports<Ds...>;
  template <class Kind>
  static constexpr bool supports_kind = ls::host_allreduce::supports_kind<Kind>;
  static constexpr bool reduces_to_slices = true;

  explicit poisoning_slice_reducer(const ls::reducer_config& c = {}) : inner_(c), pending_(c.replicas) {}
  std::size_t workspace_bytes(std::size_t b) const { return inner_.workspace_bytes(b); }
  void bind(std::size_t r, void* p, std::size_t n) { inner_.bind(r, p, n); }
  template <class Ctx, class T>
  void start(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t id) {
    inner_.start(r, ctx, data, count, id);
  }
  template <class Ctx>
  void wait(std::size_t r, Ctx& ctx, std::size_t id) {
    inner_.wait(r, ctx, id);
    auto& mine = pending_[r];
    for (auto it = mine.begin(); it != mine.end(); ++it) {
      if (it->id != id) continue;
      for (std::size_t i = it->offset; i < it->offset + it->count; ++i)
        if (i < it->own.first || i >= it->own.second) it->grads[i] = std::numeric_limits<float>::quiet_NaN();
      mine.erase(it);
      return;
    }
  }
  template <class Ctx, class T>
  void broadcast(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t root) {
    inner_.broadcast(r, ctx, data, count, root);
  }
  void abort() noexcept { inner_.abort(); }
  void reset() noexcept { inner_.reset(); }

  template <class Ctx>
  void reduce_to_slices(std::size_t r, Ctx& ctx, float* grads, std::size_t offset, std::size_t count, std::size_t bucket,
                        std::span<const std::pair<std::size_t, std::size_t>> slices) {
    inner_.start(r, ctx, grads + offset, count, bucket);
    pending_[r].push_back({bucket, grads, offset, count, slices[r]});
    reductions_.fetch_add(1);
  }
  template <class Ctx>
  void sum_chunks(std::size_t r, Ctx& ctx, double* chunks, std::size_t count) {
    inner_.start(r, ctx, chunks, count, ls::collective_ids::all_reduce);
    inner_.wait(r, ctx, ls::collective_ids::all_reduce);
    chunk_sums_.fetch_add(1);
  }
  template <class Ctx>
  void gather_slices(std::size_t r, Ctx& ctx, float* params, std::span<const std::pair<std::size_t, std::size_t>> slices) {
    for (std::size_t k = 0; k < slices.size(); ++k)  // every replica calls every broadcast, in the same order
      inner_.broadcast(r, ctx, params + slices[k].first, slices[k].second - slices[k].first, k);
    gathers_.fetch_add(1);
  }

  std::atomic<std::size_t> reductions_{0}, chunk_sums_{0}, gathers_{0};  // calls, over all replicas

private:
  struct pending {
    std::size_t id;
    float* grads;
    std::size_t offset, count;
    std::pair<std::size_t, std::size_t> own;
  };
  ls::host_allreduce inner_;
  std::vector<std::vector<pending>> pending_;  // per replica, the buckets started and not yet waited for
};

using strategy = ls::basic_mirrored<poisoning_slice_reducer, ls::determinism::run_to_run, ls::cpus>;
static_assert(ls::reducer<poisoning_slice_reducer>);

struct run : run_result {
  std::vector<double> norms;
  std::size_t reductions = 0, chunk_sums = 0, gathers = 0;
};

template <class Strategy>
run train(std::size_t replicas, bool shard, const ls::update_recipe& recipe) {
  Strategy s(ls::device_selection::first(replicas), ls::strategy_options{.bucket_bytes = 4096, .shard_optimizer = shard});
  auto m = s.template replicate<net>(ls::seed{5});
  const ls::adamw opt{.lr = 1e-3f, .weight_decay = 0.05f};
  run out;
  for (std::size_t i = 0; i < 10; ++i) {
    auto b = make_batch(step_sizes()[i], i);
    if (i == 4 && recipe.nonfinite == ls::nonfinite_policy::skip)  // a non-finite gradient: the update is skipped
      b.features[3] = std::numeric_limits<float>::quiet_NaN();
    out.norms.push_back(ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(b, replicas), recipe).grad_norm);
  }
  static_cast<run_result&>(out) = result_of(m);
  if constexpr (std::is_same_v<Strategy, strategy>) {
    out.reductions = s.reducer().reductions_.load();
    out.chunk_sums = s.reducer().chunk_sums_.load();
    out.gathers = s.reducer().gathers_.load();
    CHECK(m.update_plan().on_grid() == (shard && replicas > 1));
    for (std::size_t r = 0; r < m.size(); ++r)
      CHECK(m.update_plan().slice(r) ==
            (m.update_plan().on_grid() ? ls::grid_slice(m.param_count, r, replicas)
                                       : std::pair<std::size_t, std::size_t>{0, m.param_count}));
  }
  return out;
}
}  // namespace grid

TEST_CASE("shard_optimizer with a reducer that reduces onto the slices: the epilogue's grid, the same bits, no sum read outside a replica's slice") {
  static_assert(ls::reduces_to_slices_v<grid::poisoning_slice_reducer>);
  static_assert(ls::reduces_to_slices_v<ls::host_allreduce>);  // the default host reducer reduces onto the slices too
  const ls::update_recipe plain_recipe{};
  const ls::update_recipe guarded{.clip_global_norm = 0.5, .nonfinite = ls::nonfinite_policy::skip, .ema = {.decay = 0.9}};
  for (const ls::update_recipe* recipe : {&plain_recipe, &guarded}) {
    for (const std::size_t n : {2u, 3u, 4u}) {
      CAPTURE(n);
      CAPTURE(recipe->clip_global_norm);
      const grid::run want = grid::train<host>(n, false, *recipe);
      const grid::run got = grid::train<grid::strategy>(n, true, *recipe);
      CHECK(got.replicas_identical);
      REQUIRE(got.params.size() == want.params.size());
      REQUIRE(got.state.size() == want.state.size());
      CHECK(std::memcmp(got.params.data(), want.params.data(), want.params.size() * sizeof(float)) == 0);
      CHECK(std::memcmp(got.state.data(), want.state.data(), want.state.size() * sizeof(float)) == 0);
      REQUIRE(got.norms.size() == want.norms.size());
      CHECK(std::memcmp(got.norms.data(), want.norms.data(), want.norms.size() * sizeof(double)) == 0);
      CHECK(got.reductions > 0);                                   // the buckets went through reduce_to_slices
      CHECK(got.gathers == 10 * n - (recipe == &guarded ? n : 0));  // every update but the skipped one gathered
      CHECK(got.chunk_sums == (recipe->needs_epilogue() ? 10 * n : 0));
      std::size_t total = 0;
      for (std::size_t r = 0; r < n; ++r) {
        const auto [lo, hi] = ls::grid_slice(ls::model<net>::param_count, r, n);
        CHECK(got.state_sizes[r] == 2 * (hi - lo));
        total += got.state_sizes[r];
      }
      CHECK(total == got.state.size());
      // unsharded, the same reducer is a plain all-reduce
      const grid::run whole = grid::train<grid::strategy>(n, false, *recipe);
      CHECK(whole.reductions == 0);
      REQUIRE(whole.params.size() == want.params.size());
      CHECK(std::memcmp(whole.params.data(), want.params.data(), want.params.size() * sizeof(float)) == 0);
    }
  }
}

// The public reducer suite, with its reduces_to_slices part.
TEST_CASE_TEMPLATE_INVOKE(lockstep_reducer_conformance, grid::poisoning_slice_reducer);

TEST_CASE("shard_optimizer: slices on the grid cannot change after the first update") {
  host s(ls::device_selection::first(2), ls::strategy_options{.shard_optimizer = true});
  auto m = s.replicate<net>(ls::seed{5});
  m.set_optimizer_sharding(true, true);  // before any update: allowed
  CHECK(m.update_plan().on_grid());
  CHECK(m.update_plan().slice(1) == ls::grid_slice(m.param_count, 1, 2));
  (void)ls::train_step(s, m, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{}, distributed(make_batch(8, 0), 2));
  CHECK_THROWS_AS(m.set_optimizer_sharding(true, false), ls::config_error);
  CHECK_NOTHROW(m.set_optimizer_sharding(true, true));
}

namespace user {
// An optimiser that does not say it is elementwise (its update could read other parameters).
struct normalised_sgd {
  using optimizer_concept = lockstep::optimizer_tag;
  float lr = 0.1f;
  std::size_t state_size(std::size_t) const { return 0; }
  template <class T, class Ctx>
  void update(Ctx&, T* p, const T* g, T*, std::size_t n, const lockstep::update_info& u) const {
    double norm = 0;
    for (std::size_t i = 0; i < n; ++i) norm += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    const double k = norm > 0 ? u.lr / std::sqrt(norm) : 0.0;
    for (std::size_t i = 0; i < n; ++i) p[i] -= static_cast<T>(k * static_cast<double>(g[i]));
  }
};
}  // namespace user

TEST_CASE("shard_optimizer: an optimiser that is not elementwise is refused, naming the option") {
  host s(ls::device_selection::first(2), ls::strategy_options{.shard_optimizer = true});
  auto m = s.replicate<net>(ls::seed{1});
  const auto b = make_batch(16, 0);
  std::string msg;
  try {
    (void)ls::train_step(s, m, user::normalised_sgd{}, ls::softmax_cross_entropy{}, distributed(b, 2));
  } catch (const ls::replica_error& e) {  // both replicas refuse; the first to fail is reported
    try {
      std::rethrow_if_nested(e);
    } catch (const ls::config_error& inner) {
      msg = inner.what();
    }
  }
  CHECK(msg.find("shard_optimizer") != std::string::npos);
  CHECK(msg.find("elementwise") != std::string::npos);
  // unsharded, the same optimiser trains
  host plain(ls::device_selection::first(2));
  auto m2 = plain.replicate<net>(ls::seed{1});
  CHECK_NOTHROW((void)ls::train_step(plain, m2, user::normalised_sgd{}, ls::softmax_cross_entropy{}, distributed(b, 2)));
}

namespace {
// Whether the default setting (optimizer_sharding::automatic()) shards a model of `replicas`
// replicas of strategy S trained by `opt`, decided at its first update.
template <class S, class Opt>
bool shards_by_default(std::size_t replicas, const Opt& opt) {
  S s(ls::device_selection::first(replicas));
  auto m = s.template replicate<net>(ls::seed{3});
  (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(make_batch(12, 0), replicas));
  return m.optimizer_sharded();
}
}  // namespace

TEST_CASE("shard_optimizer, automatic: host replicas shard Adam, AdamW and SGD with momentum where the reducer reduces onto the slices, Adam and AdamW elsewhere") {
  using to_one = ls::basic_mirrored<ls::reduce_to_one_device<ls::cpu<0>>, ls::determinism::run_to_run, ls::cpus>;
  static_assert(host::shards_on_grid && !to_one::shards_on_grid);
  // host replicas run the epilogue on their own (host) gradient in either value type
  static_assert(host::shards_on_grid_for<float> && host::shards_on_grid_for<double> && !to_one::shards_on_grid_for<float>);
  const ls::sgd plain{.lr = 0.01f}, momentum{.lr = 0.01f, .momentum = 0.9f};
  const ls::adam adam{.lr = 1e-3f};
  const ls::adamw adamw{.lr = 1e-3f};
  for (const std::size_t n : {2u, 3u}) {
    CAPTURE(n);
    CHECK(shards_by_default<host>(n, adam));
    CHECK(shards_by_default<host>(n, adamw));
    CHECK(shards_by_default<host>(n, momentum));
    CHECK_FALSE(shards_by_default<host>(n, plain));  // no state to split
    CHECK(shards_by_default<to_one>(n, adamw));
    CHECK_FALSE(shards_by_default<to_one>(n, momentum));
    CHECK(shards_by_default<invariant>(n, momentum));
  }
  CHECK_FALSE(shards_by_default<host>(1, adamw));  // one replica has nothing to split
}
