// Failure behaviour: an exception in one replica reaches the caller quickly, as a replica_error
// naming the replica (and the step) with the original exception nested; the other replicas
// are released from their collectives, a stalled replica trips the timeout with a message naming
// it, the strategy works again afterwards (a failed step changes nothing), and no thread leaks.

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

#include "distribute/common.hpp"

using namespace dist_test;
namespace ls = lockstep;

namespace {

std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

using three = ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>;

// Trains 6 steps; at step `fail_step` replica `bad` gets a shard of the wrong width, so it throws
// before its first collective while the others wait in one. Returns the final parameters.
std::vector<float> train_with_failure(three& s, std::size_t bad, std::size_t fail_step) {
  auto m = s.replicate<mlp>(ls::seed{5});
  const ls::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  for (std::size_t i = 0; i < 6; ++i) {
    auto d = distributed(make_batch(30, i), 3);
    if (i == fail_step) {
      const auto before = m.parameters_to_host();
      d.shards[bad].width = 783;
      const auto t0 = std::chrono::steady_clock::now();
      const auto inner = expect_replica_error<ls::shape_error>(
          [&] { ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, d); }, bad, i);
      CHECK(inner.find("783 features") != std::string::npos);
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
      // The failed step changed nothing, and the replicas still agree.
      CHECK(m.step() == i);
      CHECK(m.parameters_to_host() == before);
      for (std::size_t r = 1; r < 3; ++r)
        CHECK(std::equal(before.begin(), before.end(), m.replica(r).model().parameters().data()));
      continue;
    }
    ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, d);
  }
  return m.parameters_to_host();
}

}  // namespace

TEST_CASE("an exception in one replica's step reaches the caller, and the strategy works again" * doctest::timeout(5)) {
  three s;
  const auto reference = train_with_failure(s, 0, 99);  // no failure; skips nothing
  for (std::size_t bad : {0u, 2u}) {
    CAPTURE(bad);
    three fresh;
    const auto got = train_with_failure(fresh, bad, 3);
    // Same as training without batch 3: compare with a run that skips it.
    three ref_s;
    auto m = ref_s.replicate<mlp>(ls::seed{5});
    for (std::size_t i = 0; i < 6; ++i)
      if (i != 3) ls::train_step(ref_s, m, ls::sgd{.lr = 0.05f, .momentum = 0.9f}, ls::softmax_cross_entropy{}, distributed(make_batch(30, i), 3));
    CHECK(got == m.parameters_to_host());
    CHECK(got != reference);
  }
}

TEST_CASE("an exception thrown by run's function reaches the caller naming its replica, its type nested" * doctest::timeout(5)) {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>, ls::cpu<3>> s;
  const auto d = distributed(make_batch(8, 0), 4);
  for (std::size_t bad = 0; bad < 4; ++bad) {
    CAPTURE(bad);
    const auto inner = expect_replica_error<std::invalid_argument>(
        [&] {
          s.run(
              [&](std::size_t r, const ls::data::shard&) {
                if (r == bad) throw std::invalid_argument("injected in replica " + std::to_string(r));
                ls::host_context ctx;
                float v = 1;
                s.all_reduce(r, ctx, &v, 1);  // the others block here until released
              },
              d);
        },
        bad);
    CHECK(inner == "injected in replica " + std::to_string(bad));
    // Afterwards collectives work again.
    const auto ok = s.run(
        [&](std::size_t r, const ls::data::shard&) {
          ls::host_context ctx;
          float v = static_cast<float>(r);
          s.all_reduce(r, ctx, &v, 1);
          return v;
        },
        d);
    for (float v : ok) CHECK(v == 6.0f);
  }
}

TEST_CASE("a stalled replica trips the timeout, which names it" * doctest::timeout(5)) {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> s(ls::strategy_options{.timeout = std::chrono::milliseconds(200)});
  const auto d = distributed(make_batch(6, 0), 3);
  std::string message;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    s.run(
        [&](std::size_t r, const ls::data::shard&) {
          if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(800));
          ls::host_context ctx;
          float v = 1;
          s.all_reduce(r, ctx, &v, 1);
        },
        d);
  } catch (const ls::timeout_error& e) {
    message = e.what();
  }
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3));
  CAPTURE(message);
  CHECK(message.find("replica(s) 1 did not arrive") != std::string::npos);
  CHECK(message.find(ls::collective_ids::name(ls::collective_ids::all_reduce)) != std::string::npos);  // the collective it waited in
  // Usable again.
  const auto v = s.run([](std::size_t r, const ls::data::shard&) { return r; }, d);
  CHECK(s.reduce(ls::reduce_op::sum, v) == 3);
}

TEST_CASE("a timeout of milliseconds::max() waits without limit (its deadline would overflow)" * doctest::timeout(5)) {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> s(ls::strategy_options{.timeout = std::chrono::milliseconds::max()});
  const auto d = distributed(make_batch(6, 0), 3);
  const auto sums = s.run(
      [&](std::size_t r, const ls::data::shard&) {
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others wait for it
        ls::host_context ctx;
        float v = static_cast<float>(r + 1);
        s.all_reduce(r, ctx, &v, 1);
        return v;
      },
      d);
  for (const float v : sums) CHECK(v == 6.0f);
}

TEST_CASE("no thread leaks: workers are persistent and joined with the strategy" * doctest::timeout(5)) {
  const std::size_t base = thread_count();
  {
    ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>, ls::cpu<3>> s;
    CHECK(thread_count() == base + 3);  // replicas 1-3; replica 0 runs on this thread
    auto m = s.replicate<mlp>(ls::seed{1});
    for (std::size_t i = 0; i < 3; ++i) {
      auto d = distributed(make_batch(9, i), 4);
      if (i == 1) d.shards[2].width = 1;
      if (i == 1)
        (void)expect_replica_error<ls::shape_error>([&] { ls::train_step(s, m, ls::adam{}, ls::softmax_cross_entropy{}, d); }, 2, 1);
      else
        ls::train_step(s, m, ls::adam{}, ls::softmax_cross_entropy{}, d);
      CHECK(thread_count() == base + 3);
    }
    CHECK(m.step() == 2);
  }
  CHECK(thread_count() == base);
  {
    ls::one_device<ls::cpu<0>> one;  // the single replica runs on the caller's thread
    CHECK(thread_count() == base);
    auto m = one.replicate<mlp>(ls::seed{1});
    auto d = distributed(make_batch(4, 0), 1);
    d.shards[0].width = 3;
    // ... and its failure is named like any other replica's
    (void)expect_replica_error<ls::shape_error>([&] { ls::train_step(one, m, ls::adam{}, ls::softmax_cross_entropy{}, d); }, 0, 0);
  }
}

TEST_CASE("a non-standard exception in a replica is still a replica_error with the original nested" * doctest::timeout(5)) {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  const auto d = distributed(make_batch(4, 0), 2);
  bool got = false;
  try {
    s.run([](std::size_t r, const ls::data::shard&) { if (r == 1) throw 42; }, d);
  } catch (const ls::replica_error& e) {
    CHECK(e.replica() == 1);
    try {
      std::rethrow_if_nested(e);
    } catch (int v) {
      got = v == 42;
    }
  }
  CHECK(got);
}

TEST_CASE("broadcast re-synchronises replicas whose optimiser states a failure left in different sizes") {
  // As an update that failed part-way in its first step leaves them: some replicas made their
  // state, others not. broadcast gives every replica root's parameters and state, in root's size
  // (an update that is not sharded: under a sharded one each replica's slice of the state is its own).
  const ls::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  for (const std::size_t root : {0u, 1u}) {
    CAPTURE(root);
    three s(ls::strategy_options{.shard_optimizer = false});
    auto m = s.replicate<mlp>(ls::seed{5});
    ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(make_batch(30, 0), 3));  // every replica has state
    m.replica(1).reset_optimizer_state(ls::sgd{});  // replica 1: none (sgd without momentum keeps no state)
    for (float& p : m.replica(2).model().parameters().span()) p += 1.0f;
    s.broadcast(m, root);
    const std::size_t want = m.replica(root).optimizer_state().size();
    CHECK(want == (root == 1 ? 0u : decltype(m)::param_count));
    const auto p = m.replica(root).model().parameters().span();
    std::vector<float> state(m.replica(root).optimizer_state().span().begin(), m.replica(root).optimizer_state().span().end());
    for (std::size_t r = 0; r < 3; ++r) {
      CHECK(std::equal(p.begin(), p.end(), m.replica(r).model().parameters().data()));
      REQUIRE(m.replica(r).optimizer_state().size() == want);
      CHECK(std::equal(state.begin(), state.end(), m.replica(r).optimizer_state().span().begin()));
    }
    // and training goes on alike on every replica (from root 1, whose state was none, each replica
    // makes its state afresh: the update's optimiser may differ from the one that left none)
    ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(make_batch(30, 1), 3));
    const auto q = m.parameters_to_host();
    for (std::size_t r = 1; r < 3; ++r) CHECK(std::equal(q.begin(), q.end(), m.replica(r).model().parameters().data()));
    for (std::size_t r = 0; r < 3; ++r) CHECK(m.replica(r).optimizer_state().size() == decltype(m)::param_count);
  }
}
