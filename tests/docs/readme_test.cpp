// The code block of README.md, compiled and run on a small synthetic dataset.
#include <doctest/doctest.h>

#include "docs/common.hpp"

// example-begin readme
#include <lockstep/lockstep.hpp>
namespace ls = lockstep;

using mlp = ls::sequential<ls::dense<784, 512>, ls::relu, ls::dropout<1, 5>, ls::dense<512, 10>>;

ls::history train_mlp(const ls::data::dataset<ls::data::sample>& images) {
  ls::mirrored<ls::cpus> strategy;                     // one replica per core (ls::gpus: every visible GPU)
  auto model = strategy.replicate<mlp>(ls::seed{42});  // the device count is a run-time value
  return ls::fit(strategy, model, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{},
                 images | ls::data::shuffle(60'000, 7) | ls::data::batched(128), {.epochs = 10});
}
// example-end readme

TEST_CASE("README.md: the first example trains") {
  const ls::history h = train_mlp(docs_test::samples(200, 784));
  CHECK(h.epochs.size() == 10);
  CHECK(h.last().train_loss < h.epochs.front().train_loss);
}
