#pragma once
/// @file report.hpp
/// `element_report`: how the conformance suites report an elementwise check, with numbers. A check
/// over many elements (a gradient against finite differences, two runs that must agree bit for
/// bit) is one assertion, not one per element: it collects the failing elements and, when any
/// fails, says how many of how many, then the first few with their place, both values, the
/// difference and the tolerance, then `… and N more`:
///
///     input gradient vs central finite differences: 212 of 280 elements differ
///       [training, 7 rows] element 3: analytic 0.51234, numeric 0.4658, |difference| 0.04654 > tolerance 1e-05
///       ...
///       … and 207 more
///
/// A suite asserts `CHECK_MESSAGE(report.ok(), report.text())` once per check.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::testing {

/// The failing elements of one elementwise check (see this file's comment).
class element_report {
public:
  /// A report on the check `name`, comparing a value called `got` (for example "analytic") with
  /// one called `expected` (for example "numeric"), showing the first `shown` failures.
  explicit element_report(std::string name, std::string got = "got", std::string expected = "expected",
                          std::size_t shown = 5)
      : name_(std::move(name)), got_(std::move(got)), expected_(std::move(expected)), shown_(shown) {}

  /// Names where the elements checked next are (for example "training, 7 rows"); shown in
  /// brackets before each failing element.
  void context(std::string where) { context_ = std::move(where); }

  /// Checks element `index`: passes when |got - expected| <= tolerance (and neither is NaN).
  /// Returns whether it passed.
  bool close(std::size_t index, double got, double expected, double tolerance) {
    ++checked_;
    const double diff = std::abs(got - expected);
    if (diff <= tolerance) return true;  // false for a NaN
    fail(index, got, expected, diff, tolerance);
    return false;
  }

  /// Checks element `index`: passes when got == expected (bit for bit, as doubles compare).
  bool equal(std::size_t index, double got, double expected) {
    ++checked_;
    if (got == expected) return true;
    fail(index, got, expected, std::abs(got - expected), 0.0);
    return false;
  }

  /// Checks element `index` for a property that has no second value (for example finiteness):
  /// passes when `holds`; `value` is shown when it does not.
  bool holds(std::size_t index, bool holds, double value) {
    ++checked_;
    if (holds) return true;
    ++failures_;
    if (lines_.size() < shown_) lines_.push_back(prefix(index) + got_ + " " + number(value));
    return false;
  }

  /// True when no element failed.
  [[nodiscard]] bool ok() const noexcept { return failures_ == 0; }
  /// Elements that failed.
  [[nodiscard]] std::size_t failures() const noexcept { return failures_; }
  /// Elements checked.
  [[nodiscard]] std::size_t checked() const noexcept { return checked_; }

  /// The report: one line saying how many elements of how many failed, one line per shown
  /// failure, and `… and N more` when more failed. "name: all N elements agree" when none failed.
  [[nodiscard]] std::string text() const {
    if (ok()) return name_ + ": all " + std::to_string(checked_) + " elements agree";
    std::string out = name_ + ": " + std::to_string(failures_) + " of " + std::to_string(checked_) + " element" +
                      (checked_ == 1 ? "" : "s") + (failures_ == 1 ? " differs" : " differ");
    for (const auto& line : lines_) out += "\n  " + line;
    if (failures_ > lines_.size()) out += "\n  \u2026 and " + std::to_string(failures_ - lines_.size()) + " more";
    return out;
  }

private:
  static std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
  }
  std::string prefix(std::size_t index) const {
    return (context_.empty() ? std::string() : "[" + context_ + "] ") + "element " + std::to_string(index) + ": ";
  }
  void fail(std::size_t index, double got, double expected, double diff, double tolerance) {
    ++failures_;
    if (lines_.size() >= shown_) return;
    lines_.push_back(prefix(index) + got_ + " " + number(got) + ", " + expected_ + " " + number(expected) +
                     ", |difference| " + number(diff) + (tolerance > 0 ? " > tolerance " + number(tolerance)
                                                                        : std::string(" (must be equal)")));
  }

  std::string name_, got_, expected_, context_;
  std::size_t shown_;
  std::size_t checked_ = 0, failures_ = 0;
  std::vector<std::string> lines_;
};

namespace detail {

/// The indices of an n-element buffer the finite-difference checks probe: the first and last 8
/// (a layer's blocks often end there: a bias after the weights) and up to 32 more at places a
/// multiplicative hash picks, so that no single column of a row-major buffer is all that is probed.
inline std::vector<std::size_t> probe_indices(std::size_t n) {
  std::vector<std::size_t> out;
  for (std::size_t k = 0; k < n && k < 8; ++k) out.push_back(k);
  for (std::size_t k = n > 8 ? n - 8 : 0; k < n; ++k) out.push_back(k);
  for (std::size_t j = 0; n > 16 && j < 32; ++j) out.push_back(8 + (j * 2654435761u) % (n - 16));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace detail

}  // namespace lockstep::testing
