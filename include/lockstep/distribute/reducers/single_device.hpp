#pragma once
/// @file single_device.hpp
/// `single_device_reducer`: the reducer of one replica (nothing to aggregate).

#include <cstddef>

#include <lockstep/distribute/reducer.hpp>

namespace lockstep {

/// The reducer of a single replica: nothing to aggregate; every call returns at once.
struct single_device_reducer {
  using reducer_concept = reducer_tag;  ///< opts in to the reducer concept
  /// Serves exactly one device of any kind.
  template <class... Ds>
  static constexpr bool supports = sizeof...(Ds) == 1;
  /// Ignores the configuration.
  explicit single_device_reducer(const reducer_config& = {}) noexcept {}
  /// Needs no workspace.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  /// Nothing to bind.
  void bind(std::size_t, void*, std::size_t) noexcept {}
  /// The sum over one replica is the data itself.
  template <class Ctx, class T>
  void start(std::size_t, Ctx&, T*, std::size_t, std::size_t) noexcept {}
  /// Nothing to wait for.
  template <class Ctx>
  void wait(std::size_t, Ctx&, std::size_t) noexcept {}
  /// A broadcast to oneself.
  template <class Ctx, class T>
  void broadcast(std::size_t, Ctx&, T*, std::size_t, std::size_t) noexcept {}
  /// Nothing to release.
  void abort() noexcept {}
  /// Nothing to re-arm.
  void reset() noexcept {}
};

}  // namespace lockstep
