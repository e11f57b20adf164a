#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>
#include <string>
#include <vector>

#include "train/helpers.hpp"

using namespace train_test;
namespace fs = std::filesystem;

TEST_CASE("fit: history holds one exact entry per epoch") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{1});
  const std::size_t n = 103, bs = 16, val = 37;
  const auto dir = temp_dir("hist");
  fs::create_directories(dir);
  const auto h = ls::fit(s, m, ls::adam{.lr = 1e-2f}, ls::softmax_cross_entropy{}, pipeline(n, bs),
                         {.epochs = 4, .validation = eval_pipeline(val, 10), .quiet = true,
                          .metrics_file = (dir / "m.jsonl").string(), .top_k = 2});
  REQUIRE(h.epochs.size() == 4);
  CHECK(!h.stopped_early);
  for (std::size_t e = 0; e < 4; ++e) {
    const auto& st = h.epochs[e];
    CAPTURE(e);
    CHECK(st.epoch == e);
    CHECK(st.samples == n);
    CHECK(st.steps == (n + bs - 1) / bs);
    CHECK(st.global_step == (e + 1) * st.steps);
    CHECK(st.val_samples == val);
    CHECK(st.train_accuracy >= 0.0);
    CHECK(st.train_accuracy <= 1.0);
    CHECK(st.val_accuracy >= 0.0);
    CHECK(st.samples_per_second > 0);
    CHECK(st.lr == doctest::Approx(1e-2f));
  }
  CHECK(h.epochs.back().train_loss < h.epochs.front().train_loss);
  CHECK(h.last().val_accuracy > 0.6);  // three well separated clusters
  CHECK(m.step() == h.last().global_step);
  // the validation numbers are those of evaluate() on the final model
  const auto ev = ls::evaluate(s, m, ls::softmax_cross_entropy{}, eval_pipeline(val, 10), {.top_k = 2});
  CHECK(ev.accuracy == h.last().val_accuracy);
  // fit_options::top_k reaches the epoch's statistics (3 classes: top-2 counts more hits than top-1)
  CHECK(h.last().val_top_k == 2);
  CHECK(ev.top_k_accuracy == h.last().val_top_k_accuracy);
  CHECK(h.last().val_top_k_accuracy >= h.last().val_accuracy);
  CHECK(ls::epoch_line(h.last(), 4).find(" val_top2 ") != std::string::npos);
  // one JSON object per epoch
  std::ifstream in(dir / "m.jsonl");
  std::string line;
  std::size_t lines = 0;
  while (std::getline(in, line)) {
    CHECK(line.front() == '{');
    CHECK(line.back() == '}');
    CHECK(line.find("\"epoch\":" + std::to_string(lines)) != std::string::npos);
    CHECK(line.find("\"val_accuracy\":") != std::string::npos);
    CHECK(line.find("\"val_top_k\":2") != std::string::npos);
    CHECK(line.find("\"val_top_k_accuracy\":null") == std::string::npos);  // measured
    ++lines;
  }
  CHECK(lines == 4);
  fs::remove_all(dir);
}

TEST_CASE("epoch_line: a loss over no rows is a dash, a diverged one over some rows is nan") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const std::uint64_t rows : {0u, 1u, 640u}) {
    CAPTURE(rows);
    ls::epoch_stats s;
    s.train_loss = nan;
    s.samples = rows;
    s.val_loss = nan;
    s.val_accuracy = 0.5;
    s.val_samples = rows;
    const std::string line = ls::epoch_line(s, 3);
    CAPTURE(line);
    CHECK(line.find(rows ? "loss nan acc" : "loss - acc") != std::string::npos);
    CHECK(line.find(rows ? "val_loss nan val_acc 0.5000" : "val_loss - val_acc 0.5000") != std::string::npos);
    s.train_loss = 0.25;
    CHECK(ls::epoch_line(s, 3).find("loss 0.2500 acc") != std::string::npos);
  }
}

TEST_CASE("fit: train loss and accuracy are exact over replicas") {
  // with a zero learning rate the model never changes, so the epoch's train metrics must equal
  // the sums over the whole epoch (dropout makes them differ from evaluation, so compare runs)
  ls::mirrored<ls::cpu<0>> one;
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> three;
  auto m1 = one.replicate<net>(ls::seed{4});
  auto m3 = three.replicate<net>(ls::seed{4});
  const auto h1 = ls::fit(one, m1, ls::sgd{.lr = 0.0f}, ls::softmax_cross_entropy{}, pipeline(50, 7), {.epochs = 2, .quiet = true});
  const auto h3 = ls::fit(three, m3, ls::sgd{.lr = 0.0f}, ls::softmax_cross_entropy{}, pipeline(50, 7), {.epochs = 2, .quiet = true});
  for (std::size_t e = 0; e < 2; ++e) {
    CHECK(h1.epochs[e].train_accuracy == h3.epochs[e].train_accuracy);
    CHECK(h1.epochs[e].train_loss == doctest::Approx(h3.epochs[e].train_loss).epsilon(1e-6));
    CHECK(h3.epochs[e].samples == 50);
  }
}

TEST_CASE("fit: a learning-rate schedule callback sets the rate of every step") {
  const ls::step_schedule sched{.every = 3, .factor = 0.5f};
  const float base = 0.05f;
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto a = s.replicate<net>(ls::seed{2});
  std::vector<double> step_losses;
  const auto h = ls::fit(s, a, ls::sgd{.lr = base}, ls::softmax_cross_entropy{}, pipeline(40, 8),
                         {.epochs = 3,
                          .callbacks = {ls::lr_schedule(sched), ls::on_step_end([&](double l) { step_losses.push_back(l); })},
                          .quiet = true});
  REQUIRE(h.epochs.size() == 3);
  CHECK(step_losses.size() == 15);
  for (const auto& e : h.epochs) CHECK(e.lr == sched(base, e.global_step - 1));

  // the same steps by hand with the scheduled rates give bitwise the same parameters
  auto b = s.replicate<net>(ls::seed{2});
  const auto data = pipeline(40, 8);
  for (std::uint64_t e = 0; e < 3; ++e)
    for (auto& db : ls::data::shard_batches(data.epoch(e), s.num_replicas()))
      (void)ls::train_step(s, b, ls::sgd{.lr = sched(base, b.step())}, ls::softmax_cross_entropy{}, db);
  CHECK(b.step() == a.step());
  CHECK(params_of(a) == params_of(b));
}

TEST_CASE("fit, evaluate and train_step refuse a loss option out of range before any replica runs") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{5});
  const auto before = params_of(m);
  for (const auto& c : {std::pair{2.0f, "2"}, std::pair{-0.5f, "-0.5"}, std::pair{-1e-9f, "-9.99999972e-10"},
                        std::pair{std::numeric_limits<float>::quiet_NaN(), "nan"}}) {
    const float bad = c.first;
    const char* const shown = c.second;  // as the message prints it
    CAPTURE(bad);
    const ls::softmax_cross_entropy loss{.label_smoothing = bad};
    const std::string named = "label_smoothing must be in [0, 1), got " + std::string(shown);
    // not a replica_error from inside a replica, and not only where a shard has rows
    CHECK_THROWS_WITH_AS(ls::fit(s, m, ls::sgd{.lr = 0.1f}, loss, pipeline(30, 10), {.epochs = 1, .quiet = true}),
                         doctest::Contains(named.c_str()), ls::config_error);
    CHECK_THROWS_WITH_AS((void)ls::evaluate(s, m, loss, eval_pipeline(1, 4)), doctest::Contains(named.c_str()),
                         ls::config_error);  // one row: replica 1's shard is empty
    const auto data = pipeline(1, 4);
    for (auto& db : ls::data::shard_batches(data.epoch(0), s.num_replicas()))
      CHECK_THROWS_WITH_AS((void)ls::train_step(s, m, ls::sgd{.lr = 0.1f}, loss, db), doctest::Contains(named.c_str()),
                           ls::config_error);
  }
  CHECK(m.step() == 0);
  CHECK(params_of(m) == before);
  // the options' exact bits are what workers compare (tests/mpi), 0 included
  CHECK(ls::loss_hyperparameters(ls::softmax_cross_entropy{}) != ls::loss_hyperparameters(ls::softmax_cross_entropy{.label_smoothing = 0.1f}));
  CHECK(ls::loss_hyperparameters(ls::softmax_cross_entropy{.label_smoothing = 0.1f}) ==
        ls::loss_hyperparameters(ls::softmax_cross_entropy{.label_smoothing = 0.1f}));
  CHECK(ls::loss_hyperparameters(ls::mse{}).empty());  // a loss without options
}

TEST_CASE("fit's session: an update whose statistics hold no rows gives step callbacks NaN, not a loss of 0") {
  // Under defer_readback (GPU replicas) the run's first update and the update after each
  // checkpoint return no statistics: a step callback (TensorBoard's step/loss) must not read 0.
  std::vector<double> seen;
  ls::fit_options o{.quiet = true};
  o.callbacks = {ls::on_step_end([&](double l) { seen.push_back(l); })};
  ls::detail::fit_session run(o, 0.1f, 1);
  run.open_outputs();
  run.begin_epoch(0);
  const auto save = [](std::uint64_t, std::uint64_t) {};
  const auto late = [] { return ls::step_stats{}; };
  ls::step_stats none, two_rows;
  two_rows.loss_sum = 3.0;
  two_rows.count = 2;
  for (const ls::step_stats& r : {none, two_rows, none}) (void)run.end_step(r, seen.size() + 1, save, 1, late);
  REQUIRE(seen.size() == 3);
  CHECK(std::isnan(seen[0]));
  CHECK(seen[1] == 1.5);
  CHECK(std::isnan(seen[2]));
}

TEST_CASE("fit: early stopping ends training after `patience` epochs without improvement") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  for (std::uint64_t patience : {1u, 2u, 4u}) {
    CAPTURE(patience);
    auto m = s.replicate<net>(ls::seed{5});
    // lr = 0: the validation loss never improves after the first epoch
    const auto h = ls::fit(s, m, ls::sgd{.lr = 0.0f}, ls::softmax_cross_entropy{}, pipeline(30, 10),
                           {.epochs = 20,
                            .validation = eval_pipeline(20, 10),
                            .callbacks = {ls::early_stopping({.monitor = ls::monitored::val_loss, .patience = patience})},
                            .quiet = true});
    CHECK(h.epochs.size() == patience + 1);
    CHECK(h.stopped_early);
  }
  // a user lambda can stop too, and improving training does not stop early
  auto m = s.replicate<net>(ls::seed{5});
  std::size_t calls = 0;
  const auto h = ls::fit(s, m, ls::adam{.lr = 1e-2f}, ls::softmax_cross_entropy{}, pipeline(60, 10),
                         {.epochs = 10,
                          .callbacks = {ls::on_epoch_end([&](const ls::epoch_stats& st, ls::training_control& c) {
                            ++calls;
                            if (st.epoch == 2) c.stop = true;
                          })},
                          .quiet = true});
  CHECK(calls == 3);
  CHECK(h.epochs.size() == 3);
  CHECK(h.stopped_early);
}

TEST_CASE("fit: one early_stopping callback given to several fits starts each afresh, and refuses a bad min_delta") {
  ls::mirrored<ls::cpu<0>> s;
  // The first run learns (adam), so its best validation loss is low; the second starts from a
  // new model at lr 0, whose loss stays at its first epoch's: with the first run's best kept, no
  // epoch of the second would improve on it and it would stop after `patience` epochs, not
  // patience + 1.
  for (std::uint64_t patience : {1u, 3u}) {
    CAPTURE(patience);
    const ls::fit_options o{.epochs = 12,
                            .validation = eval_pipeline(20, 10),
                            .callbacks = {ls::early_stopping({.monitor = ls::monitored::val_loss, .patience = patience})},
                            .quiet = true};
    auto a = s.replicate<net>(ls::seed{5});
    const auto ha = ls::fit(s, a, ls::adam{.lr = 1e-2f}, ls::softmax_cross_entropy{}, pipeline(60, 10), o);
    auto b = s.replicate<net>(ls::seed{6});
    const auto hb = ls::fit(s, b, ls::sgd{.lr = 0.0f}, ls::softmax_cross_entropy{}, pipeline(30, 10), o);
    CAPTURE(ha.epochs.size());
    REQUIRE(!ha.epochs.empty());
    CHECK(hb.epochs.front().val_loss > ha.last().val_loss);  // the second run's loss is worse than the first's best
    CHECK(hb.epochs.size() == patience + 1);
    CHECK(hb.stopped_early);
  }
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  for (const auto& c : {std::pair{-0.5, "-0.5"}, std::pair{-1e-12, "-1e-12"}, std::pair{inf, "inf"}, std::pair{nan, "nan"}}) {
    const double bad = c.first;
    const char* const shown = c.second;  // as the message prints it
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(ls::early_stopping({.min_delta = bad}),
                         doctest::Contains(("min_delta is " + std::string(shown) + "; it must be finite and >= 0").c_str()),
                         ls::config_error);
  }
  CHECK_NOTHROW(ls::early_stopping({.min_delta = 0.0}));
}

TEST_CASE("fit: plain progress prints one line per epoch, quiet prints nothing") {
  ls::mirrored<ls::cpu<0>> s;
  auto m = s.replicate<net>(ls::seed{5});
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  (void)ls::fit(s, m, ls::adam{}, ls::softmax_cross_entropy{}, pipeline(20, 5),
                {.epochs = 3, .progress = {.stream = f, .live = false}});
  std::rewind(f);
  char buf[1024];
  // On a CPU whose AVX2 or AVX-512 the OpenBLAS kernels in use ignore, fit's warning comes first.
  const std::string warning = ls::host_gemm_warning();
  if (!warning.empty()) {
    REQUIRE(std::fgets(buf, sizeof buf, f));
    CHECK(std::string(buf) == warning + "\n");
  }
  std::size_t lines = 0;
  while (std::fgets(buf, sizeof buf, f)) {
    CHECK(std::string(buf).rfind("epoch " + std::to_string(lines + 1) + "/3:", 0) == 0);
    ++lines;
  }
  CHECK(lines == 3);
  std::fclose(f);
  f = std::tmpfile();
  (void)ls::fit(s, m, ls::adam{}, ls::softmax_cross_entropy{}, pipeline(20, 5),
                {.epochs = 1, .quiet = true, .progress = {.stream = f, .live = true}});
  CHECK(std::ftell(f) == 0);
  std::fclose(f);
}

TEST_CASE("fit: the live bar redraws in place and ends each epoch with its summary line") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{5});
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  (void)ls::fit(s, m, ls::adam{}, ls::softmax_cross_entropy{}, pipeline(40, 5),
                {.epochs = 2, .progress = {.stream = f, .live = true, .interval = std::chrono::milliseconds(0)}});
  std::string out;
  std::rewind(f);
  for (int ch = std::fgetc(f); ch != EOF; ch = std::fgetc(f)) out.push_back(static_cast<char>(ch));
  std::fclose(f);
  CHECK(out.find("\r\033[Kepoch 1/2 1/? |") != std::string::npos);     // first epoch: step count unknown
  CHECK(out.find("\r\033[Kepoch 2/2 [") != std::string::npos);            // then a bar with 8 steps
  CHECK(out.find("8/8 |") != std::string::npos);
  CHECK(out.find("samples/s | loss ") != std::string::npos);
  CHECK(out.find("ETA ") != std::string::npos);
  CHECK(out.find("\r\033[Kepoch 1/2: loss ") != std::string::npos);      // summary replaces the bar
  CHECK(out.find("\r\033[Kepoch 2/2: loss ") != std::string::npos);
  // One line per epoch, after fit's warning where the OpenBLAS kernels in use ignore this CPU's
  // AVX2 or AVX-512.
  const std::string warning = ls::host_gemm_warning();
  CHECK(out.rfind(warning.empty() ? std::string("\r") : warning + "\n", 0) == 0);
  CHECK(std::count(out.begin(), out.end(), '\n') == (warning.empty() ? 2 : 3));
}

TEST_CASE("fit: resume needs a checkpoint directory") {
  ls::mirrored<ls::cpu<0>> s;
  auto m = s.replicate<net>(ls::seed{5});
  CHECK_THROWS_AS(ls::fit(s, m, ls::adam{}, ls::softmax_cross_entropy{}, pipeline(20, 5), {.resume = true}),
                  ls::config_error);
}

TEST_CASE("fit: early stopping raises config_error for a metric the epochs do not measure, and stops on a diverged one") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{5});
  // val_loss (the default) without validation data: at the first epoch's end, naming both
  try {
    (void)ls::fit(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, pipeline(30, 10),
                  {.epochs = 5, .callbacks = {ls::early_stopping()}, .quiet = true});
    FAIL("early stopping on a metric that is never measured");
  } catch (const ls::config_error& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.find("monitors val_loss, but epoch 0 had no validation") != std::string::npos);
    CHECK(msg.find("fit_options::validation") != std::string::npos);
  }
  CHECK(m.step() == 3);  // one epoch ran
  // each metric, NaN because it was not measured or because training diverged
  const auto nan = std::numeric_limits<double>::quiet_NaN();
  struct row {
    ls::monitored metric;
    ls::epoch_stats st;
    bool raises;
  };
  ls::epoch_stats unmeasured;  // every metric NaN, no validation samples
  ls::epoch_stats diverged;
  diverged.train_loss = nan;
  diverged.val_loss = nan;
  diverged.val_samples = 10;
  ls::epoch_stats no_val_labels = diverged;  // validation ran but counted no hits
  no_val_labels.val_accuracy = nan;
  ls::epoch_stats no_train_labels;  // updates applied, but no labelled rows among them
  no_train_labels.steps = 3;
  no_train_labels.samples = 30;
  ls::epoch_stats all_skipped;  // the non-finite guard skipped every update: nothing measured, no improvement
  all_skipped.steps = 3;
  all_skipped.skipped_updates = 3;
  for (const row& r : {row{ls::monitored::val_loss, unmeasured, true}, row{ls::monitored::val_accuracy, unmeasured, true},
                       row{ls::monitored::train_accuracy, no_train_labels, true},
                       row{ls::monitored::train_accuracy, all_skipped, false},
                       row{ls::monitored::train_loss, all_skipped, false},
                       row{ls::monitored::val_accuracy, no_val_labels, true},
                       row{ls::monitored::train_loss, unmeasured, false}, row{ls::monitored::train_loss, diverged, false},
                       row{ls::monitored::val_loss, diverged, false}}) {
    CAPTURE(static_cast<int>(r.metric));
    CAPTURE(r.raises);
    auto c = ls::early_stopping({.monitor = r.metric, .patience = 2});
    ls::training_control ctl;
    if (r.raises) {
      CHECK_THROWS_AS(c.epoch_end(r.st, ctl), ls::config_error);
      continue;
    }
    CHECK_NOTHROW(c.epoch_end(r.st, ctl));  // at any epoch, not only the first
    CHECK_FALSE(ctl.stop);
    c.epoch_end(r.st, ctl);  // a NaN metric is no improvement: stops after `patience` epochs
    CHECK(ctl.stop);
  }
}
