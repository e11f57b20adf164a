#pragma once
/// @file dropout.hpp
/// `dropout<Rate>`: inverted dropout whose mask is keyed by (seed, layer, step, global sample
/// position, feature) through the counter-based RNG. The mask is recomputed in backward, so the
/// layer keeps no state, and it does not depend on how the global batch is split into shards.

#include <cstddef>
#include <cstdint>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/layers/layer.hpp>

namespace lockstep {

namespace detail {
/// out[i] = in[i] * keep(i) / (1 - rate), where keep(i) draws element (offset * width + i).
template <class T>
struct dropout_op {
  const T* in;               ///< x in forward, dy in backward
  T* out;                    ///< y in forward, dx in backward
  counter_rng rng;           ///< this layer's stream for this step
  std::uint64_t first;       ///< global element index of element 0 (sample_offset * width)
  float rate;                ///< probability of dropping
  T scale;                   ///< 1 / (1 - rate)
  /// Computes element i.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    out[i] = rng.uniform(first + i) >= rate ? in[i] * scale : T(0);
  }
};
}  // namespace detail

/// Inverted dropout: in training, zeroes each feature with probability Rate and scales the rest
/// by 1 / (1 - Rate); in evaluation, the identity.
template <double Rate>
struct dropout {
  static_assert(Rate >= 0.0 && Rate < 1.0, "lockstep::dropout: Rate must be in [0, 1)");
  using layer_concept = layer_tag;                  ///< opts in to the layer concept
  static constexpr std::size_t expected_input = 0;  ///< any width
  static constexpr double rate = Rate;              ///< drop probability

  /// Dropout bound to width I.
  template <std::size_t I>
  struct bind {
    static constexpr std::size_t input_size = I;            ///< features in
    static constexpr std::size_t output_size = I;           ///< features out
    static constexpr std::size_t param_count = 0;           ///< no parameters
    static constexpr std::size_t workspace_per_sample = 0;  ///< the mask is recomputed, not stored

    /// Nothing to initialise.
    template <class T>
    static void init(T*, const counter_rng&) {}

    /// y = x * mask / (1 - Rate) in training, y = x in evaluation.
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const T*, const T* x, T* y, T*, std::size_t batch, const pass_info& info) {
      apply(ctx, x, y, batch, info);
    }

    /// dx = dy * mask / (1 - Rate) (the same mask as forward), or dx = dy in evaluation.
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const T*, const T*, const T*, const T* dy, T* dx, T*, T*, std::size_t batch,
                         const pass_info& info) {
      if (dx) apply(ctx, dy, dx, batch, info);
    }

  private:
    template <class T, class Ctx>
    static void apply(Ctx& ctx, const T* in, T* out, std::size_t batch, const pass_info& info) {
      if (!info.training || Rate == 0.0) {
        copy(ctx, out, in, batch * I);
        return;
      }
      const counter_rng rng(info.seed, layer_rng_stream(info.layer_stream, rng_purpose::dropout, info.step));
      for_each_index(ctx, batch * I,
                     detail::dropout_op<T>{in, out, rng, info.sample_offset * I, static_cast<float>(Rate),
                                           static_cast<T>(1.0 / (1.0 - Rate))});
    }
  };
};

}  // namespace lockstep
