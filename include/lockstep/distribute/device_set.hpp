#pragma once
/// @file device_set.hpp
/// Run-time device lists: which devices of one kind a strategy's replicas run on. A
/// `device_selection` is every device of the kind (the default: every visible GPU, every allowed
/// core), the first n devices, or explicit ordinals in replica order; `resolve_devices<Kind>`
/// turns it into ordinals and refuses a repeated ordinal or one that does not exist.

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/backend/context.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>

namespace lockstep {

/// Which devices of a kind a run-time strategy uses, one replica per entry.
class device_selection {
public:
  /// Every device of the kind: every visible GPU, every core this process may run on.
  device_selection() = default;
  /// Explicit ordinals, in replica order (for example {0, 2}).
  device_selection(std::initializer_list<std::size_t> ordinals) : ordinals_(ordinals), explicit_(true) {}
  /// Explicit ordinals, in replica order.
  explicit device_selection(std::vector<std::size_t> ordinals) : ordinals_(std::move(ordinals)), explicit_(true) {}

  /// The first n devices of the kind (ordinals 0..n-1); n must be at least 1.
  [[nodiscard]] static device_selection first(std::size_t n) {
    device_selection s;
    s.first_ = n;
    s.counted_ = true;
    return s;
  }
  /// Every device of the kind (the default).
  [[nodiscard]] static device_selection all() { return {}; }

  /// True for an explicit list of ordinals.
  [[nodiscard]] bool is_explicit() const noexcept { return explicit_; }
  /// True for first(n).
  [[nodiscard]] bool is_first() const noexcept { return counted_; }
  /// The explicit ordinals (empty unless is_explicit()).
  [[nodiscard]] const std::vector<std::size_t>& ordinals() const noexcept { return ordinals_; }
  /// The n of first(n) (0 unless is_first()).
  [[nodiscard]] std::size_t count() const noexcept { return first_; }

private:
  std::vector<std::size_t> ordinals_;
  std::size_t first_ = 0;
  bool explicit_ = false;
  bool counted_ = false;
};

namespace detail {
inline std::string list_text(const std::vector<std::size_t>& v) {
  std::string s = "{";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "}";
}
}  // namespace detail

/// The ordinals `sel` names among the `available` devices of kind Kind (backend_traits<Kind>
/// says whether ordinals must be below that count: GPUs must exist, host replicas may outnumber
/// the cores and share them). `who` prefixes messages.
/// @throws config_error for an empty list, a repeated ordinal, first(0), or a device that does
///         not exist; the message names the value and the limit.
template <class Kind>
std::vector<std::size_t> resolve_devices(const device_selection& sel, std::size_t available, const std::string& who) {
  const std::string kind = backend_traits<Kind>::name;
  constexpr bool bounded = backend_traits<Kind>::ordinals_bounded;
  std::vector<std::size_t> out;
  if (sel.is_explicit()) {
    out = sel.ordinals();
    if (out.empty()) throw config_error(who + ": the device list is empty; name at least one " + kind + " device");
    for (std::size_t i = 0; i < out.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j)
        if (out[j] == out[i])
          throw config_error(who + ": " + kind + " device " + std::to_string(out[i]) + " appears twice in the device list " +
                             detail::list_text(out) + "; each replica needs its own device");
      if (bounded && out[i] >= available)
        throw config_error(who + ": " + kind + " device " + std::to_string(out[i]) + " does not exist: " +
                           std::to_string(available) + " " + kind + " device(s) are visible" +
                           (available ? " (ordinals 0.." + std::to_string(available - 1) + ")" : std::string()));
    }
    return out;
  }
  std::size_t n = available;
  if (sel.is_first()) {
    n = sel.count();
    if (n == 0) throw config_error(who + ": the number of " + kind + " replicas must be at least 1, got 0");
    if (bounded && n > available)
      throw config_error(who + ": asked for " + std::to_string(n) + " " + kind + " devices, but " + std::to_string(available) +
                         " are visible");
  } else if (n == 0) {
    std::string why;
    if constexpr (requires { backend_traits<Kind>::why_none(); }) why = " (" + backend_traits<Kind>::why_none() + ")";
    throw config_error(who + ": no " + kind + " device is visible" + why);
  }
  out.resize(n);
  for (std::size_t i = 0; i < n; ++i) out[i] = i;
  return out;
}

}  // namespace lockstep
