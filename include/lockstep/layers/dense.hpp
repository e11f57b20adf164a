#pragma once
/// @file dense.hpp
/// `dense<In, Out>`: a fully connected layer y = x W + b.

#include <cstddef>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/layers/init.hpp>
#include <lockstep/layers/layer.hpp>

namespace lockstep {

/// Fully connected layer from In to Out features. Parameters: W (In x Out, row-major) then b (Out).
/// @tparam Init weight initialiser (biases start at zero)
template <std::size_t In, std::size_t Out, class Init = he_uniform>
struct dense {
  static_assert(In > 0 && Out > 0, "lockstep::dense: both widths must be positive");
  using layer_concept = layer_tag;             ///< opts in to the layer concept
  static constexpr std::size_t expected_input = In;  ///< the only input width it accepts

  /// The bound layer (dense has a fixed input width, so binding only checks it).
  template <std::size_t I>
  struct bind {
    static_assert(I == In, "lockstep::dense bound to the wrong input width");
    static constexpr std::size_t input_size = In;                 ///< features in
    static constexpr std::size_t output_size = Out;               ///< features out
    static constexpr std::size_t param_count = In * Out + Out;    ///< weights then biases
    static constexpr std::size_t workspace_per_sample = 0;        ///< needs no scratch

    /// Initialises W with Init and b with zeros (host memory).
    template <class T>
    static void init(T* params, const counter_rng& rng) {
      Init::fill(params, In * Out, In, Out, rng);
      for (std::size_t o = 0; o < Out; ++o) params[In * Out + o] = T(0);
    }

    /// y (batch x Out) = x (batch x In) W + b.
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const T* params, const T* x, T* y, T*, std::size_t batch, const pass_info&) {
      using backend::trans;
      broadcast_rows(ctx, y, params + In * Out, batch, Out);
      gemm(ctx, trans::no, trans::no, batch, Out, In, T(1), x, In, params, Out, T(1), y, Out);
    }

    /// dW = x^T dy, db = column sums of dy, and dx = dy W^T when dx is not null (the first layer
    /// of a model skips its input gradient).
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const T* params, const T* x, const T*, const T* dy, T* dx, T* dparams, T*,
                         std::size_t batch, const pass_info&) {
      using backend::trans;
      gemm(ctx, trans::yes, trans::no, In, Out, batch, T(1), x, In, dy, Out, T(0), dparams, Out);
      column_sums(ctx, dy, batch, Out, dparams + In * Out);
      if (dx) gemm(ctx, trans::no, trans::yes, batch, In, Out, T(1), dy, Out, params, Out, T(0), dx, In);
    }
  };
};

}  // namespace lockstep
