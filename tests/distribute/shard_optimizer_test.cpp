// strategy_options::shard_optimizer (ZeRO stage 1): each replica updates its 1/N of the
// parameters with its 1/N of the optimiser state, then copies the others' slices. The update is
// elementwise, so sharded training must give the very same bits as unsharded training, for every
// optimiser, replica count, determinism level and parameter count (also fewer parameters than
// replicas), and its state — put together for a checkpoint — must be the unsharded state.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/lockstep.hpp>

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

template <class Strategy, class Opt>
run_result train_sharded(std::size_t replicas, bool shard, const Opt& opt, std::size_t steps = 12) {
  Strategy s(ls::device_selection::first(replicas), ls::strategy_options{.micro_shard_rows = 8, .shard_optimizer = shard});
  auto m = s.template replicate<net>(ls::seed{5});
  CHECK(m.optimizer_sharded() == (shard && replicas > 1));
  for (std::size_t i = 0; i < steps; ++i) {
    const auto b = make_batch(step_sizes()[i], i);
    (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(b, replicas));
  }
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
      const std::size_t share = ls::model<net>::param_count * (r + 1) / n - ls::model<net>::param_count * r / n;
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
