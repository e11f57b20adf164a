// interleave(cycle, block): the order of a worked example, every sample once, a pure function of
// (seed, epoch, the groups), and the same global batches whatever the number of workers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include <lockstep/data.hpp>

namespace ld = lockstep::data;

namespace {

// A source whose samples fall into groups of the given sizes, in order.
class grouped_source final : public ld::sample_source {
public:
  explicit grouped_source(std::vector<std::size_t> sizes) {
    for (std::size_t g = 0; g < sizes.size(); ++g)
      for (std::size_t k = 0; k < sizes[g]; ++k) groups_.push_back(static_cast<std::uint32_t>(g));
  }
  std::uint64_t size() const override { return groups_.size(); }
  std::uint32_t group(std::uint64_t i) const override { return groups_[i]; }
  std::uint32_t channels() const override { return 1; }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> fixed_size() const override { return std::pair{1u, 2u}; }
  void load(std::uint64_t i, const ld::region_planner& r, ld::decoded_sample& out, ld::load_scratch&) const override {
    out.channels = 1;
    out.height = 1;
    out.width = 2;
    (void)r.plan(1, 2);
    out.region = {0, 0, 2, 1};
    out.pixels = {static_cast<std::uint8_t>(i), static_cast<std::uint8_t>(groups_[i])};
  }
  std::string describe() const override { return "grouped"; }

private:
  std::vector<std::uint32_t> groups_;
};

std::vector<std::uint64_t> order(const ld::dataset<ld::sample_ref>& d, std::uint64_t epoch) {
  std::vector<std::uint64_t> out;
  for (auto&& s : d.epoch(epoch)) out.push_back(s.index);
  return out;
}

}  // namespace

TEST_CASE("interleave: cycle 2, block 2 over groups of 3, 2 and 4") {
  const auto src = ld::indexed(std::make_shared<grouped_source>(std::vector<std::size_t>{3, 2, 4}));
  CHECK(order(src | ld::interleave(2, 2), 0) == std::vector<std::uint64_t>{0, 1, 3, 4, 2, 5, 6, 7, 8});
  CHECK(order(src | ld::interleave(1, 5), 0) == std::vector<std::uint64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(order(src | ld::interleave(3, 1), 0) == std::vector<std::uint64_t>{0, 3, 5, 1, 4, 6, 2, 7, 8});
  CHECK_THROWS_AS(ld::interleave(0, 1), lockstep::config_error);
  CHECK_THROWS_AS(ld::interleave(2, 0), lockstep::config_error);
}

TEST_CASE("interleave: every sample once, a pure function of (seed, epoch, groups)") {
  for (const auto& sizes : {std::vector<std::size_t>{}, std::vector<std::size_t>{1}, std::vector<std::size_t>{5, 1, 7, 2, 9, 3, 3},
                            std::vector<std::size_t>(20, 13)})
    for (std::size_t cycle : {1u, 2u, 4u, 30u})
      for (std::size_t block : {1u, 3u, 16u}) {
        CAPTURE(sizes.size());
        CAPTURE(cycle);
        CAPTURE(block);
        const auto src = ld::indexed(std::make_shared<grouped_source>(sizes));
        const std::size_t n = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
        const auto plain = src | ld::interleave(cycle, block);
        const auto seeded = src | ld::interleave(cycle, block, 77);
        for (const auto& d : {plain, seeded}) {
          auto o = order(d, 3);
          CHECK(o == order(d, 3));
          std::sort(o.begin(), o.end());
          std::vector<std::uint64_t> all(n);
          std::iota(all.begin(), all.end(), 0);
          CHECK(o == all);
        }
        CHECK(order(plain, 1) == order(plain, 2));  // no seed: the same every epoch
        if (sizes.size() > 3) {
          CHECK(order(seeded, 1) != order(seeded, 2));  // seeded: the group order changes per epoch
          CHECK(order(seeded, 1) == order(src | ld::interleave(cycle, block, 77), 1));
        }
      }
}

TEST_CASE("interleave: then a bounded shuffle, and the global batches do not depend on workers or replicas") {
  const auto src = ld::indexed(std::make_shared<grouped_source>(std::vector<std::size_t>(12, 17)));
  const auto pipe = src | ld::interleave(3, 4, 5) | ld::shuffle(32, 6) | ld::batched(10);
  std::vector<std::uint64_t> global;
  for (auto&& b : pipe.epoch(2)) global.insert(global.end(), b.indices.begin(), b.indices.end());
  for (std::size_t world = 1; world <= 3; ++world)
    for (std::size_t replicas = 1; replicas <= 3; ++replicas) {
      std::vector<std::vector<std::uint64_t>> per_batch;
      for (std::size_t rank = 0; rank < world; ++rank) {
        std::size_t k = 0;
        for (auto&& b : pipe.epoch(2)) {
          const auto db = ld::detail::make_sharded(std::move(b), world * replicas, rank * replicas, replicas);
          if (per_batch.size() <= k) per_batch.resize(k + 1);
          for (const auto& s : db.shards)
            for (std::size_t r = 0; r < s.size; ++r) {
              per_batch[k].push_back(s.indices[r]);
              CHECK(s.features[r * 2] == static_cast<float>(static_cast<std::uint8_t>(s.indices[r])));
            }
          ++k;
        }
      }
      // Every worker's shards of batch k, in rank order, are global batch k.
      std::vector<std::uint64_t> joined;
      for (const auto& b : per_batch) joined.insert(joined.end(), b.begin(), b.end());
      CHECK(joined == global);
    }
}
