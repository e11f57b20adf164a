// Overlap of communication and backward: with one bucket per layer, the top bucket's all-reduce
// starts (and, on at least one replica, has already combined data) before layer 0's backward has
// finished. Observed through a user-defined reducer that wraps host_allreduce and logs events.

#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <vector>

#include "distribute/common.hpp"

using namespace dist_test;
namespace ls = lockstep;

namespace {

struct event_log {
  std::array<std::chrono::steady_clock::time_point, 2> top_started{}, layer0_done{};
  std::array<bool, 2> top_changed{};
  std::array<std::vector<float>, 2> saved;
  std::array<float*, 2> top_data{};
  std::array<std::size_t, 2> top_count{};
  std::array<std::size_t, 2> starts{};
};
event_log events;  // test-only log the reducer writes (each replica writes only its own entries)

/// host_allreduce plus an event log: bucket 0 is the top layer's, the last bucket starts right
/// after layer 0's backward.
class logging_reducer : public ls::host_allreduce {
public:
  using ls::host_allreduce::host_allreduce;
  template <class Ctx, class T>
  void start(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t bucket) {
    ++events.starts[r];
    const auto [lo, hi] = ls::detail::slice_of<T>(count, r, 2);
    if (bucket == 0) {
      events.top_started[r] = std::chrono::steady_clock::now();
      events.saved[r].assign(data + lo, data + hi);
      events.top_data[r] = data;
      events.top_count[r] = count;
    } else {
      events.layer0_done[r] = std::chrono::steady_clock::now();
      const auto [tlo, thi] = ls::detail::slice_of<T>(events.top_count[r], r, 2);
      events.top_changed[r] = std::memcmp(events.saved[r].data(), events.top_data[r] + tlo, (thi - tlo) * sizeof(T)) != 0;
    }
    ls::host_allreduce::start(r, ctx, data, count, bucket);
  }
};

}  // namespace

TEST_CASE("a bucket's all-reduce begins before layer 0's backward has finished") {
  ls::basic_mirrored<logging_reducer, ls::determinism::run_to_run, ls::cpu<0>, ls::cpu<1>> s(
      ls::strategy_options{.bucket_bytes = 0});
  auto m = s.replicate<mlp>(ls::seed{4});
  REQUIRE(m.buckets().size == 2);  // dense<32, 10> then dense<784, 32>
  const auto b = make_batch(64, 0);
  ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, distributed(b, 2));
  bool some_combined = false;
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(events.starts[r] == 2);
    CHECK(events.top_started[r] < events.layer0_done[r]);
    some_combined = some_combined || events.top_changed[r];
  }
  // The replica that arrived last at the top bucket reduced its slice at once, before computing
  // layer 0's gradients: the reduction overlapped the rest of the backward pass.
  CHECK(some_combined);

  // And the result equals the unbucketed one.
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> plain(ls::strategy_options{.bucket_bytes = std::size_t{1} << 30});
  auto m2 = plain.replicate<mlp>(ls::seed{4});
  ls::train_step(plain, m2, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, distributed(b, 2));
  CHECK(m.parameters_to_host() == m2.parameters_to_host());
}
