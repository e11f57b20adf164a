// fit with the training recipe: fit_options::accumulate = k over batches of B / k is bitwise the
// run over batches of B under replica_count_invariant (parameters and every epoch's numbers), an
// epoch's last short update included, or dropped on request; steps, max_steps and checkpoints
// count updates; a run killed (SIGKILL) in the middle of an accumulation group resumes from the
// last update boundary to the uninterrupted result; the EMA resumes bitwise, sharded or not, and
// validation with the EMA restores the live weights; the norm, clip factor and skipped updates
// reach the epoch statistics, the metrics file and the progress line.

#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <limits>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "train/helpers.hpp"

using namespace train_test;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t fit_samples = 45;  // batches of 8: 5 full and one of 5; of 2: 22 and one of 1

template <class... Ds>
using invariant = ls::basic_mirrored<ls::select_reducer_t<Ds...>, ls::determinism::replica_count_invariant, Ds...>;

/// invariant<Ds...> with micro-shards of one row (every batch's rows are a multiple of it).
template <class... Ds>
struct one_row : invariant<Ds...> {
  one_row() : invariant<Ds...>(ls::strategy_options{.micro_shard_rows = 1}) {}
};
template <class... Ds>
struct one_row_sharded : invariant<Ds...> {
  one_row_sharded() : invariant<Ds...>(ls::strategy_options{.micro_shard_rows = 1, .shard_optimizer = true}) {}
};

struct run_result {
  ls::history h;
  std::vector<float> params, ema;
  std::uint64_t steps = 0;
};

/// fit with batches of `batch` rows and `k` batches per update, options adjusted by `adjust`.
template <class Strategy, class Adjust>
run_result fit_run(std::size_t batch, std::size_t k, Adjust adjust) {
  Strategy s;
  auto m = s.template replicate<net>(ls::seed{21});
  ls::fit_options o{.epochs = 3,
                    .validation = eval_pipeline(20, 6),
                    .callbacks = {ls::lr_schedule(ls::cosine_schedule{.total = 18, .min_lr = 1e-4f})},
                    .quiet = true};
  o.accumulate = k;
  adjust(o);
  run_result r;
  r.h = ls::fit(s, m, ls::adamw{.lr = 5e-3f, .weight_decay = 0.01f}, ls::softmax_cross_entropy{}, pipeline(fit_samples, batch), o);
  r.params = m.parameters_to_host();
  r.ema = m.ema_to_host();
  r.steps = m.step();
  return r;
}

void check_same_history(const ls::history& a, const ls::history& b) {
  REQUIRE(a.epochs.size() == b.epochs.size());
  for (std::size_t i = 0; i < a.epochs.size(); ++i) {
    CAPTURE(i);
    const auto &x = a.epochs[i], &y = b.epochs[i];
    CHECK(x.train_loss == y.train_loss);
    CHECK(x.train_accuracy == y.train_accuracy);
    CHECK(x.val_loss == y.val_loss);
    CHECK(x.steps == y.steps);
    CHECK(x.samples == y.samples);
    CHECK(x.global_step == y.global_step);
    CHECK(x.lr == y.lr);
    CHECK((std::isnan(x.grad_norm) ? std::isnan(y.grad_norm) : x.grad_norm == y.grad_norm));
    CHECK((std::isnan(x.clip_factor) ? std::isnan(y.clip_factor) : x.clip_factor == y.clip_factor));
  }
}

}  // namespace

TEST_CASE("fit: accumulate = 4 over batches of 2 is bitwise batches of 8 under replica_count_invariant, the short last update included") {
  const auto plain = [](ls::fit_options&) {};
  const auto clipped = [](ls::fit_options& o) {
    o.clip_global_norm = 0.5;
    o.ema = {.decay = 0.9};
  };
  const auto big = fit_run<one_row<ls::cpu<0>>>(8, 1, plain);
  CHECK(big.steps == 18);
  CHECK(big.h.epochs[0].steps == 6);
  CHECK(big.h.epochs[0].samples == fit_samples);
  check_same_history(fit_run<one_row<ls::cpu<0>, ls::cpu<1>>>(2, 4, plain).h, big.h);
  CHECK(fit_run<one_row<ls::cpu<0>, ls::cpu<1>>>(2, 4, plain).params == big.params);
  CHECK(fit_run<one_row<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>>(4, 2, plain).params == big.params);
  // with clipping and the EMA
  const auto big_clip = fit_run<one_row<ls::cpu<0>>>(8, 1, clipped);
  const auto acc_clip = fit_run<one_row<ls::cpu<0>, ls::cpu<1>>>(2, 4, clipped);
  check_same_history(acc_clip.h, big_clip.h);
  CHECK(acc_clip.params == big_clip.params);
  CHECK(acc_clip.ema == big_clip.ema);
  CHECK(big_clip.h.epochs[0].grad_norm > 0);
  CHECK(big_clip.params != big.params);
}

TEST_CASE("fit: drop_partial_update drops an epoch's last batches that do not fill an update") {
  const auto r = fit_run<one_row<ls::cpu<0>>>(2, 4, [](ls::fit_options& o) { o.drop_partial_update = true; });
  REQUIRE(r.h.epochs.size() == 3);
  for (const auto& e : r.h.epochs) {
    CHECK(e.steps == 5);
    CHECK(e.samples == 40);
  }
  CHECK(r.steps == 15);
}

TEST_CASE("fit: accumulate counts updates for max_steps and the step counter, and a bad value is refused") {
  const auto r = fit_run<ls::mirrored<ls::cpu<0>, ls::cpu<1>>>(2, 4, [](ls::fit_options& o) { o.max_steps = 7; });
  CHECK(r.steps == 7);
  CHECK(r.h.last().global_step == 7);
  CHECK_THROWS_AS(fit_run<ls::mirrored<ls::cpu<0>>>(2, 4, [](ls::fit_options& o) { o.accumulate = 0; }), ls::config_error);
  CHECK_THROWS_AS(fit_run<ls::mirrored<ls::cpu<0>>>(2, 1, [](ls::fit_options& o) { o.validate_with_ema = true; }),
                  ls::config_error);
}

namespace {
/// Trains with accumulate 4 over batches of 2 (checkpoints in `dir` after every update when
/// given) until `steps` updates are done in total.
template <class Strategy>
run_result accumulate_to(std::uint64_t steps, const fs::path& dir = {}, bool resume = false) {
  return fit_run<Strategy>(2, 4, [&](ls::fit_options& o) {
    o.epochs = 1000;
    o.validation = {};
    o.ema = {.decay = 0.8, .start_step = 2};
    o.clip_global_norm = 1.0;
    o.checkpoint_dir = dir.string();
    o.checkpoint_every = dir.empty() ? 0 : 1;
    o.keep_checkpoints = 2;
    o.resume = resume;
    o.max_steps = steps;
  });
}
}  // namespace

TEST_CASE("fit: K updates, stop, M more with accumulation (and the EMA, sharded or not) is bitwise K + M") {
  using two = one_row<ls::cpu<0>, ls::cpu<1>>;
  using three_sharded = one_row_sharded<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>;
  const auto straight = accumulate_to<two>(11);
  for (const std::uint64_t k : {1u, 5u, 6u, 9u}) {
    CAPTURE(k);
    const auto dir = temp_dir("acc" + std::to_string(k));
    (void)accumulate_to<two>(k, dir);
    const auto resumed = accumulate_to<three_sharded>(11, dir, true);  // another replica count, sharded
    CHECK(resumed.h.resumed_from_step == k);
    CHECK(resumed.params == straight.params);
    CHECK(resumed.ema == straight.ema);
    fs::remove_all(dir);
  }
}

TEST_CASE("fit: a resume without fit_options::ema drops the checkpoint's EMA, which nothing would update") {
  // Kept, it stayed as the checkpoint had it, stale, in every later checkpoint and export.
  using two = one_row<ls::cpu<0>, ls::cpu<1>>;
  const auto dir = temp_dir("emadrop");
  REQUIRE(!accumulate_to<two>(6, dir).ema.empty());
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  const auto resumed = fit_run<two>(2, 4, [&](ls::fit_options& o) {
    o.quiet = false;
    o.progress = {.stream = f, .live = false};
    o.epochs = 1000;
    o.validation = {};
    o.clip_global_norm = 1.0;
    o.checkpoint_dir = dir.string();
    o.checkpoint_every = 1;
    o.keep_checkpoints = 2;
    o.resume = true;
    o.max_steps = 8;
  });
  CHECK(resumed.h.resumed_from_step == 6);
  CHECK(resumed.steps == 8);
  CHECK(resumed.ema.empty());
  std::string out;
  std::rewind(f);
  for (int ch = std::fgetc(f); ch != EOF; ch = std::fgetc(f)) out.push_back(static_cast<char>(ch));
  std::fclose(f);
  CAPTURE(out);
  CHECK(out.find("is dropped: fit_options::ema is off in this run") != std::string::npos);
  const auto latest = ls::checkpoint_manager(dir, 2).load_latest(ls::model_signature<net>());
  REQUIRE(latest.has_value());
  CHECK(ls::checkpoint_state::from_file(*latest).ema.empty());  // its checkpoints hold none either
  fs::remove_all(dir);
}

TEST_CASE("fit: SIGKILL in the middle of an accumulation group resumes from the last update boundary to the uninterrupted result") {
  using two = one_row<ls::cpu<0>, ls::cpu<1>>;
  const ls::counter_rng rng(static_cast<std::uint64_t>(::getpid()), 11);
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    const auto dir = temp_dir("acckill" + std::to_string(round));
    // a checkpoint after every update until killed
    REQUIRE(killed_while_checkpointing(dir, rng.u32(static_cast<std::uint64_t>(round)) % 150'000,
                                       [&] { (void)accumulate_to<two>(1'000'000, dir); }));
    const auto latest = ls::checkpoint_manager(dir, 2).load_latest(ls::model_signature<net>());
    REQUIRE(latest.has_value());
    const auto st = ls::checkpoint_state::from_file(*latest);
    const std::uint64_t k = st.step;
    INFO("killed after the checkpoint of update ", k);
    // an update boundary within the epoch: 23 batches in groups of 4, the last group of 3 (a kill
    // between the checkpoint of an epoch's last update and that of the epoch's end finds 23)
    CHECK((st.batches % 4 == 0 || st.batches == 23));
    const auto resumed = accumulate_to<two>(k + 5, dir, true);
    CHECK(resumed.h.resumed_from_step == k);
    const auto straight = accumulate_to<two>(k + 5);
    CHECK(resumed.params == straight.params);
    CHECK(resumed.ema == straight.ema);
    fs::remove_all(dir);
  }
}

TEST_CASE("fit: the norm, the clip factor and skipped updates reach the epoch statistics, the metrics file and the progress line") {
  const auto dir = temp_dir("recipe_outputs");
  fs::create_directories(dir);
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  const auto r = fit_run<ls::mirrored<ls::cpu<0>, ls::cpu<1>>>(8, 1, [&](ls::fit_options& o) {
    o.clip_global_norm = 0.1;
    o.nonfinite = ls::nonfinite_policy::skip;
    o.quiet = false;
    o.progress = {.stream = f, .live = false};
    o.metrics_file = (dir / "m.jsonl").string();
  });
  for (const auto& e : r.h.epochs) {
    CHECK(e.grad_norm > 0.1);  // every update clipped
    CHECK(e.clip_factor > 0);
    CHECK(e.clip_factor < 1);
    CHECK(e.skipped_updates == 0);
  }
  std::string out;
  std::rewind(f);
  for (int ch = std::fgetc(f); ch != EOF; ch = std::fgetc(f)) out.push_back(static_cast<char>(ch));
  std::fclose(f);
  CHECK(out.find("| norm ") != std::string::npos);
  CHECK(out.find(" clip 0.") != std::string::npos);
  std::ifstream in(dir / "m.jsonl");
  std::string line;
  std::size_t lines = 0;
  while (std::getline(in, line)) {
    CHECK(line.find("\"grad_norm\":") != std::string::npos);
    CHECK(line.find("\"clip_factor\":0.") != std::string::npos);
    CHECK(line.find("\"skipped_updates\":0") != std::string::npos);
    ++lines;
  }
  CHECK(lines == 3);
  // Without the epilogue: no norm, written as null.
  const auto plain = fit_run<ls::mirrored<ls::cpu<0>>>(8, 1, [](ls::fit_options&) {});
  CHECK(std::isnan(plain.h.last().grad_norm));
  CHECK(ls::epoch_json(plain.h.last()).find("\"grad_norm\":null") != std::string::npos);
  CHECK(ls::epoch_line(plain.h.last(), 3).find("norm") == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("fit: validation with the EMA evaluates the average and leaves the live weights in place") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{21});
  ls::fit_options o{.epochs = 2, .validation = eval_pipeline(20, 6), .quiet = true};
  o.ema = {.decay = 0.7};
  o.validate_with_ema = true;
  const auto h = ls::fit(s, m, ls::adam{.lr = 1e-2f}, ls::softmax_cross_entropy{}, pipeline(fit_samples, 8), o);
  const auto live = m.parameters_to_host();
  const auto ema = ls::evaluate(s, m, ls::softmax_cross_entropy{}, eval_pipeline(20, 6), ls::weights::ema);
  CHECK(h.last().val_loss == ema.loss);
  CHECK(m.parameters_to_host() == live);
  CHECK(ls::evaluate(s, m, ls::softmax_cross_entropy{}, eval_pipeline(20, 6)).loss != ema.loss);
}

TEST_CASE("fit: the update recipe example of docs/training.md runs: updates of 4 batches, clipped, guarded, with an EMA") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> strategy;
  auto model = strategy.replicate<net>(ls::seed{21});
  const auto train = pipeline(fit_samples, 2);
  const auto test_data = eval_pipeline(20, 6);
  // example-begin recipe
  ls::fit_options o{.epochs = 2, .validation = test_data, .quiet = true};
  o.accumulate = 4;                                   // an update covers 4 consecutive global batches
  o.clip_global_norm = 1.0;                           // clip the update's gradient to global norm 1
  o.clip_value = 0.0f;                                // > 0: clamp each element as well
  o.nonfinite = ls::nonfinite_policy::skip;           // skip an update whose gradient is not finite
  o.ema = {.decay = 0.999, .start_step = 0, .every = 1};
  o.validate_with_ema = true;                         // validation evaluates the EMA
  const ls::history h =
      ls::fit(strategy, model, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{.label_smoothing = 0.1f}, train, o);
  // example-end
  REQUIRE(h.epochs.size() == 2);
  CHECK(h.epochs[0].steps == 6);  // 23 batches: 5 updates of 4 and one of 3
  CHECK(model.step() == 12);
  CHECK(model.ema_updates() == 12);
  CHECK(std::isfinite(h.last().grad_norm));
  CHECK(h.last().skipped_updates == 0);
  CHECK(std::isfinite(h.last().val_loss));
}

namespace {
/// Regression samples (targets 3 wide) with a NaN feature at row 0 (relu turns it into 0 in
/// forward: a finite loss, a NaN weight gradient) and a NaN target at row 9 (a NaN loss): with
/// batches of 4 (unshuffled, 6 per epoch), each epoch's updates 1 and 3 are not finite.
auto nan_rows_pipeline() {
  const blobs b = make_blobs(24);
  std::vector<float> features = b.features, targets;
  features[0 * width + 2] = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t i = 0; i < 24; ++i)
    for (std::size_t c = 0; c < classes; ++c) targets.push_back(b.labels[i] == static_cast<std::int32_t>(c) ? 1.0f : 0.0f);
  targets[9 * classes + 1] = std::numeric_limits<float>::quiet_NaN();
  return ls::data::from_memory(std::move(features), width, std::move(targets), classes) | ls::data::batched(4);
}

/// fit of `net` (seed 8) with mse on `s` under `o`, quiet, until `steps` updates are done;
/// checkpoints after every update in `dir` when given, and resumes from it when `resume`.
template <class Strategy, class Optimizer, class Source>
run_result checkpointed_run(Strategy& s, const Optimizer& opt, const Source& data, ls::fit_options o, std::uint64_t steps,
                            const fs::path& dir, bool resume) {
  auto m = s.template replicate<net>(ls::seed{8});
  o.quiet = true;
  o.checkpoint_dir = dir.string();
  o.checkpoint_every = dir.empty() ? 0 : 1;
  o.resume = resume;
  o.max_steps = steps;
  run_result r;
  r.h = ls::fit(s, m, opt, ls::mse{}, data, o);
  r.params = m.parameters_to_host();
  r.steps = m.step();
  return r;
}

/// Two epochs with the non-finite guard skipping, on `Strategy`, sharding the update or not
/// (checkpointed_run).
template <class Strategy>
run_result skipping_run(bool sharded, std::uint64_t steps, const fs::path& dir = {}, bool resume = false) {
  Strategy s(ls::strategy_options{.shard_optimizer = sharded});
  ls::fit_options o{.epochs = 2};
  o.nonfinite = ls::nonfinite_policy::skip;
  return checkpointed_run(s, ls::adam{.lr = 1e-2f}, nan_rows_pipeline(), o, steps, dir, resume);
}
}  // namespace

TEST_CASE("fit: skipped updates stay out of the epoch's loss, samples and norm, and a checkpoint after them resumes bitwise (sharded or not)") {
  using two = ls::mirrored<ls::cpu<0>, ls::cpu<1>>;
  for (const bool sharded : {false, true}) {
    CAPTURE(sharded);
    const auto straight = skipping_run<two>(sharded, 12);
    REQUIRE(straight.h.epochs.size() == 2);
    for (const auto& e : straight.h.epochs) {
      CHECK(e.steps == 6);
      CHECK(e.skipped_updates == 2);
      CHECK(e.samples == 16);  // the 4 applied updates' rows
      CHECK(std::isfinite(e.train_loss));
      CHECK(std::isfinite(e.grad_norm));
      CHECK(e.clip_factor == 1.0);
    }
    for (const float p : straight.params) REQUIRE(std::isfinite(p));
    // Stopped after update 1 (skipped: the optimiser holds no state yet), 2, 3 (skipped, mid-epoch)
    // and 7 (the next epoch's first, skipped), then resumed to the end.
    for (const std::uint64_t k : {1u, 2u, 3u, 7u}) {
      CAPTURE(k);
      const auto dir = temp_dir("skipresume" + std::to_string(k) + (sharded ? "s" : ""));
      const auto first = skipping_run<two>(sharded, k, dir);
      CHECK(first.steps == k);
      const auto resumed = skipping_run<two>(sharded, 12, dir, true);
      CHECK(resumed.h.resumed_from_step == k);
      CHECK(resumed.params == straight.params);
      const auto& a = resumed.h.last();
      const auto& b = straight.h.last();
      CHECK(a.train_loss == b.train_loss);
      CHECK(a.samples == b.samples);
      CHECK(a.grad_norm == b.grad_norm);
      CHECK(a.skipped_updates == b.skipped_updates);
      fs::remove_all(dir);
    }
  }
}

namespace {
/// Regression samples (targets 3 wide) whose row 5 has a target of 1e20: its squared error
/// overflows a float (an infinite loss) while its gradient, 2e20 / 3, stays finite and is clipped.
auto overflowing_loss_pipeline() {
  const blobs b = make_blobs(24);
  std::vector<float> targets;
  for (std::size_t i = 0; i < 24; ++i)
    for (std::size_t c = 0; c < classes; ++c) targets.push_back(b.labels[i] == static_cast<std::int32_t>(c) ? 1.0f : 0.0f);
  targets[5 * classes] = 1e20f;
  return ls::data::from_memory(std::vector<float>(b.features), width, std::move(targets), classes) | ls::data::batched(4);
}

/// One epoch with clipping by global norm 1 (non-finite policy: the default, apply) on two host
/// replicas (checkpointed_run).
run_result overflowing_run(std::uint64_t steps, const fs::path& dir = {}, bool resume = false) {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  ls::fit_options o{.epochs = 1};
  o.clip_global_norm = 1.0;
  return checkpointed_run(s, ls::sgd{.lr = 1e-2f}, overflowing_loss_pipeline(), o, steps, dir, resume);
}

/// The message of the config_error fit throws under `o` (sgd and mse on two host replicas, over
/// overflowing_loss_pipeline), "" when none; `steps` gets the updates done.
std::string fit_config_error(const ls::fit_options& o, std::uint64_t& steps) {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{8});
  std::string msg;
  try {
    (void)ls::fit(s, m, ls::sgd{.lr = 1e-2f}, ls::mse{}, overflowing_loss_pipeline(), o);
  } catch (const ls::config_error& e) {
    msg = e.what();
  }
  steps = m.step();
  return msg;
}
}  // namespace

TEST_CASE("fit: a checkpoint after an update whose loss overflowed resumes to the uninterrupted epoch (its loss infinite)") {
  const auto straight = overflowing_run(6);
  REQUIRE(straight.h.epochs.size() == 1);
  CHECK(std::isinf(straight.h.last().train_loss));  // row 5's loss, in update 2
  for (const float p : straight.params) REQUIRE(std::isfinite(p));  // its gradient was clipped
  for (const std::uint64_t k : {2u, 3u, 5u}) {
    CAPTURE(k);
    const auto dir = temp_dir("overflowresume" + std::to_string(k));
    const auto first = overflowing_run(k, dir);
    CHECK(first.steps == k);
    const auto resumed = overflowing_run(6, dir, true);
    CHECK(resumed.h.resumed_from_step == k);
    CHECK(resumed.params == straight.params);
    CHECK(std::isinf(resumed.h.last().train_loss));
    CHECK(resumed.h.last().samples == straight.h.last().samples);
    CHECK(resumed.h.last().grad_norm == straight.h.last().grad_norm);
    fs::remove_all(dir);
  }
}

TEST_CASE("fit: a schedule's rate that is negative or not finite is a config_error naming the update") {
  for (const float bad : {-1e-3f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    ls::fit_options o{.epochs = 1, .quiet = true};
    ls::callback schedule;
    schedule.schedule = [bad](float lr, std::uint64_t step) { return step >= 3 ? bad : lr; };
    o.callbacks.push_back(schedule);
    std::uint64_t steps = 0;
    const std::string msg = fit_config_error(o, steps);
    CAPTURE(msg);
    CHECK(msg.find("the learning rate of update 4 is") != std::string::npos);
    CHECK(steps == 3);  // the updates before it ran
  }
}

TEST_CASE("fit: a learning-rate factor a callback sets negative or not finite is a config_error, and no checkpoint holds it") {
  for (const float bad : {-0.5f, std::numeric_limits<float>::quiet_NaN()}) {
    CAPTURE(bad);
    const auto dir = temp_dir("badfactor");
    ls::fit_options o{.epochs = 2, .quiet = true};
    o.checkpoint_dir = dir.string();
    ls::callback plateau;  // a callback gone wrong at the end of the first epoch
    plateau.epoch_end = [bad](const ls::epoch_stats&, ls::training_control& c) { c.lr_factor = bad; };
    o.callbacks.push_back(plateau);
    std::uint64_t steps = 0;
    const std::string msg = fit_config_error(o, steps);
    CAPTURE(msg);
    CHECK(steps == 6);
    CHECK(msg.find("training_control::lr_factor") != std::string::npos);
    CHECK(msg.find("after 6 updates") != std::string::npos);
    // the first epoch's end, the only checkpoint, was refused rather than written
    ls::io::checkpoint_manager mgr(dir, 3);
    CHECK(!mgr.latest());
    fs::remove_all(dir);
  }
}
