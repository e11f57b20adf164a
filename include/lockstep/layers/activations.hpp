#pragma once
/// @file activations.hpp
/// Elementwise activation layers: `relu`, `leaky_relu<Num, Den>` (slope Num / Den), `gelu`,
/// `tanh`, `sigmoid`, and `activation<Fn>` to define more. Each is a pair of scalar functions run by the backend's
/// elementwise primitive, so one definition serves host and GPU.

#include <cmath>
#include <cstddef>
#include <cstdint>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/precision.hpp>
#include <lockstep/layers/layer.hpp>

namespace lockstep {

namespace detail {
/// y[i] = Fn::f(x[i]).
template <class Fn, class T>
struct activation_forward_op {
  static constexpr bool avx2_copy = true;  ///< one element per call: for_each_index may run its AVX2 copy
  const T* x;  ///< input
  T* y;        ///< output
  /// Computes element i.
  LOCKSTEP_HD void operator()(std::size_t i) const { y[i] = Fn::f(x[i]); }
};
/// dx[i] = Fn::grad(x[i], y[i], dy[i]) when Fn defines it, dy[i] * Fn::df(x[i], y[i]) otherwise.
template <class Fn, class T>
struct activation_backward_op {
  static constexpr bool avx2_copy = true;  ///< one element per call: for_each_index may run its AVX2 copy
  const T* x;   ///< forward input
  const T* y;   ///< forward output
  const T* dy;  ///< output gradient
  T* dx;        ///< input gradient
  /// Computes element i.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    if constexpr (requires { Fn::grad(x[i], y[i], dy[i]); })
      dx[i] = Fn::grad(x[i], y[i], dy[i]);
    else
      dx[i] = dy[i] * Fn::df(x[i], y[i]);
  }
};
/// dx[i] = Fn::grad_from_output(y[i], dy[i]): the input gradient from the output alone, for an
/// activation a preceding layer applied in its own forward (its input was never written).
template <class Fn, class T>
struct activation_output_backward_op {
  static constexpr bool avx2_copy = true;  ///< one element per call: for_each_index may run its AVX2 copy
  const T* y;   ///< forward output
  const T* dy;  ///< output gradient
  T* dx;        ///< input gradient
  /// Computes element i.
  LOCKSTEP_HD void operator()(std::size_t i) const { dx[i] = Fn::grad_from_output(y[i], dy[i]); }
};
/// activation_output_backward_op with the output read from its bf16 encodings (kept in bf16, see
/// grad_from_sign_v).
template <class Fn, class T>
struct activation_stored_backward_op {
  static constexpr bool avx2_copy = true;  ///< one element per call: for_each_index may run its AVX2 copy
  const std::uint16_t* y16;  ///< forward output, bf16 encodings
  const T* dy;               ///< output gradient
  T* dx;                     ///< input gradient
  /// Computes element i.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    dx[i] = Fn::grad_from_output(static_cast<T>(from_bf16_bits(y16[i])), dy[i]);
  }
};
}  // namespace detail

/// An elementwise activation layer from a functor type Fn with static `f(x)` and `df(x, y)`
/// (the derivative, given the input x and output y). Fn may also define `grad(x, y, dy)`, the
/// input gradient dy * f'(x) written as a select or fused expression that vectorises; backward
/// then uses it instead of the product. Accepts any width and keeps it.
template <class Fn>
struct activation {
  using layer_concept = layer_tag;                ///< opts in to the layer concept
  static constexpr std::size_t expected_input = 0;  ///< any width
  static constexpr bool preserves_shape = true;    ///< elementwise: an image stays an image
  using function = Fn;                              ///< the scalar function pair

  /// The activation bound to width I.
  template <std::size_t I>
  struct bind {
    static constexpr std::size_t input_size = I;            ///< features in
    static constexpr std::size_t output_size = I;           ///< features out
    static constexpr std::size_t param_count = 0;           ///< no parameters
    static constexpr std::size_t workspace_per_sample = 0;  ///< no scratch
    static constexpr bool mixed_precision = true;  ///< runs under any precision policy (its own arithmetic stays fp32)
    /// The scalar functions a preceding layer may apply in its own forward (fuses_activation_v:
    /// when Fn has `grad_from_output`).
    using fused_activation = activation_fusion<Fn, bind>;

    /// Nothing to initialise.
    template <class T>
    static void init(T*, const counter_rng&) {}

    /// y = f(x) elementwise.
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const forward_args<T, Ctx, shape<I>, shape<I>>& a) {
      for_each_index(ctx, a.x.size(), detail::activation_forward_op<Fn, T>{a.x.data(), a.y.data()});
    }

    /// dx = dy * f'(x) elementwise (skipped when dx is empty).
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const backward_args<T, Ctx, shape<I>, shape<I>>& a) {
      if (a.dx)
        for_each_index(ctx, a.x.size(),
                       detail::activation_backward_op<Fn, T>{a.x.data(), a.y.data(), a.dy.data(), a.dx.data()});
    }
    /// dx = dy * f'(x) from y alone (Fn::grad_from_output), reading neither x nor anything else:
    /// the backward of an activation that the preceding layer applied in its forward.
    template <class T, class Ctx>
    static void backward_from_output(Ctx& ctx, const backward_args<T, Ctx, shape<I>, shape<I>>& a) {
      if (a.dx)
        for_each_index(ctx, a.y.size(),
                       detail::activation_output_backward_op<Fn, T>{a.y.data(), a.dy.data(), a.dx.data()});
    }
    /// backward_from_output with y read from its bf16 encodings y16 (a.y unused): the output kept
    /// in bf16 by the layer that applied this activation (grad_from_sign_v of Fn).
    template <class T, class Ctx>
    static void backward_from_stored(Ctx& ctx, const backward_args<T, Ctx, shape<I>, shape<I>>& a,
                                     const std::uint16_t* y16) {
      if (a.dx)
        for_each_index(ctx, a.dy.size(),
                       detail::activation_stored_backward_op<Fn, T>{y16, a.dy.data(), a.dx.data()});
    }
  };
};

/// max(0, x); a NaN gives 0 (x > 0 is false).
struct relu_fn {
  /// The function.
  template <class T> LOCKSTEP_HD static T f(T x) { return x > T(0) ? x : T(0); }
  /// Its derivative from input and output (0 at x = 0).
  template <class T> LOCKSTEP_HD static T df(T x, T) { return x > T(0) ? T(1) : T(0); }
  /// The input gradient dy * df(x) as a select (dy where x > 0, else 0), which vectorises.
  template <class T> LOCKSTEP_HD static T grad(T x, T, T dy) { return x > T(0) ? dy : T(0); }
  /// The same from the output alone (y > 0 exactly where x > 0, NaN included): what lets a
  /// preceding layer apply relu in its own forward (fuses_activation_v).
  template <class T> LOCKSTEP_HD static T grad_from_output(T y, T dy) { return y > T(0) ? dy : T(0); }
  /// grad_from_output reads only whether y > 0 (grad_from_sign_v), so y may be kept in bf16.
  static constexpr bool grad_from_sign = true;
};

/// x for x > 0, (Num / Den) * x otherwise.
template <std::intmax_t Num, std::intmax_t Den>
struct leaky_relu_fn {
  static_assert(Den > 0, "lockstep::leaky_relu<Num, Den>: the denominator Den must be positive");
  static constexpr double slope = static_cast<double>(Num) / static_cast<double>(Den);  ///< the negative slope
  /// The function.
  template <class T> LOCKSTEP_HD static T f(T x) { return x > T(0) ? x : static_cast<T>(slope) * x; }
  /// Its derivative from input and output.
  template <class T> LOCKSTEP_HD static T df(T x, T) { return x > T(0) ? T(1) : static_cast<T>(slope); }
};

/// The exact GELU: x * Phi(x), Phi the standard normal CDF.
struct gelu_fn {
  /// The function.
  template <class T> LOCKSTEP_HD static T f(T x) {
    return T(0.5) * x * (T(1) + std::erf(x * static_cast<T>(0.70710678118654752440)));
  }
  /// Its derivative: Phi(x) + x * phi(x).
  template <class T> LOCKSTEP_HD static T df(T x, T) {
    const T cdf = T(0.5) * (T(1) + std::erf(x * static_cast<T>(0.70710678118654752440)));
    const T pdf = static_cast<T>(0.39894228040143267794) * std::exp(T(-0.5) * x * x);
    return cdf + x * pdf;
  }
};

/// Hyperbolic tangent.
struct tanh_fn {
  /// The function.
  template <class T> LOCKSTEP_HD static T f(T x) { return std::tanh(x); }
  /// Its derivative from the output: 1 - y^2.
  template <class T> LOCKSTEP_HD static T df(T, T y) { return T(1) - y * y; }
};

/// The logistic function 1 / (1 + e^-x).
struct sigmoid_fn {
  /// The function (stable for large |x|).
  template <class T> LOCKSTEP_HD static T f(T x) {
    if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
    const T e = std::exp(x);
    return e / (T(1) + e);
  }
  /// Its derivative from the output: y (1 - y).
  template <class T> LOCKSTEP_HD static T df(T, T y) { return y * (T(1) - y); }
};

using relu = activation<relu_fn>;                    ///< rectified linear unit layer
template <std::intmax_t Num = 1, std::intmax_t Den = 100>
using leaky_relu = activation<leaky_relu_fn<Num, Den>>;  ///< leaky ReLU layer with negative slope Num / Den
using gelu = activation<gelu_fn>;                    ///< exact GELU layer
using tanh = activation<tanh_fn>;                    ///< hyperbolic tangent layer
using sigmoid = activation<sigmoid_fn>;              ///< logistic sigmoid layer

}  // namespace lockstep
