#pragma once
/// @file residual.hpp
/// `residual<Layers...>`: y = x + f(x), where f is `sequential<Layers...>` and keeps the shape of
/// its input; with convolutions and batch norm inside, a ResNet block is a type.

#include <cstddef>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/layers/sequential.hpp>

namespace lockstep {

namespace shape_mismatch {
/// A residual block whose body maps rows of shape In to rows of another shape Out, so that
/// y = x + f(x) cannot add them; the compiler's one error names
/// `residual_body<Body>::maps<In>::to<Out>`.
template <class Body>
struct residual_body {
  /// ... maps rows of shape In ...
  template <class In>
  struct maps {
    /// ... to rows of shape Out.
    template <class Out>
    struct to {
      static_assert(detail::reported<to>,
                    "lockstep::residual: the body must keep the shape of its input (y = x + f(x)). The type named in "
                    "this diagnostic reads as a sentence: residual_body<body>::maps<input shape>::to<output shape>");
    };
  };
};
}  // namespace shape_mismatch

namespace detail {
/// a[i] += b[i].
template <class T>
struct add_into_op {
  T* a;        ///< accumulated into
  const T* b;  ///< added
  /// Element i.
  LOCKSTEP_HD void operator()(std::size_t i) const { a[i] += b[i]; }
};

/// Reports a body (bound to S) that changes the shape, once; nothing otherwise.
template <class Body, class S, class Bound, bool Keeps = std::is_same_v<typename Bound::output_shape, S>>
struct residual_check {};
template <class Body, class S, class Bound>
struct residual_check<Body, S, Bound, false>
    : shape_mismatch::residual_body<Body>::template maps<S>::template to<typename Bound::output_shape> {};
}  // namespace detail

/// y = x + f(x) with f = `sequential<Layers...>`, whose output must have the input's shape.
template <class... Layers>
struct residual {
  using body = sequential<Layers...>;                ///< f
  using layer_concept = layer_tag;                   ///< opts in to the layer concept
  static constexpr std::size_t expected_input = body::expected_input;  ///< the body's

  /// True when the body accepts rows of shape S and gives back the same shape.
  template <class S>
  static constexpr bool accepts_shape = [] {
    if constexpr (body::template accepts_shape<S>)
      return std::is_same_v<typename body::template chain_at<S>::output, S>;
    else
      return false;
  }();

  /// The body's chain from S (a mismatch inside is reported with its position).
  template <class S>
  using chain_at = typename body::template chain_at<S>;

  /// The block bound to input rows of shape S (a body that changes the shape is reported here,
  /// in one compile error).
  template <class S>
  struct bind_shape {
    using inner = typename body::template bind_shape<S>;  ///< the bound body
    static_assert(sizeof(detail::residual_check<body, S, inner>) > 0);  // reports a body that changes the shape
    using input_shape = S;                                        ///< an input row
    using output_shape = S;                                       ///< the input's shape
    static constexpr std::size_t input_size = S::size;            ///< features in
    static constexpr std::size_t output_size = S::size;           ///< features out
    static constexpr std::size_t param_count = inner::param_count;  ///< the body's parameters
    static constexpr std::size_t state_count = inner::state_count;  ///< the body's state
    static constexpr bool couples_rows = inner::couples_rows;      ///< when the body does
    static constexpr bool mixed_precision = true;  ///< transparent: the body runs in its own precision
    static constexpr bool accumulates_gradients = accumulates_gradients_v<inner>;  ///< when the body does
    /// The body's scratch, then its output f(x) kept for its backward.
    static constexpr std::size_t workspace_per_sample = inner::workspace_per_sample + S::size;
    /// The same in a pass that keeps activations in bf16 (workspace_bf16_v of the body).
    static constexpr std::size_t workspace_per_sample_bf16 = workspace_bf16_v<inner> + S::size;
    static constexpr std::size_t workspace_fixed = inner::workspace_fixed;  ///< the body's

    /// Checks the body's layers (see check_bound_layer).
    template <class T, class Ctx>
    static constexpr bool check_layers() {
      return inner::template check_layers<T, Ctx>();
    }

    /// The body's parameters.
    template <class T>
    static void init(T* params, const counter_rng& rng) {
      inner::init(params, rng);
    }
    /// The body's state.
    template <class T>
    static void init_state(T* state) {
      if constexpr (state_count > 0) inner::init_state(state);
    }

    /// y = x + f(x).
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const forward_args<T, Ctx, S, S>& a) {
      const std::size_t batch = a.batch();
      T* fx = body_output(a.workspace, batch, a.info);
      {
        const detail::layer_precision_scope<inner, Ctx> precision(ctx);
        inner::forward(ctx, forward_args_for<T, Ctx, inner>{a.params, a.x, {fx, batch}, a.workspace, a.info});
      }
      copy(ctx, a.y.data(), fx, a.y.size());
      for_each_index(ctx, a.y.size(), detail::add_into_op<T>{a.y.data(), a.x.data()});
    }

    /// dx = dy + f'(x)^T dy; the body's parameter gradients.
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const backward_args<T, Ctx, S, S>& a) {
      const std::size_t batch = a.batch();
      {
        const detail::layer_precision_scope<inner, Ctx> precision(ctx);
        inner::backward(ctx, backward_args_for<T, Ctx, inner>{a.params, a.x, {body_output(a.workspace, batch, a.info), batch}, a.dy,
                                                        a.dx, a.dparams, a.workspace, a.info});
      }
      if (a.dx) for_each_index(ctx, a.dx.size(), detail::add_into_op<T>{a.dx.data(), a.dy.data()});
    }

  private:
    // After the body's workspace, laid out as the pass lays it out.
    template <class T>
    static T* body_output(T* ws, std::size_t batch, const pass_info& info) {
      const std::size_t body = info.bf16_activations ? workspace_bf16_v<inner> : inner::workspace_per_sample;
      return ws + batch * body + inner::workspace_fixed;
    }
  };
};

}  // namespace lockstep
