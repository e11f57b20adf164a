// Device kinds as types, device counts at run time: the run-time form mirrored<cpus> trains over
// any number of host replicas from one instantiation and equals the static form; bad device lists
// are refused naming the value and the limit; a model is bound to the strategy that made it.

#include <doctest/doctest.h>

#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "distribute/common.hpp"

using namespace dist_test;
namespace ls = lockstep;

/// A device kind of this test whose ordinals must name existing devices (as GPUs must).
struct accel {
  using kind_type = accel;  ///< a kind is its own kind
};
template <>
struct lockstep::backend_traits<accel> {
  static constexpr bool registered = true;
  static constexpr const char* name = "accel";
  static constexpr bool ordinals_bounded = true;
};

namespace {

using runtime_host = ls::mirrored<ls::cpus>;
using runtime_invariant = ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus>;

// One instantiation per kind: every host mirrored form shares its core class and model type.
template <class S>
using core_t = std::remove_reference_t<decltype(ls::detail::core_of(std::declval<S&>()))>;
static_assert(std::is_same_v<core_t<ls::mirrored<ls::cpu<0>, ls::cpu<1>>>, core_t<runtime_host>>);
static_assert(std::is_same_v<core_t<ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>>, core_t<runtime_host>>);
static_assert(std::is_same_v<core_t<runtime_host>, ls::mirrored_strategy<ls::cpus, ls::host_allreduce,
                                                                          ls::determinism::run_to_run>>);
static_assert(std::is_same_v<ls::mirrored<ls::cpu<0>, ls::cpu<1>>::model_type<mlp>, runtime_host::model_type<mlp>>);
static_assert(std::is_same_v<ls::one_device<ls::cpu<3>>::model_type<mlp>, runtime_host::model_type<mlp>>);
static_assert(std::is_same_v<ls::replicated<mlp, ls::cpu<0>>, ls::replicated<mlp, ls::cpu<7>>>);
static_assert(std::is_same_v<ls::buffer<float, ls::cpu<0>>, ls::buffer<float, ls::cpus>>);
static_assert(std::is_same_v<ls::context_t<ls::cpu<5>>, ls::host_context>);
static_assert(ls::strategy<runtime_host> && ls::strategy<runtime_invariant>);
static_assert(ls::device_backend<ls::cpus>);
static_assert(std::is_same_v<ls::kind_of_t<ls::cpu<4>>, ls::cpus> && std::is_same_v<ls::kind_of_t<ls::gpu<1>>, ls::gpus>);
static_assert(std::is_same_v<ls::kind_of_t<ls::cpus>, ls::cpus>);

template <std::size_t... I>
auto static_host(std::index_sequence<I...>) -> ls::mirrored<ls::cpu<I>...>;

/// The static form over cpu<0> .. cpu<N-1>, trained for the 20 steps.
template <std::size_t N, class Opt>
std::vector<float> train_static(const Opt& opt) {
  decltype(static_host(std::make_index_sequence<N>{})) s;
  return train<mlp>(s, opt);
}

std::string message_of(const auto& f) {
  try {
    f();
  } catch (const ls::config_error& e) {
    return e.what();
  }
  return "(no config_error)";
}

}  // namespace

TEST_CASE("mirrored<cpus>: 1, 2, 3 and 5 replicas from one instantiation train like the static form") {
  const ls::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  const std::vector<std::vector<float>> fixed{train_static<1>(opt), train_static<2>(opt), train_static<3>(opt),
                                              train_static<5>(opt)};
  const std::size_t counts[] = {1, 2, 3, 5};
  for (std::size_t i = 0; i < 4; ++i) {
    const std::size_t n = counts[i];
    CAPTURE(n);
    runtime_host s(ls::device_selection::first(n));
    REQUIRE(s.num_replicas() == n);
    bool identical = false;
    const auto p = train<mlp>(s, opt, &identical);
    CHECK(identical);
    REQUIRE(p.size() == fixed[i].size());
    CHECK(p == fixed[i]);  // same reducer, same summation order: bitwise
    CHECK(relative_difference(p, fixed[0]) <= 1e-5);
  }
}

TEST_CASE("mirrored<cpus> under replica_count_invariant: 1, 2, 3 and 5 replicas are bitwise equal") {
  const ls::adam opt{.lr = 1e-3f};
  std::vector<float> first;
  for (std::size_t n : {1u, 2u, 3u, 5u}) {
    CAPTURE(n);
    runtime_invariant s(ls::device_selection::first(n), ls::strategy_options{.micro_shard_rows = 8});
    const auto p = train<mlp_dropout>(s, opt);
    REQUIRE(!p.empty());
    if (first.empty()) first = p;
    CHECK(p == first);
  }
}

TEST_CASE("mirrored<cpus>: the default is one replica per allowed core, and explicit ordinals name the replicas") {
  runtime_host all;
  CHECK(all.num_replicas() == static_cast<std::size_t>(ls::allowed_cpu_count()));
  runtime_host picked({4, 0, 9});
  CHECK(picked.num_replicas() == 3);
  CHECK(picked.device_ordinals() == std::vector<std::size_t>{4, 0, 9});
  CHECK(picked.description() == "mirrored over cpu devices {4, 0, 9}");
  // More replicas than cores: they share the cores and still train.
  runtime_host over(ls::device_selection::first(static_cast<std::size_t>(ls::allowed_cpu_count()) + 3));
  bool identical = false;
  CHECK(!train<mlp>(over, ls::sgd{.lr = 0.05f}, &identical).empty());
  CHECK(identical);
}

TEST_CASE("bad device lists are refused with a config_error naming the value and the limit") {
  const auto repeated = message_of([] { runtime_host s({0, 1, 0}); });
  CHECK(repeated.find("cpu device 0 appears twice in the device list {0, 1, 0}") != std::string::npos);
  const auto zero = message_of([] { runtime_host s(ls::device_selection::first(0)); });
  CHECK(zero.find("must be at least 1, got 0") != std::string::npos);
  const auto empty = message_of([] { runtime_host s(ls::device_selection(std::vector<std::size_t>{})); });
  CHECK(empty.find("the device list is empty") != std::string::npos);
  // A kind whose ordinals must exist (like GPUs): checked against the visible count.
  const auto missing = message_of([] { (void)ls::resolve_devices<accel>(ls::device_selection{0, 3}, 2, "who"); });
  CHECK(missing.find("accel device 3 does not exist: 2 accel device(s) are visible (ordinals 0..1)") != std::string::npos);
  const auto too_many = message_of([] { (void)ls::resolve_devices<accel>(ls::device_selection::first(3), 2, "who"); });
  CHECK(too_many.find("asked for 3 accel devices, but 2 are visible") != std::string::npos);
  const auto none = message_of([] { (void)ls::resolve_devices<accel>(ls::device_selection{}, 0, "who"); });
  CHECK(none.find("no accel device is visible") != std::string::npos);
  CHECK(ls::resolve_devices<accel>(ls::device_selection{}, 3, "who") == std::vector<std::size_t>{0, 1, 2});
  CHECK(ls::resolve_devices<accel>(ls::device_selection{2, 0}, 3, "who") == std::vector<std::size_t>{2, 0});
  // Host replicas may outnumber the cores: any ordinal is valid.
  CHECK(ls::resolve_devices<ls::cpus>(ls::device_selection{100}, 2, "who") == std::vector<std::size_t>{100});
}

TEST_CASE("a model is bound to the strategy that made it: another strategy refuses it, naming both") {
  runtime_host three(ls::device_selection::first(3));
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> two;
  auto m = three.replicate<mlp>(ls::seed{1});
  const auto b = make_batch(12, 0);
  const auto msg = message_of([&] { ls::train_step(two, m, ls::sgd{}, ls::softmax_cross_entropy{}, distributed(b, 2)); });
  CHECK(msg.find("made by another strategy (mirrored over cpu devices {0, 1, 2})") != std::string::npos);
  CHECK(msg.find("this one (mirrored over cpu devices {0, 1})") != std::string::npos);
  auto data = ls::data::from_memory(std::vector<float>(b.features), 784, std::vector<std::int32_t>(b.labels)) |
              ls::data::batched(6);
  CHECK_THROWS_AS((void)ls::evaluate(two, m, ls::softmax_cross_entropy{}, data), ls::config_error);
  CHECK_THROWS_AS((void)ls::predict(two, m, data), ls::config_error);
  CHECK_THROWS_AS((void)ls::fit(two, m, ls::sgd{}, ls::softmax_cross_entropy{}, data, {.quiet = true}), ls::config_error);
  // Even a strategy of the same shape did not make it.
  runtime_host other_three(ls::device_selection::first(3));
  CHECK_THROWS_AS(other_three.broadcast(m), ls::config_error);
  // Its own strategy takes it.
  CHECK(ls::train_step(three, m, ls::sgd{}, ls::softmax_cross_entropy{}, distributed(b, 3)).count == 12);
  CHECK(ls::evaluate(three, m, ls::softmax_cross_entropy{}, data).samples == 12);
}
