// The host reducers against a naive sum (same order 0..N-1, so bitwise equal) for lengths 0, 1,
// primes and 10^7, for 1 to 4 replicas, each replica driving the reducer from its own thread.

#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/distribute/reducers/detail/rendezvous.hpp>

#include "distribute/common.hpp"

namespace ls = lockstep;

namespace {

float value(std::size_t i, std::size_t r) { return static_cast<float>((i * 2654435761u + r * 97u) % 1000u) * 1e-3f - 0.5f; }

template <class Reducer>
void check_all_reduce(std::size_t replicas, std::size_t length) {
  CAPTURE(replicas);
  CAPTURE(length);
  std::vector<std::vector<float>> data(replicas, std::vector<float>(length));
  for (std::size_t r = 0; r < replicas; ++r)
    for (std::size_t i = 0; i < length; ++i) data[r][i] = value(i, r);
  std::vector<float> expect(length);
  for (std::size_t i = 0; i < length; ++i) {
    float s = data[0][i];
    for (std::size_t r = 1; r < replicas; ++r) s += data[r][i];
    expect[i] = s;
  }
  Reducer red(ls::reducer_config{replicas, std::chrono::milliseconds(20'000), ls::collective_ids::count, replicas - 1});
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < replicas; ++r)
    threads.emplace_back([&, r] {
      ls::host_context ctx;
      // Two buckets over the two halves, started in order, waited in order.
      const std::size_t half = length / 2;
      red.start(r, ctx, data[r].data(), half, 0);
      red.start(r, ctx, data[r].data() + half, length - half, 1);
      red.wait(r, ctx, 0);
      red.wait(r, ctx, 1);
    });
  for (auto& t : threads) t.join();
  for (std::size_t r = 0; r < replicas; ++r)
    CHECK((length == 0 || std::memcmp(data[r].data(), expect.data(), length * sizeof(float)) == 0));
}

template <class Reducer>
void sweep() {
  for (std::size_t n = 1; n <= 4; ++n)
    for (std::size_t len : {0u, 1u, 2u, 3u, 7u, 13u, 31u, 1009u, 65537u}) check_all_reduce<Reducer>(n, len);
}

}  // namespace

TEST_CASE("host_allreduce equals the naive sum for lengths 0, 1 and primes") { sweep<ls::host_allreduce>(); }

TEST_CASE("reduce_to_one_device equals the naive sum for lengths 0, 1 and primes") {
  sweep<ls::reduce_to_one_device<ls::cpu<0>>>();
}

TEST_CASE("host_allreduce equals the naive sum for 10^7 elements") {
  for (std::size_t n = 1; n <= 4; ++n) check_all_reduce<ls::host_allreduce>(n, 10'000'000);
}

TEST_CASE("broadcast copies the root's data to every replica") {
  for (std::size_t n = 1; n <= 4; ++n)
    for (std::size_t root = 0; root < n; ++root) {
      std::vector<std::vector<double>> data(n, std::vector<double>(101));
      for (std::size_t r = 0; r < n; ++r)
        for (std::size_t i = 0; i < 101; ++i) data[r][i] = static_cast<double>(r * 1000 + i);
      ls::host_allreduce red(ls::reducer_config{n, std::chrono::milliseconds(20'000), ls::collective_ids::count, 0});
      std::vector<std::thread> threads;
      for (std::size_t r = 0; r < n; ++r)
        threads.emplace_back([&, r] {
          ls::host_context ctx;
          red.broadcast(r, ctx, data[r].data(), 101, root);
        });
      for (auto& t : threads) t.join();
      for (std::size_t r = 0; r < n; ++r) CHECK(data[r] == data[root]);
    }
}

TEST_CASE("strategy::reduce combines per-replica values in every mode") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> s;
  const std::vector<double> v{1.5, -2.0, 4.0};
  CHECK(s.reduce(ls::reduce_op::sum, v) == 3.5);
  CHECK(s.reduce(ls::reduce_op::mean, v) == doctest::Approx(3.5 / 3));
  CHECK(s.reduce(ls::reduce_op::min, v) == -2.0);
  CHECK(s.reduce(ls::reduce_op::max, v) == 4.0);
  const std::vector<ls::loss_sum> l{{1.0, 2, 1, 2}, {3.0, 1, 0, 1}, {0.0, 0, 0, 0}};
  for (const auto op : {ls::reduce_op::sum, ls::reduce_op::mean}) {
    const ls::loss_sum t = s.reduce(op, l);
    CHECK(t.count == 3);
    CHECK(t.correct == 1);
    CHECK(t.labelled == 3);  // so the accuracy of the whole can be computed
  }
  CHECK(s.reduce(ls::reduce_op::sum, l).sum == 4.0);
  CHECK(s.reduce(ls::reduce_op::mean, l).sum == doctest::Approx(4.0 / 3));
  CHECK(s.reduce(ls::reduce_op::min, l).sum == 0.0);
  CHECK(s.reduce(ls::reduce_op::max, l).labelled == 1);  // the replica with the largest sum
}

TEST_CASE("run gives every replica its shard and all_reduce sums across them") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>, ls::cpu<3>> s;
  const auto b = dist_test::make_batch(10, 1);
  const auto d = dist_test::distributed(b, 4);
  const auto per = s.run(
      [&](std::size_t r, const ls::data::shard& sh) {
        ls::host_context ctx;
        double v[2] = {static_cast<double>(sh.size), static_cast<double>(r)};
        s.all_reduce(r, ctx, v, 2);
        return v[0] * 100 + v[1];
      },
      d);
  REQUIRE(per.size() == 4);
  for (double x : per) CHECK(x == 10 * 100 + 6);
  CHECK(s.reduce(ls::reduce_op::sum, per) == 4 * 1006);
}

TEST_CASE("the GPU reducers' rendezvous refuses a wait for a collective never started and slots beyond it") {
  // Host code only: what same_device_allreduce, reduce_to_one_device<gpu<K>> and nccl_allreduce
  // meet in. A wait for a bucket this replica never started returned at once, and the caller then
  // read the event of no collective (a null pointer).
  for (const std::size_t replicas : {1u, 2u, 3u}) {
    CAPTURE(replicas);
    ls::detail::device_rendezvous rv(replicas, std::chrono::milliseconds(5000), 4);
    CHECK_THROWS_WITH_AS(rv.await(0, 2), doctest::Contains("waits for bucket 2, which it never started"), ls::config_error);
    CHECK_THROWS_WITH_AS(rv.check_slot(replicas, 0), doctest::Contains("is beyond the reducer's"), ls::config_error);
    CHECK_THROWS_WITH_AS(rv.check_slot(0, 4), doctest::Contains("beyond the reducer's 4 collective ids"), ls::config_error);
    CHECK_THROWS_AS(rv.arrive(replicas, 0, nullptr, 0, [] {}), ls::config_error);
    // a collective every replica started: each wait returns once, after the launch ran once
    std::size_t launches = 0;
    std::vector<std::thread> threads;
    for (std::size_t r = 0; r < replicas; ++r)
      threads.emplace_back([&, r] {
        rv.arrive(r, 1, nullptr, 0, [&] { ++launches; });
        rv.await(r, 1);
      });
    for (auto& t : threads) t.join();
    CHECK(launches == 1);
    CHECK_NOTHROW(rv.await(0, 1));  // generation 1 is complete
    rv.reset();  // after a failure: nothing started again
    CHECK_THROWS_AS(rv.await(0, 1), ls::config_error);
  }
}
