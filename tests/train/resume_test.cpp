#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <utility>
#include <string>
#include <vector>

#include "train/helpers.hpp"

using namespace train_test;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t samples = 45, batch = 8;  // 6 steps per epoch, the last one uneven
const ls::adamw optimizer{.lr = 5e-3f, .weight_decay = 0.01f};

/// Trains (with checkpoints in `dir` when given) until `steps` updates are done in total.
template <class Strategy>
std::vector<float> train_to(std::uint64_t steps, const fs::path& dir = {}, bool resume = false,
                            std::uint64_t* start = nullptr) {
  Strategy s;
  auto m = s.template replicate<net>(ls::seed{21});
  const auto h = ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                         {.epochs = 1000,
                          .callbacks = {ls::lr_schedule(ls::cosine_schedule{.total = 40, .min_lr = 1e-4f})},
                          .quiet = true,
                          .checkpoint_dir = dir.string(),
                          .checkpoint_every = dir.empty() ? 0u : 1u,
                          .keep_checkpoints = 2,
                          .resume = resume,
                          .max_steps = steps});
  if (start) *start = h.resumed_from_step;
  REQUIRE(m.step() == steps);
  return params_of(m);
}

using two = ls::mirrored<ls::cpu<0>, ls::cpu<1>>;
template <class... Ds>
using invariant = ls::basic_mirrored<ls::select_reducer_t<Ds...>, ls::determinism::replica_count_invariant, Ds...>;

}  // namespace

TEST_CASE("resume: K steps, stop, M more steps is bitwise K+M uninterrupted steps") {
  for (const auto& km : std::vector<std::pair<std::uint64_t, std::uint64_t>>{{1, 2}, {3, 4}, {6, 1}, {7, 6}, {5, 8}}) {
    const std::uint64_t k = km.first;  // not a structured binding: CAPTURE's lambda uses it
    const std::uint64_t more = km.second;
    CAPTURE(k);
    CAPTURE(more);
    const auto dir = temp_dir("km");
    (void)train_to<two>(k, dir);
    std::uint64_t from = 0;
    const auto resumed = train_to<two>(k + more, dir, true, &from);
    CHECK(from == k);
    const auto straight = train_to<two>(k + more);
    CHECK(resumed == straight);
    fs::remove_all(dir);
  }
}

TEST_CASE("resume: with replica_count_invariant the replica count may change at the restart") {
  const auto straight = train_to<invariant<ls::cpu<0>>>(9);
  const auto dir = temp_dir("inv");
  (void)train_to<invariant<ls::cpu<0>, ls::cpu<1>>>(4, dir);
  const auto resumed = train_to<invariant<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>>(9, dir, true);
  CHECK(resumed == straight);
  fs::remove_all(dir);
}

TEST_CASE("resume: a checkpoint of another model, model seed or pipeline seed is refused, naming both seeds") {
  const auto dir = temp_dir("other");
  (void)train_to<two>(2, dir);
  using other = ls::sequential<ls::dense<width, 12>, ls::relu, ls::dense<12, classes>>;
  two s;
  auto m = s.replicate<other>(ls::seed{21});
  CHECK_THROWS_AS(ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                          {.quiet = true, .checkpoint_dir = dir.string(), .resume = true}),
                  ls::checkpoint_error);
  auto wrong_seed = s.replicate<net>(ls::seed{22});
  CHECK_THROWS_WITH_AS(ls::fit(s, wrong_seed, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                               {.quiet = true, .checkpoint_dir = dir.string(), .resume = true}),
                       doctest::Contains("section 'fit' (FITS): the checkpoint's model seed 21 differs from this model's seed 22"),
                       ls::checkpoint_error);
  // The pipeline's seed as fit_options::data_seed records it: another would reorder the epoch.
  auto same = s.replicate<net>(ls::seed{21});
  CHECK_THROWS_WITH_AS(ls::fit(s, same, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                               {.quiet = true, .checkpoint_dir = dir.string(), .resume = true, .data_seed = 5}),
                       doctest::Contains("section 'fit' (FITS): the checkpoint's pipeline seed 0 differs from fit_options::data_seed 5"),
                       ls::checkpoint_error);
  CHECK(same.step() == 0);  // refused before anything was restored
  fs::remove_all(dir);
}

TEST_CASE("resume: a pipeline that gives other batches than those consumed before a mid-epoch checkpoint is refused") {
  // The checkpoint records the rows (dataset indices) of the batches of the epoch consumed so far;
  // resuming skips as many batches: another shuffle or batch size would train samples twice or
  // never, silently. The same data_seed (the option is the user's record, not the pipeline's).
  const auto dir = temp_dir("pipe");
  (void)train_to<two>(3, dir);  // 3 of epoch 0's 6 batches consumed
  // A run resumed from checkpoint directory `from` with the pipeline `data`.
  const auto resumed_from = [&](const fs::path& from, auto data) {
    two s;
    auto m = s.replicate<net>(ls::seed{21});
    return ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, data,
                   {.epochs = 1000,
                    .callbacks = {ls::lr_schedule(ls::cosine_schedule{.total = 40, .min_lr = 1e-4f})},
                    .quiet = true,
                    .checkpoint_dir = from.string(),
                    .resume = true,
                    .max_steps = 4});
  };
  const auto resumed = [&](auto data) { return resumed_from(dir, data); };
  for (const std::size_t other_batch : {std::size_t{4}, std::size_t{9}}) {
    CAPTURE(other_batch);
    CHECK_THROWS_WITH_AS(
        (void)resumed(pipeline(samples, other_batch)),
        doctest::Contains("section 'fit pipeline position' (FPIP): the 3 batches of epoch 0 consumed before the "
                          "checkpoint are not those the pipeline gives now"),
        ls::checkpoint_error);
  }
  CHECK_THROWS_WITH_AS((void)resumed(pipeline(samples, batch, 6)), doctest::Contains("ckpt-000000000003.lsck: section"), ls::checkpoint_error);
  // The same pipeline resumes (and the files the refusals left are the same ones).
  CHECK(resumed(pipeline(samples, batch)).resumed_from_step == 3);
  fs::remove_all(dir);
  // A state saved without the record (filled by hand, or read from an older file) writes no FPIP
  // and resumes unchecked: any pipeline is accepted, as before the section existed.
  const auto by_hand = temp_dir("pipe_by_hand");
  (void)train_to<two>(3, by_hand);
  const auto newest = ls::checkpoint_manager(by_hand, 2).latest();
  REQUIRE(newest.has_value());
  ls::checkpoint_state st = ls::load_checkpoint(*newest);
  CHECK(st.consumed_rows_hash.has_value());
  st.consumed_rows_hash.reset();
  ls::save_checkpoint(*newest, st);
  CHECK(!ls::load_checkpoint(*newest).consumed_rows_hash.has_value());
  CHECK(resumed_from(by_hand, pipeline(samples, 4)).resumed_from_step == 3);
  fs::remove_all(by_hand);
  // A run resumed mid-epoch records the skipped batches too: resumed again in the same epoch, it
  // continues to the uninterrupted result.
  const auto twice = temp_dir("pipe_twice");
  (void)train_to<two>(2, twice);
  (void)train_to<two>(4, twice, true);
  std::uint64_t from = 0;
  CHECK(train_to<two>(5, twice, true, &from) == train_to<two>(5));
  CHECK(from == 4);
  fs::remove_all(twice);
}

TEST_CASE("resume: a checkpoint of another kind of optimiser is refused, naming both") {
  const auto dir = temp_dir("optim");
  (void)train_to<two>(2, dir);  // adamw: two state values per parameter
  two s;
  auto m = s.replicate<net>(ls::seed{21});
  try {
    (void)ls::fit(s, m, ls::sgd{.lr = 0.1f, .momentum = 0.9f}, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                  {.callbacks = {ls::lr_schedule(ls::cosine_schedule{.total = 40, .min_lr = 1e-4f})},
                   .quiet = true,
                   .checkpoint_dir = dir.string(),
                   .resume = true});
    FAIL("resumed with another optimiser");
  } catch (const ls::checkpoint_error& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.find("section 'optimizer'") != std::string::npos);
    CHECK(msg.find("lockstep::adam or lockstep::adamw") != std::string::npos);
    CHECK(msg.find("lockstep::sgd with momentum 0.9 keeps") != std::string::npos);
    CHECK(msg.find("(resume with the model, seed and optimiser that wrote it, or use another checkpoint_dir)") != std::string::npos);  // and what to do
  }
  CHECK(m.step() == 0);  // nothing was loaded
  fs::remove_all(dir);
}

TEST_CASE("resume: an AdamW checkpoint resumed with Adam (the same state size) is refused, naming both") {
  const auto dir = temp_dir("adamw_adam");
  (void)train_to<two>(2, dir);  // adamw
  two s;
  auto m = s.replicate<net>(ls::seed{21});
  try {
    (void)ls::fit(s, m, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                  {.callbacks = {ls::lr_schedule(ls::cosine_schedule{.total = 40, .min_lr = 1e-4f})},
                   .quiet = true,
                   .checkpoint_dir = dir.string(),
                   .resume = true});
    FAIL("resumed AdamW's moments with Adam");
  } catch (const ls::checkpoint_error& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.find("section 'optimizer'") != std::string::npos);
    CHECK(msg.find("written by lockstep::adamw;") != std::string::npos);
    CHECK(msg.find("this run's optimizer lockstep::adam keeps as much state") != std::string::npos);
    CHECK(msg.find("(resume with the model, seed and optimiser that wrote it, or use another checkpoint_dir)") != std::string::npos);
  }
  CHECK(m.step() == 0);  // nothing was loaded
  fs::remove_all(dir);
}

TEST_CASE("resume: SIGKILL while checkpointing every step leaves a loadable checkpoint to resume from") {
  const ls::counter_rng rng(static_cast<std::uint64_t>(::getpid()), 3);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    const auto dir = temp_dir("kill" + std::to_string(round));
    // checkpoints after every step until killed, at a random moment after its first checkpoint
    REQUIRE(killed_while_checkpointing(dir, rng.u32(static_cast<std::uint64_t>(round)) % 200'000,
                                       [&] { (void)train_to<two>(1'000'000, dir); }));

    ls::checkpoint_manager mgr(dir, 2);
    const auto latest = mgr.load_latest(ls::model_signature<net>());  // never a torn file
    REQUIRE(latest.has_value());
    const std::uint64_t k = ls::checkpoint_state::from_file(*latest).step;
    INFO("killed after checkpoint step ", k);
    CHECK(k >= 1);
    std::uint64_t from = 0;
    const auto resumed = train_to<two>(k + 3, dir, true, &from);
    CHECK(from == k);
    CHECK(resumed == train_to<two>(k + 3));
    fs::remove_all(dir);
  }
}

namespace {

/// One early-stopping run: its history, final parameters and how many epoch ends a stateful
/// user callback has counted (across resumes, through its saved state).
struct stopping_run {
  ls::history h;
  std::vector<float> params;
  double epoch_ends = 0;
};

/// A user callback with state: counts epoch ends, saved and restored through checkpoints.
ls::callback epoch_counter(std::shared_ptr<double> n) {
  ls::callback c = ls::on_epoch_end([n](const ls::epoch_stats&) { *n += 1; });
  c.save_state = [n] { return std::vector<double>{*n}; };
  c.load_state = [n](std::span<const double> v) {
    if (v.size() != 1) throw ls::checkpoint_error("epoch_counter: expected one value");
    *n = v[0];
  };
  return c;
}

constexpr std::uint64_t stop_patience = 2;

stopping_run stopping_to(std::uint64_t max_steps, const fs::path& dir = {}, bool resume = false,
                         std::uint64_t every = 0) {
  two s;
  auto m = s.replicate<net>(ls::seed{21});
  auto n = std::make_shared<double>(0);
  stopping_run r;
  r.h = ls::fit(s, m, ls::adamw{.lr = 2e-2f, .weight_decay = 0.01f}, ls::softmax_cross_entropy{},
                pipeline(samples, batch),
                {.epochs = 40,
                 .validation = eval_pipeline(30, 10),
                 .callbacks = {ls::early_stopping({.monitor = ls::monitored::val_loss, .patience = stop_patience,
                                                   .min_delta = 0.01}),
                               epoch_counter(n)},
                 .quiet = true,
                 .checkpoint_dir = dir.string(),
                 .checkpoint_every = every,
                 .resume = resume,
                 .max_steps = max_steps});
  r.params = params_of(m);
  r.epoch_ends = *n;
  return r;
}

/// The fields of epoch_stats that do not depend on timing.
void check_same_epoch(const ls::epoch_stats& a, const ls::epoch_stats& b) {
  CHECK(a.epoch == b.epoch);
  CHECK(a.train_loss == b.train_loss);
  CHECK(a.train_accuracy == b.train_accuracy);
  CHECK(a.val_loss == b.val_loss);
  CHECK(a.val_accuracy == b.val_accuracy);
  CHECK(a.val_samples == b.val_samples);
  CHECK(a.lr == b.lr);
  CHECK(a.steps == b.steps);
  CHECK(a.samples == b.samples);
  CHECK(a.global_step == b.global_step);
}

}  // namespace

TEST_CASE("resume: early stopping stops an interrupted run at the same epoch as an uninterrupted one") {
  constexpr std::uint64_t steps_per_epoch = 6;
  const auto straight = stopping_to(0);
  REQUIRE(straight.h.stopped_early);
  const std::uint64_t epochs_run = straight.h.epochs.size();
  INFO("the uninterrupted run stopped after ", epochs_run, " epochs");
  REQUIRE(epochs_run > stop_patience + 2);  // stops mid-run, after some improvement
  REQUIRE(epochs_run < 40);
  CHECK(straight.epoch_ends == static_cast<double>(epochs_run));
  const std::uint64_t total_steps = straight.h.last().global_step;

  // interruptions at epoch ends, in the middle of epochs and during the patience window
  std::vector<std::uint64_t> cuts{1, steps_per_epoch, steps_per_epoch + 3, 2 * steps_per_epoch, total_steps - 1,
                                  total_steps - steps_per_epoch, total_steps - steps_per_epoch - 2};
  for (const std::uint64_t every : {std::uint64_t{0}, std::uint64_t{1}}) {
    for (const std::uint64_t cut : cuts) {
      CAPTURE(every);
      CAPTURE(cut);
      REQUIRE(cut < total_steps);
      const auto dir = temp_dir("stop");
      const auto first = stopping_to(cut, dir, false, every);
      REQUIRE(first.h.last().global_step == cut);
      const auto resumed = stopping_to(0, dir, true, every);
      CHECK(resumed.h.resumed_from_step == cut);
      CHECK(resumed.h.stopped_early);
      CHECK(resumed.params == straight.params);
      CHECK(resumed.epoch_ends == straight.epoch_ends);
      REQUIRE(!resumed.h.epochs.empty());
      const std::uint64_t from = resumed.h.epochs.front().epoch;
      CHECK(from == cut / steps_per_epoch);  // the epoch the cut fell in (one it ended is whole: the next)
      REQUIRE(from + resumed.h.epochs.size() == epochs_run);
      for (std::size_t i = 0; i < resumed.h.epochs.size(); ++i) {
        CAPTURE(i);
        check_same_epoch(resumed.h.epochs[i], straight.h.epochs[from + i]);
      }
      fs::remove_all(dir);
    }
  }

  // interrupted twice, then resumed to the end
  const auto dir = temp_dir("stop2");
  (void)stopping_to(steps_per_epoch + 2, dir);
  (void)stopping_to(3 * steps_per_epoch + 5, dir, true);
  const auto third = stopping_to(0, dir, true);
  CHECK(third.params == straight.params);
  CHECK(third.h.last().epoch == straight.h.last().epoch);
  CHECK(third.epoch_ends == straight.epoch_ends);

  // resuming a run that early stopping ended trains nothing more and reports the stop
  const auto again = stopping_to(0, dir, true);
  CHECK(again.h.epochs.empty());
  CHECK(again.h.stopped_early);
  CHECK(again.params == straight.params);
  CHECK(again.h.resumed_from_step == total_steps);
  fs::remove_all(dir);
}

TEST_CASE("resume: a checkpoint with another number of callback states is refused, naming the counts") {
  const auto dir = temp_dir("cbcount");
  (void)stopping_to(4, dir);  // two callbacks
  for (std::size_t given : {0u, 1u, 3u}) {
    CAPTURE(given);
    two s;
    auto m = s.replicate<net>(ls::seed{21});
    std::vector<ls::callback> cbs;
    for (std::size_t i = 0; i < given; ++i) cbs.push_back(ls::early_stopping());
    const auto before = params_of(m);
    try {
      (void)ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                    {.callbacks = cbs, .quiet = true, .checkpoint_dir = dir.string(), .resume = true});
      FAIL("no exception");
    } catch (const ls::checkpoint_error& e) {
      const std::string msg = e.what();
      CHECK(msg.find("section 'callbacks'") != std::string::npos);
      CHECK(msg.find("state of 2 callbacks") != std::string::npos);
      CHECK(msg.find("given " + std::to_string(given) + " callbacks") != std::string::npos);
    }
    CHECK(params_of(m) == before);  // nothing was loaded
    CHECK(m.step() == 0);
  }
  // the same count with a callback whose state does not fit it is refused too
  {
    two s;
    auto m = s.replicate<net>(ls::seed{21});
    CHECK_THROWS_AS(ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                            {.callbacks = {epoch_counter(std::make_shared<double>(0)), ls::early_stopping()},
                             .quiet = true,
                             .checkpoint_dir = dir.string(),
                             .resume = true}),
                    ls::checkpoint_error);
  }
  fs::remove_all(dir);
}

namespace {
/// Strategy S with the optimiser update sharded over its replicas (strategy_options::shard_optimizer).
template <class S>
struct sharded : S {
  sharded() : S(ls::strategy_options{.shard_optimizer = true}) {}
};
}  // namespace

TEST_CASE("resume: checkpoints of a sharded optimiser update resume bitwise, sharded or not, on other replica counts") {
  const auto straight = train_to<invariant<ls::cpu<0>>>(9);
  SUBCASE("sharded on 3 replicas, resumed sharded on 2") {
    const auto dir = temp_dir("shard32");
    (void)train_to<sharded<invariant<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>>>(4, dir);
    CHECK(train_to<sharded<invariant<ls::cpu<0>, ls::cpu<1>>>>(9, dir, true) == straight);
    fs::remove_all(dir);
  }
  SUBCASE("sharded on 2 replicas, resumed unsharded on 1") {
    const auto dir = temp_dir("shard21");
    (void)train_to<sharded<invariant<ls::cpu<0>, ls::cpu<1>>>>(5, dir);
    CHECK(train_to<invariant<ls::cpu<0>>>(9, dir, true) == straight);
    fs::remove_all(dir);
  }
  SUBCASE("run_to_run: sharded K steps, resumed sharded, is the unsharded run") {
    const auto plain = train_to<two>(9);
    const auto dir = temp_dir("shardrr");
    (void)train_to<sharded<two>>(3, dir);
    CHECK(train_to<sharded<two>>(9, dir, true) == plain);
    fs::remove_all(dir);
  }
}

namespace {
/// Trains `steps` updates in total with checkpoints in `dir`, the progress display written to a
/// file; returns what it printed.
std::string progress_of(const fs::path& dir, bool resume, std::uint64_t steps) {
  std::FILE* out = std::tmpfile();
  REQUIRE(out != nullptr);
  two s;
  auto m = s.replicate<net>(ls::seed{21});
  (void)ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                {.epochs = 1000,
                 .progress = {.stream = out, .live = false},
                 .checkpoint_dir = dir.string(),
                 .checkpoint_every = 1,
                 .resume = resume,
                 .max_steps = steps});
  std::string text;
  std::rewind(out);
  for (int ch = std::fgetc(out); ch != EOF; ch = std::fgetc(out)) text.push_back(static_cast<char>(ch));
  std::fclose(out);
  return text;
}
}  // namespace

TEST_CASE("resume: fit says where a run starts, and its epoch count honours max_steps") {
  const auto dir = temp_dir("lines");
  const std::string fresh = progress_of(dir, true, 4);  // resume asked, nothing to resume
  CAPTURE(fresh);
  CHECK(fresh.rfind("no checkpoint in " + dir.string() + ": starting fresh\n", 0) == 0);
  CHECK(fresh.find("epoch 1/1: ") != std::string::npos);  // the budget of 4 updates ends in epoch 1
  CHECK(fresh.find("max_steps 4 reached") != std::string::npos);
  const std::string resumed = progress_of(dir, true, 9);  // from step 4, in epoch 1
  CAPTURE(resumed);
  CHECK(resumed.rfind("resuming from " + (dir / "ckpt-000000000004.lsck").string() + " (epoch 1, step 4)\n", 0) == 0);
  CHECK(resumed.find("epoch 2/2: ") != std::string::npos);  // 6 steps an epoch: the budget of 9 ends in epoch 2
  const auto plain_dir = temp_dir("lines_plain");
  const std::string plain = progress_of(plain_dir, false, 2);  // no resume asked: no line
  CHECK(plain.find("starting fresh") == std::string::npos);
  CHECK(plain.find("resuming from") == std::string::npos);
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(plain_dir);
}

TEST_CASE("resume: a fresh run refuses a checkpoint_dir holding checkpoints, and the manager a save below them") {
  const auto dir = temp_dir("fresh_in_used");
  (void)train_to<two>(4, dir);  // keeps steps 3 and 4
  ls::checkpoint_manager mgr(dir, 2);
  const auto before = mgr.list();
  REQUIRE(before.size() == 2);
  // a fresh run there would delete its own checkpoints (lower steps) and a resume would continue the other run
  try {
    (void)train_to<two>(2, dir);
    FAIL("a fresh run started among another run's checkpoints");
  } catch (const ls::config_error& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.find("checkpoint_dir " + dir.string() +
                   " holds checkpoints of another run (ckpt-000000000004.lsck, step 4, while the model has done 0 "
                   "updates)") != std::string::npos);
    CHECK(msg.find("fit_options::resume") != std::string::npos);
  }
  CHECK(mgr.list() == before);
  // the same model trained on, without resume, writes later steps there: its own run, allowed
  {
    two s;
    auto m = s.replicate<net>(ls::seed{21});
    for (const std::uint64_t steps : {std::uint64_t{5}, std::uint64_t{7}})
      (void)ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                    {.epochs = 1000, .quiet = true, .checkpoint_dir = (dir / "stages").string(), .checkpoint_every = 1,
                     .keep_checkpoints = 2, .max_steps = steps});
    CHECK(m.step() == 7);
    CHECK(ls::checkpoint_manager(dir / "stages", 2).latest() == ls::checkpoint_manager(dir / "stages", 2).path_for(7));
  }
  // the manager refuses a step below the newest; the same step and later ones are saved
  const auto file = ls::io::load_checkpoint_file(before.back());
  for (const std::uint64_t step : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{3}}) {
    CAPTURE(step);
    try {
      (void)mgr.save(file, step);
      FAIL("saved below the newest checkpoint");
    } catch (const ls::checkpoint_error& e) {
      const std::string msg = e.what();
      CAPTURE(msg);
      CHECK(msg.find("holds ckpt-000000000004.lsck, of a later step than " + std::to_string(step)) != std::string::npos);
    }
    CHECK(mgr.list() == before);
  }
  CHECK(mgr.save(file, 4) == before.back());
  CHECK(mgr.save(file, 9) == mgr.path_for(9));
  CHECK(mgr.list() == std::vector<fs::path>{before.back(), mgr.path_for(9)});
  fs::remove_all(dir);
}

TEST_CASE("resume: bad options are refused before a resume changes the model or the callbacks") {
  const auto dir = temp_dir("opts_first");
  (void)stopping_to(4, dir);  // callbacks: early stopping, epoch counter
  const auto run = [&](const ls::fit_options& bad) {
    two s;
    auto m = s.replicate<net>(ls::seed{21});
    const auto before = params_of(m);
    auto n = std::make_shared<double>(77);
    ls::fit_options o = bad;
    o.callbacks = {ls::early_stopping(), epoch_counter(n)};
    o.quiet = true;
    o.checkpoint_dir = dir.string();
    o.resume = true;
    CHECK_THROWS_AS(ls::fit(s, m, ls::adamw{.lr = 2e-2f, .weight_decay = 0.01f}, ls::softmax_cross_entropy{},
                            pipeline(samples, batch), o),
                    ls::config_error);
    CHECK(params_of(m) == before);
    CHECK(m.step() == 0);
    CHECK(*n == 77);  // the counter's state was not loaded
  };
  run({.accumulate = 0});
  run({.top_k = 0});
  run({.validate_with_ema = true});
  run({.clip_global_norm = -1});
  run({.metrics_file = (dir / "no-such-directory" / "metrics.jsonl").string()});  // cannot be opened
  fs::remove_all(dir);
}

TEST_CASE("resume: a pipeline refused mid-epoch (FPIP) gives the callbacks their states back") {
  const auto dir = temp_dir("pipe_callbacks");
  (void)stopping_to(9, dir, false, 1);  // step 9: epoch 1, 3 of its 6 batches consumed; the counter at 1
  two s;
  auto m = s.replicate<net>(ls::seed{21});
  auto n = std::make_shared<double>(77);
  CHECK_THROWS_WITH_AS(
      ls::fit(s, m, ls::adamw{.lr = 2e-2f, .weight_decay = 0.01f}, ls::softmax_cross_entropy{},
              pipeline(samples, batch, 6),  // another shuffle
              {.epochs = 40,
               .callbacks = {ls::early_stopping({.monitor = ls::monitored::val_loss, .patience = stop_patience,
                                                 .min_delta = 0.01}),
                             epoch_counter(n)},
               .quiet = true,
               .checkpoint_dir = dir.string(),
               .resume = true}),
      doctest::Contains("the 3 batches of epoch 1 consumed before the checkpoint"), ls::checkpoint_error);
  CHECK(*n == 77);  // the checkpoint's 1 was loaded, then given back
  fs::remove_all(dir);
}

TEST_CASE("resume: a callback refusing its state gives the callbacks before it their own states back") {
  const auto dir = temp_dir("cb_rollback");
  (void)stopping_to(4, dir);  // states: early stopping's two values, the counter's one
  two s;
  auto m = s.replicate<net>(ls::seed{21});
  const auto before = params_of(m);
  auto kept = std::make_shared<std::vector<double>>(std::vector<double>{5, 6, 7});
  ls::callback first;  // takes any state
  first.save_state = [kept] { return *kept; };
  first.load_state = [kept](std::span<const double> v) { kept->assign(v.begin(), v.end()); };
  ls::callback second;  // refuses every state
  second.save_state = [] { return std::vector<double>{}; };
  second.load_state = [](std::span<const double>) { throw ls::checkpoint_error("second: not mine"); };
  try {
    (void)ls::fit(s, m, ls::adamw{.lr = 2e-2f, .weight_decay = 0.01f}, ls::softmax_cross_entropy{},
                  pipeline(samples, batch),
                  {.callbacks = {first, second}, .quiet = true, .checkpoint_dir = dir.string(), .resume = true});
    FAIL("no exception");
  } catch (const ls::checkpoint_error& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.find("callback 1: second: not mine") != std::string::npos);
  }
  CHECK(*kept == std::vector<double>{5, 6, 7});
  CHECK(params_of(m) == before);
  fs::remove_all(dir);
}

TEST_CASE("resume: an epoch max_steps cuts short reaches the history only, and the resumed run reports it once, whole") {
  const auto dir = temp_dir("cut_short");
  const auto metrics = dir / "metrics.jsonl";
  const auto train = [&](std::uint64_t steps, bool resume, std::shared_ptr<double> n) {
    two s;
    auto m = s.replicate<net>(ls::seed{21});
    return ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                   {.epochs = 1000,
                    .validation = eval_pipeline(30, 10),
                    .callbacks = {epoch_counter(std::move(n))},
                    .quiet = true,
                    .metrics_file = metrics.string(),
                    .checkpoint_dir = (dir / "ck").string(),
                    .resume = resume,
                    .max_steps = steps});
  };
  const auto lines = [&] {
    std::ifstream in(metrics);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  };
  auto n = std::make_shared<double>(0);
  const auto first = train(4, false, n);  // 6 steps an epoch: cut in epoch 0
  REQUIRE(first.epochs.size() == 1);
  CHECK(first.epochs[0].cut_short);
  CHECK(first.epochs[0].steps == 4);
  CHECK(first.epochs[0].val_samples == 30);  // validated all the same
  CHECK(*n == 0);                             // no callback saw it
  CHECK(lines().empty());                     // nor the metrics file
  CHECK_FALSE(first.stopped_early);
  // to the end of epoch 1 exactly: both epochs whole, once each
  auto n2 = std::make_shared<double>(0);
  const auto second = train(12, true, n2);
  REQUIRE(second.epochs.size() == 2);
  CHECK_FALSE(second.epochs[0].cut_short);
  CHECK_FALSE(second.epochs[1].cut_short);
  CHECK(second.epochs[0].steps == 6);
  CHECK(*n2 == 2);
  auto rows = lines();
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].rfind("{\"epoch\":0,", 0) == 0);
  CHECK(rows[1].rfind("{\"epoch\":1,", 0) == 0);
  // a budget ending at an epoch's end leaves nothing to finish: the next run starts at epoch 2
  auto n3 = std::make_shared<double>(0);
  const auto third = train(13, true, n3);
  REQUIRE(third.epochs.size() == 1);
  CHECK(third.epochs[0].epoch == 2);
  CHECK(third.epochs[0].cut_short);
  CHECK(*n3 == 2);  // the counter's state, and no call for the cut epoch
  CHECK(lines().size() == 2);
  fs::remove_all(dir);
}

TEST_CASE("fit: a batch past max_steps that fails to load ends nothing: the run stops as asked, with its checkpoint") {
  // fit looks at the batch after the last update to know whether the epoch is finished (under
  // accumulation, before that update); the error of that batch is not this run's (it trained none
  // of it), so the run makes its last update, keeps its history and writes its cut-short
  // checkpoint. 6 batches per epoch: the bad batch is batch steps x accumulate + 1.
  const std::vector<std::pair<std::uint64_t, std::uint64_t>> cases = {{1, 1}, {1, 4}, {1, 5}, {2, 1}, {2, 2}, {3, 1}};
  for (const auto& c : cases) {
    const std::uint64_t accumulate = c.first, steps = c.second;  // named: clang 14's lambdas cannot capture bindings
    CAPTURE(accumulate);
    CAPTURE(steps);
    const auto dir = temp_dir("stop_before_bad_batch");
    two s;
    auto m = s.replicate<net>(ls::seed{21});
    auto loaded = std::make_shared<std::uint64_t>(0);
    const std::uint64_t bad = steps * accumulate + 1;  // counted from 1
    const auto bad_after = [loaded, bad](ls::data::batch b) {
      if (++*loaded == bad) throw ls::data_error("lockstep test: batch " + std::to_string(bad - 1) + " is corrupt");
      return b;
    };
    const auto h = ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch) | ls::data::map(bad_after),
                           {.epochs = 3, .quiet = true, .checkpoint_dir = (dir / "ck").string(), .max_steps = steps,
                            .accumulate = accumulate});
    CHECK(m.step() == steps);
    REQUIRE(h.epochs.size() == 1);
    CHECK(h.epochs[0].steps == steps);
    CHECK(h.epochs[0].cut_short);
    const ls::checkpoint_manager ck((dir / "ck").string());
    REQUIRE(ck.latest().has_value());
    CHECK(ls::checkpoint_manager::step_of(*ck.latest()) == steps);
    // the same batch met by a run that trains on it: the error is raised
    auto again = s.replicate<net>(ls::seed{21});
    *loaded = 0;
    CHECK_THROWS_AS(ls::fit(s, again, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch) | ls::data::map(bad_after),
                            {.epochs = 3, .quiet = true, .max_steps = steps + 1, .accumulate = accumulate}),
                    ls::data_error);
    CHECK(again.step() == steps);  // the updates before the bad batch's were made
    fs::remove_all(dir);
  }
  // The bad batch inside an update, after a held batch that only accumulates: the error is raised,
  // after the updates before it.
  for (const std::uint64_t accumulate : {2u, 3u}) {
    CAPTURE(accumulate);
    two s;
    auto m = s.replicate<net>(ls::seed{21});
    auto loaded = std::make_shared<std::uint64_t>(0);
    const std::uint64_t bad = accumulate + 2;  // the second batch of update 2
    const auto bad_at = [loaded, bad](ls::data::batch b) {
      if (++*loaded == bad) throw ls::data_error("lockstep test: batch " + std::to_string(bad - 1) + " is corrupt");
      return b;
    };
    CHECK_THROWS_AS(ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch) | ls::data::map(bad_at),
                            {.epochs = 3, .quiet = true, .max_steps = 2, .accumulate = accumulate}),
                    ls::data_error);
    CHECK(m.step() == 1);
  }
}
