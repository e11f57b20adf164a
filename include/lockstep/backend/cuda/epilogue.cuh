#pragma once
/// @file epilogue.cuh
/// The reduced-gradient epilogue on a GPU (backend/epilogue.hpp holds its arithmetic): the chunk
/// sums of squares and the decision are computed on the replica's device, into device memory,
/// where the optimiser's update kernel reads them (update_info::decision) — so the host never
/// waits between the gradient's reduction and the update. Every GPU replica runs the same kernels
/// on the same reduced sums, so every replica decides the same; the chunk arithmetic is the
/// host's (16 lanes per chunk in index order, then added pairwise; a float's square is exact in
/// a double, so contraction into fused multiply-adds does not change a bit), and the decision is
/// `decide_update` itself, run by one device thread.
/// Compile with nvcc only.

#if !defined(__CUDACC__)
#error "lockstep/backend/cuda/epilogue.cuh holds CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <string>

#include <lockstep/backend/cuda/context.hpp>
#include <lockstep/backend/cuda/device.hpp>
#include <lockstep/backend/cuda/error.hpp>
#include <lockstep/backend/epilogue.hpp>
#include <lockstep/core/error.hpp>

namespace lockstep::backend {

namespace detail {

/// Chunks per block of epilogue_chunks_kernel (each chunk takes epilogue_lanes threads).
inline constexpr unsigned cuda_epilogue_chunks_per_block = 8;

/// out[c] = the sum of squares of chunk c of g for the chunks c in [first, last), 0 for the other
/// chunks below `chunks`: epilogue_lanes threads per chunk, each summing its lane in index order,
/// then the lanes added pairwise (l + 8 into l, + 4, + 2, + 1).
template <class T>
__global__ void epilogue_chunks_kernel(const T* g, std::size_t n, std::size_t chunks, std::size_t first,
                                       std::size_t last, double* out) {
  __shared__ double lanes[cuda_epilogue_chunks_per_block][epilogue_lanes];
  const unsigned local = threadIdx.x / epilogue_lanes, lane = threadIdx.x % epilogue_lanes;
  const std::size_t chunk = static_cast<std::size_t>(blockIdx.x) * cuda_epilogue_chunks_per_block + local;
  lanes[local][lane] = chunk < chunks && chunk >= first && chunk < last ? epilogue_lane_sum(g, n, chunk, lane) : 0.0;
  __syncthreads();
  for (unsigned w = epilogue_lanes / 2; w > 0; w /= 2) {
    if (lane < w) lanes[local][lane] += lanes[local][lane + w];
    __syncthreads();
  }
  if (lane == 0 && chunk < chunks) out[chunk] = lanes[local][0];
}

/// The decision from the chunk sums, in one thread (decide_update itself), written to `out`.
template <class Decision>
__global__ void epilogue_decide_kernel(const double* chunks, std::size_t count, epilogue_inputs in, Decision* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  *out = decision_of(decide_update(chunks, count, in));
}

}  // namespace detail

/// The chunk sums of the `n` reduced gradient sums `g` of a GPU replica into `chunks`
/// (epilogue_chunks(n) doubles of device memory), queued on its compute stream: chunks [first,
/// last) summed from g, every other chunk 0 (a replica that holds the reduced sums of its slice
/// only: reduces_to_slices_v). No host wait.
template <class T>
void reduced_gradient_chunk_sums(const cuda_context& ctx, const T* g, std::size_t n, std::size_t first, std::size_t last,
                                 double* chunks) {
  device_guard guard(ctx.ordinal());
  const std::size_t count = epilogue_chunks(n);
  const std::size_t blocks = (count + detail::cuda_epilogue_chunks_per_block - 1) / detail::cuda_epilogue_chunks_per_block;
  if (blocks > INT_MAX) throw config_error("lockstep: the epilogue over " + std::to_string(n) + " parameters");
  if (blocks == 0) return;
  detail::epilogue_chunks_kernel<<<static_cast<unsigned>(blocks),
                                   detail::cuda_epilogue_chunks_per_block * static_cast<unsigned>(epilogue_lanes), 0,
                                   ctx.compute_stream()>>>(g, n, count, first, last, chunks);
  ctx.count_launches();
  check_cuda(cudaGetLastError(), "epilogue_chunks_kernel");
}

/// The decision from `count` chunk sums (device memory) into `out` (device memory), queued on the
/// replica's compute stream: decide_update, in one device thread. No host wait.
inline void reduced_gradient_decision(const cuda_context& ctx, const double* chunks, std::size_t count,
                                      const epilogue_inputs& in, update_decision* out) {
  device_guard guard(ctx.ordinal());
  detail::epilogue_decide_kernel<<<1, 1, 0, ctx.compute_stream()>>>(chunks, count, in, out);
  ctx.count_launches();
  check_cuda(cudaGetLastError(), "epilogue_decide_kernel");
}

/// The epilogue of the `n` reduced gradient sums `g` of a GPU replica, queued on its compute
/// stream: the chunk sums into `chunks` (epilogue_chunks(n) doubles of device memory) and the
/// decision into `out` (device memory), which the update kernels read. No host wait.
template <class T>
void reduced_gradient_epilogue(const cuda_context& ctx, const T* g, std::size_t n, const epilogue_inputs& in,
                               double* chunks, update_decision* out) {
  const std::size_t count = epilogue_chunks(n);
  reduced_gradient_chunk_sums(ctx, g, n, 0, count, chunks);
  reduced_gradient_decision(ctx, chunks, count, in, out);
}

}  // namespace lockstep::backend
