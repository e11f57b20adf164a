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
    static void forward(Ctx& ctx, const forward_args<T, Ctx, shape<In>, shape<Out>>& a) {
      using backend::trans;
      broadcast_rows(ctx, a.y.data(), a.params + In * Out, a.batch(), Out);
      gemm(ctx, trans::no, trans::no, a.batch(), Out, In, T(1), a.x.data(), In, a.params, Out, T(1), a.y.data(), Out);
    }

    /// dW = x^T dy, db = column sums of dy, and dx = dy W^T when dx is not empty (the first layer
    /// of a model skips its input gradient).
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const backward_args<T, Ctx, shape<In>, shape<Out>>& a) {
      using backend::trans;
      const std::size_t batch = a.batch();
      gemm(ctx, trans::yes, trans::no, In, Out, batch, T(1), a.x.data(), In, a.dy.data(), Out, T(0), a.dparams, Out);
      column_sums(ctx, a.dy.data(), batch, Out, a.dparams + In * Out);
      if (a.dx) gemm(ctx, trans::no, trans::yes, batch, In, Out, T(1), a.dy.data(), Out, a.params, Out, T(0), a.dx.data(), In);
    }
  };
};

}  // namespace lockstep
