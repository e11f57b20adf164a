#pragma once
/// @file memory.hpp (testing/archetypes/kind)
/// The memory of the archetype kind.
/// The archetype device kind is built the way docs/architecture.md ("Adding a device kind") says
/// a new kind is added, in these files: context.hpp (the kind tag and its execution context),
/// kernels.hpp (the kernels layers, losses and optimisers call, found by argument-dependent
/// lookup on the context), memory.hpp (its memory), backend.hpp (its registration) and
/// reducer.hpp (its reducer and default selection); ../kind.hpp includes them all. Its memory is
/// host memory in fact, declared not host-accessible, so the library must treat it as device
/// memory; its kernels are naive loops. The backend suite (lockstep/testing/backend.hpp) checks it.

#include <cstddef>
#include <new>

#include <lockstep/memory/resource.hpp>
#include <lockstep/testing/archetypes/kind/context.hpp>

/// ... and its memory.
template <>
struct lockstep::device_memory<lockstep_archetypes::cells> {
  static constexpr bool host_accessible = false;
  static void* allocate(std::size_t bytes) { return bytes ? ::operator new(bytes) : nullptr; }
  static void deallocate(void* p, std::size_t) noexcept { ::operator delete(p); }
};

