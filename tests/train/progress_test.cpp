// Tests of train/progress.hpp on its own: the step budget (max_steps) in the bar, the epoch count
// and the summary; the lines that say where a run starts; the metrics file's errors.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/train/progress.hpp>

namespace ls = lockstep;

namespace {

/// Everything written to `f` so far.
std::string contents(std::FILE* f) {
  std::string out;
  std::rewind(f);
  for (int ch = std::fgetc(f); ch != EOF; ch = std::fgetc(f)) out.push_back(static_cast<char>(ch));
  return out;
}

/// The epochs a run shows, by walking its steps one by one.
std::uint64_t walk(std::uint64_t epochs, std::uint64_t max_steps, std::uint64_t epoch, std::uint64_t done,
                   std::uint64_t consumed, std::uint64_t per_epoch) {
  std::uint64_t last = epoch, e = epoch, pos = consumed;
  while (done < max_steps && e < epochs) {
    if (pos < per_epoch) {
      ++pos;
      ++done;
      last = e;
    } else {
      ++e;
      pos = 0;
    }
  }
  return std::min(epochs, last + 1);
}

ls::epoch_stats stats(std::uint64_t epoch, std::uint64_t global_step) {
  ls::epoch_stats s;
  s.epoch = epoch;
  s.global_step = global_step;
  s.train_loss = 0.5;
  s.train_accuracy = 0.75;
  return s;
}

}  // namespace

TEST_CASE("progress: the lines that say where a run starts") {
  CHECK(ls::resume_line("ckpt/ckpt-000000000469.lockstep", 1, 469) ==
        "resuming from ckpt/ckpt-000000000469.lockstep (epoch 2, step 469)");
  CHECK(ls::resume_line("a", 0, 0) == "resuming from a (epoch 1, step 0)");
  CHECK(ls::fresh_start_line("runs/first") == "no checkpoint in runs/first: starting fresh");
}

TEST_CASE("progress: epochs_within_budget is the number of epochs the step budget lets run") {
  for (const std::uint64_t epochs : {1u, 3u, 20u})
    for (const std::uint64_t per_epoch : {1u, 7u, 8u, 469u})
      for (const std::uint64_t max_steps : {1u, 7u, 8u, 9u, 100u, 10000u})
        for (const std::uint64_t epoch : {0u, 1u, 2u})
          for (const std::uint64_t consumed : {0u, 1u, 5u}) {
            if (epoch >= epochs || consumed > per_epoch) continue;
            const std::uint64_t done = epoch * per_epoch + consumed;
            if (done >= max_steps) continue;  // fit runs no such epoch
            CAPTURE(epochs);
            CAPTURE(per_epoch);
            CAPTURE(max_steps);
            CAPTURE(epoch);
            CAPTURE(consumed);
            CHECK(ls::epochs_within_budget(epochs, max_steps, epoch, done, consumed, per_epoch) ==
                  walk(epochs, max_steps, epoch, done, consumed, per_epoch));
          }
  // No budget, or steps per epoch not known yet: the epochs asked for.
  CHECK(ls::epochs_within_budget(20, 0, 0, 0, 0, 469) == 20);
  CHECK(ls::epochs_within_budget(20, 100, 0, 0, 0, 0) == 20);
}

TEST_CASE("progress: with max_steps the bar ends at the budget and the counts are the budget's") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  {
    // 20 epochs of 469 steps asked for, but max_steps = 100: one epoch of 100 steps runs.
    ls::progress bar({.stream = f, .live = true, .interval = std::chrono::milliseconds(0)}, 20, 100);
    bar.begin_epoch(0, 469);
    for (std::uint64_t k = 1; k <= 100; ++k) bar.step(k, 128 * k, 0.5);
    bar.end_epoch(stats(0, 100));
  }
  const std::string out = contents(f);
  std::fclose(f);
  CAPTURE(out);
  CHECK(out.find("\r\033[Kepoch 1/1 [") != std::string::npos);
  CHECK(out.find("] 100/100 |") != std::string::npos);
  CHECK(out.find("/469") == std::string::npos);
  CHECK(out.find("/20") == std::string::npos);
  CHECK(out.find("ETA 0s") != std::string::npos);  // the bar's end is the budget's
  CHECK(out.find("\r\033[Kepoch 1/1: loss 0.5000 acc 0.7500") != std::string::npos);
  CHECK(out.find("| max_steps 100 reached\n") != std::string::npos);
}

TEST_CASE("progress: a budget that spans epochs, and a run resumed in the middle of one") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  {
    // 8 steps an epoch, max_steps 20, resumed at step 11 (epoch 1, 3 batches consumed): epoch 2
    // (counted from 1) runs steps 4..8, epoch 3 steps 1..4, and the run shows 3 epochs.
    ls::progress bar({.stream = f, .live = false}, 10, 20);
    bar.begin_epoch(1, 8, 11, 3);
    bar.end_epoch(stats(1, 16));
    bar.begin_epoch(2, 8, 16, 0);
    bar.end_epoch(stats(2, 20));
  }
  const std::string out = contents(f);
  std::fclose(f);
  CAPTURE(out);
  CHECK(out.find("epoch 2/3: loss") == 0);
  CHECK(out.find("\nepoch 3/3: loss") != std::string::npos);
  CHECK(out.find("16 |") == std::string::npos);
  CHECK(std::count(out.begin(), out.end(), '\n') == 2);
  CHECK(out.find("max_steps 20 reached\n") == out.size() - std::string("max_steps 20 reached\n").size());
}

TEST_CASE("progress: a resumed epoch's rate and ETA count the steps this process ran, not those before the resume") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  {
    // resumed after 90 of 100 steps of 128 samples: one more step 100 ms later is 128 samples in
    // 100 ms (about 1280/s, less on a loaded machine) with 9 steps left (about 0.9 s), not 91
    // steps' samples in 100 ms with an ETA of 0 s
    ls::progress bar({.stream = f, .live = true, .interval = std::chrono::milliseconds(0)}, 1);
    bar.begin_epoch(0, 100, 90, 90, 90 * 128);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    bar.step(91, 91 * 128, 0.5);
  }
  const std::string out = contents(f);
  std::fclose(f);
  CAPTURE(out);
  const std::size_t at = out.find(" samples/s");
  REQUIRE(at != std::string::npos);
  const std::size_t from = out.rfind("| ", at);
  REQUIRE(from != std::string::npos);
  const double rate = std::stod(out.substr(from + 2, at - from - 2));
  CHECK(rate > 0);
  CHECK(rate <= 128 / 0.1);  // the old count, 91 steps' samples, gave more than 90 times this
  CHECK(out.find("ETA 0s") == std::string::npos);
  CHECK(out.find("91/100 |") != std::string::npos);
}

TEST_CASE("progress: without a budget nothing changes, and note prints unless quiet") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  {
    ls::progress bar({.stream = f, .live = true, .interval = std::chrono::milliseconds(0)}, 3);
    bar.note(ls::fresh_start_line("ckpt"));
    bar.begin_epoch(0, 8);
    bar.step(8, 64, 0.25);
    bar.end_epoch(stats(0, 8));
  }
  std::string out = contents(f);
  std::fclose(f);
  CAPTURE(out);
  CHECK(out.find("no checkpoint in ckpt: starting fresh\n") == 0);
  CHECK(out.find("epoch 1/3 [") != std::string::npos);
  CHECK(out.find("8/8 |") != std::string::npos);
  CHECK(out.find("max_steps") == std::string::npos);
  f = std::tmpfile();
  REQUIRE(f);
  {
    ls::progress bar({.quiet = true, .stream = f, .live = false}, 3, 5);
    bar.note(ls::resume_line("x", 0, 1));
    bar.begin_epoch(0, 8, 1);
    bar.step(1, 8, 0.1);
    bar.end_epoch(stats(0, 5));
  }
  CHECK(contents(f).empty());
  std::fclose(f);
}

TEST_CASE("metrics_log: a last line left unfinished is ended before the next object, so every line is one object") {
  const auto path = std::filesystem::temp_directory_path() / ("lockstep_metrics_torn_" + std::to_string(::getpid()) + ".jsonl");
  for (const std::string& before : {std::string(), std::string("{\"epoch\":0,\"step\":5}\n"), std::string("{\"epoch\":0,\"st")}) {
    CAPTURE(before);
    { std::ofstream(path, std::ios::binary | std::ios::trunc) << before; }
    {
      ls::metrics_log log(path.string());
      log.write(stats(1, 10));
    }
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    const std::size_t kept = before.empty() ? 0 : 1;
    REQUIRE(lines.size() == kept + 1);
    if (kept) CHECK(lines[0] + (before.back() == '\n' ? "\n" : "") == before);  // the earlier text, whole or cut, alone
    CHECK(lines.back().rfind("{\"epoch\":1,", 0) == 0);
    CHECK(lines.back().back() == '}');
  }
  std::filesystem::remove(path);
}

TEST_CASE("metrics_log: a file that cannot be opened is named with the operating system's reason") {
  try {
    ls::metrics_log log("/nonexistent-directory-of-lockstep/m.jsonl");
    FAIL("opened");
  } catch (const ls::config_error& e) {
    CHECK(std::string(e.what()) == "lockstep: metrics_file '/nonexistent-directory-of-lockstep/m.jsonl' cannot be "
                                   "opened for writing: No such file or directory");
  }
}
