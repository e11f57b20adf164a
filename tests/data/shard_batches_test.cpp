// Tests of distribute and shard_by_worker: the exactly-once contract over many sizes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include <lockstep/data.hpp>

namespace ld = lockstep::data;

namespace {

ld::dataset<ld::sample> numbered(std::size_t n) {
  std::vector<float> features(n * 3);
  std::vector<std::int32_t> labels(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < 3; ++j) features[3 * i + j] = static_cast<float>(i * 10 + j);
    labels[i] = static_cast<std::int32_t>(i % 7);
  }
  return ld::from_memory(std::move(features), 3, std::move(labels));
}

// Checks that a shard's rows are the rows of the dataset named by its indices.
void check_shard_rows(const ld::shard& s) {
  for (std::size_t r = 0; r < s.size; ++r) {
    const auto i = s.indices[r];
    CHECK(s.features[3 * r] == static_cast<float>(i * 10));
    CHECK(s.features[3 * r + 2] == static_cast<float>(i * 10 + 2));
    CHECK(s.labels[r] == static_cast<std::int32_t>(i % 7));
  }
}

}  // namespace

TEST_CASE("distribute: every sample of an epoch reaches exactly one replica once") {
  for (std::size_t n : {0u, 1u, 2u, 7u, 31u, 60u, 97u, 128u})
    for (std::size_t bs : {1u, 3u, 4u, 8u, 16u, 25u})
      for (bool drop : {false, true})
        for (std::size_t replicas = 1; replicas <= 8; ++replicas) {
          CAPTURE(n);
          CAPTURE(bs);
          CAPTURE(drop);
          CAPTURE(replicas);
          const auto d = numbered(n) | ld::shuffle(n + 1, 5) | ld::batched(bs, drop) | ld::shard_batches(replicas);
          std::vector<int> seen(n, 0);
          std::vector<std::uint64_t> order;
          for (auto&& step : d.epoch(1)) {
            REQUIRE(step.shards.size() == replicas);
            std::size_t lo = step.global_size(), hi = 0, covered = 0;
            for (std::size_t r = 0; r < replicas; ++r) {
              const ld::shard& s = step.shards[r];
              lo = std::min(lo, s.size);
              hi = std::max(hi, s.size);
              CHECK(s.offset == covered);
              CHECK(s.global_size == step.global_size());
              covered += s.size;
              for (auto i : s.index_span()) {
                REQUIRE(i < n);
                ++seen[i];
                order.push_back(i);
              }
              check_shard_rows(s);
            }
            CHECK(covered == step.global_size());
            CHECK(hi - lo <= 1);  // shard sizes differ by at most one
          }
          const std::size_t kept = drop ? n - n % bs : n;
          CHECK(order.size() == kept);
          CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c <= 1; }));
          // without drop_remainder every sample appears; with it exactly the last n % bs of the
          // shuffled order are missing
          std::vector<std::uint64_t> full;
          for (auto&& x : (numbered(n) | ld::shuffle(n + 1, 5)).epoch(1)) full.push_back(x.index);
          CHECK(std::equal(order.begin(), order.end(), full.begin()));
          for (std::size_t k = kept; k < n; ++k) CHECK(seen[full[k]] == 0);
        }
}

TEST_CASE("distribute: a range of plain batches, moved or borrowed, with empty shards") {
  std::vector<ld::batch> batches(2);
  batches[0].width = 1;
  batches[0].features = {1, 2, 3};
  batches[0].indices = {0, 1, 2};
  batches[1].width = 1;  // an empty batch
  std::size_t steps = 0;
  for (auto&& step : ld::shard_batches(batches, 5)) {  // borrowed: copies
    REQUIRE(step.shards.size() == 5);
    const std::size_t rows = step.global_size();
    for (std::size_t r = 0; r < 5; ++r) CHECK(step.shards[r].size == (r < rows ? 1u : 0u));
    ++steps;
  }
  CHECK(steps == 2);
  CHECK(batches[0].features.size() == 3);  // untouched
  std::size_t total = 0;
  for (auto&& step : ld::shard_batches(std::move(batches), 2)) total += step.global_size();
  CHECK(total == 3);
  CHECK_THROWS_AS(ld::shard_batches(0), lockstep::config_error);
}

TEST_CASE("distribute: shards stay valid after the generator moves on (shared ownership)") {
  std::vector<ld::distributed_batch> kept;
  for (auto&& step : (numbered(50) | ld::batched(8) | ld::shard_batches(3)).epoch()) kept.push_back(std::move(step));
  std::set<std::uint64_t> all;
  for (const auto& step : kept)
    for (const auto& s : step.shards) {
      check_shard_rows(s);
      all.insert(s.indices, s.indices + s.size);
    }
  CHECK(all.size() == 50);
}

TEST_CASE("shard_by_worker: workers see disjoint parts of the same global batches, together every sample once") {
  for (std::size_t n : {0u, 1u, 10u, 37u, 64u})
    for (std::size_t world : {1u, 2u, 3u, 5u})
      for (std::size_t bs : {1u, 4u, 7u}) {
        CAPTURE(n);
        CAPTURE(world);
        CAPTURE(bs);
        const auto global = numbered(n) | ld::shuffle(16, 11) | ld::batched(bs);
        std::vector<std::vector<ld::pooled_batch>> per_worker(world);
        for (std::size_t r = 0; r < world; ++r)
          for (auto&& b : (global | ld::shard_by_worker(r, world)).epoch(2)) per_worker[r].push_back(std::move(b));
        std::vector<ld::pooled_batch> globals;
        for (auto&& b : global.epoch(2)) globals.push_back(std::move(b));
        for (std::size_t r = 0; r < world; ++r) REQUIRE(per_worker[r].size() == globals.size());  // same steps
        std::vector<int> seen(n, 0);
        for (std::size_t k = 0; k < globals.size(); ++k) {
          std::vector<std::uint64_t> joined;
          for (std::size_t r = 0; r < world; ++r) {
            const auto& part = per_worker[r][k];
            CHECK(part.labels.size() == part.rows());
            joined.insert(joined.end(), part.indices.begin(), part.indices.end());
            for (auto i : part.indices) ++seen[i];
            check_shard_rows(ld::whole(part));
          }
          CHECK(joined == globals[k].indices);  // worker parts concatenate to the global batch
        }
        CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
      }
  CHECK_THROWS_AS(ld::shard_by_worker(2, 2), lockstep::config_error);
}
