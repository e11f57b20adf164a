#pragma once
/// @file resource.hpp
/// Memory resources: how the bytes of a device kind are allocated. `device_memory<Kind>` is
/// specialised once per kind (the host's is here; the CUDA backend's, device memory, in
/// backend/cuda/context.hpp); `memory_resource<D>` names it for a device tag or a kind, so
/// `memory_resource<cpu<0>>` and `memory_resource<cpu<3>>` are one type.

#include <cstddef>
#include <new>
#include <string>

#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>

namespace lockstep {

/// Alignment of every host buffer: a cache line, and a full AVX-512 vector.
inline constexpr std::size_t host_alignment = 64;

/// Allocates and frees the memory of device kind Kind. This primary template is chosen only for
/// a kind no backend registered.
template <class Kind>
struct device_memory {
  static_assert(!is_gpu_v<Kind>,
                "lockstep: no memory resource for gpu devices; include <lockstep/backend/cuda.hpp> (a .cu file "
                "compiled by nvcc) and link lockstep::cuda");
  static_assert(is_gpu_v<Kind>, "lockstep: no memory resource for this device kind; its backend must specialise "
                                "lockstep::device_memory<Kind> (see docs/architecture.md, adding a device kind)");
};

/// Host memory: aligned operator new.
template <>
struct device_memory<cpus> {
  static constexpr bool host_accessible = true;  ///< host code may read and write it directly
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

/// The memory resource of device D (a tag such as cpu<I>, or a kind): device_memory of its kind.
template <class D>
using memory_resource = device_memory<kind_of_t<D>>;

/// True when memory of device D can be read and written by host code directly.
template <class D>
inline constexpr bool host_accessible_v = memory_resource<D>::host_accessible;

}  // namespace lockstep
