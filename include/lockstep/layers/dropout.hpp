#pragma once
/// @file dropout.hpp
/// `dropout<Num, Den>`: inverted dropout with rate Num / Den (a rational, so that the rate is a
/// compile-time constant that every C++20 compiler accepts as a template argument), whose mask is keyed by (seed, layer, step, the row's position
/// in the update's rows, feature) through the counter-based RNG, so it does not depend on how the global batch
/// is split into shards. Forward keeps the mask in the workspace; backward applies it again.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/backend/host/philox.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/layers/layer.hpp>

namespace lockstep {

namespace detail {
/// out[i] = in[i] * keep(g) / (1 - rate) for the n elements i, where g = first + i is the element's
/// global index and keep(g) uses word g % 4 of Philox block g / 4 (counter_rng::uniform(g)). One
/// call handles one Philox block, so each block is generated once for its four elements.
template <class T>
struct dropout_op {
  const T* in;               ///< x in forward, dy in backward
  T* out;                    ///< y in forward, dx in backward
  std::uint8_t* keep;        ///< where each element's mask (1 kept, 0 dropped) goes, one byte each
  counter_rng rng;           ///< this layer's stream for this step
  std::uint64_t first;       ///< global element index of element 0 (sample_offset * width)
  std::uint64_t n;           ///< elements
  float rate;                ///< probability of dropping
  T scale;                   ///< 1 / (1 - rate)
  /// Handles the elements of Philox block (first / 4 + k).
  LOCKSTEP_HD void operator()(std::size_t k) const {
    const std::uint64_t block = first / 4 + k;
    const philox4x32::block bits = rng.bits(block);
    for (std::uint64_t w = 0; w < 4; ++w) {
      const std::uint64_t g = block * 4 + w;
      if (g < first || g >= first + n) continue;
      const std::uint64_t i = g - first;
      const float u = static_cast<float>(bits.v[w] >> 8) * (1.0f / 16777216.0f);
      const bool kept = u >= rate;
      out[i] = kept ? in[i] * scale : T(0);
      keep[i] = kept ? std::uint8_t{1} : std::uint8_t{0};
    }
  }
  /// Number of Philox blocks the elements span.
  [[nodiscard]] LOCKSTEP_HD std::uint64_t blocks() const { return n == 0 ? 0 : (first + n - 1) / 4 - first / 4 + 1; }
};

/// dropout_op on a host context, with the same bits: the Philox blocks of a chunk of elements are
/// drawn first (backend::philox_words: eight blocks per AVX2 vector where the CPU has AVX2), then
/// the chunk's elements are masked and scaled in a loop without branches, which the compiler
/// vectorises.
template <class T>
void dropout_host(const dropout_op<T>& op) {
  constexpr std::size_t chunk_blocks = 64;
  std::uint32_t words[4 * chunk_blocks];
  // Element i is word j = i + lead of the words counted from block first / 4.
  const std::uint64_t first_block = op.first / 4;
  const std::size_t lead = static_cast<std::size_t>(op.first % 4);
  const std::size_t end = static_cast<std::size_t>(op.n) + lead;
  // u = (w >> 8) / 2^24 >= rate exactly when w >> 8 >= ceil(rate 2^24): both sides are exact (a
  // 24-bit integer and a float scaled by a power of two), and integers compare in vector lanes.
  const auto threshold = static_cast<std::uint32_t>(std::ceil(static_cast<double>(op.rate) * 16777216.0));
  for (std::size_t j0 = 0; j0 < end; j0 += 4 * chunk_blocks) {
    const std::size_t blocks = std::min(chunk_blocks, (end - j0 + 3) / 4);
    backend::philox_words(op.rng, first_block + j0 / 4, blocks, words);
    const std::size_t jb = std::max(j0, lead), je = std::min(j0 + 4 * blocks, end);
    const std::uint32_t* wd = words + (jb - j0);
    const T* in = op.in + (jb - lead);
    T* out = op.out + (jb - lead);
    std::uint8_t* keep = op.keep + (jb - lead);
    const T scale = op.scale;
    if constexpr (sizeof(T) == 4 || sizeof(T) == 8) {
      // The select as a bit mask (all ones where kept), which g++ vectorises where it would not
      // vectorise `kept ? in * scale : 0`; a dropped element is +0 either way.
      using bits_t = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
      for (std::size_t k = 0; k < je - jb; ++k) {
        const bool kept = (wd[k] >> 8) >= threshold;
        const bits_t mask = bits_t(0) - static_cast<bits_t>(kept);
        out[k] = std::bit_cast<T>(std::bit_cast<bits_t>(static_cast<T>(in[k] * scale)) & mask);
        keep[k] = static_cast<std::uint8_t>(kept);
      }
    } else {
      for (std::size_t k = 0; k < je - jb; ++k) {
        const bool kept = (wd[k] >> 8) >= threshold;
        out[k] = kept ? in[k] * scale : T(0);
        keep[k] = static_cast<std::uint8_t>(kept);
      }
    }
  }
}

/// dx[i] = dy[i] / (1 - rate) where forward kept element i, else 0.
template <class T>
struct dropout_mask_op {
  static constexpr bool avx2_copy = true;  ///< one element per call: for_each_index may run its AVX2 copy
  const T* dy;    ///< output gradient
  const std::uint8_t* keep;  ///< forward's mask, one byte per element
  T* dx;          ///< input gradient
  T scale;        ///< 1 / (1 - rate)
  /// Computes element i. On the host the select is a bit mask (all ones where kept), which the
  /// compiler vectorises where it compiles `kept ? dy * scale : 0` as a branch (mispredicted for a
  /// random mask); a dropped element is +0 either way.
  LOCKSTEP_HD void operator()(std::size_t i) const {
#if !defined(__CUDA_ARCH__)
    if constexpr (sizeof(T) == 4 || sizeof(T) == 8) {
      using bits_t = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
      const bits_t mask = bits_t(0) - static_cast<bits_t>(keep[i] != 0);
      dx[i] = std::bit_cast<T>(std::bit_cast<bits_t>(static_cast<T>(dy[i] * scale)) & mask);
      return;
    }
#endif
    dx[i] = keep[i] != 0 ? dy[i] * scale : T(0);
  }
};
}  // namespace detail

/// Inverted dropout with rate Num / Den (`dropout<1, 5>` drops 20%): in training, zeroes each
/// feature with that probability and scales the rest by 1 / (1 - rate); in evaluation, the identity.
template <std::intmax_t Num, std::intmax_t Den>
struct dropout {
  static_assert(Den > 0, "lockstep::dropout<Num, Den>: the denominator Den must be positive");
  static_assert(Num >= 0 && Num < Den, "lockstep::dropout<Num, Den>: the rate Num / Den must be in [0, 1)");
  using layer_concept = layer_tag;                  ///< opts in to the layer concept
  static constexpr std::size_t expected_input = 0;  ///< any width
  static constexpr bool preserves_shape = true;    ///< elementwise: an image stays an image
  static constexpr double rate = static_cast<double>(Num) / static_cast<double>(Den);  ///< drop probability

  /// Dropout bound to width I.
  template <std::size_t I>
  struct bind {
    static constexpr std::size_t input_size = I;            ///< features in
    static constexpr std::size_t output_size = I;           ///< features out
    static constexpr std::size_t param_count = 0;           ///< no parameters
    /// The mask forward drew, for backward: one byte per feature, in elements of 4 bytes or more
    /// (none when nothing is dropped).
    static constexpr std::size_t workspace_per_sample = Num == 0 ? 0 : (I + 3) / 4;
    static constexpr bool mixed_precision = true;  ///< runs under any precision policy (its own arithmetic stays fp32)
    static constexpr bool backward_reads_output = false;  ///< backward reads the mask, never y (output_unread_v)
    static constexpr bool backward_reads_input = false;   ///< backward reads the mask, never x (input_unread_v)

    /// Nothing to initialise.
    template <class T>
    static void init(T*, const counter_rng&) {}

    /// y = x * mask / (1 - rate) in training, y = x in evaluation.
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const forward_args<T, Ctx, shape<I>, shape<I>>& a) {
      if (Num == 0 || !a.info.training) {
        copy(ctx, a.y.data(), a.x.data(), a.y.size());
        return;
      }
      const pass_info& info = a.info;
      const counter_rng rng(info.seed, layer_rng_stream(info.layer_stream, rng_purpose::dropout, info.step));
      const detail::dropout_op<T> op{a.x.data(), a.y.data(), reinterpret_cast<std::uint8_t*>(a.workspace), rng, (info.update_offset + info.sample_offset) * I, a.x.size(),
                                     static_cast<float>(rate), scale<T>()};
      if constexpr (detail::host_context_v<Ctx>)
        detail::dropout_host(op);
      else
        for_each_index(ctx, op.blocks(), op);
    }

    /// dx = dy * mask / (1 - rate) (forward's mask), or dx = dy in evaluation.
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const backward_args<T, Ctx, shape<I>, shape<I>>& a) {
      if (!a.dx) return;
      if (!a.info.training || Num == 0) {
        copy(ctx, a.dx.data(), a.dy.data(), a.dx.size());
        return;
      }
      for_each_index(ctx, a.dx.size(), detail::dropout_mask_op<T>{a.dy.data(), reinterpret_cast<const std::uint8_t*>(a.workspace), a.dx.data(), scale<T>()});
    }

  private:
    template <class T>
    static constexpr T scale() {
      return static_cast<T>(1.0 / (1.0 - rate));
    }
  };
};

}  // namespace lockstep
