#pragma once
/// @file ops.cuh
/// The CUDA kernels behind every layer, loss and optimiser: the same operation names as
/// backend/host/ops.hpp, overloaded for cuda_context and found by argument-dependent lookup.
/// Every operation is queued on the context's compute stream; only `sum`, `copy_to_host` and
/// `copy_from_host` wait for the device (they hand a value or host memory back to the caller).
/// Compile with nvcc only.

#if !defined(__CUDACC__)
#error "lockstep/backend/cuda/ops.cuh holds CUDA kernels: compile this translation unit with nvcc"
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <string>

#include <lockstep/backend/cuda/context.hpp>
#include <lockstep/backend/cuda/device.hpp>
#include <lockstep/backend/cuda/error.hpp>
#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/error.hpp>

namespace lockstep::backend {

namespace detail {

/// Threads per block of the elementwise kernels.
inline constexpr unsigned cuda_block_threads = 256;
/// Threads of the single-block reduction behind `sum`.
inline constexpr unsigned cuda_sum_threads = 512;

/// Blocks for a grid-stride loop over n elements (at least 1, at most 8192: each thread then
/// handles several elements).
inline unsigned cuda_grid_for(std::size_t n) noexcept {
  const std::size_t blocks = (n + cuda_block_threads - 1) / cuda_block_threads;
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, 8192));
}

/// Throws device_error when the last kernel launch failed.
inline void check_launch(const char* kernel, const std::source_location& where = std::source_location::current()) {
  check_cuda(cudaGetLastError(), kernel, where);
}

/// Calls f(i) for i in [0, n) with a grid-stride loop.
template <class F>
__global__ void for_each_index_kernel(std::size_t n, F f) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) f(i);
}

/// p[i] = v.
template <class T>
__global__ void fill_kernel(T* p, std::size_t n, T v) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = v;
}

/// x[i] *= a.
template <class T>
__global__ void scale_kernel(T* x, std::size_t n, T a) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] *= a;
}

/// C = beta * C over an m x n row-major matrix with row stride ldc (beta == 0 writes zeros
/// without reading C, as BLAS does).
template <class T>
__global__ void scale_matrix_kernel(T* c, std::size_t m, std::size_t n, std::size_t ldc, T beta) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t total = m * n;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    T& e = c[(i / n) * ldc + i % n];
    e = beta == T(0) ? T(0) : beta * e;
  }
}

/// y[r][c] = v[c] for a rows x cols matrix.
template <class T>
__global__ void broadcast_rows_kernel(T* y, const T* v, std::size_t rows, std::size_t cols) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t total = rows * cols;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride)
    y[i] = v[i % cols];
}

/// out[c] = sum over r of x[r][c]: one thread per column adds the rows in order (the host's
/// order, so results match the host bit for bit); neighbouring threads read neighbouring columns.
template <class T>
__global__ void column_sums_kernel(const T* x, std::size_t rows, std::size_t cols, T* out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t c = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols; c += stride) {
    T acc = T(0);
    for (std::size_t r = 0; r < rows; ++r) acc += x[r * cols + c];
    out[c] = acc;
  }
}

/// *out = sum of x[0..n) in double, by one block (a fixed order: run-to-run deterministic).
template <class T, unsigned Threads>
__global__ void __launch_bounds__(Threads) sum_kernel(const T* x, std::size_t n, double* out) {
  using reduce = cub::BlockReduce<double, Threads>;
  __shared__ typename reduce::TempStorage temp;
  double acc = 0;
  for (std::size_t i = threadIdx.x; i < n; i += Threads) acc += static_cast<double>(x[i]);
  const double total = reduce(temp).Sum(acc);
  if (threadIdx.x == 0) *out = total;
}

/// The int a cuBLAS dimension must fit in, or config_error naming the GEMM shape.
inline int blas_dim(std::size_t v, std::size_t m, std::size_t n, std::size_t k) {
  if (v > static_cast<std::size_t>(INT_MAX))
    throw config_error("lockstep: GEMM of shape m=" + std::to_string(m) + " n=" + std::to_string(n) +
                       " k=" + std::to_string(k) + " exceeds cuBLAS's int dimensions");
  return static_cast<int>(v);
}

inline cublasOperation_t cublas_op(trans t) noexcept { return t == trans::yes ? CUBLAS_OP_T : CUBLAS_OP_N; }

/// Row-major GEMM through column-major cuBLAS: row-major C is column-major C^T, and
/// C^T = op(B)^T op(A)^T, so B goes first with B's flag, and m and n swap.
template <class T, class Gemm>
void gemm_row_major(const cuda_context& ctx, Gemm call, trans ta, trans tb, std::size_t m, std::size_t n,
                    std::size_t k, T alpha, const T* a, std::size_t lda, const T* b, std::size_t ldb, T beta, T* c,
                    std::size_t ldc) {
  if (m == 0 || n == 0) return;
  device_guard g(ctx.ordinal());
  if (k == 0) {  // C = beta C; cuBLAS would not read A or B either, but keep the pointers out of it
    scale_matrix_kernel<<<cuda_grid_for(m * n), cuda_block_threads, 0, ctx.compute_stream()>>>(c, m, n, ldc, beta);
    check_launch("scale_matrix_kernel");
    return;
  }
  LOCKSTEP_CUBLAS_CHECK(call(ctx.blas_handle(), cublas_op(tb), cublas_op(ta), blas_dim(n, m, n, k),
                             blas_dim(m, m, n, k), blas_dim(k, m, n, k), &alpha, b, blas_dim(ldb, m, n, k), a,
                             blas_dim(lda, m, n, k), &beta, c, blas_dim(ldc, m, n, k)));
}

}  // namespace detail

/// C = alpha * op(A) * op(B) + beta * C, row-major, on the compute stream (cuBLAS SGEMM; TF32
/// only when the context's options ask for it).
inline void gemm(const cuda_context& ctx, trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                 const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  detail::gemm_row_major(ctx, &cublasSgemm, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// Double-precision GEMM (cuBLAS DGEMM), same contract as the float overload.
inline void gemm(const cuda_context& ctx, trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k,
                 double alpha, const double* a, std::size_t lda, const double* b, std::size_t ldb, double beta,
                 double* c, std::size_t ldc) {
  detail::gemm_row_major(ctx, &cublasDgemm, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// Calls f(i) for every i in [0, n) on the device: a grid-stride kernel over a LOCKSTEP_HD
/// functor (copied to the device by value; it must be trivially copyable).
template <class F>
inline void for_each_index(const cuda_context& ctx, std::size_t n, const F& f) {
  if (n == 0) return;
  device_guard g(ctx.ordinal());
  detail::for_each_index_kernel<<<detail::cuda_grid_for(n), detail::cuda_block_threads, 0, ctx.compute_stream()>>>(n, f);
  detail::check_launch("for_each_index_kernel");
}

/// Sets n device elements to v.
template <class T>
inline void fill(const cuda_context& ctx, T* p, std::size_t n, T v) {
  if (n == 0) return;
  device_guard g(ctx.ordinal());
  detail::fill_kernel<<<detail::cuda_grid_for(n), detail::cuda_block_threads, 0, ctx.compute_stream()>>>(p, n, v);
  detail::check_launch("fill_kernel");
}

/// Copies n elements between two buffers on the device (asynchronous, compute stream).
template <class T>
inline void copy(const cuda_context& ctx, T* dst, const T* src, std::size_t n) {
  if (n == 0 || dst == src) return;
  device_guard g(ctx.ordinal());
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, ctx.compute_stream()));
}

/// Copies n host elements to the device; returns when the copy is done, so `src` may be reused
/// at once (training input goes through cuda_context::stage_shard instead, which does not wait).
template <class T>
inline void copy_from_host(const cuda_context& ctx, T* dst, const T* src, std::size_t n) {
  if (n == 0) return;
  device_guard g(ctx.ordinal());
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, ctx.compute_stream()));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(ctx.compute_stream()));
}

/// Copies n device elements to host memory after the queued work; returns when they are there.
template <class T>
inline void copy_to_host(const cuda_context& ctx, T* dst, const T* src, std::size_t n) {
  if (n == 0) return;
  device_guard g(ctx.ordinal());
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, ctx.compute_stream()));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(ctx.compute_stream()));
}

/// Sets every row of the rows x cols device matrix y to the device vector v.
template <class T>
inline void broadcast_rows(const cuda_context& ctx, T* y, const T* v, std::size_t rows, std::size_t cols) {
  if (rows == 0 || cols == 0) return;
  device_guard g(ctx.ordinal());
  detail::broadcast_rows_kernel<<<detail::cuda_grid_for(rows * cols), detail::cuda_block_threads, 0,
                                  ctx.compute_stream()>>>(y, v, rows, cols);
  detail::check_launch("broadcast_rows_kernel");
}

/// out[c] = sum over rows of x[r][c] (bias gradients), rows added in order as on the host.
template <class T>
inline void column_sums(const cuda_context& ctx, const T* x, std::size_t rows, std::size_t cols, T* out) {
  if (cols == 0) return;
  device_guard g(ctx.ordinal());
  detail::column_sums_kernel<<<detail::cuda_grid_for(cols), detail::cuda_block_threads, 0, ctx.compute_stream()>>>(
      x, rows, cols, out);
  detail::check_launch("column_sums_kernel");
}

/// The sum of n device elements, accumulated in double and returned to the host: waits for the
/// compute stream (the one host synchronisation of a training step, for the loss).
template <class T>
inline double sum(const cuda_context& ctx, const T* x, std::size_t n) {
  if (n == 0) return 0.0;
  device_guard g(ctx.ordinal());
  auto* d_out = static_cast<double*>(ctx.scratch(sizeof(double)));
  detail::sum_kernel<T, detail::cuda_sum_threads><<<1, detail::cuda_sum_threads, 0, ctx.compute_stream()>>>(x, n, d_out);
  detail::check_launch("sum_kernel");
  LOCKSTEP_CUDA_CHECK(
      cudaMemcpyAsync(ctx.host_result(), d_out, sizeof(double), cudaMemcpyDeviceToHost, ctx.compute_stream()));
  LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(ctx.compute_stream()));
  return *ctx.host_result();
}

/// x[i] *= a for n device elements.
template <class T>
inline void scale(const cuda_context& ctx, T* x, std::size_t n, T a) {
  if (n == 0) return;
  device_guard g(ctx.ordinal());
  detail::scale_kernel<<<detail::cuda_grid_for(n), detail::cuda_block_threads, 0, ctx.compute_stream()>>>(x, n, a);
  detail::check_launch("scale_kernel");
}

}  // namespace lockstep::backend
