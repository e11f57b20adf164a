// The code blocks of docs/checkpoints.md, compiled and run.
#include <doctest/doctest.h>

#include <filesystem>

#include "docs/common.hpp"

namespace ls = lockstep;

namespace {
using mlp = ls::sequential<ls::dense<8, 16>, ls::relu, ls::dense<16, 10>>;
}  // namespace

TEST_CASE("docs/checkpoints.md: fit with checkpoint_dir and resume") {
  const docs_test::scratch_directory dir("checkpoints_fit");
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> strategy;
  auto model = strategy.replicate<mlp>(ls::seed{1});
  const ls::adam opt{.lr = 1e-2f};
  const ls::softmax_cross_entropy loss;
  const auto train = docs_test::samples(64, 8) | ls::data::batched(16);
  // example-begin checkpoints-fit
  auto h = ls::fit(strategy, model, opt, loss, train, {.epochs = 20, .checkpoint_dir = "ckpt", .resume = true});
  // example-end checkpoints-fit
  CHECK(h.epochs.size() == 20);
  CHECK(std::filesystem::exists("ckpt"));
}

TEST_CASE("docs/checkpoints.md: a checkpoint written and read directly") {
  const docs_test::scratch_directory dir("checkpoints_direct");
  ls::mirrored<ls::cpu<0>> strategy;
  auto model = strategy.replicate<mlp>(ls::seed{2});
  const ls::adam opt{};
  const std::uint64_t e = 3, b = 0;
  // example-begin checkpoints-direct
  ls::checkpoint_manager ckpt("ckpt", /*keep=*/3);
  ls::checkpoint_state s = ls::capture(model, opt);     // parameters, optimiser state and name, step
  s.epoch = e; s.batches = b;                            // the pipeline position
  ckpt.save(s);                                          // ckpt/ckpt-<step>.lsck, atomically
  if (auto last = ckpt.load_latest(ls::model_signature<mlp>())) ls::restore(model, *last);
  // example-end checkpoints-direct
  CHECK(ckpt.latest().has_value());
}
