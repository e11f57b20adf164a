#pragma once
/// @file optimizer.hpp
/// The public conformance suites of the optimiser and learning-rate schedule concepts, for
/// doctest. Instantiate them for your own types from your own test binary:
///
///     TEST_CASE_TEMPLATE_INVOKE(lockstep_optimizer_conformance, my_optimizer);
///     TEST_CASE_TEMPLATE_INVOKE(lockstep_schedule_conformance, my_schedule);
///
/// The optimiser suite runs `update` in double on the host over flat buffers of 0, 1, 13 and 1000
/// parameters and checks: that it equals the reference when one is given (the suite says so when
/// none is: specialise
/// `lockstep::testing::optimizer_reference<O>` with `static void update(const O&, double* p,
/// const double* g, double* state, std::size_t n, const update_info&)`, scalar code written from
/// the optimiser's definition); that the gradient is used only through `grads * grad_scale`; that
/// it touches nothing outside its n parameters and state_size(n) state elements; that three
/// updates on one gradient move the parameters against it; the state save/load round trip: k
/// updates, a copy of the parameters and the state (what a checkpoint keeps), m more updates on
/// the copy, each by a fresh optimiser (as fit makes one per update), and on the original give
/// bitwise the same buffers; for an optimiser that says `applies_recipe`, that it applies
/// update_info's per-value clipping, decision (scale and skip) and EMA as the library does; and, for
/// an optimiser that says it is elementwise (optimizer_elementwise_v, what
/// strategy_options::shard_optimizer needs), that updating slices of the parameters on their own,
/// each with state_size(slice) state laid out as k arrays, gives the whole update's bits. The
/// optimiser is value-initialised (`O{}`) with its `lr` set to 0.01.
///
/// The schedule suite checks that a schedule is a pure, finite, non-negative function of
/// (base, step), non-decreasing in the base rate, whose copies agree, so a resumed run continues
/// it exactly.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <lockstep/backend/host.hpp>
#include <lockstep/optimizers/optimizer.hpp>
#include <lockstep/optimizers/schedule.hpp>
#include <lockstep/testing/report.hpp>

namespace lockstep::testing {

/// The scalar reference of optimiser O; specialise it with a static `update` to have the suite
/// compare against it (the primary template has none).
template <class O>
struct optimizer_reference {};

namespace detail {

/// Parameters, gradients and state of n parameters, with a guard element on each side.
template <class O>
struct optimizer_buffers {
  std::size_t n, s;
  std::vector<double> p, g, state;
  optimizer_buffers(const O& o, std::size_t count)
      : n(count), s(o.state_size(count)), p(count + 2, 77.0), g(count + 2, 77.0), state(s + 2, 77.0) {
    for (std::size_t i = 0; i < n; ++i) {
      p[i + 1] = std::sin(0.37 * static_cast<double>(i) + 1.0);
      g[i + 1] = 3.0 * std::cos(1.1 * static_cast<double>(i));
    }
    for (std::size_t i = 0; i < s; ++i) state[i + 1] = 0.0;  // the library zeroes the state
  }
  void step(const O& o, const update_info& u) {
    host_context ctx{1};
    o.update(ctx, p.data() + 1, g.data() + 1, state.data() + 1, n, u);
  }
  void new_gradients(std::uint64_t k) {
    for (std::size_t i = 0; i < n; ++i) g[i + 1] = 3.0 * std::cos(1.1 * static_cast<double>(i) + 0.7 * static_cast<double>(k));
  }
};

template <class O>
O suite_optimizer() {
  O o{};
  o.lr = 0.01f;
  return o;
}

inline update_info info_at(std::uint64_t step, double grad_scale = 0.125) {
  return update_info{0.01f, step, grad_scale};
}

}  // namespace detail
}  // namespace lockstep::testing

/// The conformance suite of an optimiser O (see this file's comment).
TEST_CASE_TEMPLATE_DEFINE("lockstep optimizer conformance", O, lockstep_optimizer_conformance) {
  namespace lt = lockstep::testing;
  static_assert(lockstep::optimizer_for<O, double, lockstep::host_context>,
                "the optimiser suite runs the optimiser in double on the host");
  const O o = lt::detail::suite_optimizer<O>();

  SUBCASE("updates stay inside the n parameters and state_size(n) state elements (n = 0, 1, 13, 1000)") {
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{1000}}) {
      CAPTURE(n);
      lt::detail::optimizer_buffers<O> b(o, n);
      for (std::uint64_t k = 1; k <= 3; ++k) {
        b.new_gradients(k);
        b.step(o, lt::detail::info_at(k));
      }
      CHECK(b.p.front() == 77.0);
      CHECK(b.p.back() == 77.0);
      CHECK(b.g.front() == 77.0);
      CHECK(b.g.back() == 77.0);
      CHECK(b.state.front() == 77.0);
      CHECK(b.state.back() == 77.0);
      lt::element_report finite("parameters after 3 updates are finite", "value");
      for (std::size_t i = 0; i < n; ++i) finite.holds(i, std::isfinite(b.p[i + 1]), b.p[i + 1]);
      CHECK_MESSAGE(finite.ok(), finite.text());
    }
  }

  if constexpr (requires(const O& oo, double* d, const double* c, std::size_t n, const lockstep::update_info& u) {
                  lt::optimizer_reference<O>::update(oo, d, c, d, n, u);
                }) {
    SUBCASE("update equals the reference on flat buffers over several steps") {
      for (const std::size_t n : {std::size_t{1}, std::size_t{13}, std::size_t{1000}}) {
        CAPTURE(n);
        lt::detail::optimizer_buffers<O> b(o, n), ref(o, n);
        for (std::uint64_t k = 1; k <= 5; ++k) {
          b.new_gradients(k);
          ref.new_gradients(k);
          b.step(o, lt::detail::info_at(k));
          lt::optimizer_reference<O>::update(o, ref.p.data() + 1, ref.g.data() + 1, ref.state.data() + 1, n,
                                             lt::detail::info_at(k));
        }
        const auto tolerance = [](double a, double r) { return 1e-12 * (1.0 + std::max(std::abs(a), std::abs(r))); };
        lt::element_report params("parameters after 5 updates vs the reference", "update", "reference");
        for (std::size_t i = 0; i < n; ++i) params.close(i, b.p[i + 1], ref.p[i + 1], tolerance(b.p[i + 1], ref.p[i + 1]));
        CHECK_MESSAGE(params.ok(), params.text());
        lt::element_report state("state after 5 updates vs the reference", "update", "reference");
        for (std::size_t i = 0; i < b.s; ++i)
          state.close(i, b.state[i + 1], ref.state[i + 1], tolerance(b.state[i + 1], ref.state[i + 1]));
        CHECK_MESSAGE(state.ok(), state.text());
      }
    }
  }

  if constexpr (!requires(const O& oo, double* d, const double* c, std::size_t n, const lockstep::update_info& u) {
                  lt::optimizer_reference<O>::update(oo, d, c, d, n, u);
                }) {
    static_assert(!requires { &lt::optimizer_reference<O>::update; },
                  "lockstep optimizer suite: optimizer_reference<O>::update must be `static void update(const O&, "
                  "double* p, const double* g, double* state, std::size_t n, const lockstep::update_info&)`");
    MESSAGE("lockstep optimizer suite: no lockstep::testing::optimizer_reference<O> is specialised; the updates are "
            "checked for their properties only, not against a reference");
  }

  SUBCASE("the gradient counts only as grads * grad_scale") {
    lt::detail::optimizer_buffers<O> scaled(o, 57), unscaled(o, 57);
    for (std::uint64_t k = 1; k <= 4; ++k) {
      scaled.new_gradients(k);
      unscaled.new_gradients(k);
      for (std::size_t i = 0; i < 57; ++i) unscaled.g[i + 1] *= 0.25;  // exact: a power of two
      scaled.step(o, lt::detail::info_at(k, 0.25));
      unscaled.step(o, lt::detail::info_at(k, 1.0));
    }
    CHECK(scaled.p == unscaled.p);
    CHECK(scaled.state == unscaled.state);
  }

  SUBCASE("state save/load round trip: resuming from copies of the buffers is bitwise exact") {
    lt::detail::optimizer_buffers<O> a(o, 101);
    for (std::uint64_t k = 1; k <= 3; ++k) {
      a.new_gradients(k);
      a.step(o, lt::detail::info_at(k));
    }
    lt::detail::optimizer_buffers<O> b = a;  // what a checkpoint keeps: parameters and state
    for (std::uint64_t k = 4; k <= 6; ++k) {
      a.new_gradients(k);
      b.new_gradients(k);
      a.step(o, lt::detail::info_at(k));
      // a fresh copy of the hyper-parameters for every update, as fit makes one (with the
      // scheduled rate) and a resumed run starts from the user's: the update keeps nothing in
      // the optimiser object
      b.step(lt::detail::suite_optimizer<O>(), lt::detail::info_at(k));
    }
    CHECK(a.p == b.p);
    CHECK(a.state == b.state);
  }

  SUBCASE("updates descend: three updates on one gradient move the parameters against it") {
    for (const std::size_t n : {std::size_t{1}, std::size_t{13}, std::size_t{1000}}) {
      CAPTURE(n);
      lt::detail::optimizer_buffers<O> b(o, n);
      const std::vector<double> before = b.p;
      for (std::uint64_t k = 1; k <= 3; ++k) b.step(o, lt::detail::info_at(k, 1.0));
      double slope = 0;  // the first-order change of the loss whose gradient is g
      for (std::size_t i = 0; i < n; ++i) slope += b.g[i + 1] * (b.p[i + 1] - before[i + 1]);
      CHECK_MESSAGE(slope < 0, "sum of g * (p after - p before) is " << slope << ": the updates do not descend");
    }
  }

  if constexpr (lockstep::optimizer_applies_recipe_v<O>) {
    SUBCASE("applies_recipe: per-value clipping, a host-readable decision (scale, skip) and the EMA as the library's passes apply them") {
      constexpr std::size_t n = 37;
      const double scale = 0.125;
      const float bound = 0.2f;  // update_info::clip_value is a float
      // Clipping: the same bits as the update of the gradients already scaled and clamped.
      lt::detail::optimizer_buffers<O> clipped(o, n), ref(o, n);
      for (std::uint64_t k = 1; k <= 3; ++k) {
        clipped.new_gradients(k);
        ref.new_gradients(k);
        for (std::size_t i = 0; i < n; ++i)
          ref.g[i + 1] = lockstep::detail::clip_to(ref.g[i + 1] * scale, static_cast<double>(bound));  // what it uses
        lockstep::update_info u = lt::detail::info_at(k, scale);
        u.clip_value = bound;
        clipped.step(o, u);
        ref.step(o, lt::detail::info_at(k, 1.0));
      }
      CHECK(clipped.p == ref.p);
      CHECK(clipped.state == ref.state);
      // A decision: its scale replaces grad_scale; skip changes nothing.
      lt::detail::optimizer_buffers<O> decided(o, n), plain(o, n);
      lockstep::update_decision d;
      d.scale = 0.25f;
      lockstep::update_info u = lt::detail::info_at(1, 8.0);
      u.decision = &d;
      decided.step(o, u);
      plain.step(o, lt::detail::info_at(1, 0.25));
      CHECK(decided.p == plain.p);
      CHECK(decided.state == plain.state);
      d.skip = 1;
      const auto p_before = decided.p, s_before = decided.state;
      std::vector<double> ema(n, 0.5);
      u.step = 2;
      u.ema = ema.data();
      u.ema_decay = 0.9;
      decided.step(o, u);
      CHECK(decided.p == p_before);
      CHECK(decided.state == s_before);
      CHECK(ema == std::vector<double>(n, 0.5));
      // The EMA: ema = decay × ema + (1 − decay) × p after the update.
      d.skip = 0;
      decided.step(o, u);
      lt::element_report avg("the EMA after an update vs decay x ema + (1 - decay) x p", "ema", "expected");
      for (std::size_t i = 0; i < n; ++i) {
        const double want = 0.9 * 0.5 + (1.0 - 0.9) * decided.p[i + 1];
        avg.close(i, ema[i], want, 1e-14 * (1.0 + std::abs(want)));
      }
      CHECK_MESSAGE(avg.ok(), avg.text());
    }
  }

  if constexpr (lockstep::optimizer_elementwise_v<O>) {
    SUBCASE("elementwise: slices updated on their own, each with its own state, give the whole update's bits") {
      constexpr std::size_t n = 103;
      const std::size_t k = n ? o.state_size(n) / n : 0;
      CHECK(o.state_size(n) == k * n);  // k arrays of n
      for (const std::size_t parts : {std::size_t{2}, std::size_t{3}, std::size_t{7}}) {
        CAPTURE(parts);
        lt::detail::optimizer_buffers<O> w(o, n);
        std::vector<lt::detail::optimizer_buffers<O>> slices;
        for (std::size_t q = 0; q < parts; ++q) {
          const std::size_t lo = n * q / parts, hi = n * (q + 1) / parts;
          slices.emplace_back(o, hi - lo);
          for (std::size_t i = lo; i < hi; ++i) slices.back().p[i - lo + 1] = w.p[i + 1];
          CHECK(o.state_size(hi - lo) == k * (hi - lo));
        }
        for (std::uint64_t step = 1; step <= 4; ++step) {
          w.new_gradients(step);
          w.step(o, lt::detail::info_at(step));
          for (std::size_t q = 0; q < parts; ++q) {
            const std::size_t lo = n * q / parts, hi = n * (q + 1) / parts;
            for (std::size_t i = lo; i < hi; ++i) slices[q].g[i - lo + 1] = w.g[i + 1];
            slices[q].step(o, lt::detail::info_at(step));
          }
        }
        lt::element_report params("parameters updated in slices vs in one update", "slices", "whole");
        lt::element_report state("state updated in slices vs in one update", "slices", "whole");
        for (std::size_t q = 0; q < parts; ++q) {
          const std::size_t lo = n * q / parts, hi = n * (q + 1) / parts, len = hi - lo;
          for (std::size_t i = 0; i < len; ++i) params.equal(lo + i, slices[q].p[i + 1], w.p[lo + i + 1]);
          for (std::size_t c = 0; c < k; ++c)
            for (std::size_t i = 0; i < len; ++i)
              state.equal(c * n + lo + i, slices[q].state[c * len + i + 1], w.state[c * n + lo + i + 1]);
        }
        CHECK_MESSAGE(params.ok(), params.text());
        CHECK_MESSAGE(state.ok(), state.text());
      }
    }
  }
}

/// The conformance suite of a learning-rate schedule S (value-initialised; see this file's comment).
TEST_CASE_TEMPLATE_DEFINE("lockstep schedule conformance", S, lockstep_schedule_conformance) {
  static_assert(lockstep::learning_rate_schedule<S>);
  const S s{};
  const S copy = s;
  for (const std::uint64_t step : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{999},
                                   std::uint64_t{1000}, std::uint64_t{123456}}) {
    CAPTURE(step);
    const float r = s(0.5f, step);
    CHECK(std::isfinite(r));
    CHECK(r >= 0.0f);
    CHECK(s(0.5f, step) == r);     // pure
    CHECK(copy(0.5f, step) == r);  // a copy (what fit stores) gives the same rates
    CHECK(s(1.0f, step) >= r);     // a larger base rate never gives a smaller rate
  }
}
