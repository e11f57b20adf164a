#pragma once
/// @file mirrored.hpp
/// The everyday names of the mirrored strategy (all are a `mirrored_strategy<Kind, Reducer,
/// Determinism>` underneath, see strategy.hpp):
///  - `mirrored<cpu<0>, cpu<1>>`, `mirrored<gpu<0>, gpu<1>>`: the static form, a device list
///    fixed in the type, with its reducer chosen at compile time from the device set;
///  - `mirrored<cpus>`, `mirrored<gpus>`: the run-time form over one kind, whose device list is a
///    value (default: every allowed core / every visible GPU), with the kind's default reducer;
///  - `basic_mirrored<Reducer, Determinism, Devices...>` (or `<Reducer, Determinism, Kind>`):
///    either form with an explicit reducer and determinism level;
///  - `one_device<Device>`: one replica, no aggregation.

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <lockstep/core/device.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/device_set.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/host.hpp>
#include <lockstep/distribute/reducers/select.hpp>
#include <lockstep/distribute/strategy.hpp>

namespace lockstep {

namespace detail {
/// The kind a strategy is built for: Kind, or — for a device set whose missing reducer was already
/// named (no_reducer) — cpus, so that nothing of an unusable kind adds errors of its own.
template <class Kind, class Reducer>
using strategy_kind_t = std::conditional_t<is_no_reducer_v<Reducer>, cpus, Kind>;
}  // namespace detail

/// The static form: a strategy over Devices... (one device tag per replica) with an explicit
/// reducer and determinism.
/// @tparam Reducer     how gradient sums are aggregated (satisfies lockstep::reducer)
/// @tparam Determinism run_to_run or replica_count_invariant (host devices only)
/// @tparam Devices     one device tag per replica: all cpu<I> (distinct) or all gpu<I>
template <class Reducer, determinism Determinism, class... Devices>
class basic_mirrored
    : public mirrored_strategy<
          detail::strategy_kind_t<kind_of_t<std::tuple_element_t<0, std::tuple<Devices..., cpus>>>, Reducer>, Reducer,
          Determinism> {
  // A device set with no reducer was already named by select_reducer (one error): no more checks.
  static constexpr bool named = is_no_reducer_v<Reducer>;
  static_assert(sizeof...(Devices) > 0, "lockstep::mirrored needs at least one device");
  static_assert(named || (device<Devices> && ...),
                "lockstep::mirrored: every template argument must be a device tag (cpu<I> or gpu<I>)");
  static_assert(named || distinct_cpu_ordinals_v<Devices...>,
                "lockstep::mirrored: a cpu<I> device appears twice; each host replica needs its own ordinal "
                "(mirrored<cpu<0>, cpu<1>, ...>)");
  static_assert(named || (is_cpu_v<Devices> && ...) || (is_gpu_v<Devices> && ...),
                "lockstep::mirrored: cpu and gpu devices cannot be mixed in one strategy");
  static_assert(named || Reducer::template supports<Devices...>,
                "lockstep::mirrored: this reducer has no path for this device set (for example a repeated gpu<I> "
                "needs a reducer for replicas sharing one GPU)");
  using base = mirrored_strategy<
      detail::strategy_kind_t<kind_of_t<std::tuple_element_t<0, std::tuple<Devices..., cpus>>>, Reducer>, Reducer,
      Determinism>;

public:
  using devices = device_list<Devices...>;                          ///< the device tags, in replica order
  static constexpr std::size_t replica_count = sizeof...(Devices);  ///< number of replicas

  /// A strategy with the given options (starts the worker threads).
  explicit basic_mirrored(strategy_options options = {})
      : base(std::vector<std::size_t>{static_cast<std::size_t>(Devices::ordinal)...}, options) {}
};

/// The run-time form with an explicit reducer and determinism: replicas on the devices of kind
/// Kind that `devices` selects (default: every device of the kind).
template <class Reducer, determinism Determinism, class Kind>
  requires device_kind_tag<Kind>
class basic_mirrored<Reducer, Determinism, Kind>
    : public mirrored_strategy<detail::strategy_kind_t<Kind, Reducer>, Reducer, Determinism> {
  using base = mirrored_strategy<detail::strategy_kind_t<Kind, Reducer>, Reducer, Determinism>;
  using kind = detail::strategy_kind_t<Kind, Reducer>;

public:
  /// A strategy over the selected devices (every device of the kind by default).
  /// @throws config_error for a repeated ordinal, a device that does not exist, or a bad option.
  explicit basic_mirrored(const device_selection& devices = {}, strategy_options options = {})
      : base(resolve_devices<kind>(devices, backend_traits<kind>::device_count(),
                                   std::string("lockstep::mirrored<") + backend_traits<kind>::name + "s>"),
             options) {}
  /// A strategy over every device of the kind, with the given options.
  explicit basic_mirrored(strategy_options options) : basic_mirrored(device_selection{}, options) {}
};

/// Mirrored strategy over Devices..., with run_to_run determinism: `mirrored<cpu<0>, cpu<1>>`
/// trains two host replicas with the reducer select_reducer_t<Devices...>; `mirrored<cpus>` and
/// `mirrored<gpus>` take their device list at run time (see the specialisation below).
template <class... Devices>
class mirrored : public basic_mirrored<select_reducer_t<Devices...>, determinism::run_to_run, Devices...> {
  using base = basic_mirrored<select_reducer_t<Devices...>, determinism::run_to_run, Devices...>;

public:
  using base::base;
  /// A strategy with default options.
  mirrored() : base(strategy_options{}) {}
};

/// The run-time form: `mirrored<cpus>` (default: one replica per allowed core) or
/// `mirrored<gpus>` (default: every visible GPU), or an explicit list, e.g.
/// `mirrored<gpus> s({0, 2})`, `mirrored<cpus> s(device_selection::first(5))`. Its reducer is the
/// kind's default (select_kind_reducer_t), chosen at compile time.
template <class Kind>
  requires device_kind_tag<Kind>
class mirrored<Kind> : public basic_mirrored<select_kind_reducer_t<Kind>, determinism::run_to_run, Kind> {
  using base = basic_mirrored<select_kind_reducer_t<Kind>, determinism::run_to_run, Kind>;

public:
  using base::base;
  /// A strategy over every device of the kind, with default options.
  mirrored() : base(device_selection{}, strategy_options{}) {}
};

/// One replica on Device (its BLAS may use every core).
template <class Device>
class one_device : public basic_mirrored<single_device_reducer, determinism::run_to_run, Device> {
  using base = basic_mirrored<single_device_reducer, determinism::run_to_run, Device>;

public:
  using base::base;
  /// A strategy with default options.
  one_device() : base(strategy_options{}) {}
};

}  // namespace lockstep
