#pragma once
/// @file dense.hpp
/// `dense<In, Out>`: a fully connected layer y = x W + b.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/layers/activations.hpp>
#include <lockstep/layers/deferral.hpp>
#include <lockstep/layers/init.hpp>
#include <lockstep/layers/layer.hpp>

namespace lockstep {

namespace detail {
/// out[c] += the sum over rows of x[r][c], the rows added in order after what out holds (a bias
/// gradient accumulated over several batches). One call per column.
template <class T>
struct column_sums_add_op {
  const T* x;        ///< rows x cols
  std::size_t rows;  ///< rows to add
  std::size_t cols;  ///< columns
  T* out;            ///< the running sums
  /// Adds column c.
  LOCKSTEP_HD void operator()(std::size_t c) const {
    T s = out[c];
    for (std::size_t r = 0; r < rows; ++r) s += x[r * cols + c];
    out[c] = s;
  }
};

/// column_sums added to what `out` holds (the same order as column_sums_add_op): row by row on
/// the host, one column per element elsewhere.
template <class Ctx, class T>
void add_column_sums(Ctx& ctx, const T* x, std::size_t rows, std::size_t cols, T* out) {
  if constexpr (detail::host_context_v<Ctx>) {
    for (std::size_t r = 0; r < rows; ++r) {
      const T* row = x + r * cols;
      for (std::size_t c = 0; c < cols; ++c) out[c] += row[c];
    }
  } else {
    for_each_index(ctx, cols, column_sums_add_op<T>{x, rows, cols, out});
  }
}
/// y[i] = Fn::f(y[i] + b[i % Cols]): the bias and a following activation in one pass over a
/// GEMM's output of Cols columns (one element per call; the column count a constant, so the
/// remainder is a multiply and a shift rather than a division per element).
template <class Fn, class T, std::size_t Cols>
struct bias_activation_op {
  static_assert(Cols > 0, "bias_activation_op: at least one column");
  T* y;              ///< rows x Cols, the GEMM's products
  const T* b;        ///< Cols biases
  /// Finishes element i.
  LOCKSTEP_HD void operator()(std::size_t i) const { y[i] = Fn::f(y[i] + b[i % Cols]); }
};

/// bias_activation_op over the rows x Cols matrix y: row by row on the host (a loop the compiler
/// vectorises), one element per call elsewhere.
template <class Fn, std::size_t Cols, class Ctx, class T>
void bias_activation(Ctx& ctx, T* y, const T* b, std::size_t rows) {
  if constexpr (detail::host_context_v<Ctx>) {
    for (std::size_t r = 0; r < rows; ++r) {
      T* row = y + r * Cols;
      for (std::size_t c = 0; c < Cols; ++c) row[c] = Fn::f(row[c] + b[c]);
    }
  } else {
    for_each_index(ctx, rows * Cols, bias_activation_op<Fn, T, Cols>{y, b});
  }
}

/// bias_activation on the host with the results written as bf16 encodings y16 (the conversion the
/// bf16 GEMMs apply to their operands, backend::to_bf16_weights) instead of in place: y is left
/// holding the fp32 results.
template <class Fn, std::size_t Cols, class T>
void bias_activation_bf16(const host_context&, T* y, const T* b, std::size_t rows, std::uint16_t* y16) {
  for (std::size_t r = 0; r < rows; ++r) {
    T* row = y + r * Cols;
    for (std::size_t c = 0; c < Cols; ++c) row[c] = Fn::f(row[c] + b[c]);
    backend::to_bf16_weights(row, Cols, y16 + r * Cols);
  }
}
}  // namespace detail

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
    static constexpr bool mixed_precision = true;  ///< its GEMMs compute in the model's precision policy
    static constexpr bool accumulates_gradients = true;           ///< adds into dparams under pass_info::accumulate
    using fuses_activation = bind;  ///< applies a following activation in its forward (forward_activated; fuses_activation_v)
    static constexpr bool bf16_activations = true;  ///< reads and writes activations kept in bf16 (forward_stored, backward_stored)
    static constexpr bool backward_reads_output = false;  ///< backward reads x, never y (output_unread_v)

    /// Initialises W with Init and b with zeros (host memory).
    template <class T>
    static void init(T* params, const counter_rng& rng) {
      Init::fill(params, In * Out, In, Out, rng);
      for (std::size_t o = 0; o < Out; ++o) params[In * Out + o] = T(0);
    }

    /// y (batch x Out) = x (batch x In) W + b.
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const forward_args<T, Ctx, shape<In>, shape<Out>>& a) {
      forward_stored<void>(ctx, a, nullptr, nullptr);
    }

    /// y = Fn::f(x W + b): the GEMM writes x W (beta = 0), and one pass adds the bias and applies
    /// the activation Fn of the layer that follows (fuses_activation_v), in place of the bias's
    /// broadcast before the GEMM and the activation's own pass over y; on GPUs a relu goes into
    /// the GEMM's epilogue instead (backend::gemm_bias_relu). Backward never reads y.
    template <class Fn, class T, class Ctx>
    static void forward_activated(Ctx& ctx, const forward_args<T, Ctx, shape<In>, shape<Out>>& a) {
      forward_stored<Fn>(ctx, a, nullptr, nullptr);
    }

    /// Whether activations kept in bf16 can reach this layer: float on a host context.
    template <class T, class Ctx>
    static constexpr bool stored_kernels = std::is_same_v<T, float> && detail::host_context_v<Ctx>;

    /// forward (Fn void) or forward_activated<Fn>, in a pass on a host context that keeps
    /// activations in bf16 (bf16_activations_v): x read from its bf16 encodings x16 when x16 is not
    /// null (a.x unused), and Fn's results (the output itself for Fn void) written as bf16
    /// encodings y16 when y16 is not null (a.y receives the same results in fp32). The same bits as
    /// forward and forward_activated on the widened values, rounded to bf16 as the next GEMM
    /// rounds them.
    template <class Fn, class T, class Ctx>
    static void forward_stored(Ctx& ctx, const forward_args<T, Ctx, shape<In>, shape<Out>>& a,
                               [[maybe_unused]] const std::uint16_t* x16, [[maybe_unused]] std::uint16_t* y16) {
      using backend::trans;
      const std::size_t batch = a.batch();
      const auto product = [&](T beta) {
        if constexpr (stored_kernels<T, Ctx>) {
          if (x16) {
            gemm_bf16_input(ctx, trans::no, trans::no, batch, Out, In, T(1), x16, a.params, Out, beta, a.y.data(), Out);
            return;
          }
        }
        gemm(ctx, trans::no, trans::no, batch, Out, In, T(1), a.x.data(), In, a.params, Out, beta, a.y.data(), Out);
      };
      if constexpr (std::is_void_v<Fn>) {
        broadcast_rows(ctx, a.y.data(), a.params + In * Out, batch, Out);
        product(T(1));
        backend::encode_output16(ctx, a.y.data(), a.y.size(), y16);
      } else {
        // On a context with a fused GEMM for it (the CUDA backend's gemm_bias_relu: a cuBLASLt
        // matmul whose epilogue adds the bias and applies the relu), one call does all of it.
        if constexpr (std::is_same_v<Fn, relu_fn> &&
                      requires(T* y, const T* p) { gemm_bias_relu(ctx, batch, Out, In, p, In, p, Out, p, y, Out); }) {
          if (gemm_bias_relu(ctx, batch, Out, In, a.x.data(), In, a.params, Out, a.params + In * Out, a.y.data(), Out))
            return;
        }
        product(T(0));
        if constexpr (stored_kernels<T, Ctx>) {
          if (y16) {
            detail::bias_activation_bf16<Fn, Out>(ctx, a.y.data(), a.params + In * Out, batch, y16);
            return;
          }
        }
        detail::bias_activation<Fn, Out>(ctx, a.y.data(), a.params + In * Out, batch);
      }
    }

    /// dW = x^T dy, db = column sums of dy (both added to dparams under pass_info::accumulate:
    /// the GEMM's beta is 1, or dW formed once per update from the kept rows, see
    /// weight_gradient), and dx = dy W^T when dx is not empty (the first layer of a model
    /// skips its input gradient).
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const backward_args<T, Ctx, shape<In>, shape<Out>>& a) {
      backward_stored(ctx, a, nullptr);
    }

    /// backward, with x read from its bf16 encodings x16 when x16 is not null (a.x unused; a
    /// host context, see forward_stored): the same bits as backward on the widened values.
    template <class T, class Ctx>
    static void backward_stored(Ctx& ctx, const backward_args<T, Ctx, shape<In>, shape<Out>>& a,
                                [[maybe_unused]] const std::uint16_t* x16) {
      using backend::trans;
      const std::size_t batch = a.batch();
      bool done = false;
      if constexpr (stored_kernels<T, Ctx>) {
        if (x16) {
          weight_gradient_bf16_input(ctx, a.info, a.params, x16, a.dy.data(), batch, In, Out, a.dparams);
          done = true;
        }
      }
      if (!done) weight_gradient(ctx, a.info, a.params, a.x.data(), a.dy.data(), batch, In, Out, a.dparams);
      if (a.info.accumulate)
        detail::add_column_sums(ctx, a.dy.data(), batch, Out, a.dparams + In * Out);
      else
        column_sums(ctx, a.dy.data(), batch, Out, a.dparams + In * Out);
      if (a.dx) gemm(ctx, trans::no, trans::yes, batch, In, Out, T(1), a.dy.data(), Out, a.params, Out, T(0), a.dx.data(), In);
    }
  };
};

}  // namespace lockstep
