#pragma once
/// @file ops.cuh
/// The CUDA kernels behind every layer, loss and optimiser: the same operation names as
/// backend/host/ops.hpp, overloaded for cuda_context and found by argument-dependent lookup.
/// Every operation is queued on the context's compute stream; only `sum`, `softmax_xent`,
/// `copy_to_host` and `copy_from_host` wait for the device (they hand a value or host memory back
/// to the caller).
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
#include <cstdint>
#include <string>

#include <lockstep/backend/cuda/context.hpp>
#include <lockstep/backend/cuda/device.hpp>
#include <lockstep/backend/cuda/error.hpp>
#include <lockstep/backend/host/ops.hpp>
#include <lockstep/backend/pack16.hpp>
#include <lockstep/backend/softmax_xent.hpp>
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

/// Counts one launch on `ctx` and throws device_error when it failed (the launch wrapper every
/// kernel of the backend goes through: cuda_context::launches counts them).
inline void check_launch(const cuda_context& ctx, const char* kernel,
                         const std::source_location& where = std::source_location::current()) {
  ctx.count_launches();
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

/// Columns per block of column_sums_kernel (one warp's width: a warp reads 32 neighbouring floats).
inline constexpr unsigned cuda_colsum_cols = 32;
/// Row lanes per block of column_sums_kernel.
inline constexpr unsigned cuda_colsum_lanes = 16;

/// out[c] = sum over r of x[r][c], a reduction over the rows: block b owns columns
/// [32 b, 32 b + 32); row lane l adds rows l, l + 16, l + 32, ... of its column, then the 16
/// partial sums are added pairwise in a fixed tree. The order depends only on the shape, so
/// results are run-to-run deterministic (they differ from the host's row-by-row order by rounding).
template <class T>
__global__ void __launch_bounds__(cuda_colsum_cols * cuda_colsum_lanes)
    column_sums_kernel(const T* x, std::size_t rows, std::size_t cols, T* out) {
  __shared__ T part[cuda_colsum_lanes][cuda_colsum_cols];
  const unsigned tx = threadIdx.x % cuda_colsum_cols, lane = threadIdx.x / cuda_colsum_cols;
  const std::size_t c = static_cast<std::size_t>(blockIdx.x) * cuda_colsum_cols + tx;
  T acc = T(0);
  if (c < cols)
    for (std::size_t r = lane; r < rows; r += cuda_colsum_lanes) acc += x[r * cols + c];
  part[lane][tx] = acc;
  __syncthreads();
  for (unsigned half = cuda_colsum_lanes / 2; half > 0; half /= 2) {
    if (lane < half) part[lane][tx] += part[lane + half][tx];
    __syncthreads();
  }
  if (lane == 0 && c < cols) out[c] = part[0][tx];
}

/// Threads per block of softmax_xent_kernel (one warp per row, 8 rows per block at a time).
inline constexpr unsigned cuda_xent_threads = 256;
/// Most blocks of softmax_xent_kernel (their partial sums are added by the last block).
inline constexpr unsigned cuda_xent_max_blocks = 1024;

/// Device scratch layout of softmax_xent_kernel: totals (loss, hits), the finished-block counter,
/// then two partial sums per block.
struct xent_scratch {
  double* totals;      ///< [0] summed loss, [1] top-1 hits
  unsigned* finished;  ///< blocks done (zeroed before the launch)
  double* partials;    ///< per block: loss, hits
};

/// Softmax cross-entropy, one kernel: warp w of the grid handles rows w, w + warps, ...; lane l
/// of a warp takes columns l, l + 32, ... of the row (one part, backend/softmax_xent.hpp), and the
/// lanes combine their maxima and their shares of t with xor shuffles in a fixed order. Loss and
/// gradient come from the same LOCKSTEP_HD pieces as the host's row (log1p(t) - (z[y] - m), the
/// arg-max entry as -t / (1 + t)). Per-row loss and hit go to row_loss / row_hit; each block adds
/// its rows' values in double in a fixed order, and the last block to finish adds the blocks'
/// partials in block order into totals (run-to-run deterministic). A label outside [0, cols) or a
/// maximum that is not finite gives a NaN loss.
template <class T>
__global__ void __launch_bounds__(cuda_xent_threads)
    softmax_xent_kernel(const T* z, const std::int32_t* labels, std::size_t rows, std::size_t cols, T* grad,
                        T* row_loss, T* row_hit, xent_scratch out) {
  constexpr unsigned warps = cuda_xent_threads / 32;
  constexpr unsigned full = 0xffffffffu;
  const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  double my_loss = 0, my_hits = 0;  // lane 0's sums over its warp's rows
  for (std::size_t r = static_cast<std::size_t>(blockIdx.x) * warps + warp; r < rows;
       r += static_cast<std::size_t>(gridDim.x) * warps) {
    const T* zr = z + r * cols;
    xent_max<T> mx = xent_max_part(zr, cols, lane, 32);
    for (unsigned off = 16; off > 0; off /= 2)  // the largest value, the first column on ties
      mx = xent_max_combine(mx, xent_max<T>{__shfl_xor_sync(full, mx.value, off), __shfl_xor_sync(full, mx.arg, off)});
    T t = xent_t_part(zr, cols, lane, 32, mx.value, mx.arg);
    for (unsigned off = 16; off > 0; off /= 2) t += __shfl_xor_sync(full, t, off);
    const std::int32_t y = labels[r];
    if (grad) xent_grad_part(zr, cols, lane, 32, y, mx.value, mx.arg, t, grad + r * cols);
    if (lane == 0) {
      const T loss = xent_row_loss(zr, cols, y, mx.value, t);
      const T hit = xent_label_valid(y, cols) && static_cast<std::size_t>(y) == mx.arg ? T(1) : T(0);
      row_loss[r] = loss;
      row_hit[r] = hit;
      my_loss += static_cast<double>(loss);
      my_hits += static_cast<double>(hit);
    }
  }
  __shared__ double block_sums[warps][2];
  __shared__ bool last;
  if (lane == 0) {
    block_sums[warp][0] = my_loss;
    block_sums[warp][1] = my_hits;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double l = 0, h = 0;
    for (unsigned w = 0; w < warps; ++w) {
      l += block_sums[w][0];
      h += block_sums[w][1];
    }
    out.partials[2 * blockIdx.x] = l;
    out.partials[2 * blockIdx.x + 1] = h;
    __threadfence();  // the partials are visible before the counter says so
    last = atomicAdd(out.finished, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  using reduce = cub::BlockReduce<double, cuda_xent_threads>;
  __shared__ typename reduce::TempStorage temp;
  const volatile double* partials = out.partials;
  double l = 0, h = 0;
  for (unsigned b = threadIdx.x; b < gridDim.x; b += cuda_xent_threads) {
    l += partials[2 * b];
    h += partials[2 * b + 1];
  }
  const double total_loss = reduce(temp).Sum(l);
  __syncthreads();
  const double total_hits = reduce(temp).Sum(h);
  if (threadIdx.x == 0) {
    out.totals[0] = total_loss;
    out.totals[1] = total_hits;
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
/// C^T = op(B)^T op(A)^T, so B goes first with B's flag, and m and n swap. A and B are of type In
/// (T, or the 16-bit encodings of a mixed-precision GEMM).
template <class T, class In, class Gemm>
void gemm_row_major(const cuda_context& ctx, Gemm call, trans ta, trans tb, std::size_t m, std::size_t n,
                    std::size_t k, T alpha, const In* a, std::size_t lda, const In* b, std::size_t ldb, T beta, T* c,
                    std::size_t ldc) {
  if (m == 0 || n == 0) return;
  device_guard g(ctx.ordinal());
  if (k == 0) {  // C = beta C; cuBLAS would not read A or B either, but keep the pointers out of it
    scale_matrix_kernel<<<cuda_grid_for(m * n), cuda_block_threads, 0, ctx.compute_stream()>>>(c, m, n, ldc, beta);
    check_launch(ctx, "scale_matrix_kernel");
    return;
  }
  ctx.count_launches();
  LOCKSTEP_CUBLAS_CHECK(call(ctx.blas_handle(), cublas_op(tb), cublas_op(ta), blas_dim(n, m, n, k),
                             blas_dim(m, m, n, k), blas_dim(k, m, n, k), &alpha, b, blas_dim(ldb, m, n, k), a,
                             blas_dim(lda, m, n, k), &beta, c, blas_dim(ldc, m, n, k)));
}

/// A float GEMM whose products cuBLAS computes in `compute` (CUBLAS_COMPUTE_32F_FAST_TF32: TF32
/// tensor cores) from fp32 operands, accumulating and writing fp32.
inline void gemm_fp32_compute(const cuda_context& ctx, cublasComputeType_t compute, trans ta, trans tb,
                              std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                              std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                              std::size_t ldc) {
  const auto call = [compute](cublasHandle_t h, cublasOperation_t ob, cublasOperation_t oa, int cm, int cn, int ck,
                              const float* al, const float* pb, int lb, const float* pa, int la, const float* be,
                              float* pc, int lc) {
    return cublasGemmEx(h, ob, oa, cm, cn, ck, al, pb, CUDA_R_32F, lb, pa, CUDA_R_32F, la, be, pc, CUDA_R_32F, lc,
                        compute, CUBLAS_GEMM_DEFAULT);
  };
  gemm_row_major(ctx, call, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// The 16-bit operands of a GEMM on 16-bit operands (P: bf16 or fp16), dense, as stored (op(A)
/// and op(B) still to apply) with their leading dimensions.
struct packed16_operands {
  const std::uint16_t* a;  ///< A's encodings
  std::size_t lda;         ///< A's leading dimension (its columns as stored)
  const std::uint16_t* b;  ///< B's encodings
  std::size_t ldb;         ///< B's leading dimension
};

/// A and B of C = op(A) op(B) (op(A) m x k, op(B) k x n, none empty) rounded to P and packed into
/// the context's operand memory (packed_layout_of; pack16_op, one grid each), except an operand
/// that is a dense run of the model's bf16 weight copy, read from it (the copy holds the
/// encodings pack16_op writes: bf16_encode_op; counted in weight_copy_reads). With `queue`
/// false, only where the operands will be: nothing is packed or counted.
template <compute_precision P>
packed16_operands pack16_operands(const cuda_context& ctx, trans ta, trans tb, std::size_t m, std::size_t n,
                                  std::size_t k, const float* a, std::size_t lda, const float* b, std::size_t ldb,
                                  bool queue = true) {
  const packed_layout l = packed_layout_of(ta, tb, m, n, k);
  const std::uint16_t* ca = nullptr;
  const std::uint16_t* cb = nullptr;
  if constexpr (P == compute_precision::bf16) {
    const std::size_t a_rows = l.a_count / l.a_cols, b_rows = l.b_count / l.b_cols;
    ca = queue ? ctx.weight_copy_of(a, a_rows, l.a_cols, lda) : ctx.weight_copy().find_operand(a, a_rows, l.a_cols, lda);
    cb = queue ? ctx.weight_copy_of(b, b_rows, l.b_cols, ldb) : ctx.weight_copy().find_operand(b, b_rows, l.b_cols, ldb);
  }
  auto* pa = static_cast<std::uint16_t*>(ctx.gemm_operands(l.total() * sizeof(std::uint16_t)));
  std::uint16_t* pb = pa + l.b_offset;
  if (queue && !ca) for_each_index(ctx, l.a_count, pack16_op<P>{a, l.a_cols, lda, pa});
  if (queue && !cb) for_each_index(ctx, l.b_count, pack16_op<P>{b, l.b_cols, ldb, pb});
  return {ca ? ca : pa, l.a_cols, cb ? cb : pb, l.b_cols};
}

/// A float GEMM on 16-bit operands (P: bf16 or fp16): A and B are packed, rounded to P, into the
/// context's operand memory (packed_layout_of; pack16_op, one grid each) unless the model's bf16
/// weight copy holds them (cuda_context::weight_copy_of), then cuBLAS multiplies
/// them on the tensor cores with fp32 accumulation (CUBLAS_COMPUTE_32F) into the fp32 C. The
/// result is that of the host's emulation (operands rounded to P, fp32 products and sums) up to
/// the order of the sums.
template <compute_precision P>
void gemm_packed16(const cuda_context& ctx, trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k,
                   float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                   std::size_t ldc) {
  if (m == 0 || n == 0 || k == 0) {  // nothing to pack: C = beta C at most
    gemm_row_major(ctx, &cublasSgemm, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const packed16_operands q = pack16_operands<P>(ctx, ta, tb, m, n, k, a, lda, b, ldb);
  constexpr cudaDataType_t type = P == compute_precision::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  const auto call = [](cublasHandle_t h, cublasOperation_t ob, cublasOperation_t oa, int cm, int cn, int ck,
                       const float* al, const std::uint16_t* qb, int lb, const std::uint16_t* qa, int la,
                       const float* be, float* pc, int lc) {
    return cublasGemmEx(h, ob, oa, cm, cn, ck, al, qb, type, lb, qa, type, la, be, pc, CUDA_R_32F, lc,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  gemm_row_major(ctx, call, ta, tb, m, n, k, alpha, q.a, q.lda, q.b, q.ldb, beta, c, ldc);
}

}  // namespace detail

/// C = alpha * op(A) * op(B) + beta * C, row-major, on the compute stream, in the context's
/// gemm_precision(): cuBLAS SGEMM for fp32 (TF32 when the context's options turn it on for every
/// GEMM), TF32 tensor cores for tf32, and for bf16 and fp16 the operands packed to 16 bits and
/// multiplied on the tensor cores with fp32 accumulation; C is fp32 under every policy.
inline void gemm(const cuda_context& ctx, trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                 const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  switch (ctx.gemm_precision()) {
    case compute_precision::bf16:
      detail::gemm_packed16<compute_precision::bf16>(ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    case compute_precision::fp16:
      detail::gemm_packed16<compute_precision::fp16>(ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    case compute_precision::tf32:
      detail::gemm_fp32_compute(ctx, CUBLAS_COMPUTE_32F_FAST_TF32, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
      return;
    case compute_precision::fp32:
      break;
  }
  detail::gemm_row_major(ctx, &cublasSgemm, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// Double-precision GEMM (cuBLAS DGEMM), same contract as the float overload.
inline void gemm(const cuda_context& ctx, trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k,
                 double alpha, const double* a, std::size_t lda, const double* b, std::size_t ldb, double beta,
                 double* c, std::size_t ldc) {
  detail::gemm_row_major(ctx, &cublasDgemm, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace detail {

/// The largest power of two, up to 256, that divides the address p: the alignment a cuBLASLt
/// algorithm may assume for it (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES).
inline std::size_t lt_alignment(const void* p) noexcept {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::size_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

/// Sets attribute `attr` of cuBLASLt descriptor `desc` (through `set`, one of the
/// cublasLt*SetAttribute functions) to `value`.
template <class Set, class Desc, class Attr, class V>
void lt_set(Set set, Desc desc, Attr attr, const V& value) {
  LOCKSTEP_CUBLAS_CHECK(set(desc, attr, &value, sizeof(V)));
}

}  // namespace detail

/// y = relu(x w + bias), row-major (x: m x k with leading dimension ldx, w: k x n with ldw, bias:
/// n, y: m x n with ldy, all on the context's device, y not overlapping the others) as one
/// cuBLASLt matmul whose epilogue adds the bias and applies the ReLU (CUBLASLT_EPILOGUE_RELU_BIAS),
/// in the context's gemm_precision() as gemm() computes it: fp32, TF32 (also for fp32 when the
/// context's options turn TF32 on), or bf16 / fp16 operands packed as gemm() packs them, fp32
/// accumulation and an fp32 y. The dense layer's forward followed by a relu (forward_activated)
/// runs it in place of its GEMM and its bias-and-activation pass: one kernel instead of two, and
/// y written once. Only algorithms that reduce each element in one pass are allowed (no split-K
/// reduction), so the bits are the same from run to run. The matmul is prepared once per shape,
/// precision and operand alignment (cuda_context::lt_plan). Returns false, having queued nothing,
/// where there is nothing to multiply (k = 0), where the bias is not 16-byte aligned (cuBLASLt's
/// heuristic takes no alignment for the epilogue's bias, and its kernels may load it in 16-byte
/// vectors: a dense layer's bias sits after its In x Out weights in the model's flat parameters,
/// so In x Out and the layers before it decide its alignment), or where cuBLASLt offers no
/// algorithm for the shape (its heuristic found none, or refused the layouts): the caller then
/// runs gemm and the bias pass.
inline bool gemm_bias_relu(const cuda_context& ctx, std::size_t m, std::size_t n, std::size_t k, const float* x,
                           std::size_t ldx, const float* w, std::size_t ldw, const float* bias, float* y,
                           std::size_t ldy) {
  if (m == 0 || n == 0) return true;
  if (k == 0 || detail::lt_alignment(bias) < 16) return false;
  const compute_precision p = ctx.gemm_precision();
  device_guard g(ctx.ordinal());
  // The operands cuBLASLt reads: the float matrices, or their 16-bit encodings.
  const void* ra = w;  // cuBLASLt's A: w as a column-major n x k matrix
  const void* rb = x;  // cuBLASLt's B: x as a column-major k x m matrix
  std::size_t lda = ldw;
  std::size_t ldb = ldx;
  cudaDataType_t type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  // 16-bit operands: where they will be, packed only once cuBLASLt has an algorithm (below).
  const auto pack16 = [&](bool queue) {
    return p == compute_precision::bf16
               ? detail::pack16_operands<compute_precision::bf16>(ctx, trans::no, trans::no, m, n, k, x, ldx, w, ldw,
                                                                  queue)
               : detail::pack16_operands<compute_precision::fp16>(ctx, trans::no, trans::no, m, n, k, x, ldx, w, ldw,
                                                                  queue);
  };
  const bool packed = p == compute_precision::bf16 || p == compute_precision::fp16;
  if (packed) {
    const detail::packed16_operands q = pack16(false);
    ra = q.b;
    lda = q.ldb;
    rb = q.a;
    ldb = q.lda;
    type = p == compute_precision::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  } else if (p == compute_precision::tf32 || ctx.options().tf32) {
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  const std::array<std::size_t, 12> key{m,
                                        n,
                                        k,
                                        lda,
                                        ldb,
                                        ldy,
                                        static_cast<std::size_t>(type),
                                        static_cast<std::size_t>(compute),
                                        detail::lt_alignment(ra),
                                        detail::lt_alignment(rb),
                                        detail::lt_alignment(y),
                                        detail::lt_alignment(bias)};  // 16 or more (above)
  const detail::lt_matmul_plan& plan = ctx.lt_plan(key, [&](detail::lt_matmul_plan& made) {
    const auto dim = [&](std::size_t v) { return static_cast<std::uint64_t>(detail::blas_dim(v, m, n, k)); };
    LOCKSTEP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&made.op, compute, CUDA_R_32F));
    detail::lt_set(cublasLtMatmulDescSetAttribute, made.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_RELU_BIAS);
    detail::lt_set(cublasLtMatmulDescSetAttribute, made.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                   static_cast<std::int32_t>(CUDA_R_32F));
    detail::lt_set(cublasLtMatmulDescSetAttribute, made.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    LOCKSTEP_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&made.a, type, dim(n), dim(k), static_cast<std::int64_t>(dim(lda))));
    LOCKSTEP_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&made.b, type, dim(k), dim(m), static_cast<std::int64_t>(dim(ldb))));
    LOCKSTEP_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&made.d, CUDA_R_32F, dim(n), dim(m), static_cast<std::int64_t>(dim(ldy))));
    cublasLtMatmulPreference_t pref = nullptr;
    LOCKSTEP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    try {
      const auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
        detail::lt_set(cublasLtMatmulPreferenceSetAttribute, pref, attr, value);
      };
      set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<std::uint64_t>(cublas_workspace_bytes));
      set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, static_cast<std::uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE));
      set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<std::uint32_t>(key[8]));
      set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<std::uint32_t>(key[9]));
      set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<std::uint32_t>(key[10]));
      set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<std::uint32_t>(key[10]));
      status = cublasLtMatmulAlgoGetHeuristic(ctx.lt_handle(), made.op, made.a, made.b, made.d, made.d, pref, 1,
                                              &result, &found);
    } catch (...) {
      (void)cublasLtMatmulPreferenceDestroy(pref);
      throw;
    }
    (void)cublasLtMatmulPreferenceDestroy(pref);
    // No algorithm for this shape (or none that cuBLASLt accepts for these layouts): the caller's
    // path runs, as where cuBLASLt is older than the epilogue.
    if (status != CUBLAS_STATUS_SUCCESS || found == 0 || result.state != CUBLAS_STATUS_SUCCESS ||
        result.workspaceSize > cublas_workspace_bytes)
      return;
    made.algo = result.algo;
    made.usable = true;
  });
  if (!plan.usable) return false;
  if (packed) (void)pack16(true);  // the same places as above: packs (and counts weight-copy reads)
  detail::lt_set(cublasLtMatmulDescSetAttribute, plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  const float one = 1.0f;
  const float zero = 0.0f;
  ctx.count_launches();
  LOCKSTEP_CUBLAS_CHECK(cublasLtMatmul(ctx.lt_handle(), plan.op, &one, ra, plan.a, rb, plan.b, &zero, y, plan.d, y,
                                       plan.d, &plan.algo, ctx.blas_workspace(), cublas_workspace_bytes,
                                       ctx.compute_stream()));
  return true;
}

/// Calls f(i) for every i in [0, n) on the device: a grid-stride kernel over a LOCKSTEP_HD
/// functor (copied to the device by value; it must be trivially copyable).
template <class F>
inline void for_each_index(const cuda_context& ctx, std::size_t n, const F& f) {
  if (n == 0) return;
  device_guard g(ctx.ordinal());
  detail::for_each_index_kernel<<<detail::cuda_grid_for(n), detail::cuda_block_threads, 0, ctx.compute_stream()>>>(n, f);
  detail::check_launch(ctx, "for_each_index_kernel");
}

/// Sets n device elements to v.
template <class T>
inline void fill(const cuda_context& ctx, T* p, std::size_t n, T v) {
  if (n == 0) return;
  device_guard g(ctx.ordinal());
  detail::fill_kernel<<<detail::cuda_grid_for(n), detail::cuda_block_threads, 0, ctx.compute_stream()>>>(p, n, v);
  detail::check_launch(ctx, "fill_kernel");
}

/// Copies n elements between two buffers on the device (asynchronous, compute stream).
template <class T>
inline void copy(const cuda_context& ctx, T* dst, const T* src, std::size_t n) {
  if (n == 0 || dst == src) return;
  device_guard g(ctx.ordinal());
  ctx.count_launches();
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, ctx.compute_stream()));
}

/// Copies n elements of `src`, on the device of context `from`, to `dst` on the device of `ctx`,
/// on ctx's compute stream: a device-to-device copy on one GPU, a peer copy between two (CUDA
/// routes it through the host when peer access is off). No host wait.
template <class T>
inline void copy_from(const cuda_context& ctx, T* dst, const cuda_context& from, const T* src, std::size_t n) {
  if (n == 0 || dst == src) return;
  device_guard g(ctx.ordinal());
  ctx.count_launches();
  copy_device_bytes(dst, ctx.ordinal(), src, from.ordinal(), n * sizeof(T), ctx.compute_stream());
}

/// Copies n host elements to the device; returns when the copy is done, so `src` may be reused
/// at once (training input goes through cuda_context::stage_shard instead, which does not wait).
template <class T>
inline void copy_from_host(const cuda_context& ctx, T* dst, const T* src, std::size_t n) {
  if (n == 0) return;
  device_guard g(ctx.ordinal());
  ctx.count_launches();
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, ctx.compute_stream()));
  ctx.wait_stream(ctx.compute_stream());
}

/// Copies n device elements to host memory after the queued work; returns when they are there.
template <class T>
inline void copy_to_host(const cuda_context& ctx, T* dst, const T* src, std::size_t n) {
  if (n == 0) return;
  device_guard g(ctx.ordinal());
  ctx.count_launches();
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, ctx.compute_stream()));
  ctx.wait_stream(ctx.compute_stream());
}

/// Sets every row of the rows x cols device matrix y to the device vector v.
template <class T>
inline void broadcast_rows(const cuda_context& ctx, T* y, const T* v, std::size_t rows, std::size_t cols) {
  if (rows == 0 || cols == 0) return;
  device_guard g(ctx.ordinal());
  detail::broadcast_rows_kernel<<<detail::cuda_grid_for(rows * cols), detail::cuda_block_threads, 0,
                                  ctx.compute_stream()>>>(y, v, rows, cols);
  detail::check_launch(ctx, "broadcast_rows_kernel");
}

/// out[c] = sum over rows of x[r][c] (bias gradients): a block-wise reduction over the rows,
/// run-to-run deterministic (see detail::column_sums_kernel).
template <class T>
inline void column_sums(const cuda_context& ctx, const T* x, std::size_t rows, std::size_t cols, T* out) {
  if (cols == 0) return;
  device_guard g(ctx.ordinal());
  const std::size_t blocks = (cols + detail::cuda_colsum_cols - 1) / detail::cuda_colsum_cols;
  if (blocks > INT_MAX) throw config_error("lockstep: column_sums over " + std::to_string(cols) + " columns");
  detail::column_sums_kernel<<<static_cast<unsigned>(blocks), detail::cuda_colsum_cols * detail::cuda_colsum_lanes, 0,
                               ctx.compute_stream()>>>(x, rows, cols, out);
  detail::check_launch(ctx, "column_sums_kernel");
}

/// Softmax cross-entropy of `rows` rows of logits z (rows x cols) against `labels`, all on the
/// device: one kernel writes the per-row loss and top-1 hit into scratch (2 rows), the gradient of
/// the summed loss into grad (when not null) and the two totals; one copy brings the totals to the
/// host, which waits once for it (the value the step returns). While the context defers readback
/// (strategy_options::defer_readback) the copy goes to the step's page and nothing is waited
/// for: the totals returned are zeros, and the strategy reads the real ones a step later.
template <class T>
inline softmax_xent_totals softmax_xent(const cuda_context& ctx, const T* z, const std::int32_t* labels,
                                        std::size_t rows, std::size_t cols, T* grad, T* scratch) {
  if (rows == 0) return {};
  device_guard g(ctx.ordinal());
  const std::size_t warps = detail::cuda_xent_threads / 32;
  const auto blocks = static_cast<unsigned>(
      std::clamp<std::size_t>((rows + warps - 1) / warps, 1, detail::cuda_xent_max_blocks));
  auto* base = static_cast<unsigned char*>(ctx.scratch(64 + 2 * sizeof(double) * blocks));
  const detail::xent_scratch sc{reinterpret_cast<double*>(base), reinterpret_cast<unsigned*>(base + 16),
                                reinterpret_cast<double*>(base + 64)};
  ctx.count_launches();
  LOCKSTEP_CUDA_CHECK(cudaMemsetAsync(sc.finished, 0, sizeof(unsigned), ctx.compute_stream()));
  detail::softmax_xent_kernel<T><<<blocks, detail::cuda_xent_threads, 0, ctx.compute_stream()>>>(
      z, labels, rows, cols, grad, scratch, scratch + rows, sc);
  detail::check_launch(ctx, "softmax_xent_kernel");
  if (ctx.defers_readback()) {
    ctx.defer_totals(sc.totals);
    return {};
  }
  ctx.count_launches();
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(ctx.host_result(), sc.totals, 2 * sizeof(double), cudaMemcpyDeviceToHost,
                                      ctx.compute_stream()));
  ctx.wait_stream(ctx.compute_stream());
  return {ctx.host_result()[0], ctx.host_result()[1]};
}

/// The sum of n device elements, accumulated in double and returned to the host: waits for the
/// compute stream (the one host synchronisation of a training step, for the loss).
template <class T>
inline double sum(const cuda_context& ctx, const T* x, std::size_t n) {
  if (n == 0) return 0.0;
  device_guard g(ctx.ordinal());
  auto* d_out = static_cast<double*>(ctx.scratch(sizeof(double)));
  detail::sum_kernel<T, detail::cuda_sum_threads><<<1, detail::cuda_sum_threads, 0, ctx.compute_stream()>>>(x, n, d_out);
  detail::check_launch(ctx, "sum_kernel");
  ctx.count_launches();
  LOCKSTEP_CUDA_CHECK(
      cudaMemcpyAsync(ctx.host_result(), d_out, sizeof(double), cudaMemcpyDeviceToHost, ctx.compute_stream()));
  ctx.wait_stream(ctx.compute_stream());
  return *ctx.host_result();
}

/// x[i] *= a for n device elements.
template <class T>
inline void scale(const cuda_context& ctx, T* x, std::size_t n, T a) {
  if (n == 0) return;
  device_guard g(ctx.ordinal());
  detail::scale_kernel<<<detail::cuda_grid_for(n), detail::cuda_block_threads, 0, ctx.compute_stream()>>>(x, n, a);
  detail::check_launch(ctx, "scale_kernel");
}

}  // namespace lockstep::backend
