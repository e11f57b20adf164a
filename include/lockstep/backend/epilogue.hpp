#pragma once
/// @file epilogue.hpp (backend)
/// The arithmetic of the reduced-gradient epilogue (distribute/epilogue.hpp), shared by every
/// backend so that each computes the same bits: the fixed grid of chunks over a flat parameter
/// vector, a chunk's sum of squares in double (16 lanes in index order, then added pairwise),
/// and the decision made from the chunk sums combined in chunk order. The CUDA backend computes
/// the same chunks and decision on its device (backend/cuda/epilogue.cuh).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>

#include <lockstep/config.hpp>

namespace lockstep {

/// Elements per chunk of the epilogue's grid over the flat parameter vector (chunk c holds
/// elements [c · 1024, (c + 1) · 1024), the last one shorter). The replicas that share the
/// epilogue's pass split it on chunk boundaries (grid_slice), so a chunk is never split.
inline constexpr std::size_t epilogue_chunk = 1024;

/// Lanes of a chunk's sum of squares (see the file comment).
inline constexpr std::size_t epilogue_lanes = 16;

/// Number of chunks of the grid over `params` elements.
[[nodiscard]] constexpr std::size_t epilogue_chunks(std::size_t params) noexcept {
  return (params + epilogue_chunk - 1) / epilogue_chunk;
}

/// The chunks [C r / n, C (r + 1) / n) of slice r of n of the C chunks over `params` elements
/// (grid_slice's chunks).
[[nodiscard]] constexpr std::pair<std::size_t, std::size_t> grid_slice_chunks(std::size_t params, std::size_t r,
                                                                             std::size_t n) noexcept {
  const std::size_t chunks = epilogue_chunks(params);
  return {chunks * r / n, chunks * (r + 1) / n};
}

/// Slice r of n of `params` elements on chunk boundaries: chunks [C r / n, C (r + 1) / n) of the
/// C chunks (the slices differ by at most one chunk; a slice may be empty when there are fewer
/// chunks than slices).
[[nodiscard]] constexpr std::pair<std::size_t, std::size_t> grid_slice(std::size_t params, std::size_t r,
                                                                      std::size_t n) noexcept {
  const auto [first, last] = grid_slice_chunks(params, r, n);
  const std::size_t lo = first * epilogue_chunk, hi = last * epilogue_chunk;
  return {lo < params ? lo : params, hi < params ? hi : params};
}

/// What a non-finite reduced gradient does to the update.
enum class nonfinite_policy {
  apply,  ///< nothing is checked: the update is applied as it is (no epilogue pass for this)
  skip,   ///< the update is skipped (parameters, optimiser state and EMA unchanged); the batch is consumed and the schedule advances
  raise   ///< the update is skipped and the step throws numerics_error
};

/// The decision of the reduced-gradient epilogue when it is made on a device (GPU replicas): it
/// lives in device memory and the update kernels read it, so the host never waits for it.
struct update_decision {
  float scale = 1;         ///< multiplies the gradient sums (it replaces update_info::grad_scale)
  std::uint32_t skip = 0;  ///< nonzero: the update changes no parameter, state or EMA
  double norm = 0;         ///< the global norm of the gradient before clipping (for step statistics)
  double factor = 1;       ///< the clip factor (for step statistics)
  std::uint32_t finite = 1;///< zero when a reduced gradient sum was not finite
};

/// What the epilogue is given besides the chunks.
struct epilogue_inputs {
  std::size_t rows = 0;           ///< rows of the update (all its batches, every replica of every worker)
  double loss_scale = 1;          ///< the factor the loss (so the gradient sums) carries; 1 without loss scaling
  double clip_global_norm = 0;    ///< the norm bound (0: no clipping)
  nonfinite_policy nonfinite = nonfinite_policy::apply;  ///< what a non-finite sum does
};

/// What the epilogue decides for an update.
struct epilogue_result {
  bool finite = true;    ///< every reduced sum is finite
  double norm = std::numeric_limits<double>::quiet_NaN();  ///< global norm of the applied gradient before clipping (NaN: not computed)
  double factor = 1;     ///< the clip factor (1 when not clipped)
  double scale = 1;      ///< update_info::grad_scale: factor / (rows × loss scale)
  bool skip = false;     ///< the update changes nothing
};

namespace detail {
/// chunk_sum_of_squares' arithmetic, inlined into each copy of it below.
template <class T>
[[gnu::always_inline]] inline double chunk_sum_of_squares_body(const T* x, std::size_t len) noexcept {
  double acc[epilogue_lanes] = {};
  std::size_t i = 0;
  for (; i + epilogue_lanes <= len; i += epilogue_lanes)
    for (std::size_t l = 0; l < epilogue_lanes; ++l) {
      const double v = static_cast<double>(x[i + l]);
      acc[l] += v * v;
    }
  for (std::size_t l = 0; i + l < len; ++l) {
    const double v = static_cast<double>(x[i + l]);
    acc[l] += v * v;
  }
  for (std::size_t w = epilogue_lanes / 2; w > 0; w /= 2)
    for (std::size_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

/// chunk_sum_of_squares for any CPU (the translation unit's instruction set).
template <class T>
[[nodiscard]] inline double chunk_sum_of_squares_any(const T* x, std::size_t len) noexcept {
  return chunk_sum_of_squares_body(x, len);
}

#if LOCKSTEP_HOST_AVX2_LOOPS
/// chunk_sum_of_squares compiled for AVX2, without FMA, so every product and sum is rounded as in
/// chunk_sum_of_squares_any (the same bits); called only where the CPU has AVX2.
template <class T>
[[nodiscard, gnu::target("avx2")]] inline double chunk_sum_of_squares_avx2(const T* x, std::size_t len) noexcept {
  return chunk_sum_of_squares_body(x, len);
}
#endif
}  // namespace detail

/// The sum of squares of `len` (at most epilogue_chunk) elements in double, the grid's chunk
/// arithmetic (16 lanes in index order, then added pairwise); through a copy compiled for AVX2
/// where the CPU has it and the translation unit does not already target it (x86-64 baseline
/// code spent 120 µs on config M's 670 000 gradients, the AVX2 copy 50 µs, on a Zen 4 core).
template <class T>
[[nodiscard]] inline double chunk_sum_of_squares(const T* x, std::size_t len) noexcept {
#if LOCKSTEP_HOST_AVX2_LOOPS
  if (__builtin_cpu_supports("avx2")) return detail::chunk_sum_of_squares_avx2(x, len);
#endif
  return detail::chunk_sum_of_squares_any(x, len);
}

/// Lane `lane` of chunk `chunk` of the `n` elements of g: the squares (as doubles) of the chunk's
/// elements lane, lane + 16, ... added in index order (the per-thread body of the CUDA kernel;
/// chunk_sum_of_squares adds the lanes pairwise).
template <class T>
[[nodiscard]] LOCKSTEP_HD inline double epilogue_lane_sum(const T* g, std::size_t n, std::size_t chunk,
                                                          std::size_t lane) noexcept {
  const std::size_t lo = chunk * epilogue_chunk;
  const std::size_t len = n - lo < epilogue_chunk ? n - lo : epilogue_chunk;
  double acc = 0;
  for (std::size_t i = lane; i < len; i += epilogue_lanes) {
    const double v = static_cast<double>(g[lo + i]);
    acc += v * v;
  }
  return acc;
}

/// Chunks [first, last) of the grid over the `params` elements of `g`, into out[first..last).
template <class T>
void scan_chunks(const T* g, std::size_t params, std::size_t first, std::size_t last, double* out) noexcept {
  for (std::size_t c = first; c < last; ++c) {
    const std::size_t lo = c * epilogue_chunk;
    const std::size_t len = params - lo < epilogue_chunk ? params - lo : epilogue_chunk;
    out[c] = chunk_sum_of_squares(g + lo, len);
  }
}

/// The decision from the chunks' sums of squares, combined in chunk order (host and device code:
/// the CUDA backend runs this very function in one device thread).
[[nodiscard]] LOCKSTEP_HD inline epilogue_result decide_update(const double* chunks, std::size_t count,
                                                              const epilogue_inputs& in) noexcept {
  double total = 0;
  for (std::size_t c = 0; c < count; ++c) total += chunks[c];
  epilogue_result r;
  r.finite = total - total == 0;  // false for an infinite or NaN sum: some element was not finite
  const double inv = 1.0 / (static_cast<double>(in.rows) * in.loss_scale);
  r.norm = ::sqrt(total) * inv;
  r.factor = in.clip_global_norm > 0 && r.finite && r.norm > in.clip_global_norm ? in.clip_global_norm / r.norm : 1.0;
  r.scale = r.factor * inv;
  r.skip = !r.finite && in.nonfinite != nonfinite_policy::apply;
  return r;
}

/// The decision as the update kernels read it from device memory.
[[nodiscard]] LOCKSTEP_HD inline update_decision decision_of(const epilogue_result& r) noexcept {
  update_decision d;
  d.scale = static_cast<float>(r.scale);
  d.skip = r.skip ? 1u : 0u;
  d.norm = r.norm;
  d.factor = r.factor;
  d.finite = r.finite ? 1u : 0u;
  return d;
}

/// The first chunk whose sum is not finite (count when every one is).
[[nodiscard]] inline std::size_t first_nonfinite_chunk(const double* chunks, std::size_t count) noexcept {
  for (std::size_t c = 0; c < count; ++c)
    if (!std::isfinite(chunks[c])) return c;
  return count;
}

}  // namespace lockstep
