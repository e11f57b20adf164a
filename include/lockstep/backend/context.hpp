#pragma once
/// @file context.hpp
/// Maps a device tag to the execution context its replica runs kernels with.

#include <lockstep/backend/host/context.hpp>
#include <lockstep/core/device.hpp>

namespace lockstep {

/// The context type of device D; cpu<I> → host_context (the CUDA backend specialises gpu<I>).
template <class D>
struct context_of {
  static_assert(is_cpu_v<D>,
                "lockstep: no execution context for this device; for gpu<I> include <lockstep/backend/cuda.hpp>");
  using type = host_context;  ///< the context type
};

/// Shorthand for context_of<D>::type.
template <class D>
using context_t = typename context_of<D>::type;

}  // namespace lockstep
