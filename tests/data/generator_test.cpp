// Tests of lockstep::data::generator: laziness, frame destruction, exceptions, ranges conformance.
#include <doctest/doctest.h>

#include <algorithm>
#include <iterator>
#include <memory>
#include <numeric>
#include <ranges>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <lockstep/data/generator.hpp>

namespace ld = lockstep::data;

namespace {

ld::generator<int> iota(int n, int* started = nullptr) {
  if (started) ++*started;
  for (int i = 0; i < n; ++i) co_yield i;
}

struct counted {
  int* destroyed;
  explicit counted(int* d) : destroyed(d) {}
  counted(const counted&) = delete;
  counted& operator=(const counted&) = delete;
  ~counted() { ++*destroyed; }
};

ld::generator<int> with_locals(int* destroyed) {
  counted a(destroyed);
  for (int i = 0;; ++i) {
    counted b(destroyed);
    co_yield i;
  }
}

ld::generator<int> throws_after(int n) {
  for (int i = 0; i < n; ++i) co_yield i;
  throw std::runtime_error("boom after " + std::to_string(n));
}

ld::generator<std::unique_ptr<int>> move_only(int n) {
  for (int i = 0; i < n; ++i) co_yield std::make_unique<int>(i);
}

ld::generator<std::string> copies_lvalue() {
  std::string s = "kept";
  co_yield s;  // copied: the body's string stays intact
  co_yield s + "!";
}

ld::generator<const int&> refs(const std::vector<int>& v) {
  for (const int& x : v) co_yield x;
}

}  // namespace

static_assert(std::ranges::input_range<ld::generator<int>>);
static_assert(std::ranges::input_range<ld::generator<std::unique_ptr<int>>>);
static_assert(!std::ranges::forward_range<ld::generator<int>>);
static_assert(std::input_iterator<std::ranges::iterator_t<ld::generator<int>>>);
static_assert(std::same_as<std::ranges::range_value_t<ld::generator<int>>, int>);
static_assert(!std::is_copy_constructible_v<ld::generator<int>>);
static_assert(std::is_nothrow_move_constructible_v<ld::generator<int>>);

TEST_CASE("generator: lazy start, values in order, for sizes 0..20") {
  for (int n : {0, 1, 2, 3, 7, 13, 20}) {
    CAPTURE(n);
    int started = 0;
    auto g = iota(n, &started);
    CHECK(started == 0);  // nothing runs before begin()
    std::vector<int> got;
    for (auto&& x : g) got.push_back(x);
    CHECK(started == 1);
    std::vector<int> want(static_cast<std::size_t>(n));
    std::iota(want.begin(), want.end(), 0);
    CHECK(got == want);
  }
}

TEST_CASE("generator: a never-iterated generator never runs") {
  int started = 0;
  { auto g = iota(5, &started); }
  CHECK(started == 0);
}

TEST_CASE("generator: abandoning half-way destroys the frame's locals") {
  for (int stop_at : {0, 1, 5}) {
    CAPTURE(stop_at);
    int destroyed = 0;
    {
      auto g = with_locals(&destroyed);
      for (auto&& x : g) {
        if (x == stop_at) break;
      }
      CHECK(destroyed == stop_at);  // one `b` per finished iteration
    }
    CHECK(destroyed == stop_at + 2);  // the live `b` and `a`
  }
}

TEST_CASE("generator: exceptions are rethrown at the consumer after the values before them") {
  for (int n : {0, 1, 4}) {
    CAPTURE(n);
    std::vector<int> got;
    auto g = throws_after(n);
    CHECK_THROWS_WITH_AS(
        [&] {
          for (auto&& x : g) got.push_back(x);
        }(),
        doctest::Contains("boom after"), std::runtime_error);
    CHECK(got.size() == static_cast<std::size_t>(n));
  }
}

TEST_CASE("generator: move-only values can be moved out") {
  std::vector<std::unique_ptr<int>> out;
  for (auto&& p : move_only(5)) out.push_back(std::move(p));
  REQUIRE(out.size() == 5);
  for (int i = 0; i < 5; ++i) CHECK(*out[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("generator: yielding an lvalue copies it and reference generators yield references") {
  std::vector<std::string> got;
  for (auto&& s : copies_lvalue()) got.push_back(std::move(s));
  CHECK(got == std::vector<std::string>{"kept", "kept!"});

  const std::vector<int> v{4, 5, 6};
  std::vector<const int*> addrs;
  for (const int& x : refs(v)) addrs.push_back(&x);
  REQUIRE(addrs.size() == 3);
  CHECK(addrs[0] == &v[0]);
  CHECK(addrs[2] == &v[2]);
}

TEST_CASE("generator: works with std::ranges algorithms and moves") {
  auto g = iota(10);
  auto it = std::ranges::find(g, 6);
  REQUIRE(it != g.end());
  CHECK(*it == 6);
  ++it;
  CHECK(*it == 7);
  it++;  // post-increment advances, returns nothing
  CHECK(*it == 8);

  auto a = iota(3);
  auto b = std::move(a);
  int sum = 0;
  for (auto&& x : b) sum += x;
  CHECK(sum == 3);
  ld::generator<int> empty;
  CHECK(empty.begin() == empty.end());

#if !defined(__clang__) || __clang_major__ >= 15
  // std::views composition (clang 14 cannot compile libstdc++ 12's range adaptors at all).
  const auto is_even = [](int x) { return x % 2 == 0; };
  std::vector<int> evens;
  for (int x : iota(10) | std::views::filter(is_even)) evens.push_back(x);
  CHECK(evens == std::vector<int>{0, 2, 4, 6, 8});
#endif
}
