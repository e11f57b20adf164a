#pragma once
/// @file kernels.cuh
/// Internal: the kernels of the GPU reducers of one process — the in-order sum over replicas
/// written back to all of them (same_device_allreduce) and the in-order sum into one buffer
/// (reduce_to_one_device<gpu<K>>). (Their copies between devices: backend::copy_device_bytes.)
/// Compile with nvcc.

#if !defined(__CUDACC__)
#error "lockstep/distribute/reducers/detail/kernels.cuh holds CUDA kernels: compile with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>

#include <lockstep/distribute/reducers/detail/cuda_common.hpp>

namespace lockstep::detail {

/// For every element: the sum over replicas 0..n-1 in order, written back to every replica.
template <class T>
__global__ void sum_across_replicas_kernel(replica_pointers<T> ptrs, std::size_t n, std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    T acc = ptrs.p[0][i];
    for (std::size_t j = 1; j < n; ++j) acc += ptrs.p[j][i];
    for (std::size_t j = 0; j < n; ++j) ptrs.p[j][i] = acc;
  }
}

/// For every element: the sum over src[0..n-1] in that order, written to `out` (which may be one
/// of the sources: each element is read before it is written, by the same thread).
template <class T>
__global__ void sum_replicas_into_kernel(replica_pointers<T> src, std::size_t n, T* out, std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    T acc = src.p[0][i];
    for (std::size_t j = 1; j < n; ++j) acc += src.p[j][i];
    out[i] = acc;
  }
}

}  // namespace lockstep::detail
