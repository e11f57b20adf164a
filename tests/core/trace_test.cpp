#define LOCKSTEP_TESTING_COUNT_ALLOCATIONS  // this file counts heap allocations (see allocations.hpp)
#include <lockstep/testing/allocations.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/core/trace.hpp>

namespace ls = lockstep;

TEST_CASE("trace: --trace-steps values parse, bad ones name the option") {
  CHECK(ls::parse_trace_steps("10:20").first == 10);
  CHECK(ls::parse_trace_steps("10:20").last == 20);
  CHECK(ls::parse_trace_steps("0:1").contains(0));
  CHECK(!ls::parse_trace_steps("0:1").contains(1));
  CHECK(ls::parse_trace_steps("7:").last == std::numeric_limits<std::uint64_t>::max());
  CHECK(ls::parse_trace_steps("7:").contains(1'000'000'000));
  const ls::trace_window def{};
  CHECK(def.first == 10);
  CHECK(def.last == 20);
  for (const char* bad : {"", "10", ":20", "a:b", "10:5", "10:10", "-1:4", "1:2:3", "1 :2", "1:2x", "99999999999999999999:1"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS((void)ls::parse_trace_steps(bad), doctest::Contains("--trace-steps"), ls::config_error);
  }
  CHECK_THROWS_WITH_AS((void)ls::parse_trace_steps("x", "steps"), doctest::Contains("steps 'x'"), ls::config_error);
}

TEST_CASE("trace: only the steps of the window are recorded") {
  ls::trace_recorder r(1, {.steps = {3, 5}, .events_per_thread = 64});
  for (std::uint64_t s = 0; s < 8; ++s) {
    r.begin_step(s);
    CHECK(r.active() == (s == 3 || s == 4));
    ls::trace_span span(&r, 0, "step", "compute", "step", static_cast<std::int64_t>(s));
  }
  r.stop();
  const auto ev = r.events(0);
  REQUIRE(ev.size() == 2);
  CHECK(ev[0].arg == 3);
  CHECK(ev[1].arg == 4);
  CHECK(std::string(ev[0].name) == "step");
  CHECK(ev[0].duration_ns >= 0);
  CHECK(ev[1].start_ns >= ev[0].start_ns + ev[0].duration_ns);  // one monotonic clock
}

TEST_CASE("trace: recording allocates nothing, off or on, and a full buffer drops and counts") {
  ls::trace_recorder r(3, {.steps = {0, 1}, .events_per_thread = 100});
  r.name_thread(0, "replica 0");
  {
    const ls::testing::allocation_window w;
    r.begin_step(5);  // outside the window: off
    for (int i = 0; i < 100000; ++i) {
      ls::trace_span s(&r, 0, "forward", "compute", "layer", i);
      r.record(1, "x", "y", 0, 1);
    }
    ls::trace_recorder* none = nullptr;  // no recorder at all
    for (int i = 0; i < 1000; ++i) ls::trace_span s(none, 0, "forward", "compute");
    CHECK(w.count() == 0);
  }
  CHECK(r.events(0).empty());
  CHECK(r.events(1).empty());
  {
    const ls::testing::allocation_window w;
    r.begin_step(0);  // on
    for (int i = 0; i < 150; ++i) {
      ls::trace_span s(&r, 2, "backward", "compute", "layer", i);
    }
    CHECK(w.count() == 0);
  }
  CHECK(r.events(2).size() == 100);
  CHECK(r.dropped() == 50);
  r.record(7, "out of range", "x", 0, 1);  // an unknown thread is ignored
  r.clear();
  CHECK(r.events(2).empty());
  CHECK(r.dropped() == 0);
}

TEST_CASE("trace: threads record concurrently into their own buffers, and spans nest, and blocks round-trip") {
  constexpr std::size_t threads = 4, steps = 6, layers = 5;
  ls::trace_recorder r(threads + 1, {.steps = {1, 5}, .events_per_thread = 1000});
  for (std::size_t t = 0; t < threads; ++t) r.name_thread(t, "replica " + std::to_string(t));
  r.name_thread(threads, "driver");
  for (std::size_t s = 0; s < steps; ++s) {
    r.begin_step(s);
    ls::trace_span step(&r, threads, "step", "driver", "step", static_cast<std::int64_t>(s));
    std::vector<std::thread> pool;
    for (std::size_t t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        ls::trace_span outer(&r, t, "forward_backward", "compute");
        for (std::size_t l = 0; l < layers; ++l) ls::trace_span inner(&r, t, "forward", "compute", "layer", static_cast<std::int64_t>(l));
      });
    for (auto& p : pool) p.join();
  }
  r.stop();
  for (std::size_t t = 0; t < threads; ++t) {
    const auto ev = r.events(t);
    CHECK(ev.size() == 4 * (layers + 1));  // steps 1..4
    // sorted by start, spans are either disjoint or nested
    std::vector<ls::trace_event> v(ev.begin(), ev.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.start_ns < b.start_ns; });
    for (std::size_t i = 0; i + 1 < v.size(); ++i) {
      const auto end_i = v[i].start_ns + v[i].duration_ns;
      const auto end_j = v[i + 1].start_ns + v[i + 1].duration_ns;
      CHECK((v[i + 1].start_ns >= end_i || end_j <= end_i));
    }
  }
  CHECK(r.events(threads).size() == 4);
  const auto block = r.serialize(3, "worker 3");
  const auto c = ls::read_trace_block(block);
  CHECK(c.worker == 3);
  CHECK(c.worker_name == "worker 3");
  CHECK(c.thread_names.size() == threads + 1);
  CHECK(c.thread_names.back().second == "driver");
  CHECK(c.events.size() == threads * 4 * (layers + 1) + 4);
  CHECK(c.dropped == 0);
  std::size_t with_layer = 0;
  for (const auto& e : c.events) with_layer += e.arg_name == "layer" ? 1 : 0;
  CHECK(with_layer == threads * 4 * layers);
  // every truncation, and a bad magic, is a data_error
  for (std::size_t n = 0; n < block.size(); n += 7) {
    CAPTURE(n);
    CHECK_THROWS_AS((void)ls::read_trace_block(std::span(block.data(), n)), ls::data_error);
  }
  auto bad = block;
  bad[0] ^= 1;
  CHECK_THROWS_WITH_AS((void)ls::read_trace_block(bad), doctest::Contains("bad magic"), ls::data_error);
  bad = block;
  bad.push_back(0);
  CHECK_THROWS_WITH_AS((void)ls::read_trace_block(bad), doctest::Contains("trailing"), ls::data_error);
}

namespace {
/// A context that times its own stream, as the CUDA backend's does: it keeps what it was asked.
struct timed_context {
  std::vector<std::string> opened;
  std::vector<std::size_t> closed;
  int begun = 0, flushed = 0;
  std::size_t trace_open(const char* name, const char*, const char*, std::int64_t) {
    opened.emplace_back(name);
    return opened.size() - 1;
  }
  void trace_close(std::size_t i) noexcept { closed.push_back(i); }
  void trace_begin(const ls::trace_recorder&) { ++begun; }
  void trace_flush(ls::trace_recorder& rec, std::size_t thread) {
    ++flushed;
    for (std::size_t i = 0; i < opened.size(); ++i) rec.record(thread, "device", "compute", 10, 20, "span", static_cast<std::int64_t>(i));
  }
};
struct plain_context {};
}  // namespace

TEST_CASE("trace: work on a context that times its stream is a device span, and on another, a host span") {
  ls::trace_recorder rec(1, {.steps = {0, 1}});
  timed_context dev;
  plain_context host;
  for (const bool active : {false, true}) {
    CAPTURE(active);
    rec.begin_step(active ? 0 : 5);
    rec.clear();
    dev = {};
    ls::begin_device_spans(dev, &rec);
    {
      ls::work_span outer(dev, &rec, 0, "forward", "compute", "layer", 0);
      ls::work_span inner(dev, &rec, 0, "backward", "compute", "layer", 0);
    }
    { ls::work_span on_host(host, &rec, 0, "update", "compute"); }
    ls::end_device_spans(dev, &rec, 0);
    ls::end_device_spans(host, &rec, 0);  // nothing to end on a plain context
    if (!active) {
      CHECK(dev.opened.empty());
      CHECK(dev.begun == 0);
      CHECK(dev.flushed == 0);
      CHECK(rec.events(0).empty());
      continue;
    }
    CHECK(dev.begun == 1);
    CHECK(dev.opened == std::vector<std::string>{"forward", "backward"});
    CHECK(dev.closed == std::vector<std::size_t>{1, 0});  // inner first
    CHECK(dev.flushed == 1);
    // the host span of the plain context, then the two device spans the flush recorded
    REQUIRE(rec.events(0).size() == 3);
    CHECK(std::string(rec.events(0)[0].name) == "update");
    CHECK(std::string(rec.events(0)[1].name) == "device");
  }
  // a null recorder: nothing at all
  timed_context none;
  { ls::work_span s(none, nullptr, 0, "forward", "compute"); }
  ls::begin_device_spans(none, nullptr);
  ls::end_device_spans(none, nullptr, 0);
  CHECK(none.opened.empty());
  CHECK(none.begun + none.flushed == 0);
}
