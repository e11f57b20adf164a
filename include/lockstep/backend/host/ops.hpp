#pragma once
/// @file ops.hpp
/// The host kernels every layer, loss and optimiser is written in: GEMM through CBLAS (float GEMM
/// through oneDNN in the LOCKSTEP_HOST_GEMM=onednn build) and plain loops the compiler vectorises.
/// The CUDA backend overloads the same names for cuda_context.

#include <cblas.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <lockstep/backend/host/context.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/precision.hpp>

#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
#include <lockstep/backend/host/onednn_gemm.hpp>
#endif

namespace lockstep::backend {

/// Transposition flag of a GEMM operand.
enum class trans : bool { no = false, yes = true };

namespace detail {
inline CBLAS_TRANSPOSE cblas_op(trans t) noexcept { return t == trans::yes ? CblasTrans : CblasNoTrans; }
}  // namespace detail

namespace detail {
/// The fp32 GEMM of the build (oneDNN or CBLAS), m, n > 0.
inline void sgemm([[maybe_unused]] const host_context& ctx, trans ta, trans tb, std::size_t m, std::size_t n,
                  std::size_t k, float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
                  float beta, float* c, std::size_t ldc) {
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  if (k == 0 || alpha == 0.0f) {  // no product to add: C = beta * C, as CBLAS does
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  ctx.gemm_cache().sgemm(ctx.blas_threads(), ta == trans::yes, tb == trans::yes, m, n, k, alpha, a, lda, b, ldb, beta,
                         c, ldc);
#else
  cblas_sgemm(CblasRowMajor, cblas_op(ta), cblas_op(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
              static_cast<int>(ldc));
#endif
}

/// Writes Round of the rows x cols matrix at `src` (leading dimension ld) densely to `dst`.
template <float (*Round)(float)>
inline void round_rows(const float* src, std::size_t rows, std::size_t cols, std::size_t ld, float* __restrict dst) {
  for (std::size_t r = 0; r < rows; ++r) {
    const float* __restrict in = src + r * ld;
    float* __restrict out = dst + r * cols;
    for (std::size_t c = 0; c < cols; ++c) out[c] = Round(in[c]);
  }
}

/// An operand rounded to bf16 ahead of the GEMM, dense (a weight copy, bf16_weight_copy_view): its
/// values, widened exactly to fp32, into `dst`.
inline void widen_bf16(const std::uint16_t* __restrict bits, std::size_t n, float* __restrict dst) noexcept {
  for (std::size_t i = 0; i < n; ++i) dst[i] = from_bf16_bits(bits[i]);
}

/// The GEMM (m, n, k > 0) on operands rounded by Round (to bf16 or fp16) into the context's
/// scratch, by the fp32 kernels: the products of such values are exact in fp32, so this
/// accumulates the products of the rounded operands in fp32. `a_bits` / `b_bits` (bf16 only, else
/// null): the operand's bf16 encodings from a weight copy, widened instead of rounded (same values).
template <float (*Round)(float)>
inline void rounded_gemm(const host_context& ctx, trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k,
                         float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta,
                         float* c, std::size_t ldc, const std::uint16_t* a_bits = nullptr,
                         const std::uint16_t* b_bits = nullptr) {
  const std::size_t a_rows = ta == trans::yes ? k : m, a_cols = ta == trans::yes ? m : k;
  const std::size_t b_rows = tb == trans::yes ? n : k, b_cols = tb == trans::yes ? k : n;
  float* ra = ctx.rounding().get(0, a_rows * a_cols);
  float* rb = ctx.rounding().get(1, b_rows * b_cols);
  if (a_bits)
    widen_bf16(a_bits, a_rows * a_cols, ra);
  else
    round_rows<Round>(a, a_rows, a_cols, lda, ra);
  if (b_bits)
    widen_bf16(b_bits, b_rows * b_cols, rb);
  else
    round_rows<Round>(b, b_rows, b_cols, ldb, rb);
  sgemm(ctx, ta, tb, m, n, k, alpha, ra, a_cols, rb, b_cols, beta, c, ldc);
}

/// The bf16 GEMM (m, n, k > 0): oneDNN's bf16 kernels where the CPU has them, else rounded_gemm
/// (both accumulate the same exact products in fp32: they differ only in the order of the
/// additions). `a_bits` (or null): A's encodings, dense, given in place of `a` (an activation kept
/// in bf16).
inline void bf16gemm(const host_context& ctx, trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k,
                     float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta,
                     float* c, std::size_t ldc, const std::uint16_t* a_bits = nullptr) {
  // An operand that is a dense run of the model's weight copy is read from it, not converted.
  if (!a_bits) a_bits = ctx.weight_copy_of(a, ta == trans::yes ? k : m, ta == trans::yes ? m : k, lda);
  const std::uint16_t* b_bits =
      ctx.weight_copy_of(b, tb == trans::yes ? n : k, tb == trans::yes ? k : n, ldb);
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  if (ctx.gemm_cache().native_bf16()) {
    ctx.gemm_cache().bf16gemm(ctx.blas_threads(), ta == trans::yes, tb == trans::yes, m, n, k, alpha, a, lda, b, ldb,
                              beta, c, ldc, a_bits, b_bits);
    return;
  }
#endif
  rounded_gemm<round_to_bf16>(ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, a_bits, b_bits);
}
}  // namespace detail

/// Writes src[0, n) rounded to bf16 into dst with the conversion this process's bf16 GEMMs apply
/// to their operands (the CPU's AVX512-BF16 instructions where oneDNN runs bf16 natively, else
/// to_bf16_bits), so a GEMM reading the encodings computes the bits it computes from src: what a
/// model's bf16 weight copy is written with. Element i is to_bf16_bits_daz(src[i],
/// host_bf16_native()): the native conversion reads subnormal values as zero.
inline void to_bf16_weights(const float* src, std::size_t n, std::uint16_t* dst) noexcept {
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  if (host_bf16_native()) {
    detail::to_bf16_row(src, n, dst);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) dst[i] = to_bf16_bits(src[i]);
}

/// A layer's output kept in bf16: to_bf16_weights of the n values at y into y16 when y16 is not
/// null and Ctx is a host context computing in float (the only place activations are kept in
/// bf16); nothing on any other context, so a layer's forward calls it on every device.
template <class Ctx, class T>
void encode_output16(const Ctx&, const T* y, std::size_t n, [[maybe_unused]] std::uint16_t* y16) noexcept {
  if constexpr (std::is_same_v<T, float> && lockstep::detail::host_context_v<Ctx>) {
    if (y16) to_bf16_weights(y, n, y16);
  }
}

/// How a host replica's GEMMs compute under `policy`, for start-up lines: "fp32", "mixed<bf16>
/// (native bf16 GEMMs)", "mixed<bf16> (emulated: operands rounded to bf16, fp32 GEMMs)" or
/// "mixed<fp16> (emulated: ...; dynamic loss scale)".
inline std::string host_precision_description(compute_precision policy) {
  if (policy == compute_precision::fp16)
    return "mixed<fp16> (emulated: operands rounded to fp16, fp32 GEMMs; dynamic loss scale)";
  if (policy != compute_precision::bf16) return std::string(precision_name(policy));
  return host_bf16_native() ? "mixed<bf16> (native bf16 GEMMs)"
                            : "mixed<bf16> (emulated: operands rounded to bf16, fp32 GEMMs)";
}

/// The warning due when a model of policy `policy` computes its bf16 GEMMs by emulation (no faster
/// than fp32): a sentence naming why and the fix, or empty (fp32, or native bf16 kernels). fit
/// shows it on the chief's progress display (unless quiet).
inline std::string host_precision_warning(compute_precision policy) {
  if (policy != compute_precision::bf16 || host_bf16_native()) return {};
  std::string warning =
      "lockstep: warning: mixed<bf16> is emulated (operands rounded to bf16, fp32 GEMMs: no faster than fp32)";
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  warning += ": oneDNN runs " + detail::onednn_name();
  if (detail::onednn_bf16_isa())
    return warning + ": with no AMX in oneDNN's instruction set, this CPU's AVX512-BF16 instructions run no faster "
                     "than its fp32 ones; fp32 (the default policy) trains faster here";
  return warning + ", without the AVX512-BF16 or AMX instructions its bf16 kernels need";
#else
  return warning + " in the OpenBLAS build; build with oneDNN (libdnnl-dev, -DLOCKSTEP_HOST_GEMM=onednn) for native "
                   "bf16 GEMMs on CPUs with AMX, or AMD CPUs with AVX512-BF16";
#endif
}

/// C = alpha * op(A) * op(B) + beta * C, row-major, C is m x n, op(A) m x k, op(B) k x n.
/// beta = 0 never reads C (NaNs in it do not propagate). Inside a layer that opts in to a mixed
/// policy (ctx.gemm_precision() is bf16 or fp16), A and B are rounded to that type and the products
/// accumulate in fp32 (detail::bf16gemm, detail::rounded_gemm).
inline void gemm(const host_context& ctx, trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k,
                 float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                 std::size_t ldc) {
  if (m == 0 || n == 0) return;
  const compute_precision p = ctx.gemm_precision();
  if (p == compute_precision::bf16 && k != 0 && alpha != 0.0f)
    detail::bf16gemm(ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else if (p == compute_precision::fp16 && k != 0 && alpha != 0.0f)
    detail::rounded_gemm<round_to_fp16>(ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else
    detail::sgemm(ctx, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/// The bf16 GEMM C = alpha * op(A) * op(B) + beta * C (as gemm under a bf16 GEMM precision) with A
/// given as its bf16 encodings, dense (m x k, or k x m when transposed): an activation kept in bf16
/// (pass_info::bf16_activations). B is rounded as gemm rounds it, or read from the weight copy.
/// The same bits as gemm on A's widened values.
inline void gemm_bf16_input(const host_context& ctx, trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k,
                            float alpha, const std::uint16_t* a16, const float* b, std::size_t ldb, float beta,
                            float* c, std::size_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0 || alpha == 0.0f) {  // C = beta * C, C not read when beta = 0 (as gemm)
    for (std::size_t i = 0; i < m; ++i)
      for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  detail::bf16gemm(ctx, ta, tb, m, n, k, alpha, nullptr, ta == trans::yes ? m : k, b, ldb, beta, c, ldc, a16);
}

/// Double-precision GEMM (used by gradient checks), same contract as the float overload (CBLAS in
/// every build: oneDNN has no f64 matmul on CPUs).
inline void gemm(const host_context&, trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k, double alpha,
                 const double* a, std::size_t lda, const double* b, std::size_t ldb, double beta, double* c,
                 std::size_t ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, detail::cblas_op(ta), detail::cblas_op(tb), static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
              static_cast<int>(ldc));
}

namespace detail {
/// f(i) for i in [0, n), compiled for the translation unit's instruction set.
template <class F>
inline void index_loop(std::size_t n, const F f) {
  for (std::size_t i = 0; i < n; ++i) f(i);
}

/// True when functor F declares `static constexpr bool avx2_copy = true;`: its call computes one
/// element per index, with no loop inside, and for_each_index may run it through its AVX2 copy.
/// Only such functors do: g++ 12 at -O3 with AVX2 miscompiles some loops nested inside the
/// index loop (a row zeroed and then partly overwritten lost the overwrite).
template <class F>
inline constexpr bool avx2_copy_v = requires {
  requires F::avx2_copy;
};

#if LOCKSTEP_HOST_AVX2_LOOPS
/// index_loop compiled for AVX2 (without FMA, so no product and sum fuse and every value is
/// bitwise that of index_loop); called only where the CPU has AVX2.
template <class F>
[[gnu::target("avx2")]] inline void index_loop_avx2(std::size_t n, const F f) {
  for (std::size_t i = 0; i < n; ++i) f(i);
}
#endif
}  // namespace detail

/// Calls f(i) for every i in [0, n): the one elementwise primitive (a grid-stride kernel on GPUs).
/// The functor is copied first, so its pointers live in registers and the loop can vectorise; on
/// an x86-64 CPU with AVX2, a functor that declares `avx2_copy` (detail::avx2_copy_v) runs through
/// a copy of the loop compiled for AVX2 (see host_loops_name).
template <class F>
inline void for_each_index(const host_context&, std::size_t n, const F& f) {
#if LOCKSTEP_HOST_AVX2_LOOPS
  if constexpr (detail::avx2_copy_v<F>)
    if (__builtin_cpu_supports("avx2")) return detail::index_loop_avx2(n, f);
#endif
  detail::index_loop(n, f);
}

/// The instruction set of the host's elementwise loops (for_each_index over the functors that
/// declare `avx2_copy`: the optimiser updates, the activations, dropout's backward mask; and
/// the 2 x 2 pooling windows, backend::host_pool_avx2): "avx2
/// (chosen at run time)" where the CPU has AVX2 and the loops carry their AVX2 copy, "sse2" for
/// x86-64's baseline, otherwise "compiler's target" (the translation unit's flags decide, for
/// example -march=native).
inline std::string host_loops_name() {
#if LOCKSTEP_HOST_AVX2_LOOPS
  if (__builtin_cpu_supports("avx2")) return "avx2 (chosen at run time)";
  return "sse2";
#else
  return "compiler's target";
#endif
}

/// Sets n elements to v.
template <class T>
inline void fill(const host_context&, T* p, std::size_t n, T v) {
  for (std::size_t i = 0; i < n; ++i) p[i] = v;
}

/// Copies n elements between two buffers of the same device.
template <class T>
inline void copy(const host_context&, T* dst, const T* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = src[i];
}

/// Copies n host elements to this device (a plain copy on the host).
template <class T>
inline void copy_from_host(const host_context& c, T* dst, const T* src, std::size_t n) {
  copy(c, dst, src, n);
}

/// Copies n elements of this device to host memory (a plain copy on the host).
template <class T>
inline void copy_to_host(const host_context& c, T* dst, const T* src, std::size_t n) {
  copy(c, dst, src, n);
}

/// Sets every row of the rows x cols matrix y to the vector v.
template <class T>
inline void broadcast_rows(const host_context&, T* y, const T* v, std::size_t rows, std::size_t cols) {
  for (std::size_t r = 0; r < rows; ++r) {
    T* row = y + r * cols;
    for (std::size_t c = 0; c < cols; ++c) row[c] = v[c];
  }
}

/// out[c] = sum over rows of x[r][c] (bias gradients); the rows are added in order.
template <class T>
inline void column_sums(const host_context&, const T* x, std::size_t rows, std::size_t cols, T* out) {
  for (std::size_t c = 0; c < cols; ++c) out[c] = T(0);
  for (std::size_t r = 0; r < rows; ++r) {
    const T* row = x + r * cols;
    for (std::size_t c = 0; c < cols; ++c) out[c] += row[c];
  }
}

/// The sum of n elements, accumulated in double, returned to the host.
template <class T>
inline double sum(const host_context&, const T* x, std::size_t n) {
  double s = 0;
  for (std::size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]);
  return s;
}

/// x[i] *= a for n elements.
template <class T>
inline void scale(const host_context&, T* x, std::size_t n, T a) {
  for (std::size_t i = 0; i < n; ++i) x[i] *= a;
}

}  // namespace lockstep::backend

namespace lockstep {
using backend::host_bf16_native;
using backend::host_loops_name;
using backend::host_precision_description;
using backend::host_precision_warning;
}  // namespace lockstep
