#pragma once
/// @file drive.hpp
/// Drives a bound layer from flat buffers: `run_forward<B>` and `run_backward<B>` build the
/// typed views of forward_args / backward_args from a pointer and a row count, as the
/// conformance suites, tests and benchmarks do. Needs no test framework.

#include <cstddef>

#include <lockstep/layers/layer.hpp>

namespace lockstep::testing {

/// B::forward on `rows` rows: x (rows x input_size), y (rows x output_size), ws (rows *
/// workspace_per_sample + workspace_fixed), all on the context's device; in the context's
/// precision policy when B opts in (mixed_precision_v), in fp32 otherwise, as a model runs it.
template <class B, class T, class Ctx>
void run_forward(Ctx& ctx, const T* params, const T* x, T* y, T* ws, std::size_t rows, const pass_info& info) {
  const lockstep::detail::layer_precision_scope<B, Ctx> precision(ctx);
  B::forward(ctx, forward_args_for<T, Ctx, B>{params, {x, rows}, {y, rows}, ws, info});
}

/// B::backward on `rows` rows after run_forward (in the same precision); dx may be null (no input
/// gradient wanted).
template <class B, class T, class Ctx>
void run_backward(Ctx& ctx, const T* params, const T* x, const T* y, const T* dy, T* dx, T* dparams, T* ws,
                  std::size_t rows, const pass_info& info) {
  const lockstep::detail::layer_precision_scope<B, Ctx> precision(ctx);
  B::backward(ctx, backward_args_for<T, Ctx, B>{params, {x, rows}, {y, rows}, {dy, rows}, {dx, rows}, dparams, ws, info});
}

}  // namespace lockstep::testing
