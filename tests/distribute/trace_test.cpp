// The timeline of the steps (strategy::set_trace): which spans each replica records, only in the
// recorder's window of steps; each bucket's reduction is one span that overlaps the backward of
// the layers below it; the update, the epilogue, the micro-shard sum; tracing changes no bit of
// the training; a recorder with too few threads is refused.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include <lockstep/core/trace.hpp>

#include "distribute/common.hpp"

using namespace dist_test;
namespace ls = lockstep;

namespace {

using invariant = ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus>;

/// The spans of `thread` named `name`.
std::vector<ls::trace_event> spans(const ls::trace_recorder& r, std::size_t thread, std::string_view name) {
  std::vector<ls::trace_event> out;
  for (const auto& e : r.events(thread))
    if (name == e.name) out.push_back(e);
  return out;
}

/// Trains `steps` updates of mlp on `s` (recording on `rec` when given); returns the parameters.
template <class S>
std::vector<float> train_traced(S& s, ls::trace_recorder* rec, std::size_t steps, const ls::update_recipe& recipe = {}) {
  auto m = s.template replicate<mlp>(ls::seed{7});
  s.set_trace(rec);
  for (std::size_t i = 0; i < steps; ++i) {
    if (rec) rec->begin_step(m.step());
    (void)s.train_step(m, ls::sgd{.lr = 0.05f}, ls::softmax_cross_entropy{}, distributed(make_batch(24 + i, i), s.num_replicas()),
                       recipe);
  }
  s.set_trace(nullptr);
  return m.parameters_to_host();
}

}  // namespace

TEST_CASE("trace: each replica records forward and backward per layer, each bucket's reduction and the update, in the window only") {
  for (const std::size_t n : {1u, 2u, 3u}) {
    CAPTURE(n);
    // bucket_bytes = 0: one bucket per layer with parameters (two for mlp: dense 2 completes first).
    ls::mirrored<ls::cpus> s(ls::device_selection::first(n), ls::strategy_options{.bucket_bytes = 0});
    ls::trace_recorder rec(n + 1, {.steps = {1, 3}});
    const auto traced = train_traced(s, &rec, 4, ls::update_recipe{.clip_global_norm = 1.0});
    for (std::size_t r = 0; r < n; ++r) {
      CAPTURE(r);
      const auto fwd = spans(rec, r, "forward");
      const auto bwd = spans(rec, r, "backward");
      REQUIRE(fwd.size() == 2 * 3);  // steps 1 and 2, layers 0..2
      REQUIRE(bwd.size() == 2 * 3);
      for (std::size_t i = 0; i < 3; ++i) {
        CHECK(fwd[i].arg == static_cast<std::int64_t>(i));      // in layer order
        CHECK(bwd[i].arg == static_cast<std::int64_t>(2 - i));  // in reverse
        CHECK(std::string_view(fwd[i].arg_name) == "layer");
      }
      CHECK(spans(rec, r, "update").size() == 2);
      CHECK(spans(rec, r, "epilogue").size() == 2);
      const auto reduce = spans(rec, r, "reduce bucket");
      if (n == 1) {
        CHECK(reduce.empty());  // a lone replica reduces nothing
        continue;
      }
      REQUIRE(reduce.size() == 2 * 2);
      CHECK(std::string_view(reduce[0].category) == "communication");
      // The first bucket to start (the top dense layer's) is reduced while layer 0's backward runs.
      const auto first = *std::min_element(reduce.begin(), reduce.begin() + 2,
                                           [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
      const auto layer0 = std::find_if(bwd.begin(), bwd.end(), [](const auto& e) { return e.arg == 0; });
      REQUIRE(layer0 != bwd.end());
      CHECK(layer0->start_ns >= first.start_ns);
      CHECK(layer0->start_ns < first.start_ns + first.duration_ns);
      // spans of one thread are well formed: non-negative and nested or disjoint with the update
      for (const auto& e : rec.events(r)) CHECK(e.duration_ns >= 0);
    }
    CHECK(rec.events(n).empty());  // the driver's thread: no strategy span
    CHECK(rec.dropped() == 0);
    // The same training without a recorder: the same bits.
    ls::mirrored<ls::cpus> plain(ls::device_selection::first(n), ls::strategy_options{.bucket_bytes = 0});
    CHECK(train_traced(plain, nullptr, 4, ls::update_recipe{.clip_global_norm = 1.0}) == traced);
  }
}

TEST_CASE("trace: under replica_count_invariant each replica records its micro-shards' passes and its part of the sum") {
  invariant s(ls::device_selection::first(2), ls::strategy_options{.micro_shard_rows = 8});
  ls::trace_recorder rec(3, {.steps = {0, 2}});
  const auto traced = train_traced(s, &rec, 2);
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(spans(rec, r, "forward").size() >= 2 * 3);  // at least one micro-shard per step
    CHECK(spans(rec, r, "forward").size() % 3 == 0);
    CHECK(spans(rec, r, "sum micro-shards").size() == 2);
    CHECK(spans(rec, r, "update").size() == 2);
  }
  invariant plain(ls::device_selection::first(2), ls::strategy_options{.micro_shard_rows = 8});
  CHECK(train_traced(plain, nullptr, 2) == traced);
}

TEST_CASE("trace: a recorder with fewer threads than replicas is refused, naming both counts") {
  ls::mirrored<ls::cpus> s(ls::device_selection::first(3));
  ls::trace_recorder rec(2);
  CHECK_THROWS_WITH_AS(s.set_trace(&rec), doctest::Contains("2 threads"), ls::config_error);
  CHECK_THROWS_WITH_AS(s.set_trace(&rec), doctest::Contains("3 replicas"), ls::config_error);
  CHECK(s.trace() == nullptr);
}
