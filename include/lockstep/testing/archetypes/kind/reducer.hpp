#pragma once
/// @file reducer.hpp (testing/archetypes/kind)
/// The reducer of the archetype kind and its default selection.
/// The archetype device kind is built the way docs/architecture.md ("Adding a device kind") says
/// a new kind is added, in these files: context.hpp (the kind tag and its execution context),
/// kernels.hpp (the kernels layers, losses and optimisers call, found by argument-dependent
/// lookup on the context), memory.hpp (its memory), backend.hpp (its registration) and
/// reducer.hpp (its reducer and default selection); ../kind.hpp includes them all. Its memory is
/// host memory in fact, declared not host-accessible, so the library must treat it as device
/// memory; its kernels are naive loops. The backend suite (lockstep/testing/backend.hpp) checks it.

#include <cstddef>
#include <type_traits>

#include <lockstep/core/device.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/host_allreduce.hpp>
#include <lockstep/distribute/reducers/select.hpp>
#include <lockstep/testing/archetypes/kind/backend.hpp>

namespace lockstep_archetypes {

/// The reducer of `cells` replicas. The kind's author knows its memory is host memory in fact, so
/// the buckets are summed on the host (the library, which must not know it, refuses host_allreduce
/// for the kind).
class cells_reducer : public lockstep::host_allreduce {
public:
  using lockstep::host_allreduce::host_allreduce;
  /// Reduces with start() only: a sharded update's slices are gathered by the strategy's copies.
  static constexpr bool reduces_to_slices = false;
  /// Serves `cells` replicas (and host ones).
  template <class Kind>
  static constexpr bool supports_kind =
      std::is_same_v<Kind, cells> || lockstep::device_memory<Kind>::host_accessible;
  /// Replica `replica` contributes `count` elements at `data` to bucket `bucket`: summed as the
  /// host memory they are in fact.
  template <class Ctx, class T>
  void start(std::size_t replica, Ctx&, T* data, std::size_t count, std::size_t bucket) {
    as_host h;
    lockstep::host_allreduce::start(replica, h, data, count, bucket);
  }

private:
  /// What the host reducer sees: a context on host memory.
  struct as_host {
    using kind_type = lockstep::cpus;  ///< host memory
  };
};

}  // namespace lockstep_archetypes

/// A run-time strategy over `cells` (basic_mirrored<..., cells>, mirrored<cells>) sums with cells_reducer.
template <>
struct lockstep::select_kind_reducer<lockstep_archetypes::cells> {
  using type = lockstep_archetypes::cells_reducer;  ///< the kind's reducer
};
