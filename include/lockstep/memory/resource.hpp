#pragma once
/// @file resource.hpp
/// Memory resources: how a device's bytes are allocated. The host resource is here; the CUDA
/// resource (device memory) lives in backend/cuda/memory.hpp.

#include <cstddef>
#include <new>
#include <string>

#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>

namespace lockstep {

/// Alignment of every host buffer: a cache line, and a full AVX-512 vector.
inline constexpr std::size_t host_alignment = 64;

/// Allocates and frees memory of device D; specialised per device kind.
template <class D>
struct memory_resource {
  static_assert(is_cpu_v<D>,
                "lockstep: no memory resource for this device; for gpu<I> include "
                "<lockstep/backend/cuda.hpp> and build with LOCKSTEP_HAS_CUDA");
  /// Allocates `bytes` bytes aligned to host_alignment (nullptr for 0 bytes).
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    return ::operator new(bytes, std::align_val_t{host_alignment});
  }
  /// Frees memory from allocate.
  static void deallocate(void* p, std::size_t) noexcept {
    if (p) ::operator delete(p, std::align_val_t{host_alignment});
  }
};

}  // namespace lockstep
