// Tests of the synchronous stages: map, filter, shuffle, batched, repeat, take, skip, cache,
// parallel_map, and closure composition.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/data.hpp>

namespace ld = lockstep::data;

namespace {

std::vector<int> stage_range(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

template <class T>
std::vector<T> collect(const ld::dataset<T>& d, std::uint64_t epoch = 0) {
  std::vector<T> out;
  for (auto&& x : d.epoch(epoch)) out.push_back(std::move(x));
  return out;
}

const int sizes[] = {0, 1, 2, 3, 7, 13, 31, 64, 100};

// A pipeline element that opts in to prefetching: shuffle calls prefetch_features (found by
// argument-dependent lookup) on the element it predicts it will emit a few outputs later, and
// this one records which element that was.
struct tracked {
  int value = 0;
  std::vector<char>* prefetched = nullptr;  // prefetched[value] set once predicted
  friend void prefetch_features(const tracked& t) noexcept { (*t.prefetched)[static_cast<std::size_t>(t.value)] = 1; }
};

}  // namespace

TEST_CASE("map, filter and composed closures") {
  for (int n : sizes) {
    CAPTURE(n);
    const auto stage = ld::map([](int x) { return 2 * x; }) | ld::filter([](int x) { return x % 3 != 0; });
    const auto d = ld::from_vector(stage_range(n)) | stage;
    std::vector<int> want;
    for (int x = 0; x < n; ++x)
      if ((2 * x) % 3 != 0) want.push_back(2 * x);
    CHECK(collect(d) == want);
    CHECK(collect(d, 5) == want);  // every epoch replays
  }
  const auto to_string = ld::from_vector(stage_range(3)) | ld::map([](int x) { return std::to_string(x); });
  CHECK(collect(to_string) == std::vector<std::string>{"0", "1", "2"});
}

TEST_CASE("take, skip, repeat count elements exactly") {
  for (int n : sizes)
    for (std::uint64_t k : {0u, 1u, 2u, 5u, 200u}) {
      CAPTURE(n);
      CAPTURE(k);
      const auto src = ld::from_vector(stage_range(n));
      const auto taken = collect(src | ld::take(k));
      CHECK(taken.size() == std::min<std::size_t>(k, static_cast<std::size_t>(n)));
      CHECK(std::equal(taken.begin(), taken.end(), stage_range(n).begin()));
      const auto skipped = collect(src | ld::skip(k));
      CHECK(skipped.size() == static_cast<std::size_t>(n) - std::min<std::size_t>(k, static_cast<std::size_t>(n)));
      if (!skipped.empty()) CHECK(skipped.front() == static_cast<int>(k));
      const auto repeated = collect(src | ld::repeat(k));
      CHECK(repeated.size() == k * static_cast<std::size_t>(n));
      const auto forever = collect(src | ld::repeat() | ld::take(k));
      CHECK(forever.size() == (n == 0 ? 0 : k));
      for (std::size_t i = 0; i < forever.size(); ++i) CHECK(forever[i] == static_cast<int>(i % static_cast<std::size_t>(n)));
    }
}

namespace {
ld::generator<int> count_to(int n) {
  for (int i = 0; i < n; ++i) co_yield i;
}
}  // namespace

TEST_CASE("repeat(k) keeps every repetition of a source whose epochs differ, an empty one among them") {
  // epoch e of the source holds e % 3 elements: 0, 1, 2, 0, 1, 2, ...
  const ld::dataset<int> varying{[](std::uint64_t e) { return count_to(static_cast<int>(e % 3)); }};
  for (std::uint64_t k : {1u, 2u, 4u, 7u}) {
    CAPTURE(k);
    for (std::uint64_t e = 0; e < 3; ++e) {
      CAPTURE(e);
      std::size_t want = 0;
      for (std::uint64_t r = 0; r < k; ++r) want += (e * k + r) % 3;
      CHECK(collect(varying | ld::repeat(k), e).size() == want);
    }
  }
  // Epochs whose upstream epochs e*k + k - 1 pass 2^64 - 1 would wrap onto earlier ones: refused.
  const std::uint64_t top = ~std::uint64_t{0};
  const std::uint64_t k = std::uint64_t{1} << 63;
  CHECK(collect(varying | ld::repeat(k) | ld::take(5), 1).size() == 5);  // upstream epochs 2^63 ..: no wrap
  CHECK_THROWS_WITH_AS(collect(varying | ld::repeat(k), 2), doctest::Contains("repeat(9223372036854775808): epoch 2"),
                       lockstep::config_error);
  CHECK(collect(varying | ld::repeat(2) | ld::take(3), top / 2 - 1).size() <= 3);  // last upstream epoch top - 2
  CHECK_NOTHROW(collect(varying | ld::repeat(2) | ld::take(3), top / 2));            // last upstream epoch top: the edge
  CHECK_THROWS_AS(collect(varying | ld::repeat(2), top / 2 + 1), lockstep::config_error);
  CHECK(collect(varying | ld::repeat(1), top).size() == top % 3);
}

TEST_CASE("take pulls no more elements than it yields") {
  int pulled = 0;
  const auto src = ld::from_vector(stage_range(100)) | ld::map([&pulled](int x) {
                     ++pulled;
                     return x;
                   });
  CHECK(collect(src | ld::take(7)).size() == 7);
  CHECK(pulled == 7);
}

TEST_CASE("shuffle: buffer 1 is the identity") {
  for (int n : sizes) {
    CAPTURE(n);
    CHECK(collect(ld::from_vector(stage_range(n)) | ld::shuffle(1, 42), 3) == stage_range(n));
  }
}

TEST_CASE("shuffle: a buffer >= n gives a permutation, same seed same order, another epoch another order") {
  for (int n : sizes) {
    CAPTURE(n);
    const auto d = ld::from_vector(stage_range(n)) | ld::shuffle(static_cast<std::size_t>(std::max(n, 1)) + 3, 7);
    const auto e0 = collect(d, 0), e0_again = collect(d, 0), e1 = collect(d, 1);
    auto sorted = e0;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == stage_range(n));
    CHECK(e0 == e0_again);
    const auto other_seed = collect(ld::from_vector(stage_range(n)) | ld::shuffle(static_cast<std::size_t>(n) + 3, 8), 0);
    if (n >= 7) {
      CHECK(e0 != e1);
      CHECK(e0 != other_seed);
      CHECK(e0 != stage_range(n));
    }
  }
}

TEST_CASE("shuffle: full buffer is uniform over permutations (n = 3)") {
  std::map<std::vector<int>, int> counts;
  const auto d = ld::from_vector(stage_range(3)) | ld::shuffle(3, 1234);
  const int trials = 6000;
  for (int e = 0; e < trials; ++e) ++counts[collect(d, static_cast<std::uint64_t>(e))];
  CHECK(counts.size() == 6);
  for (const auto& [perm, c] : counts) CHECK(std::abs(c - trials / 6) < 150);  // ~5 sigma
}

TEST_CASE("shuffle: bounded buffer keeps each element within the window") {
  // The first output comes after buffer_size inputs, and every further output after one more
  // input; so the output at position p is one of inputs 0 .. p + buffer_size - 1, i.e. input i
  // appears at a position >= i - (buffer_size - 1).
  for (int n : {1, 2, 17, 100, 257})
    for (std::size_t b : {1u, 2u, 3u, 10u, 64u, 1000u})
      for (std::uint64_t epoch : {0u, 1u, 2u}) {
        CAPTURE(n);
        CAPTURE(b);
        const auto out = collect(ld::from_vector(stage_range(n)) | ld::shuffle(b, 99), epoch);
        REQUIRE(out.size() == static_cast<std::size_t>(n));
        std::vector<int> seen(static_cast<std::size_t>(n), 0);
        for (std::size_t p = 0; p < out.size(); ++p) {
          CHECK(static_cast<std::size_t>(out[p]) <= p + b - 1);
          ++seen[static_cast<std::size_t>(out[p])];
        }
        CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
      }
}

TEST_CASE("shuffle: prefetching ahead predicts the picks and leaves the order as it is") {
  // The order of elements that prefetch is the order of plain ints, and most elements are
  // predicted (prefetched) before they come out, in the filling and in the draining phase.
  for (int n : {0, 1, 2, 7, 100, 3000})
    for (std::size_t b : {1u, 2u, 3u, 10u, 1000u, 5000u})
      for (std::uint64_t epoch : {0u, 3u}) {
        CAPTURE(n);
        CAPTURE(b);
        CAPTURE(epoch);
        std::vector<char> prefetched(static_cast<std::size_t>(n), 0);
        std::vector<tracked> elements;
        for (int i = 0; i < n; ++i) elements.push_back({i, &prefetched});
        const auto plain = collect(ld::from_vector(stage_range(n)) | ld::shuffle(b, 5), epoch);
        std::vector<int> order;
        std::size_t predicted = 0;
        for (auto&& t : (ld::from_vector(elements) | ld::shuffle(b, 5)).epoch(epoch)) {
          predicted += prefetched[static_cast<std::size_t>(t.value)] != 0 ? 1u : 0u;
          order.push_back(t.value);
        }
        CHECK(order == plain);
        // A pick is missed when its slot changes between prediction and emission: about
        // near / b of the picks while filling and near / k at k elements left while draining
        // (shuffle_lookahead::near = 6 outputs ahead), so many in small buffers, few in large.
        if (n >= 1000 && b >= 1000) CHECK(static_cast<double>(predicted) >= 0.98 * n);
        if (n >= 100 && b >= 10) CHECK(static_cast<double>(predicted) >= 0.5 * n);
      }
}

TEST_CASE("batched: rows, indices, labels and the remainder") {
  for (int n : sizes)
    for (std::size_t bs : {1u, 2u, 3u, 8u, 64u, 1000u})
      for (bool drop : {false, true}) {
        CAPTURE(n);
        CAPTURE(bs);
        CAPTURE(drop);
        std::vector<float> features;
        std::vector<std::int32_t> labels;
        for (int i = 0; i < n; ++i) {
          features.push_back(static_cast<float>(i));
          features.push_back(static_cast<float>(-i));
          labels.push_back(i % 10);
        }
        const auto d = ld::from_memory(features, 2, labels) | ld::map(ld::scale(0.5f)) | ld::batched(bs, drop);
        std::size_t rows = 0, batches = 0;
        for (auto&& b : d.epoch()) {
          const ld::batch& gb = b;
          ++batches;
          CHECK(gb.width == 2);
          CHECK((gb.rows() == bs || (!drop && gb.rows() == static_cast<std::size_t>(n) % bs)));
          REQUIRE(gb.features.size() == gb.rows() * 2);
          REQUIRE(gb.labels.size() == gb.rows());
          for (std::size_t r = 0; r < gb.rows(); ++r) {
            const auto i = gb.indices[r];
            CHECK(i == rows + r);
            CHECK(gb.features[2 * r] == 0.5f * static_cast<float>(i));
            CHECK(gb.features[2 * r + 1] == -0.5f * static_cast<float>(i));
            CHECK(gb.labels[r] == static_cast<std::int32_t>(i % 10));
          }
          rows += gb.rows();
        }
        const std::size_t un = static_cast<std::size_t>(n);
        CHECK(rows == (drop ? un - un % bs : un));
        CHECK(batches == (drop ? un / bs : (un + bs - 1) / bs));
      }
}

TEST_CASE("batched: owned samples and regression targets") {
  const auto d = ld::from_memory(std::vector<float>{1, 2, 3, 4, 5, 6}, 2, std::vector<float>{10, 20, 30}, 1) |
                 ld::map([](ld::sample s) {
                   ld::owned_sample o(s);
                   o.features.push_back(o.features[0] + o.features[1]);
                   return o;
                 }) |
                 ld::batched(2);
  std::vector<ld::pooled_batch> out = collect(d);
  REQUIRE(out.size() == 2);
  CHECK(out[0].width == 3);
  CHECK(out[0].target_width == 1);
  CHECK(out[0].labels.empty());
  CHECK(out[0].features == std::vector<float>{1, 2, 3, 3, 4, 7});
  CHECK(out[0].targets == std::vector<float>{10, 20});
  CHECK(out[1].features == std::vector<float>{5, 6, 11});
  CHECK(out[1].indices == std::vector<std::uint64_t>{2});
}

TEST_CASE("batched: rows of different widths are a shape_error") {
  const auto d = ld::from_vector(std::vector<ld::owned_sample>(2)) | ld::map([](ld::owned_sample s) {
                   s.features.resize(s.index + 1);
                   return s;
                 });
  std::vector<ld::owned_sample> two(2);
  two[1].index = 1;
  two[1].features.resize(3);
  const auto bad = ld::from_vector(two) | ld::batched(2);
  CHECK_THROWS_AS(collect(bad), lockstep::shape_error);
  CHECK_THROWS_AS(ld::batched(0), lockstep::config_error);
  CHECK_THROWS_AS(ld::shuffle(0, 1), lockstep::config_error);
  CHECK(collect(d).size() == 2);
}

namespace {
/// 0 .. n-1, counted into `pulled` as the map pulls them, shuffled, then cached.
auto counted_then_cached(int n, std::atomic<int>& pulled) {
  return ld::from_vector(stage_range(n)) | ld::map([&pulled](int x) {
           ++pulled;
           return x;
         }) |
         ld::shuffle(8, 3) | ld::cache();
}
}  // namespace

TEST_CASE("cache replays the first complete pass and an abandoned pass caches nothing") {
  for (int n : sizes) {
    CAPTURE(n);
    std::atomic<int> pulled{0};
    const auto d = counted_then_cached(n, pulled);
    if (n > 1) {  // leave early: not cached
      for (auto&& x : d.epoch(0)) {
        (void)x;
        break;
      }
    }
    pulled = 0;
    const auto first = collect(d, 1);
    CHECK(pulled == n);
    const auto again = collect(d, 2);
    CHECK(pulled == n);  // replayed, not recomputed
    CHECK(first == again);
    auto sorted = first;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == stage_range(n));
  }
}

TEST_CASE("cache is filled by a pass whose consumer stops at the last element (take of the dataset's size)") {
  // take(n) returns after the n-th element without resuming the cache's pass past it: the pass
  // fills the cache when its upstream ends, before it gives the last element.
  for (int n : sizes) {
    CAPTURE(n);
    std::atomic<int> pulled{0};
    const auto d = counted_then_cached(n, pulled) | ld::take(static_cast<std::uint64_t>(n));
    const auto first = collect(d, 1);
    CHECK(pulled == n);
    const auto again = collect(d, 2);
    CHECK(pulled == n);  // replayed: the shuffle's order of the first pass, not epoch 2's
    CHECK(first == again);
    CHECK(first.size() == static_cast<std::size_t>(n));
  }
  // Reading one element ahead loses none when the upstream fails: every element before the
  // failure arrives, then the error (and nothing is cached).
  for (const int k : {0, 1, 2, 5}) {
    CAPTURE(k);
    const auto failing = ld::from_generator([k](std::uint64_t) -> ld::generator<int> {
                           for (int i = 0; i < k; ++i) co_yield i;
                           throw lockstep::data_error("upstream failed");
                         }) |
                         ld::cache();
    for (std::uint64_t e = 0; e < 2; ++e) {
      std::vector<int> got;
      CHECK_THROWS_WITH_AS(
          [&] {
            for (auto&& x : failing.epoch(e)) got.push_back(x);
          }(),
          "upstream failed", lockstep::data_error);
      CHECK(got == stage_range(k));
    }
  }
}

TEST_CASE("parallel_map keeps the order and forwards exceptions in place") {
  for (int n : sizes)
    for (std::size_t workers : {1u, 2u, 3u, 8u}) {
      CAPTURE(n);
      CAPTURE(workers);
      const auto d = ld::from_vector(stage_range(n)) | ld::parallel_map(
                                                        [](int x) {
                                                          if (x % 7 == 3) std::this_thread::yield();
                                                          return std::to_string(x * x);
                                                        },
                                                        workers);
      const auto out = collect(d);
      REQUIRE(out.size() == static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) CHECK(out[static_cast<std::size_t>(i)] == std::to_string(i * i));
    }
  const auto failing = ld::from_vector(stage_range(50)) | ld::parallel_map(
                                                           [](int x) {
                                                             if (x == 20) throw std::runtime_error("bad element 20");
                                                             return x;
                                                           },
                                                           4);
  std::vector<int> got;
  CHECK_THROWS_WITH(
      [&] {
        for (auto&& x : failing.epoch()) got.push_back(x);
      }(),
      doctest::Contains("bad element 20"));
  CHECK(got == stage_range(20));  // everything before the failing element, in order
  // an upstream error comes after every element before it, and after an earlier element's own
  // error, whatever the number of workers
  for (std::size_t workers : {1u, 2u, 4u, 8u}) {
    CAPTURE(workers);
    const auto upstream_fails = ld::from_vector(stage_range(50)) | ld::map([](int x) {
                                  if (x == 25) throw std::runtime_error("upstream at 25");
                                  return x;
                                });
    const auto mapped = upstream_fails | ld::parallel_map([](int x) { return x + 1000; }, workers);
    std::vector<int> in_order;
    CHECK_THROWS_WITH(
        [&] {
          for (auto&& x : mapped.epoch()) in_order.push_back(x - 1000);
        }(),
        doctest::Contains("upstream at 25"));
    CHECK(in_order == stage_range(25));
    const auto both = upstream_fails | ld::parallel_map(
                                           [](int x) {
                                             if (x == 22) throw std::runtime_error("map at 22");
                                             return x;
                                           },
                                           workers);
    in_order.clear();
    CHECK_THROWS_WITH(
        [&] {
          for (auto&& x : both.epoch()) in_order.push_back(x);
        }(),
        doctest::Contains("map at 22"));
    CHECK(in_order == stage_range(22));
  }
  // leaving early joins the workers
  int seen = 0;
  for (auto&& x : failing.epoch()) {
    (void)x;
    if (++seen == 3) break;
  }
  CHECK(seen == 3);
}

TEST_CASE("exceptions thrown in map and in a user source reach the consumer") {
  const auto bad_map = ld::from_vector(stage_range(10)) | ld::map([](int x) {
                         if (x == 4) throw std::runtime_error("map failed at 4");
                         return x;
                       }) |
                       ld::shuffle(3, 1);
  CHECK_THROWS_WITH(collect(bad_map), doctest::Contains("map failed at 4"));

  const auto source = ld::from_generator([](std::uint64_t epoch) -> ld::generator<int> {
    co_yield static_cast<int>(epoch);
    throw lockstep::data_error("source failed in epoch " + std::to_string(epoch));
  });
  CHECK_THROWS_WITH_AS(collect(source | ld::take(5), 3), "source failed in epoch 3", lockstep::data_error);
  CHECK(collect(source | ld::take(1), 3) == std::vector<int>{3});

  int calls = 0;
  const auto lambda = ld::from_function([calls]() mutable -> std::optional<int> {
    if (calls == 4) return std::nullopt;
    return calls++;
  });
  CHECK(collect(lambda) == stage_range(4));
  CHECK(collect(lambda, 1) == stage_range(4));  // each epoch starts from a fresh copy
  (void)calls;
}
