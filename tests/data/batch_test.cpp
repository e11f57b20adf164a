// A global batch's shards: split and whole read every row through the batch's indices, so they
// refuse a batch whose features, labels or targets do not hold exactly those rows.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <lockstep/data/batch.hpp>
#include <lockstep/data/shard_batches.hpp>

namespace ld = lockstep::data;

namespace {
/// A consistent batch of `rows` rows of `width` features, with labels and 2 targets per row.
ld::batch consistent(std::size_t rows, std::size_t width) {
  ld::batch b;
  b.width = width;
  b.target_width = 2;
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t c = 0; c < width; ++c) b.features.push_back(static_cast<float>(r * width + c));
    b.labels.push_back(static_cast<std::int32_t>(r % 3));
    b.targets.push_back(0.5f);
    b.targets.push_back(-0.5f);
    b.indices.push_back(100 + r);
  }
  return b;
}

/// The batches of `b`, one epoch (a dataset of hand-made global batches).
ld::generator<ld::batch> each_batch(std::vector<ld::batch> b) {
  for (auto& x : b) co_yield std::move(x);
}

/// The message of the shape_error `f` throws (empty when it throws none).
template <class F>
std::string shape_message(F&& f) {
  try {
    f();
  } catch (const lockstep::shape_error& e) {
    return e.what();
  }
  return {};
}
}  // namespace

TEST_CASE("split and whole take a consistent batch of any size and cut every row once") {
  for (const std::size_t rows : {0, 1, 2, 7, 13})
    for (const std::size_t n : {1, 2, 3, 5}) {
      CAPTURE(rows);
      CAPTURE(n);
      const auto b = consistent(rows, 3);
      const auto shards = ld::split(b, n);
      std::size_t covered = 0;
      for (const auto& s : shards) {
        CHECK(s.offset == covered);
        for (std::size_t i = 0; i < s.size; ++i) CHECK(s.features[i * 3] == static_cast<float>((covered + i) * 3));
        covered += s.size;
      }
      CHECK(covered == rows);
      CHECK(ld::whole(b).size == rows);
    }
}

TEST_CASE("split into 0 shards is a config_error naming the batch's rows, whatever the rows") {
  for (const std::size_t rows : {0, 1, 7}) {
    CAPTURE(rows);
    const auto b = consistent(rows, 3);
    CHECK_THROWS_WITH_AS((void)ld::split(b, 0),
                         ("lockstep::data::split: a batch of " + std::to_string(rows) + " rows into 0 shards").c_str(),
                         lockstep::config_error);
  }
}

TEST_CASE("split and whole refuse features, labels or targets that do not hold exactly the batch's rows") {
  for (const std::size_t rows : {0, 1, 5, 11}) {
    CAPTURE(rows);
    auto features_without_indices = consistent(rows + 2, 4);
    features_without_indices.indices.clear();  // filled by hand without indices: would train on none
    std::string m = shape_message([&] { (void)ld::split(features_without_indices, 2); });
    CHECK(m.find("`features` holds " + std::to_string((rows + 2) * 4) + " values, not 0") != std::string::npos);
    CHECK(m.find("lockstep::data::split") != std::string::npos);

    auto short_features = consistent(rows + 1, 4);
    short_features.features.pop_back();
    m = shape_message([&] { (void)ld::whole(short_features); });
    CHECK(m.find("lockstep::data::whole") != std::string::npos);
    CHECK(m.find("`features` holds " + std::to_string((rows + 1) * 4 - 1)) != std::string::npos);

    auto extra_labels = consistent(rows, 4);
    extra_labels.labels.push_back(1);
    m = shape_message([&] { (void)ld::split(extra_labels, 3); });
    CHECK(m.find("`labels` holds " + std::to_string(rows + 1) + " values, not " + std::to_string(rows)) !=
          std::string::npos);

    auto short_targets = consistent(rows + 1, 4);
    short_targets.targets.pop_back();
    m = shape_message([&] { (void)ld::split(short_targets, 1); });
    CHECK(m.find("`targets` holds") != std::string::npos);
    CHECK(m.find("rows x target_width") != std::string::npos);

    // Unlabelled and target-free batches are consistent.
    auto bare = consistent(rows, 4);
    bare.labels.clear();
    bare.targets.clear();
    bare.target_width = 0;
    CHECK(ld::split(bare, 2).size() == 2);
  }
}

TEST_CASE("shard_by_worker refuses what split refuses: a hand-made batch without indices, labels short of its rows") {
  const auto parts = [](ld::batch b) {
    const ld::dataset<ld::batch> d{[b](std::uint64_t) { return each_batch({b}); }};
    std::size_t rows = 0;
    for (auto&& p : (d | ld::shard_by_worker(1, 2)).epoch(0)) rows += p.rows();
    return rows;
  };
  for (const std::size_t rows : {1, 2, 7}) {
    CAPTURE(rows);
    CHECK(parts(consistent(rows, 3)) == rows / 2);  // worker 1 of 2: the second half
    auto without_indices = consistent(rows, 3);
    without_indices.indices.clear();  // would give every worker no row, and train on none
    std::string m = shape_message([&] { (void)parts(without_indices); });
    CHECK(m.find("lockstep::data::shard_by_worker") != std::string::npos);
    CHECK(m.find("`features` holds " + std::to_string(rows * 3) + " values, not 0") != std::string::npos);
    auto short_labels = consistent(rows + 1, 3);
    short_labels.labels.pop_back();  // would be read past their end
    m = shape_message([&] { (void)parts(short_labels); });
    CHECK(m.find("`labels` holds " + std::to_string(rows) + " values, not " + std::to_string(rows + 1)) !=
          std::string::npos);
  }
}
