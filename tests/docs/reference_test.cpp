// The code blocks of docs/reference.md, compiled and run: regression from a CSV file with target
// columns, and a map to owned_sample that computes new features.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "docs/common.hpp"

namespace ls = lockstep;

namespace {

/// houses.csv: a header, then area, rooms, price (the target), age; price = 2 area + rooms.
void write_houses() {
  std::ofstream f("houses.csv");
  f << "area,rooms,price,age\n";
  const ls::counter_rng rng(9, 9);
  for (std::size_t r = 0; r < 256; ++r) {
    const float area = rng.uniform(2 * r), rooms = rng.uniform(2 * r + 1);
    f << area << ',' << rooms << ',' << 2 * area + rooms << ',' << (r % 7) / 7.0 << '\n';
  }
}

}  // namespace

TEST_CASE("docs/reference.md: regression from a CSV file with a target column") {
  const docs_test::scratch_directory dir("reference_csv");
  write_houses();
  // example-begin reference-csv-regression
  using regressor = ls::sequential<ls::dense<3, 16>, ls::tanh, ls::dense<16, 1>>;
  const auto houses = ls::data::csv("houses.csv", {.header = true, .target_columns = {2}});  // price
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> strategy;
  auto model = strategy.replicate<regressor>(ls::seed{1});
  auto h = ls::fit(strategy, model, ls::adam{.lr = 1e-2f}, ls::mse{},
                   houses | ls::data::shuffle(256, 3) | ls::data::batched(32), {.epochs = 40, .quiet = true});
  std::printf("mean squared error %.4f\n", h.last().train_loss);  // features: area, rooms, age
  // example-end reference-csv-regression
  CHECK(h.last().train_loss < 0.05);
  CHECK(h.last().train_loss < h.epochs.front().train_loss / 4);
}

TEST_CASE("docs/reference.md: a map that computes new features") {
  const auto source = docs_test::samples(10, 4);
  // example-begin reference-owned-sample
  auto squared = [](const ls::data::sample& s) {  // a view in, an owned sample out
    ls::data::owned_sample o(s);                  // features, targets, label and index copied
    for (float& v : o.features) v = v * v;
    return o;
  };
  auto squares = source | ls::data::map(squared) | ls::data::batched(4);  // batched as views are
  // example-end reference-owned-sample
  std::size_t rows = 0;
  for (auto&& b : squares.epoch(0)) {
    for (std::size_t i = 0; i < b.features.size(); ++i) CHECK(b.features[i] >= 0);
    rows += b.rows();
  }
  CHECK(rows == 10);
}
