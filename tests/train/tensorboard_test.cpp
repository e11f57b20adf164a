#include <doctest/doctest.h>

#include <sys/resource.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/io/tensorboard.hpp>
#include <lockstep/train/tensorboard.hpp>

#include "train/helpers.hpp"

using namespace train_test;
namespace fs = std::filesystem;
namespace tb = lockstep::io::detail::tensorboard;

namespace {

// One decoded Event.
struct event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;
  int session_status = -1;  // a SessionLog's status (1: START); -1 without one
  std::vector<std::pair<std::string, float>> values;
};

// A protobuf reader over one message (varint, fixed32, fixed64, length-delimited).
struct pb_message {
  const std::uint8_t* p;
  const std::uint8_t* end;
  std::uint64_t varint() {
    std::uint64_t v = 0;
    for (int s = 0; s < 64; s += 7) {
      REQUIRE(p < end);
      const std::uint8_t b = *p++;
      v |= static_cast<std::uint64_t>(b & 0x7f) << s;
      if (!(b & 0x80)) return v;
    }
    FAIL("varint too long");
    return 0;
  }
  template <class T>
  T fixed() {
    REQUIRE(end - p >= static_cast<std::ptrdiff_t>(sizeof(T)));
    T v;
    std::memcpy(&v, p, sizeof(T));
    p += sizeof(T);
    return v;
  }
  pb_message sub() {
    const auto n = varint();
    REQUIRE(static_cast<std::uint64_t>(end - p) >= n);
    pb_message s{p, p + n};
    p += n;
    return s;
  }
};

// Reads every record of an event file, checking both masked CRCs of each.
std::vector<event> read_events(const fs::path& path, std::size_t* torn_tail = nullptr) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<std::uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<event> out;
  std::size_t pos = 0;
  while (pos < b.size()) {
    if (b.size() - pos < 12) break;
    std::uint64_t len;
    std::memcpy(&len, b.data() + pos, 8);
    std::uint32_t crc_len;
    std::memcpy(&crc_len, b.data() + pos + 8, 4);
    CHECK(crc_len == tb::masked_crc32c({b.data() + pos, 8}));
    if (b.size() - pos - 12 < len + 4) break;
    const std::uint8_t* data = b.data() + pos + 12;
    std::uint32_t crc_data;
    std::memcpy(&crc_data, data + len, 4);
    CHECK(crc_data == tb::masked_crc32c({data, static_cast<std::size_t>(len)}));
    event e;
    pb_message m{data, data + len};
    while (m.p < m.end) {
      const auto key = m.varint();
      switch (key) {
        case (1 << 3) | 1: e.wall_time = m.fixed<double>(); break;
        case (2 << 3) | 0: e.step = static_cast<std::int64_t>(m.varint()); break;
        case (3 << 3) | 2: {
          pb_message s = m.sub();
          e.file_version.assign(reinterpret_cast<const char*>(s.p), static_cast<std::size_t>(s.end - s.p));
          break;
        }
        case (5 << 3) | 2: {
          pb_message summary = m.sub();
          while (summary.p < summary.end) {
            REQUIRE(summary.varint() == ((1 << 3) | 2));
            pb_message v = summary.sub();
            std::string tag;
            float value = NAN;
            while (v.p < v.end) {
              const auto k = v.varint();
              if (k == ((1 << 3) | 2)) {
                pb_message t = v.sub();
                tag.assign(reinterpret_cast<const char*>(t.p), static_cast<std::size_t>(t.end - t.p));
              } else {
                REQUIRE(k == ((2 << 3) | 5));
                value = v.fixed<float>();
              }
            }
            e.values.emplace_back(tag, value);
          }
          break;
        }
        case (7 << 3) | 2: {
          pb_message log = m.sub();
          e.session_status = 0;
          while (log.p < log.end) {
            REQUIRE(log.varint() == ((1 << 3) | 0));
            e.session_status = static_cast<int>(log.varint());
          }
          break;
        }
        default: FAIL("unexpected field " << key);
      }
    }
    out.push_back(e);
    pos += 12 + len + 4;
  }
  if (torn_tail) *torn_tail = b.size() - pos;
  return out;
}

fs::path only_event_file(const fs::path& dir) {
  fs::path found;
  std::size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("events.out.tfevents.")) {
      found = e.path();
      ++n;
    }
  REQUIRE(n == 1);
  return found;
}

}  // namespace

TEST_CASE("tensorboard: CRC-32C and its mask match the published values") {
  const char* digits = "123456789";
  CHECK(tb::crc32c({reinterpret_cast<const std::uint8_t*>(digits), 9}) == 0xe3069283u);
  const std::vector<std::uint8_t> zeros(32, 0);
  CHECK(tb::crc32c(zeros) == 0x8a9136aau);  // RFC 3720 B.4
  std::vector<std::uint8_t> up(32);
  for (std::size_t i = 0; i < 32; ++i) up[i] = static_cast<std::uint8_t>(i);
  CHECK(tb::crc32c(up) == 0x46dd794eu);
  const std::uint32_t c = tb::crc32c(zeros);
  CHECK(tb::masked_crc32c(zeros) == ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST_CASE("tensorboard: the writer's file starts with brain.Event:2 and holds every scalar, one record each") {
  const auto dir = temp_dir("tb_writer");
  {
    ls::io::tensorboard_writer w(dir);
    CHECK(w.path().filename().string().starts_with("events.out.tfevents."));
    CHECK(fs::exists(w.path()));
    for (std::int64_t s = 0; s < 50; ++s) w.scalar("a/b", s * 1000, 0.5 * static_cast<double>(s) - 3.0, 1.5e9 + static_cast<double>(s));
    const ls::io::tensorboard_scalar two[] = {{"x", 1.25}, {"y", -2.0}};
    w.scalars(1ll << 40, two);
    w.scalars(7, {});
    // a second writer in the same directory in the same second gets its own file
    ls::io::tensorboard_writer w2(dir);
    CHECK(w2.path() != w.path());
  }
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  REQUIRE(files.size() == 2);
  const fs::path first = files[0].string().size() < files[1].string().size() ? files[0] : files[1];
  std::size_t torn = 1;
  const auto ev = read_events(first, &torn);
  CHECK(torn == 0);
  REQUIRE(ev.size() == 1 + 50 + 2);
  CHECK(ev[0].file_version == "brain.Event:2");
  CHECK(ev[0].wall_time > 1.6e9);
  for (std::int64_t s = 0; s < 50; ++s) {
    const auto& e = ev[1 + static_cast<std::size_t>(s)];
    CHECK(e.step == s * 1000);
    CHECK(e.wall_time == 1.5e9 + static_cast<double>(s));
    REQUIRE(e.values.size() == 1);
    CHECK(e.values[0].first == "a/b");
    CHECK(e.values[0].second == static_cast<float>(0.5 * static_cast<double>(s) - 3.0));
  }
  CHECK(ev[51].step == (1ll << 40));
  REQUIRE(ev[51].values.size() == 2);
  CHECK(ev[51].values[1] == std::pair<std::string, float>{"y", -2.0f});
  CHECK(ev[52].values.empty());
  std::ofstream(dir / "a_file") << "x";
  CHECK_THROWS_WITH_AS(ls::io::tensorboard_writer(dir / "a_file" / "sub"), doctest::Contains("a_file"),
                       ls::config_error);  // a file where the directory should be
  fs::remove_all(dir);
}

TEST_CASE("tensorboard: a tag that is not valid UTF-8 is refused, naming it, and nothing of its event is written") {
  const auto dir = temp_dir("tb_utf8");
  fs::path file;
  {
    ls::io::tensorboard_writer w(dir);
    file = w.path();
    w.scalar("gr\xc3\xb6\xc3\x9f" "e/loss", 1, 0.5);  // UTF-8 "größe/loss"
    // a stray byte, an overlong '/', a surrogate, a cut sequence: each in an event with a good tag
    for (const std::string& bad : {std::string("loss\xff"), std::string("a\xc0\xaf"), std::string("\xed\xa0\x80"),
                                  std::string("x\xe2\x82")}) {
      CAPTURE(bad);
      const ls::io::tensorboard_scalar two[] = {{"fine", 1.0}, {bad, 2.0}};
      CHECK_THROWS_WITH_AS(w.scalars(2, two), doctest::Contains("is not valid UTF-8"), ls::config_error);
    }
    // the message shows the stray byte
    CHECK_THROWS_WITH_AS(w.scalar("loss\xff", 2, 1.0), doctest::Contains("the tag \"loss\\xff\" is not valid UTF-8"),
                         ls::config_error);
    w.scalar("after", 3, 1.5);
  }
  std::size_t torn = 1;
  const auto ev = read_events(file, &torn);
  CHECK(torn == 0);
  REQUIRE(ev.size() == 3);  // the version, "größe/loss" and "after"
  REQUIRE(ev[1].values.size() == 1);
  CHECK(ev[1].values[0].first == "gr\xc3\xb6\xc3\x9f" "e/loss");
  REQUIRE(ev[2].values.size() == 1);
  CHECK(ev[2].values[0].first == "after");
  fs::remove_all(dir);
}

TEST_CASE("tensorboard: a write that fails leaves the file at its last whole record, for the events after it") {
  const auto dir = temp_dir("tb_full");
  fs::create_directories(dir);
  constexpr ::rlim_t limit = 4096;  // the file may not grow past this: writes fail part-way
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const ::rlimit lim{limit, limit};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(5);
    int failures = 0, written_after = 0;  // writes that succeeded after one failed
    try {
      ls::io::tensorboard_writer w(dir);
      const std::vector<ls::io::tensorboard_scalar> many(30, {"a/rather/long/tag", 1.0});
      for (int s = 0; s < 40; ++s) {
        try {
          w.scalars(s, many);
          written_after += failures > 0 ? 1 : 0;
        } catch (const ls::error&) {
          ++failures;
        }
        try {
          w.scalar("small", s, 2.0);  // a record that may still fit after a torn one was cut away
          written_after += failures > 0 ? 1 : 0;
        } catch (const ls::error&) {
          ++failures;
        }
      }
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(failures > 0 && written_after > 0 ? 0 : 4);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  REQUIRE(files.size() == 1);
  CHECK(fs::file_size(files[0]) <= limit);
  std::size_t torn = 1;
  const auto ev = read_events(files[0], &torn);
  CHECK(torn == 0);  // every byte belongs to a whole record
  REQUIRE(ev.size() >= 2);
  CHECK(ev[0].file_version == "brain.Event:2");
  fs::remove_all(dir);
}

TEST_CASE("tensorboard: the fit callback writes the epoch and step scalars, and only the chief writes") {
  const auto dir = temp_dir("tb_fit");
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{3});
  const std::size_t n = 100, bs = 20, epochs = 3;  // 5 steps per epoch
  const auto schedule = [](float base, std::uint64_t step) { return base / static_cast<float>(1 + step); };
  const auto h = ls::fit(
      s, m, ls::adam{.lr = 1e-2f}, ls::softmax_cross_entropy{}, pipeline(n, bs),
      {.epochs = epochs,
       .validation = eval_pipeline(30, 10),
       .callbacks = {ls::lr_schedule(schedule),
                     ls::tensorboard(dir / "chief",
                                     {.step_scalars =
                                          [](const ls::training_control& c, ls::tensorboard_step_scalars& out) {
                                            out.add("step/epoch", static_cast<double>(c.epoch));
                                            // a tag in the hook's own string (on the heap), changed
                                            // and destroyed before the event is written
                                            std::string tag = "step/updates_of_the_whole_run";
                                            out.add(tag, static_cast<double>(c.step));
                                            tag.assign(tag.size(), 'x');
                                          }}),
                     ls::tensorboard(dir / "other", {.chief = false})},
       .quiet = true});
  CHECK(!fs::exists(dir / "other"));
  const auto ev = read_events(only_event_file(dir / "chief"));
  std::map<std::string, std::map<std::int64_t, float>> series;
  for (const auto& e : ev)
    for (const auto& [tag, v] : e.values) {
      CHECK(!series[tag].count(e.step));
      series[tag][e.step] = v;
    }
  for (const char* tag : {"epoch/loss", "epoch/accuracy", "epoch/lr", "epoch/samples_per_second", "epoch/val_loss",
                          "epoch/val_accuracy", "epoch/val_top_k_accuracy"}) {
    CAPTURE(tag);
    REQUIRE(series[tag].size() == epochs);
  }
  for (std::size_t e = 0; e < epochs; ++e) {
    const auto& st = h.epochs[e];
    const auto k = static_cast<std::int64_t>(e);
    CHECK(series["epoch/loss"][k] == static_cast<float>(st.train_loss));
    CHECK(series["epoch/accuracy"][k] == static_cast<float>(st.train_accuracy));
    CHECK(series["epoch/val_loss"][k] == static_cast<float>(st.val_loss));
    CHECK(series["epoch/val_accuracy"][k] == static_cast<float>(st.val_accuracy));
    CHECK(series["epoch/val_top_k_accuracy"][k] == static_cast<float>(st.val_top_k_accuracy));
    CHECK(series["epoch/lr"][k] == st.lr);
  }
  REQUIRE(series["step/loss"].size() == epochs * 5);
  REQUIRE(series["step/lr"].size() == epochs * 5);
  REQUIRE(series["step/epoch"].size() == epochs * 5);
  for (std::int64_t step = 1; step <= static_cast<std::int64_t>(epochs * 5); ++step) {
    CAPTURE(step);
    CHECK(series["step/lr"][step] == schedule(1e-2f, static_cast<std::uint64_t>(step - 1)));  // the rate of that update
    CHECK(std::isfinite(series["step/loss"][step]));
    CHECK(series["step/epoch"][step] == static_cast<float>((step - 1) / 5));
    CHECK(series["step/updates_of_the_whole_run"][step] == static_cast<float>(step));
  }
  CHECK(series["step/updates_of_the_whole_run"].size() == epochs * 5);
  CHECK(series.count(std::string(29, 'x')) == 0);
  CHECK(series["epoch/lr"][2] == series["step/lr"][15]);
  fs::remove_all(dir);
}

TEST_CASE("tensorboard: a resumed fit marks a restart at its first update, a fresh one does not") {
  const auto dir = temp_dir("tb_restart");
  ls::mirrored<ls::cpu<0>> s;
  // The first run stops after 7 of 15 updates (max_steps, a checkpoint at step 7: as a crash after
  // a checkpoint); the resumed one writes a new file into the same directory, with a restart at
  // update 8 and every step from it on (every_steps 2: the restart does not wait for a thinned step).
  const auto run = [&](std::uint64_t max_steps, bool resume) {
    auto m = s.replicate<net>(ls::seed{3});
    ls::fit_options o{.epochs = 3, .callbacks = {ls::tensorboard(dir / "tb", {.every_steps = 2})}, .quiet = true};
    o.checkpoint_dir = (dir / "ck").string();
    o.checkpoint_every = 1;
    o.resume = resume;
    o.max_steps = max_steps;
    (void)ls::fit(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, pipeline(100, 20), o);
    return m.step();
  };
  REQUIRE(run(7, false) == 7);
  const fs::path first = only_event_file(dir / "tb");
  for (const auto& e : read_events(first)) CHECK(e.session_status == -1);  // a fresh fit marks no restart
  REQUIRE(run(0, true) == 15);
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(dir / "tb")) files.push_back(f.path());
  REQUIRE(files.size() == 2);
  const fs::path second = files[0] == first ? files[1] : files[0];
  const auto ev = read_events(second);
  REQUIRE(ev.size() >= 3);
  CHECK(ev[0].file_version == "brain.Event:2");
  CHECK(ev[1].session_status == 1);  // START, before any scalar of the resumed run
  CHECK(ev[1].step == 8);
  CHECK(ev[1].values.empty());
  std::size_t starts = 0;
  for (const auto& e : ev) starts += e.session_status == 1 ? 1 : 0;
  CHECK(starts == 1);
  // a checkpoint holding state for the callback that it does not take is refused
  const auto c = ls::tensorboard(dir / "tb2");
  const double one[] = {1.0};
  CHECK_THROWS_AS(c.load_state(one), ls::checkpoint_error);
  fs::remove_all(dir);
}

TEST_CASE("tensorboard: every_steps thins the step scalars, and without validation no val tags") {
  const auto dir = temp_dir("tb_every");
  ls::mirrored<ls::cpu<0>> s;
  auto m = s.replicate<net>(ls::seed{3});
  (void)ls::fit(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, pipeline(60, 10),
                {.epochs = 2, .callbacks = {ls::tensorboard(dir, {.every_steps = 4})}, .quiet = true});
  std::map<std::string, std::vector<std::int64_t>> steps;
  for (const auto& e : read_events(only_event_file(dir)))
    for (const auto& [tag, v] : e.values) steps[tag].push_back(e.step);
  CHECK(steps["step/loss"] == std::vector<std::int64_t>{4, 8, 12});
  CHECK(steps["epoch/loss"] == std::vector<std::int64_t>{0, 1});
  CHECK(!steps.count("epoch/val_loss"));
  fs::remove_all(dir);
}

TEST_CASE("tensorboard: with clipping, the gradient norm and skipped updates per step and per epoch") {
  const auto dir = temp_dir("tb_norm");
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{3});
  const std::size_t epochs = 2;  // 5 steps per epoch
  std::vector<double> norms;       // each update's, as fit's callbacks see them
  ls::callback seen;
  seen.step_end = [&](double, ls::training_control& c) { norms.push_back(c.grad_norm); };
  ls::fit_options o{.epochs = epochs, .callbacks = {seen, ls::tensorboard(dir)}, .quiet = true};
  o.clip_global_norm = 0.5;
  o.nonfinite = ls::nonfinite_policy::skip;
  const auto h = ls::fit(s, m, ls::adam{.lr = 1e-2f}, ls::softmax_cross_entropy{}, pipeline(100, 20), o);
  const auto ev = read_events(only_event_file(dir));
  std::map<std::string, std::map<std::int64_t, float>> series;
  for (const auto& e : ev)
    for (const auto& [tag, v] : e.values) series[tag][e.step] = v;
  REQUIRE(norms.size() == epochs * 5);
  REQUIRE(series["step/grad_norm"].size() == epochs * 5);
  REQUIRE(series["step/skipped"].size() == epochs * 5);
  for (std::int64_t step = 1; step <= static_cast<std::int64_t>(epochs * 5); ++step) {
    CAPTURE(step);
    CHECK(series["step/grad_norm"][step] == static_cast<float>(norms[static_cast<std::size_t>(step - 1)]));
    CHECK(series["step/grad_norm"][step] > 0);
    CHECK(series["step/skipped"][step] == 0);
  }
  for (std::size_t e = 0; e < epochs; ++e) {
    const auto k = static_cast<std::int64_t>(e);
    CHECK(series["epoch/grad_norm"][k] == static_cast<float>(h.epochs[e].grad_norm));
    CHECK(series["epoch/clip_factor"][k] == static_cast<float>(h.epochs[e].clip_factor));
    CHECK(series["epoch/skipped_updates"][k] == 0);
  }
  fs::remove_all(dir);
}

TEST_CASE("tensorboard: without an epilogue there is no gradient-norm tag") {
  const auto dir = temp_dir("tb_no_norm");
  ls::mirrored<ls::cpu<0>> s;
  auto m = s.replicate<net>(ls::seed{3});
  (void)ls::fit(s, m, ls::adam{.lr = 1e-2f}, ls::softmax_cross_entropy{}, pipeline(40, 20),
                {.epochs = 1, .callbacks = {ls::tensorboard(dir)}, .quiet = true});
  for (const auto& e : read_events(only_event_file(dir)))
    for (const auto& value : e.values) {
      const std::string& tag = value.first;  // a variable: CAPTURE cannot take a structured binding under clang++ 14
      CAPTURE(tag);
      CHECK(tag.find("grad_norm") == std::string::npos);
      CHECK(tag.find("skipped") == std::string::npos);
    }
  fs::remove_all(dir);
}
