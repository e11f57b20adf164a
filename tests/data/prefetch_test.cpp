// Tests of prefetch: order, exceptions, prompt stop without leaked threads.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/data.hpp>

namespace ld = lockstep::data;

namespace {

std::size_t thread_count() {
  std::size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++n;
  }
  return n;
}

// The thread count once the process's own helper threads exist (sanitizer runtimes start one
// with the first std::thread).
std::size_t baseline_threads() {
  std::thread([] {}).join();
  return thread_count();
}

// Waits up to a second for the thread count to drop back to `want` (the kernel updates
// /proc/self/task shortly after a joined thread exits).
bool threads_return_to(std::size_t want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (thread_count() > want && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return thread_count() == want;
}

std::vector<int> range_of(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// A source whose elements view into a table its generator owns (a parameter: it lives as long as
// the generator, as a library source's table does), large enough to be unmapped when freed.
ld::generator<std::span<const int>> viewing_source(std::vector<int> table) {
  for (std::size_t i = 0; i < table.size(); i += 4096) co_yield std::span<const int>(table.data() + i, 1);
}

}  // namespace

TEST_CASE("prefetch: queued elements that view into the upstream stay valid after it is exhausted" *
          doctest::timeout(10)) {
  constexpr int n = 10 << 20;
  for (std::size_t depth : {1u, 3u, 3000u}) {
    CAPTURE(depth);
    const auto d = ld::dataset<std::span<const int>>{[](std::uint64_t) { return viewing_source(range_of(n)); }} |
                   ld::prefetch(depth);
    std::vector<int> got;
    for (auto&& x : d.epoch()) {
      // the producer runs to the end of the upstream while the consumer waits
      if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      got.push_back(x[0]);
    }
    std::vector<int> want;
    for (int i = 0; i < n; i += 4096) want.push_back(i);
    CHECK(got == want);
  }
}

TEST_CASE("prefetch: same elements in the same order, for depths and sizes" * doctest::timeout(20)) {
  const std::size_t before = baseline_threads();
  for (int n : {0, 1, 2, 5, 64, 1000})
    for (std::size_t depth : {1u, 2u, 3u, 16u}) {
      CAPTURE(n);
      CAPTURE(depth);
      const auto d = ld::from_vector(range_of(n)) | ld::shuffle(10, 3) | ld::prefetch(depth);
      std::vector<int> got;
      for (auto&& x : d.epoch(4)) got.push_back(x);
      std::vector<int> want;
      for (auto&& x : (ld::from_vector(range_of(n)) | ld::shuffle(10, 3)).epoch(4)) want.push_back(x);
      CHECK(got == want);
    }
  CHECK(threads_return_to(before));
}

TEST_CASE("prefetch: leaving early stops the producer within a second and leaks no thread" * doctest::timeout(5)) {
  const std::size_t before = baseline_threads();
  // An endless, slow-ish source: the producer would run forever if not stopped.
  const auto endless = ld::from_function([i = 0]() mutable -> std::optional<int> {
                         std::this_thread::sleep_for(std::chrono::microseconds(100));
                         return i++;
                       }) |
                       ld::prefetch(4);
  for (int round = 0; round < 20; ++round) {
    const auto start = std::chrono::steady_clock::now();
    {
      auto g = endless.epoch(static_cast<std::uint64_t>(round));
      auto it = g.begin();  // starts the producer and takes the first element
      for (int k = 0; k < round; ++k) ++it;
      CHECK(*it == round);
      CHECK(thread_count() == before + 1);  // the producer is running
    }  // generator destroyed here: stop + join
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
    CHECK(threads_return_to(before));  // joined; /proc/self/task may lag the join briefly
  }
  // a generator that is never iterated never starts a thread
  { auto g = endless.epoch(0); CHECK(thread_count() == before); }
  CHECK(threads_return_to(before));
}

TEST_CASE("prefetch: the producer's exception reaches the consumer after the earlier elements" * doctest::timeout(5)) {
  const std::size_t before = baseline_threads();
  for (int fail_at : {0, 1, 10}) {
    CAPTURE(fail_at);
    const auto d = ld::from_vector(range_of(100)) | ld::map([fail_at](int x) {
                     if (x == fail_at) throw lockstep::data_error("bad record " + std::to_string(x));
                     return x;
                   }) |
                   ld::prefetch(3);
    std::vector<int> got;
    CHECK_THROWS_WITH_AS(
        [&] {
          for (auto&& x : d.epoch()) got.push_back(x);
        }(),
        doctest::Contains("bad record"), lockstep::data_error);
    CHECK(got == range_of(fail_at));
  }
  CHECK(threads_return_to(before));
  CHECK_THROWS_AS(ld::prefetch(0), lockstep::config_error);
  // A depth the queue could not hold is refused when the stage is made, naming it (not a
  // bad_alloc when an epoch starts).
  CHECK_NOTHROW((void)ld::prefetch(ld::max_prefetch_depth));
  for (const std::size_t depth : {ld::max_prefetch_depth + 1, std::size_t{1} << 40, SIZE_MAX})
    CHECK_THROWS_WITH_AS((void)ld::prefetch(depth), doctest::Contains(("depth " + std::to_string(depth)).c_str()),
                         lockstep::config_error);
  CHECK_THROWS_WITH_AS((void)ld::parallel_map([](int x) { return x; }, SIZE_MAX / 2 + 1),
                       doctest::Contains((std::to_string(SIZE_MAX / 2 + 1) + " workers").c_str()), lockstep::config_error);
  CHECK_THROWS_WITH_AS((void)ld::parallel_map([](int x) { return x; }, ld::max_parallel_map_workers + 1),
                       doctest::Contains("workers are more than"), lockstep::config_error);
}

TEST_CASE("prefetch: batches through prefetch and distribute keep every sample once, epochs reuse buffers" *
          doctest::timeout(20)) {
  const std::size_t n = 1000;
  std::vector<std::uint8_t> pixels(n * 4);
  for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<std::uint8_t>(i / 4 % 256);
  std::vector<std::int32_t> labels(n, 1);
  const auto d = ld::from_memory(std::move(pixels), 4, std::move(labels)) | ld::map(ld::scale(1.0f / 255)) |
                 ld::shuffle(n, 9) | ld::batched(64) | ld::shard_batches(3) | ld::prefetch(2);
  for (std::uint64_t e = 0; e < 3; ++e) {
    std::vector<int> seen(n, 0);
    for (auto&& step : d.epoch(e))
      for (const auto& s : step.shards)
        for (std::size_t r = 0; r < s.size; ++r) {
          ++seen[s.indices[r]];
          CHECK(s.features[4 * r] == doctest::Approx(static_cast<float>(s.indices[r] % 256) / 255));
        }
    CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
  }
}
