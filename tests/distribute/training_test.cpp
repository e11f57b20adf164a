// Training equivalence: N replicas on the same global batches train the same model as one device
// (within float tolerance, for both host reducers, SGD with momentum and Adam), replica counts
// give bitwise-identical results under replica_count_invariant, and runs repeat bitwise.

#include <doctest/doctest.h>

#include <cstring>
#include <utility>

#include "distribute/common.hpp"

using namespace dist_test;
namespace ls = lockstep;

namespace {

template <class Reducer, ls::determinism Det, std::size_t... I>
auto make_strategy_type(std::index_sequence<I...>) -> ls::basic_mirrored<Reducer, Det, ls::cpu<I>...>;

/// basic_mirrored over cpu<0> .. cpu<N-1>.
template <class Reducer, std::size_t N, ls::determinism Det = ls::determinism::run_to_run>
using host_strategy = decltype(make_strategy_type<Reducer, Det>(std::make_index_sequence<N>{}));

template <std::size_t N>
using to_last = ls::reduce_to_one_device<ls::cpu<N - 1>>;

template <class Opt>
void check_against_one_device(const Opt& opt) {
  ls::one_device<ls::cpu<0>> one;
  bool same = false;
  const auto ref = train<mlp>(one, opt, &same);
  REQUIRE(ref.size() == ls::replicated<mlp>::param_count);
  CHECK(same);
  const auto check = [&](auto strategy_tag, const char* reducer) {
    using S = typename decltype(strategy_tag)::type;
    S s;
    bool identical = false;
    const auto p = train<mlp>(s, opt, &identical);
    CAPTURE(S::replica_count);
    CAPTURE(reducer);
    REQUIRE(p.size() == ref.size());
    CHECK(identical);
    CHECK(relative_difference(p, ref) <= 1e-5);
  };
  check(std::type_identity<host_strategy<ls::host_allreduce, 1>>{}, "host_allreduce");
  check(std::type_identity<host_strategy<ls::host_allreduce, 2>>{}, "host_allreduce");
  check(std::type_identity<host_strategy<ls::host_allreduce, 3>>{}, "host_allreduce");
  check(std::type_identity<host_strategy<ls::host_allreduce, 4>>{}, "host_allreduce");
  check(std::type_identity<host_strategy<to_last<1>, 1>>{}, "reduce_to_one_device");
  check(std::type_identity<host_strategy<to_last<2>, 2>>{}, "reduce_to_one_device");
  check(std::type_identity<host_strategy<to_last<3>, 3>>{}, "reduce_to_one_device");
  check(std::type_identity<host_strategy<to_last<4>, 4>>{}, "reduce_to_one_device");
}

template <std::size_t N, class Opt>
std::vector<float> train_invariant(const Opt& opt) {
  host_strategy<ls::host_allreduce, N, ls::determinism::replica_count_invariant> s(
      ls::strategy_options{.micro_shard_rows = 8});
  bool identical = false;
  auto p = train<mlp_dropout>(s, opt, &identical);
  CHECK(identical);
  return p;
}

template <class Opt>
void check_invariant(const Opt& opt) {
  const auto p1 = train_invariant<1>(opt);
  REQUIRE(p1.size() == ls::replicated<mlp_dropout>::param_count);
  const auto p2 = train_invariant<2>(opt);
  const auto p3 = train_invariant<3>(opt);
  const auto p4 = train_invariant<4>(opt);
  const std::size_t bytes = p1.size() * sizeof(float);
  REQUIRE(p2.size() == p1.size());
  REQUIRE(p3.size() == p1.size());
  REQUIRE(p4.size() == p1.size());
  CHECK(std::memcmp(p1.data(), p2.data(), bytes) == 0);
  CHECK(std::memcmp(p1.data(), p3.data(), bytes) == 0);
  CHECK(std::memcmp(p1.data(), p4.data(), bytes) == 0);
  // Training did move the parameters (the comparison is not of untouched initial values).
  ls::one_device<ls::cpu<0>> one;
  const auto initial = one.replicate<mlp_dropout>(ls::seed{42}).parameters_to_host();
  CHECK(std::memcmp(initial.data(), p1.data(), bytes) != 0);
}

}  // namespace

TEST_CASE("N replicas train like one device: SGD with momentum") {
  check_against_one_device(ls::sgd{.lr = 0.05f, .momentum = 0.9f});
}

TEST_CASE("N replicas train like one device: Adam") { check_against_one_device(ls::adam{.lr = 1e-3f}); }

TEST_CASE("replica_count_invariant: bitwise identical for 1, 2, 3 and 4 replicas: SGD with momentum") {
  check_invariant(ls::sgd{.lr = 0.05f, .momentum = 0.9f});
}

TEST_CASE("replica_count_invariant: bitwise identical for 1, 2, 3 and 4 replicas: Adam") {
  check_invariant(ls::adam{.lr = 1e-3f});
}

TEST_CASE("run_to_run: two runs of one configuration are bitwise equal") {
  const auto run = [] {
    ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> s;
    return train<mlp_dropout>(s, ls::adam{.lr = 1e-3f});
  };
  const auto a = run(), b = run();
  REQUIRE(a.size() == ls::replicated<mlp_dropout>::param_count);
  REQUIRE(b.size() == a.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

TEST_CASE("bucketed all-reduce gives exactly the unbucketed result") {
  const auto run = [](std::size_t bucket_bytes) {
    ls::mirrored<ls::cpu<0>, ls::cpu<1>> s(ls::strategy_options{.bucket_bytes = bucket_bytes});
    return train<mlp>(s, ls::sgd{.lr = 0.05f, .momentum = 0.9f});
  };
  const auto per_layer = run(0), one_bucket = run(std::size_t{1} << 30);
  REQUIRE(per_layer.size() == one_bucket.size());
  CHECK(std::memcmp(per_layer.data(), one_bucket.data(), per_layer.size() * sizeof(float)) == 0);
}

TEST_CASE("train_step reports the exact global loss sum and count") {
  const auto b = make_batch(37, 5);
  ls::one_device<ls::cpu<0>> one;
  auto m1 = one.replicate<mlp>(ls::seed{3});
  const auto ref = ls::train_step(one, m1, ls::sgd{.lr = 0.0f}, ls::softmax_cross_entropy{}, distributed(b, 1));
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>, ls::cpu<3>> four;
  auto m4 = four.replicate<mlp>(ls::seed{3});
  const auto got = ls::train_step(four, m4, ls::sgd{.lr = 0.0f}, ls::softmax_cross_entropy{}, distributed(b, 4));
  CHECK(got.count == 37);
  CHECK(ref.count == 37);
  CHECK(got.loss_sum == doctest::Approx(ref.loss_sum).epsilon(1e-6));
  CHECK(m4.step() == 1);
  // An empty global batch changes nothing.
  const auto none = ls::train_step(four, m4, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, distributed(make_batch(0, 1), 4));
  CHECK(none.count == 0);
  CHECK(m4.step() == 1);
}
