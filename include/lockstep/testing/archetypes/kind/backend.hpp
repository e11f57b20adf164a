#pragma once
/// @file backend.hpp (testing/archetypes/kind)
/// The registration of the archetype kind.
/// The archetype device kind is built the way docs/architecture.md ("Adding a device kind") says
/// a new kind is added, in these files: context.hpp (the kind tag and its execution context),
/// kernels.hpp (the kernels layers, losses and optimisers call, found by argument-dependent
/// lookup on the context), memory.hpp (its memory), backend.hpp (its registration) and
/// reducer.hpp (its reducer and default selection); ../kind.hpp includes them all. Its memory is
/// host memory in fact, declared not host-accessible, so the library must treat it as device
/// memory; its kernels are naive loops. The backend suite (lockstep/testing/backend.hpp) checks it.

#include <cstddef>

#include <lockstep/backend/context.hpp>
#include <lockstep/testing/archetypes/kind/context.hpp>
#include <lockstep/testing/archetypes/kind/kernels.hpp>
#include <lockstep/testing/archetypes/kind/memory.hpp>

/// The archetype's registration: its traits ...
template <>
struct lockstep::backend_traits<lockstep_archetypes::cells> {
  static constexpr bool registered = true;
  using context_type = lockstep_archetypes::context;
  static constexpr const char* name = "cell";
  static constexpr bool ordinals_bounded = true;
  static constexpr bool replica_owns_core = false;
  static std::size_t device_count() { return 3; }
  static context_type make_context(std::size_t, const lockstep::replica_settings&) { return {}; }
};
