#pragma once
/// @file schedule.hpp
/// Learning-rate schedules: pure functions of (base lr, step), so resuming at a step resumes the
/// schedule exactly. Steps count from 0.

#include <cmath>
#include <concepts>
#include <cstdint>
#include <string>

#include <lockstep/core/error.hpp>

namespace lockstep {

/// A learning-rate schedule: a copyable function object that fit calls as
/// `float operator()(float base, std::uint64_t step) const`, giving the rate of update `step`
/// (0-based) from the base rate. It must be a pure function of its arguments, so that a resumed
/// run continues the schedule exactly. It may have `void check() const`, which throws
/// config_error for a field out of range: lr_schedule calls it when the callback is made, so a
/// bad field is refused before training rather than when the decay reaches it.
template <class S>
concept learning_rate_schedule = std::copy_constructible<S> && requires(const S& s, float base, std::uint64_t step) {
  { s(base, step) } -> std::convertible_to<float>;
};

namespace detail {
/// Checks schedule S member by member, so that a type that lacks one is told which.
template <class S>
constexpr bool check_schedule() {
  static_assert(requires(const S& s, float base, std::uint64_t step) { { s(base, step) } -> std::convertible_to<float>; },
                "lockstep: a learning-rate schedule needs `float operator()(float base, std::uint64_t step) const` "
                "(note the const: a schedule is a pure function of the step)");
  static_assert(std::copy_constructible<S>, "lockstep: a learning-rate schedule must be copyable");
  return true;  // each missing member was named above
}

/// Calls schedule `s`'s optional `check()` (a schedule without one has nothing to check).
template <class S>
void check_schedule_fields(const S& s) {
  if constexpr (requires { s.check(); }) s.check();
}
}  // namespace detail

/// The base learning rate at every step.
struct constant_schedule {
  /// The rate at `step`.
  [[nodiscard]] float operator()(float base, std::uint64_t) const noexcept { return base; }
};

/// Multiplies the rate by `factor` every `every` steps.
struct step_schedule {
  std::uint64_t every = 1000;  ///< steps between decays
  float factor = 0.1f;         ///< multiplier per decay, finite and >= 0
  /// @throws config_error for `every` 0 or a factor negative or not finite.
  void check() const {
    if (every == 0) throw config_error("lockstep::step_schedule: `every` must be > 0");
    if (!detail::finite_nonnegative(factor))
      throw config_error("lockstep::step_schedule: `factor` is " + detail::option_value(factor) + "; it must be finite and >= 0");
  }
  /// The rate at `step`. @throws config_error as check() (at every step: a schedule called
  /// directly is refused at its first step, not at the first decay).
  [[nodiscard]] float operator()(float base, std::uint64_t step) const {
    check();
    return base * std::pow(factor, static_cast<float>(step / every));
  }
};

/// Cosine decay from the base rate to `min_lr` over `total` steps, then `min_lr`.
struct cosine_schedule {
  std::uint64_t total = 1000;  ///< steps of the decay
  float min_lr = 0.0f;         ///< floor: an absolute rate, not scaled with the base; finite and >= 0
  /// @throws config_error for `total` 0 or a min_lr negative or not finite.
  void check() const {
    if (total == 0) throw config_error("lockstep::cosine_schedule: `total` must be > 0");
    if (!detail::finite_nonnegative(min_lr))
      throw config_error("lockstep::cosine_schedule: `min_lr` is " + detail::option_value(min_lr) + "; it must be finite and >= 0");
  }
  /// The rate at `step`. @throws config_error as check() (at every step: a schedule called
  /// directly is refused at its first step, not when the decay reaches the bad field).
  [[nodiscard]] float operator()(float base, std::uint64_t step) const {
    check();
    if (step >= total) return min_lr;
    const double t = static_cast<double>(step) / static_cast<double>(total);
    return static_cast<float>(min_lr + 0.5 * (base - min_lr) * (1.0 + std::cos(3.14159265358979323846 * t)));
  }
};

/// Linear warm-up from base / (warmup + 1) to the base rate over `steps` steps, then `after`
/// (counted from the end of the warm-up).
template <learning_rate_schedule After = constant_schedule>
struct warmup_schedule {
  std::uint64_t steps = 100;  ///< warm-up length
  After after{};              ///< schedule after the warm-up
  /// @throws config_error for a field of `after` out of range (its own check(), when it has one).
  void check() const { detail::check_schedule_fields(after); }
  /// The rate at `step`. @throws config_error as check() during the warm-up (a field of `after`
  /// out of range is refused at the first step, not after the warm-up; an `after` without check()
  /// is called instead, its rate at its step 0 unused, so that what it throws comes at the first
  /// step too), and whatever `after` throws after it (the built-in schedules check their fields
  /// at every step: nothing is checked twice).
  [[nodiscard]] float operator()(float base, std::uint64_t step) const {
    if (step < steps) {
      if constexpr (requires { after.check(); })
        after.check();
      else
        (void)after(base, 0);
      return base * static_cast<float>(step + 1) / static_cast<float>(steps + 1);
    }
    return after(base, step - steps);
  }
};

}  // namespace lockstep
