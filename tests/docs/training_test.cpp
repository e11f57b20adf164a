// The code blocks of docs/training.md, compiled and run.
#include <doctest/doctest.h>

#include <filesystem>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "docs/common.hpp"

namespace ls = lockstep;

namespace {
using mlp = ls::sequential<ls::dense<8, 16>, ls::relu, ls::dense<16, 10>>;
}  // namespace

TEST_CASE("docs/training.md: fit with validation, callbacks, metrics and checkpoints") {
  const docs_test::scratch_directory dir("training_fit");
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> strategy;
  auto model = strategy.replicate<mlp>(ls::seed{3});
  const ls::adamw optimizer{.lr = 1e-2f};
  const ls::softmax_cross_entropy loss;
  const auto train_data = docs_test::samples(96, 8) | ls::data::batched(32);
  const auto test_data = docs_test::samples(30, 8) | ls::data::batched(10);
  // example-begin training-fit
  ls::history h = ls::fit(strategy, model, optimizer, loss, train_data, {
      .epochs = 20,
      .validation = test_data,                                   // optional, evaluated after each epoch
      .callbacks = {ls::lr_schedule(ls::cosine_schedule{.total = 20 * 469}),
                    ls::early_stopping({.monitor = ls::monitored::val_loss, .patience = 3})},
      .metrics_file = "metrics.jsonl",                          // optional, one JSON object per epoch
      .checkpoint_dir = "ckpt",                                 // optional, see checkpoints.md
  });
  // example-end training-fit
  CHECK(!h.epochs.empty());
  CHECK(std::filesystem::exists("metrics.jsonl"));
}

TEST_CASE("docs/training.md: a callback with state that survives a resume") {
  // example-begin training-callback-state
  auto seen = std::make_shared<double>(0);
  ls::callback counter = ls::on_epoch_end([seen](const ls::epoch_stats&) { *seen += 1; });
  counter.save_state = [seen] { return std::vector<double>{*seen}; };
  counter.load_state = [seen](std::span<const double> v) {
    if (v.size() != 1) throw ls::checkpoint_error("counter: expected 1 value");
    *seen = v[0];
  };
  // example-end training-callback-state
  ls::mirrored<ls::cpu<0>> strategy;
  auto model = strategy.replicate<mlp>(ls::seed{4});
  (void)ls::fit(strategy, model, ls::sgd{}, ls::softmax_cross_entropy{}, docs_test::samples(20, 8) | ls::data::batched(10),
                {.epochs = 3, .callbacks = {counter}, .quiet = true});
  CHECK(*seen == 3);
  counter.load_state(std::vector<double>{7});
  CHECK(counter.save_state() == std::vector<double>{7});
}

TEST_CASE("docs/precision.md: a model made under mixed<bf16>") {
  // example-begin precision-replicate
  ls::mirrored<ls::cpus> strategy;
  auto model = strategy.replicate<mlp, ls::mixed<ls::bf16>>(ls::seed{42});  // bf16 GEMMs, fp32 weights
  // example-end precision-replicate
  CHECK(model.precision() == ls::compute_precision::bf16);
  static_assert(std::is_same_v<decltype(model), decltype(strategy.replicate<mlp>(ls::seed{42}))>);
}
