#pragma once
/// @file stage.hpp
/// The public conformance suite of pipeline stages, for doctest. Describe your stage by a case
/// type and instantiate the suite for it from your own test binary:
///
///     struct my_case {
///       static auto make(std::uint64_t seed) { return my_stage{seed}; }  // a stage over dataset<int>
///       static constexpr bool keeps_all = true;  // optional (default true): passes every element on
///       static constexpr bool pulls_all = true;  // optional (default true): reads the whole upstream
///     };
///     TEST_CASE_TEMPLATE_INVOKE(lockstep_stage_conformance, my_case);
///
/// The suite feeds the stage `dataset<int>`s of 0, 1, 7 and 1000 distinct elements and checks:
/// exactly once (no element is passed on twice or invented; with `keeps_all`, every element is
/// passed on); a deterministic order from (seed, epoch) (epoch e iterated twice, or from a second
/// stage made with the same seed, gives the same sequence); and errors reach the consumer (an
/// exception thrown upstream at any position is rethrown where the epoch is iterated, with its
/// type and message, and nothing hangs). Include it from a doctest test file compiled by a host
/// compiler.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/generator.hpp>

namespace lockstep::testing {

/// True when the stage of case C pulls its whole upstream (C::pulls_all, default true); a stage
/// that stops early (take) is not checked for upstream errors it never reaches.
template <class C>
constexpr bool stage_pulls_all() {
  if constexpr (requires { C::pulls_all; })
    return C::pulls_all;
  else
    return true;
}

/// True when the stage of case C passes every element on (C::keeps_all, default true).
template <class C>
constexpr bool stage_keeps_all() {
  if constexpr (requires { C::keeps_all; })
    return C::keeps_all;
  else
    return true;
}

namespace detail {

inline data::generator<int> throwing_source(int n, int fail_at) {
  for (int i = 0; i < n; ++i) {
    if (i == fail_at) throw data_error("lockstep::testing: upstream failure at element " + std::to_string(i));
    co_yield i;
  }
}

inline data::dataset<int> counting(int n) {
  return data::dataset<int>{[n](std::uint64_t) { return throwing_source(n, -1); }};
}

template <class D>
std::vector<int> drain(const D& d, std::uint64_t epoch) {
  std::vector<int> out;
  for (auto&& x : d.epoch(epoch)) out.push_back(static_cast<int>(x));
  return out;
}

}  // namespace detail
}  // namespace lockstep::testing

/// The conformance suite of a pipeline stage described by case C (see this file's comment).
TEST_CASE_TEMPLATE_DEFINE("lockstep stage conformance", C, lockstep_stage_conformance) {
  namespace lt = lockstep::testing;
  using stage_type = decltype(C::make(std::uint64_t{1}));
  static_assert(lockstep::data::detail::check_stage<stage_type, int>());  // names a missing member

  SUBCASE("exactly once, in a deterministic order from (seed, epoch)") {
    for (const int n : {0, 1, 7, 1000}) {
      for (const std::uint64_t seed : {std::uint64_t{1}, std::uint64_t{99}}) {
        CAPTURE(n);
        CAPTURE(seed);
        const auto d = lt::detail::counting(n) | C::make(seed);
        const auto twin = lt::detail::counting(n) | C::make(seed);
        for (const std::uint64_t epoch : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{5}}) {
          CAPTURE(epoch);
          const std::vector<int> got = lt::detail::drain(d, epoch);
          CHECK(lt::detail::drain(d, epoch) == got);     // the same epoch again
          CHECK(lt::detail::drain(twin, epoch) == got);  // another stage with the same seed
          std::vector<int> sorted = got;
          std::sort(sorted.begin(), sorted.end());
          CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());  // nothing twice
          CHECK(std::all_of(sorted.begin(), sorted.end(), [n](int x) { return x >= 0 && x < n; }));  // nothing invented
          if constexpr (lt::stage_keeps_all<C>()) CHECK(sorted.size() == static_cast<std::size_t>(n));
        }
      }
    }
  }

  SUBCASE("an upstream exception reaches the consumer with its type and message") {
    if constexpr (lt::stage_pulls_all<C>())
    for (const int fail_at : {0, 1, 50, 999}) {
      CAPTURE(fail_at);
      const lockstep::data::dataset<int> failing{
          [fail_at](std::uint64_t) { return lt::detail::throwing_source(1000, fail_at); }};
      const auto d = failing | C::make(3);
      std::string message;
      try {
        (void)lt::detail::drain(d, 0);
      } catch (const lockstep::data_error& e) {
        message = e.what();
      }
      CHECK(message == "lockstep::testing: upstream failure at element " + std::to_string(fail_at));
    }
  }
}
