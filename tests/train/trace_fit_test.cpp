// fit's timeline (fit_options::trace_file): the file holds the window's steps only, the
// replicas' and the driver's named threads, the driver's pipeline waits, steps and checkpoint
// writes; fit prints its name and size; tracing changes no bit of the training; a bad window is
// refused before training.

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "train/helpers.hpp"

using namespace train_test;
namespace fs = std::filesystem;

namespace {

/// Occurrences of `what` in `text`.
std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto p = text.find(what); p != std::string::npos; p = text.find(what, p + what.size())) ++n;
  return n;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct traced_run {
  ls::history h;
  std::vector<float> params;
  std::string printed;
};

/// Two epochs of 6 batches on two replicas, checkpointing every 4 steps, with `adjust`ed options.
template <class Adjust>
traced_run run(const fs::path& dir, Adjust adjust) {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{5});
  std::FILE* f = std::tmpfile();
  REQUIRE(f);
  ls::fit_options o{.epochs = 2, .quiet = false};
  o.progress = {.stream = f, .live = false};
  o.checkpoint_dir = (dir / "ckpt").string();
  o.checkpoint_every = 4;
  adjust(o);
  traced_run r;
  r.h = ls::fit(s, m, ls::sgd{.lr = 0.05f}, ls::softmax_cross_entropy{}, pipeline(48, 8), o);
  r.params = m.parameters_to_host();
  std::rewind(f);
  for (int ch = std::fgetc(f); ch != EOF; ch = std::fgetc(f)) r.printed.push_back(static_cast<char>(ch));
  std::fclose(f);
  return r;
}

}  // namespace

TEST_CASE("fit: trace_file holds the window's steps, every replica's and the driver's spans, and changes no bit") {
  const auto dir = temp_dir("trace_fit");
  fs::create_directories(dir);
  const fs::path file = dir / "trace.json";
  const auto traced = run(dir / "a", [&](ls::fit_options& o) {
    o.trace_file = file.string();
    o.trace_steps = ls::parse_trace_steps("3:9");  // across the epoch boundary (6 steps an epoch) and a checkpoint at 4 and 8
  });
  const auto plain = run(dir / "b", [](ls::fit_options&) {});
  CHECK(traced.params == plain.params);
  CHECK(traced.h.epochs.back().train_loss == plain.h.epochs.back().train_loss);

  REQUIRE(fs::exists(file));
  const std::string json = read_file(file);
  CHECK(json.rfind("{\"traceEvents\":[", 0) == 0);
  CHECK(count(json, "\"name\":\"train_step\"") == 6);  // steps 3..8
  for (int step = 3; step < 9; ++step) {
    CAPTURE(step);
    CHECK(json.find("\"name\":\"train_step\",\"cat\":\"step\",\"args\":{\"step\":" + std::to_string(step) + "}") !=
          std::string::npos);
  }
  CHECK(json.find("\"args\":{\"step\":2}") == std::string::npos);  // before the window
  CHECK(json.find("\"args\":{\"step\":9}") == std::string::npos);  // after it
  CHECK(count(json, "\"name\":\"pipeline wait\"") == 6);
  // checkpoints at updates 4 and 8 (checkpoint_every) and 6 (the first epoch's end); not 12
  CHECK(count(json, "\"name\":\"checkpoint\"") == 3);
  CHECK(count(json, "\"name\":\"update\"") == 2 * 6);   // each replica, each step
  CHECK(count(json, "\"name\":\"forward\"") == 2 * 6 * 4);  // 4 layers
  CHECK(count(json, "\"name\":\"reduce bucket\"") >= 2 * 6);
  CHECK(json.find("{\"name\":\"replica 0\"}") != std::string::npos);
  CHECK(json.find("{\"name\":\"replica 1\"}") != std::string::npos);
  CHECK(json.find("{\"name\":\"driver\"}") != std::string::npos);
  CHECK(json.find("{\"name\":\"worker 0\"}") != std::string::npos);
  CHECK(json.find("\"dropped_spans\":0") != std::string::npos);
  // fit says where the file is and how large it is
  CHECK(traced.printed.find("trace: " + file.string() + " (") != std::string::npos);
  CHECK(traced.printed.find(" KiB; open it in ui.perfetto.dev") != std::string::npos);
  CHECK(plain.printed.find("trace:") == std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("fit: a trace whose window holds no step writes a file with no span") {
  const auto dir = temp_dir("trace_empty");
  fs::create_directories(dir);
  const fs::path file = dir / "t.json";
  (void)run(dir / "a", [&](ls::fit_options& o) {
    o.trace_file = file.string();
    o.trace_steps = {1000, 2000};
  });
  const std::string json = read_file(file);
  CHECK(count(json, "\"ph\":\"X\"") == 0);
  CHECK(json.find("{\"name\":\"driver\"}") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("fit: a trace_file whose directory does not exist is refused before the first step") {
  const auto dir = temp_dir("trace_nodir");
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{5});
  const std::string file = (dir / "missing" / "t.json").string();
  try {
    (void)ls::fit(s, m, ls::adam{}, ls::softmax_cross_entropy{}, pipeline(20, 5),
                  {.epochs = 2, .quiet = true, .trace_file = file});
    FAIL("trained with a trace file that could never be written");
  } catch (const ls::config_error& e) {
    const std::string msg = e.what();
    CAPTURE(msg);
    CHECK(msg.find("fit_options::trace_file " + file) != std::string::npos);
    CHECK(msg.find("does not exist") != std::string::npos);
  }
  CHECK(m.step() == 0);
}
