#pragma once
/// @file layer.hpp
/// The public conformance suite of the layer concept, for doctest. Instantiate it for your own
/// bound layers from your own test binary with one line:
///
///     TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, lockstep::bind_t<my_layer, 7>);
///
/// It checks, in double on the host (`host_context`): the gradients of the inputs and of the
/// parameters against central finite differences over batch sizes 0, 1, 7 and 64, in evaluation,
/// in training, and in training on a shard of a larger batch in a later batch of an accumulated
/// update (`pass_info::sample_offset`, `global_rows` and `update_offset` set as a strategy sets
/// them); that `backward` overwrites `dparams` and writes `dx` only when asked, and that a layer
/// that says `accumulates_gradients` adds to `dparams` under `pass_info::accumulate`; that `init` writes exactly
/// `param_count` elements and is a pure function of its generator (and, for a sequential, that
/// `param_offsets` are the prefix sums of the layers' parameter counts); that forward is
/// deterministic in train and in evaluation mode and leaves its input alone; and micro-shard
/// invariance: a row's output and input gradient do not depend on the other rows, nor on how the
/// batch is split into shards (with `pass_info::sample_offset` set as a strategy sets it), and the
/// shards' parameter gradients sum to the whole batch's, the property that
/// `determinism::replica_count_invariant` relies on, and that a row's randomness follows its place
/// in the update (a shard at `update_offset` U and `sample_offset` S gives the rows [U + S, ...) of
/// one pass over the whole update, as gradient accumulation needs); for a layer that `couples_rows` (batch norm),
/// instead, that the batch split over 1 to 4 threads through a row exchange gives one call's
/// results. A layer that opts in to mixed precision (`mixed_precision`) and runs in float is also
/// run under mixed<bf16> and mixed<fp16> against fp32 on the same rounded inputs, parameters and
/// output gradients (mixed_precision_tolerance; a sequential or residual block is not, its layers
/// are). A layer that reads and writes activations kept in bf16 (`bf16_activations`) is checked
/// to compute, from bf16 encodings, the bits it computes from their widened values (stored_check),
/// and one that says `backward_reads_output = false` (`backward_reads_input = false`) to compute its
/// backward without its output (input).
/// Layers with non-trainable state get it after their
/// parameters, as a model stores them. In the one file of a test binary that defines
/// LOCKSTEP_TESTING_COUNT_ALLOCATIONS (see allocations.hpp), it also checks that a second forward
/// and backward of a batch allocate nothing on the heap.
///
/// A layer with a kink (relu) is checked at inputs that avoid it with high probability; one that
/// needs other inputs specialises `lockstep::testing::layer_inputs<B>`. This header includes
/// <doctest/doctest.h>: include it from a doctest test file compiled by a host compiler (doctest's
/// template test cases do not work under nvcc).

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/backend/host.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/distribute/detail/row_exchange.hpp>
#include <lockstep/layers/activations.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/testing/allocations.hpp>
#include <lockstep/testing/drive.hpp>
#include <lockstep/testing/report.hpp>

namespace lockstep::testing {

/// The inputs the layer suite feeds bound layer B: `value(i)` is element i of a batch. The default
/// is a smooth, irregular sequence in [-1.5, 1.5] that stays clear of 0 (kinks) by at least 1e-3.
template <class B>
struct layer_inputs {
  /// Element i of the input batch.
  static double value(std::size_t i) {
    const double v = 1.5 * std::sin(0.7 * static_cast<double>(i) + 0.3);
    return std::abs(v) < 1e-3 ? 0.25 : v;
  }
};

/// Tolerances of the suite's finite-difference checks (relative, with an absolute floor).
struct gradient_tolerance {
  double step = 1e-6;      ///< central-difference step
  double relative = 1e-5;  ///< |analytic - numeric| <= relative * max(1, |numeric|)
};

/// The normwise relative error the layer suite allows between a layer's results under a mixed
/// policy and under fp32, on inputs, parameters and output gradients already rounded to the
/// policy's type (`significant_bits` p: 8 for bf16, 11 for fp16; unit roundoff u = 2^-p), where
/// the longest sum in the layer adds `reduction_length` products: 2u for the rounding of values
/// the layer computes itself and then multiplies, plus fp32's summation error bound
/// (reduction_length * 2^-24) for the different order in which other kernels add the same exact
/// products.
inline double mixed_precision_tolerance(std::size_t reduction_length, int significant_bits = 8) {
  return 2.0 * std::ldexp(1.0, -significant_bits) + static_cast<double>(reduction_length) * 0x1p-24;
}

/// The train-mode pass_info the suite uses (a fixed seed and step, this layer at stream 3).
inline pass_info suite_train_info() {
  pass_info p = pass_info::for_training(17, 4);
  p.layer_stream = 3;
  return p;
}

/// suite_train_info for bound layer B in `training` mode, its state right after its parameters.
template <class B>
pass_info suite_info(bool training) {
  pass_info info = suite_train_info();
  info.training = training;
  info.state_offset = static_cast<std::ptrdiff_t>(B::param_count);
  return info;
}

namespace detail {

/// Workspace elements bound layer B needs for `rows` rows.
template <class B>
std::size_t workspace_size(std::size_t rows) {
  return rows * B::workspace_per_sample + workspace_fixed_v<B>;
}

/// One forward and backward of bound layer B in double on the host, with its own buffers. The
/// parameter vector holds B's parameters, then its non-trainable state (as a model stores them).
template <class B>
struct layer_harness {
  host_context ctx{1};
  std::vector<double> params = std::vector<double>(B::param_count + state_count_v<B>);

  explicit layer_harness(std::uint64_t seed = 11) {
    B::init(params.data(), counter_rng(seed, 5));
    if constexpr (state_count_v<B> > 0) B::init_state(params.data() + B::param_count);
  }

  /// y = forward(x) for `rows` rows.
  std::vector<double> forward(const std::vector<double>& p, const std::vector<double>& x, std::size_t rows,
                              const pass_info& info) {
    std::vector<double> y(rows * B::output_size + 1), ws(workspace_size<B>(rows) + 1);
    lockstep::testing::run_forward<B>(ctx, p.data(), x.data(), y.data(), ws.data(), rows, info);
    y.pop_back();
    return y;
  }

  /// Forward of `rows` rows of x (training or evaluation as `info` says) into the workspace `ws`
  /// (grown to what B needs for `rows`), then backward with dy = w into `dx` (null: none) and
  /// `dp`; returns the output.
  std::vector<double> forward_backward(const double* x, const double* w, std::size_t rows, const pass_info& info,
                                       std::vector<double>& ws, double* dx, double* dp) {
    std::vector<double> y(rows * B::output_size + 1);
    ws.resize(std::max(ws.size(), workspace_size<B>(rows) + 1));
    lockstep::testing::run_forward<B>(ctx, params.data(), x, y.data(), ws.data(), rows, info);
    lockstep::testing::run_backward<B>(ctx, params.data(), x, y.data(), w, dx, dp, ws.data(), rows, info);
    y.pop_back();
    return y;
  }

  /// The objective sum(forward(x) * w), whose gradient backward computes with dy = w.
  double objective(const std::vector<double>& p, const std::vector<double>& x, const std::vector<double>& w,
                   std::size_t rows, const pass_info& info) {
    const std::vector<double> y = forward(p, x, rows, info);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += y[i] * w[i];
    return s;
  }
};

/// ||a - b||_2 / max(||b||_2, tiny): the normwise relative difference the precision check uses.
inline double normwise_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff += d * d;
    norm += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

/// Output, input gradient and parameter gradient of one float forward and backward of B on
/// `rows` rows under policy `p`, every input rounded by `round` (to bf16 or fp16) first.
struct precision_run {
  std::vector<float> y, dx, dp;  ///< output, input gradient, parameter gradient
};
/// The float parameters (then the state, as a model stores them), inputs and output gradients
/// that the suite's float checks run B on for `rows` rows; with `round`, the parameters, inputs
/// and output gradients rounded by it.
template <class B>
struct float_case {
  std::vector<float> params;  ///< B's parameters, then its state
  std::vector<float> x;       ///< rows x input_size inputs
  std::vector<float> dy;      ///< rows x output_size output gradients
  /// The case for `rows` rows, rounded by `round` when it is not null.
  explicit float_case(std::size_t rows, float (*round)(float) = nullptr)
      : params(B::param_count + state_count_v<B>), x(rows * B::input_size), dy(rows * B::output_size) {
    B::init(params.data(), counter_rng(11, 5));
    if constexpr (state_count_v<B> > 0) B::init_state(params.data() + B::param_count);
    const auto r = [round](float v) { return round ? round(v) : v; };
    for (std::size_t i = 0; i < B::param_count; ++i) params[i] = r(params[i]);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = r(static_cast<float>(layer_inputs<B>::value(i)));
    for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = r(static_cast<float>(std::cos(1.3 * double(i) + 0.1)));
  }
};

template <class B>
precision_run run_in_precision(compute_precision p, float (*round)(float), std::size_t rows, const pass_info& info) {
  host_context ctx(1, true, p);
  const float_case<B> c(rows, round);
  precision_run r{std::vector<float>(c.dy.size()), std::vector<float>(c.x.size()), std::vector<float>(B::param_count)};
  std::vector<float> ws(workspace_size<B>(rows) + 1);
  lockstep::testing::run_forward<B>(ctx, c.params.data(), c.x.data(), r.y.data(), ws.data(), rows, info);
  lockstep::testing::run_backward<B>(ctx, c.params.data(), c.x.data(), r.y.data(), c.dy.data(), r.dx.data(),
                                     r.dp.data(), ws.data(), rows, info);
  return r;
}

inline std::vector<double> weights(std::size_t n) {
  std::vector<double> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = std::cos(1.3 * static_cast<double>(i) + 0.1);
  return w;
}

template <class B>
std::vector<double> inputs(std::size_t rows) {
  std::vector<double> x(rows * B::input_size);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = layer_inputs<B>::value(i);
  return x;
}

/// Runs training forward and backward of B on `rows` rows split into n shards (the first rows %
/// n one row longer) on n threads sharing a row exchange, and checks that outputs, input
/// gradients and the state are bitwise those of one call on the whole batch, and so are the
/// parameter gradients summed over shards (a coupled layer writes global sums from one shard).
/// In a layer made of layers (one with `check_layers`: a sequential, a residual block), a
/// parameter to which several shards contribute their rows' parts (a layer around the coupled
/// one) sums to the whole up to the order of summation.
/// The elementwise checks of coupled_split_check, reported once over every split it is called for.
struct split_reports {
  element_report outputs{"outputs of the split batch vs one call", "split", "one call"};
  element_report inputs{"input gradient of the split batch vs one call", "split", "one call"};
  element_report grads{"parameter gradient summed over the shards vs one call", "summed", "one call"};
  /// Names the split the next elements come from.
  void context(const std::string& where) {
    outputs.context(where);
    inputs.context(where);
    grads.context(where);
  }
};

template <class B>
void coupled_split_check(std::size_t rows, std::size_t n, split_reports& reports) {
  reports.context(std::to_string(rows) + " rows over " + std::to_string(n) + " replicas");
  const pass_info info = suite_info<B>(true);
  const auto x = inputs<B>(rows);
  const auto w = weights(rows * B::output_size);
  layer_harness<B> whole;
  std::vector<double> y(rows * B::output_size), dx(rows * B::input_size), dp(B::param_count),
      ws(workspace_size<B>(rows) + 1);
  lockstep::testing::run_forward<B>(whole.ctx, whole.params.data(), x.data(), y.data(), ws.data(), rows, info);
  lockstep::testing::run_backward<B>(whole.ctx, whole.params.data(), x.data(), y.data(), w.data(), dx.data(), dp.data(), ws.data(), rows, info);

  lockstep::detail::host_row_exchange exchange(n, std::chrono::milliseconds(20'000));
  std::vector<layer_harness<B>> parts(n);
  std::vector<std::vector<double>> part_dp(n, std::vector<double>(B::param_count));
  std::vector<double> y2(y.size()), dx2(dx.size());
  std::vector<std::thread> threads;
  std::vector<std::string> failures(n);
  for (std::size_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        const std::size_t lo = r * (rows / n) + std::min(r, rows % n), len = rows / n + (r < rows % n ? 1 : 0);
        pass_info i = info;
        i.sample_offset = lo;
        i.global_rows = rows;
        i.exchange = &exchange;
        i.rank = r;
        std::vector<double> wsr(workspace_size<B>(len) + 1);
        lockstep::testing::run_forward<B>(parts[r].ctx, parts[r].params.data(), x.data() + lo * B::input_size, y2.data() + lo * B::output_size,
                   wsr.data(), len, i);
        lockstep::testing::run_backward<B>(parts[r].ctx, parts[r].params.data(), x.data() + lo * B::input_size, y2.data() + lo * B::output_size,
                    w.data() + lo * B::output_size, dx2.data() + lo * B::input_size, part_dp[r].data(), wsr.data(), len, i);
      } catch (const std::exception& e) {
        failures[r] = e.what();
        exchange.abort();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& f : failures) REQUIRE_MESSAGE(f.empty(), f);
  for (std::size_t i = 0; i < y.size(); ++i) reports.outputs.equal(i, y2[i], y[i]);
  for (std::size_t i = 0; i < dx.size(); ++i) reports.inputs.equal(i, dx2[i], dx[i]);
  constexpr bool composite = requires { B::template check_layers<double, host_context>(); };
  for (std::size_t k = 0; k < B::param_count; ++k) {
    double sum = part_dp[0][k];  // replicas' contributions, summed as a reducer would
    std::size_t contributors = part_dp[0][k] != 0 ? 1 : 0;
    for (std::size_t r = 1; r < n; ++r) {
      sum += part_dp[r][k];
      if (part_dp[r][k] != 0) ++contributors;
    }
    if (!composite || contributors <= 1)
      reports.grads.equal(k, sum, dp[k]);  // one shard wrote it all: bitwise
    else
      reports.grads.close(k, sum, dp[k], 1e-12 * std::max(1.0, std::abs(dp[k])));  // partial sums, added in another order
  }
  for (std::size_t r = 0; r < n; ++r) CHECK(parts[r].params == whole.params);  // state included
}

/// For a layer that reads and writes activations in bf16 (bf16_activations_v), under mixed<bf16>
/// on `rows` rows: whether forward_stored and backward_stored, given the inputs as bf16
/// encodings, compute the bits of forward and backward on their widened values, whether
/// forward_stored<void> writes the encodings of its outputs, and (for a layer that fuses a
/// following activation) whether forward_stored<relu_fn> writes the encodings of
/// forward_activated<relu_fn>'s outputs.
struct stored_results {
  bool forward = false;            ///< forward_stored<void> from x16 into y16: forward's outputs, and encoded
  bool activated = true;           ///< forward_stored<relu_fn> from x16 into y16: forward_activated's, encoded
  bool backward = false;           ///< backward_stored from x16: backward's gradients
};
template <class B>
stored_results stored_check(std::size_t rows) {
  host_context ctx(1, true, compute_precision::bf16);
  ctx.set_gemm_precision(compute_precision::bf16);
  float_case<B> c(rows);
  const float* params = c.params.data();
  const std::size_t nx = c.x.size(), ny = c.dy.size();
  std::vector<std::uint16_t> x16(nx), y16(ny), ref16(ny);
  backend::to_bf16_weights(c.x.data(), nx, x16.data());
  for (std::size_t i = 0; i < nx; ++i) c.x[i] = from_bf16_bits(x16[i]);  // the values the encodings hold
  std::vector<float> y_ref(ny), y(ny), dx_ref(nx), dx(nx), dp_ref(B::param_count), dp(B::param_count);
  std::vector<float> ws(workspace_size<B>(rows) + 1), ws2(ws.size());
  const pass_info info = suite_info<B>(true);
  using fargs = forward_args_for<float, host_context, B>;
  using bargs = backward_args_for<float, host_context, B>;
  stored_results r;
  B::forward(ctx, fargs{params, {c.x.data(), rows}, {y_ref.data(), rows}, ws.data(), info});
  B::template forward_stored<void>(ctx, fargs{params, {nullptr, rows}, {y.data(), rows}, ws2.data(), info}, x16.data(),
                                   y16.data());
  backend::to_bf16_weights(y_ref.data(), ny, ref16.data());
  r.forward = y == y_ref && y16 == ref16;  // its output kept in bf16 where the next layer reads bf16
  B::backward(ctx, bargs{params, {c.x.data(), rows}, {y_ref.data(), rows}, {c.dy.data(), rows}, {dx_ref.data(), rows},
                         dp_ref.data(), ws.data(), info});
  B::backward_stored(ctx, bargs{params, {nullptr, rows}, {y.data(), rows}, {c.dy.data(), rows}, {dx.data(), rows},
                                dp.data(), ws2.data(), info},
                     x16.data());
  r.backward = dx == dx_ref && dp == dp_ref;
  if constexpr (requires { typename B::fuses_activation; }) {
    B::template forward_activated<relu_fn>(ctx, fargs{params, {c.x.data(), rows}, {y_ref.data(), rows}, ws.data(), info});
    backend::to_bf16_weights(y_ref.data(), ny, ref16.data());
    B::template forward_stored<relu_fn>(ctx, fargs{params, {nullptr, rows}, {y.data(), rows}, ws2.data(), info},
                                        x16.data(), y16.data());
    r.activated = y16 == ref16 && y == y_ref;  // the fp32 results too: a next layer may read them
  }
  return r;
}

/// For a layer whose backward never reads its output (output_unread_v) or its input
/// (input_unread_v, `poison_input`): whether its backward on `rows` rows in training mode, given
/// an output (input) of NaNs, writes the bits it writes given what its forward read and computed.
template <class B>
bool unread_check(std::size_t rows, bool poison_input) {
  host_context ctx;
  const float_case<B> c(rows);
  std::vector<float> y(c.dy.size()), dx(c.x.size()), dp(B::param_count), dx2(dx.size()), dp2(dp.size());
  std::vector<float> ws(workspace_size<B>(rows) + 1);
  const pass_info info = suite_info<B>(true);
  run_forward<B>(ctx, c.params.data(), c.x.data(), y.data(), ws.data(), rows, info);
  const std::vector<float> kept = ws;  // forward's workspace, for the second backward
  run_backward<B>(ctx, c.params.data(), c.x.data(), y.data(), c.dy.data(), dx.data(), dp.data(), ws.data(), rows, info);
  ws = kept;
  std::vector<float> x = c.x;
  std::vector<float>& poisoned = poison_input ? x : y;
  std::fill(poisoned.begin(), poisoned.end(), std::numeric_limits<float>::quiet_NaN());
  run_backward<B>(ctx, c.params.data(), x.data(), y.data(), c.dy.data(), dx2.data(), dp2.data(), ws.data(), rows, info);
  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
  };
  return same_bits(dx, dx2) && same_bits(dp, dp2);
}

/// `info` placed as a strategy places a shard: its rows start at row `sample_offset` of a global
/// batch of `global_rows` rows, after `update_offset` rows of the update's earlier batches.
inline pass_info placed(pass_info info, std::size_t sample_offset, std::size_t global_rows,
                        std::size_t update_offset) {
  info.sample_offset = sample_offset;
  info.global_rows = global_rows;
  info.update_offset = update_offset;
  return info;
}

/// The pass_info of a shard that a strategy makes: bound layer B's `info` for rows that start at
/// row 5 of a global batch of rows + 9, in the fourth batch of an accumulated update (a layer
/// that keys randomness by local rows, or ignores the update's earlier rows, then fails the
/// checks that use it). Layers that couple rows are checked on shards through a row exchange.
inline pass_info shard_info(pass_info info, std::size_t rows) { return placed(info, 5, rows + 9, 3 * (rows + 9)); }

}  // namespace detail

}  // namespace lockstep::testing

/// The conformance suite of a bound layer B (see this file's comment).
TEST_CASE_TEMPLATE_DEFINE("lockstep layer conformance", B, lockstep_layer_conformance) {
  namespace lt = lockstep::testing;
  static_assert(lockstep::bound_layer_for<B, double, lockstep::host_context>,
                "the layer suite runs the bound layer in double on the host");
  const lt::gradient_tolerance tol{};

  // A layer made of layers (a sequential, a residual block) is transparent to the policy: each of
  // its layers is checked on its own, since its composition can move a value across a kink (relu)
  // by one rounding, which no tolerance bounds.
  constexpr bool container = requires { B::template check_layers<float, lockstep::host_context>(); };
  if constexpr (lockstep::mixed_precision_v<B> && !container &&
                lockstep::bound_layer_for<B, float, lockstep::host_context>) {
    SUBCASE("under mixed<bf16> and mixed<fp16>: outputs and gradients within the format's tolerance of fp32's on rounded inputs") {
      struct format {
        lockstep::compute_precision policy;
        float (*round)(float);
        int significant_bits;
      };
      for (const format f : {format{lockstep::compute_precision::bf16, lockstep::round_to_bf16, 8},
                             format{lockstep::compute_precision::fp16, lockstep::round_to_fp16, 11}})
        for (const std::size_t rows : {std::size_t{1}, std::size_t{7}, std::size_t{64}}) {
          CAPTURE(f.significant_bits);
          CAPTURE(rows);
          const lockstep::pass_info info = lt::suite_info<B>(true);
          const auto ref = lt::detail::run_in_precision<B>(lockstep::compute_precision::fp32, f.round, rows, info);
          const auto got = lt::detail::run_in_precision<B>(f.policy, f.round, rows, info);
          // The longest sum: a row's input (forward, input gradient) or the batch (parameter gradients).
          const double tol = lt::mixed_precision_tolerance(std::max<std::size_t>(B::input_size, rows * B::output_size),
                                                           f.significant_bits);
          CHECK(lt::detail::normwise_difference(got.y, ref.y) <= tol);
          CHECK(lt::detail::normwise_difference(got.dx, ref.dx) <= tol);
          CHECK(lt::detail::normwise_difference(got.dp, ref.dp) <= tol);
        }
    }
  }

  if constexpr (lockstep::bf16_activations_v<B> && lockstep::bound_layer_for<B, float, lockstep::host_context>) {
    SUBCASE("bf16 activations: forward_stored and backward_stored give the bits of forward and backward on the widened encodings") {
      for (const std::size_t rows : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{64}}) {
        CAPTURE(rows);
        const auto r = lt::detail::stored_check<B>(rows);
        CHECK(r.forward);
        CHECK(r.activated);
        CHECK(r.backward);
      }
    }
  }

  if constexpr (lockstep::output_unread_v<B> && lockstep::bound_layer_for<B, float, lockstep::host_context>) {
    SUBCASE("backward_reads_output = false: backward given an output of NaNs writes the same bits") {
      for (const std::size_t rows : {std::size_t{1}, std::size_t{7}, std::size_t{64}}) {
        CAPTURE(rows);
        CHECK(lt::detail::unread_check<B>(rows, false));
      }
    }
  }

  if constexpr (lockstep::input_unread_v<B> && lockstep::bound_layer_for<B, float, lockstep::host_context>) {
    SUBCASE("backward_reads_input = false: backward given an input of NaNs writes the same bits") {
      for (const std::size_t rows : {std::size_t{1}, std::size_t{7}, std::size_t{64}}) {
        CAPTURE(rows);
        CHECK(lt::detail::unread_check<B>(rows, true));
      }
    }
  }

  SUBCASE("gradients of inputs and parameters match central finite differences (batch 0, 1, 7, 64)") {
    // One report per check over every mode and batch size: the first failing elements with their
    // numbers, and how many more.
    lt::element_report param_report("parameter gradient vs central finite differences", "analytic", "numeric");
    lt::element_report input_report("input gradient vs central finite differences", "analytic", "numeric");
    lt::element_report nodx_report("parameter gradient without dx vs with dx", "without dx", "with dx");
    // evaluation; training on a whole batch; training on a shard of a global batch in a later
    // batch of an accumulated update (pass_info's offsets set as a strategy sets them)
    for (const int mode : {0, 1, 2}) {
      const bool training = mode > 0;
      if (mode == 2 && lockstep::couples_rows_v<B>) continue;  // its shards are checked through a row exchange
      for (const std::size_t rows : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{64}}) {
        CAPTURE(mode);
        CAPTURE(rows);
        const std::string where = std::string(mode == 0 ? "evaluation" : mode == 1 ? "training" : "training, a shard at offsets") +
                                  ", " + std::to_string(rows) + " rows";
        param_report.context(where);
        input_report.context(where);
        nodx_report.context(where);
        const lockstep::pass_info info =
            mode == 2 ? lt::detail::shard_info(lt::suite_info<B>(true), rows) : lt::suite_info<B>(training);
        lt::detail::layer_harness<B> h;
        const auto x = lt::detail::inputs<B>(rows);
        const auto w = lt::detail::weights(rows * B::output_size);
        std::vector<double> ws, dx(rows * B::input_size + 1, -7.0), dp(B::param_count + 1, -7.0);
        const auto y = h.forward_backward(x.data(), w.data(), rows, info, ws, dx.data(), dp.data());
        CHECK(dx.back() == -7.0);  // nothing written past the input gradient
        CHECK(dp.back() == -7.0);  // nor past the parameter gradient
        // Parameters: probe the first and last few and some spread over the buffer.
        for (const std::size_t k : lt::detail::probe_indices(B::param_count)) {
          auto a = h.params, b = h.params;
          a[k] += tol.step;
          b[k] -= tol.step;
          const double numeric = (h.objective(a, x, w, rows, info) - h.objective(b, x, w, rows, info)) / (2 * tol.step);
          // also: backward OVERWRITES (-7 is gone)
          param_report.close(k, dp[k], numeric, tol.relative * std::max(1.0, std::abs(numeric)));
        }
        // Inputs: likewise.
        for (const std::size_t k : lt::detail::probe_indices(x.size())) {
          auto a = x, b = x;
          a[k] += tol.step;
          b[k] -= tol.step;
          const double numeric =
              (h.objective(h.params, a, w, rows, info) - h.objective(h.params, b, w, rows, info)) / (2 * tol.step);
          input_report.close(k, dx[k], numeric, tol.relative * std::max(1.0, std::abs(numeric)));
        }
        // Without dx the parameter gradient is the same and nothing is written to the input side
        // (a layer that writes through a null dx crashes here: the report names this check).
        INFO("backward with dx = null (as a model's first layer gets it): the layer must not write dx");
        std::vector<double> dp2(B::param_count + 1, 3.0);
        lockstep::testing::run_backward<B>(h.ctx, h.params.data(), x.data(), y.data(), w.data(), static_cast<double*>(nullptr), dp2.data(),
                    ws.data(), rows, info);
        for (std::size_t k = 0; k < B::param_count; ++k)
          nodx_report.close(k, dp2[k], dp[k], 1e-12 * (1.0 + std::max(std::abs(dp2[k]), std::abs(dp[k]))));
      }
    }
    CHECK_MESSAGE(param_report.ok(), param_report.text());
    CHECK_MESSAGE(input_report.ok(), input_report.text());
    CHECK_MESSAGE(nodx_report.ok(), nodx_report.text());
  }

  if constexpr (lockstep::accumulates_gradients_v<B> && B::param_count > 0) {
    SUBCASE("accumulates_gradients: backward with pass_info::accumulate adds the batch's parameter gradient to dparams") {
      lt::element_report added("dparams after an accumulating backward vs what it held + the batch's gradient",
                               "accumulated", "held + batch");
      for (const std::size_t rows : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{64}}) {
        added.context(std::to_string(rows) + " rows");
        lt::detail::layer_harness<B> h;
        const lockstep::pass_info info = lt::suite_info<B>(true);
        const auto x = lt::detail::inputs<B>(rows);
        const auto w = lt::detail::weights(rows * B::output_size);
        std::vector<double> ws, dx(rows * B::input_size + 1), fresh(B::param_count + 1), held(B::param_count + 1);
        (void)h.forward_backward(x.data(), w.data(), rows, info, ws, dx.data(), fresh.data());
        for (std::size_t k = 0; k < B::param_count; ++k) held[k] = std::cos(0.9 * static_cast<double>(k) + 0.2);
        std::vector<double> acc = held;
        lockstep::pass_info adding = info;
        adding.accumulate = true;
        (void)h.forward_backward(x.data(), w.data(), rows, adding, ws, dx.data(), acc.data());
        for (std::size_t k = 0; k < B::param_count; ++k)
          added.close(k, acc[k], held[k] + fresh[k], 1e-12 * std::max(1.0, std::abs(held[k] + fresh[k])));
      }
      CHECK_MESSAGE(added.ok(), added.text());
    }
  }

  SUBCASE("init writes exactly param_count elements and is a pure function of its generator") {
    std::vector<double> a(B::param_count + 2, 123.0), b(B::param_count + 2, -5.0);
    B::init(a.data() + 1, lockstep::counter_rng(9, 2));
    B::init(b.data() + 1, lockstep::counter_rng(9, 2));
    CHECK(a.front() == 123.0);
    CHECK(a.back() == 123.0);
    lt::element_report same("init twice from one generator", "first", "second");
    lt::element_report finite("init writes finite values", "value");
    for (std::size_t k = 0; k < B::param_count; ++k) {
      same.equal(k, a[k + 1], b[k + 1]);
      finite.holds(k, std::isfinite(a[k + 1]), a[k + 1]);
    }
    CHECK_MESSAGE(same.ok(), same.text());
    CHECK_MESSAGE(finite.ok(), finite.text());
    if constexpr (requires { B::param_offsets; B::params; }) {
      std::size_t acc = 0;
      for (std::size_t i = 0; i < B::params.size(); ++i) {
        CHECK(B::param_offsets[i] == acc);
        acc += B::params[i];
      }
      CHECK(acc == B::param_count);
    }
  }

  SUBCASE("forward is deterministic in both modes and leaves its input alone") {
    for (const bool training : {false, true}) {
      CAPTURE(training);
      const lockstep::pass_info info = lt::suite_info<B>(training);
      lt::detail::layer_harness<B> h;
      const auto x = lt::detail::inputs<B>(13);
      const auto x0 = x;
      const auto y1 = h.forward(h.params, x, 13, info);
      const auto y2 = h.forward(h.params, x, 13, info);
      CHECK(x == x0);
      CHECK(y1 == y2);
      lt::element_report finite("forward writes finite outputs", "output");
      for (std::size_t i = 0; i < y1.size(); ++i) finite.holds(i, std::isfinite(y1[i]), y1[i]);
      CHECK_MESSAGE(finite.ok(), finite.text());
    }
  }

#if defined(LOCKSTEP_TESTING_COUNT_ALLOCATIONS)
  SUBCASE("after the first step, forward and backward allocate nothing on the heap") {
    lt::detail::layer_harness<B> h;
    constexpr std::size_t rows = 33;
    const auto x = lt::detail::inputs<B>(rows);
    const auto w = lt::detail::weights(rows * B::output_size);
    std::vector<double> y(rows * B::output_size), ws(lt::detail::workspace_size<B>(rows) + 1), dx(rows * B::input_size),
        dp(B::param_count + 1);
    const lockstep::pass_info info = lt::suite_info<B>(true);
    const auto step = [&] {
      lockstep::testing::run_forward<B>(h.ctx, h.params.data(), x.data(), y.data(), ws.data(), rows, info);
      lockstep::testing::run_backward<B>(h.ctx, h.params.data(), x.data(), y.data(), w.data(), dx.data(), dp.data(), ws.data(), rows, info);
    };
    step();  // the first step may set things up
    const lt::allocation_window window;
    step();
    step();
    CHECK(window.count() == 0);
  }
#endif

  if constexpr (!lockstep::couples_rows_v<B>) {
    SUBCASE("micro-shard invariance: a row's output and input gradient do not depend on the other rows or on the split, "
            "and the shards' parameter gradients sum to the whole batch's") {
      lt::element_report split("a row's output, computed in two shards vs in the whole batch", "in a shard",
                               "in the whole batch");
      lt::element_report split_dx("a row's input gradient, computed in two shards vs in the whole batch", "in a shard",
                                  "in the whole batch");
      lt::element_report split_dp("the parameter gradient summed over two shards vs the whole batch's", "summed",
                                  "whole batch");
      for (const bool training : {false, true}) {
        CAPTURE(training);
        constexpr std::size_t rows = 29;
        // training: the third batch of an accumulated update
        const lockstep::pass_info info = lt::detail::placed(lt::suite_info<B>(training), 0, rows, training ? 2 * rows : 0);
        lt::detail::layer_harness<B> h;
        const auto x = lt::detail::inputs<B>(rows);
        const auto w = lt::detail::weights(rows * B::output_size);
        // One forward and backward of `n` rows from row `first` (its sample_offset).
        const auto run = [&](std::size_t first, std::size_t n, std::vector<double>& y, std::vector<double>& dx,
                             std::vector<double>& dp) {
          lockstep::pass_info i = info;
          i.sample_offset = info.sample_offset + first;  // as a strategy keys each shard
          dx.assign(n * B::input_size, 0.0);
          dp.assign(B::param_count, 0.0);
          std::vector<double> ws;
          y = h.forward_backward(x.data() + first * B::input_size, w.data() + first * B::output_size, n, i, ws, dx.data(),
                                 dp.data());
        };
        std::vector<double> y, dx, dp, ya, dxa, dpa, yb, dxb, dpb;
        run(0, rows, y, dx, dp);
        for (const std::size_t cut : {std::size_t{1}, std::size_t{10}, std::size_t{28}}) {
          const std::string where = std::string(training ? "training" : "evaluation") + ", cut after row " + std::to_string(cut);
          split.context(where);
          split_dx.context(where);
          split_dp.context(where);
          run(0, cut, ya, dxa, dpa);
          run(cut, rows - cut, yb, dxb, dpb);
          for (std::size_t i = 0; i < y.size(); ++i) {
            const double part = i < ya.size() ? ya[i] : yb[i - ya.size()];
            split.close(i, part, y[i], 1e-12 * std::max(1.0, std::abs(y[i])));
          }
          for (std::size_t i = 0; i < dx.size(); ++i) {
            const double part = i < dxa.size() ? dxa[i] : dxb[i - dxa.size()];
            split_dx.close(i, part, dx[i], 1e-12 * std::max(1.0, std::abs(dx[i])));
          }
          for (std::size_t k = 0; k < dp.size(); ++k)
            split_dp.close(k, dpa[k] + dpb[k], dp[k], 1e-11 * std::max(1.0, std::abs(dp[k])));
        }
      }
      CHECK_MESSAGE(split.ok(), split.text());
      CHECK_MESSAGE(split_dx.ok(), split_dx.text());
      CHECK_MESSAGE(split_dp.ok(), split_dp.text());
    }
    SUBCASE("a row's randomness follows its place in the update: a shard at update_offset U and sample_offset S gives "
            "the rows [U + S, U + S + n) of one pass over U + S + n rows") {
      // Gradient accumulation keys a row by update_offset + sample_offset + its row (pass_info): a
      // layer that ignores update_offset draws the same masks in every batch of an update, and
      // accumulating N batches then differs from one batch of all their rows.
      lt::element_report shard_y("a shard's output vs the same rows of one pass over the update", "in the shard",
                                 "in one pass");
      lt::element_report shard_dx("a shard's input gradient vs the same rows of one pass over the update", "in the shard",
                                  "in one pass");
      for (const std::size_t n : {std::size_t{1}, std::size_t{7}}) {
        // earlier batches' rows (a prime: a mask periodic in the row would not hide the offset), then
        // earlier shards' rows
        constexpr std::size_t update = 23, offset = 5;
        const std::size_t total = update + offset + n;
        const lockstep::pass_info whole = lt::detail::placed(lt::suite_info<B>(true), 0, total, 0);
        // in a batch of offset + n + 3 rows
        const lockstep::pass_info shard = lt::detail::placed(lt::suite_info<B>(true), offset, offset + n + 3, update);
        lt::detail::layer_harness<B> h;
        const auto x = lt::detail::inputs<B>(total);
        const auto w = lt::detail::weights(total * B::output_size);
        std::vector<double> ws, dx(total * B::input_size), dp(B::param_count + 1), sdx(n * B::input_size),
            sdp(B::param_count + 1);
        const auto y = h.forward_backward(x.data(), w.data(), total, whole, ws, dx.data(), dp.data());
        const std::size_t first = update + offset;
        const auto sy = h.forward_backward(x.data() + first * B::input_size, w.data() + first * B::output_size, n, shard,
                                           ws, sdx.data(), sdp.data());
        const std::string where = std::to_string(n) + " rows at update_offset " + std::to_string(update) +
                                  ", sample_offset " + std::to_string(offset);
        shard_y.context(where);
        shard_dx.context(where);
        for (std::size_t i = 0; i < sy.size(); ++i) {
          const double ref = y[first * B::output_size + i];
          shard_y.close(i, sy[i], ref, 1e-12 * std::max(1.0, std::abs(ref)));
        }
        for (std::size_t i = 0; i < sdx.size(); ++i) {
          const double ref = dx[first * B::input_size + i];
          shard_dx.close(i, sdx[i], ref, 1e-12 * std::max(1.0, std::abs(ref)));
        }
      }
      CHECK_MESSAGE(shard_y.ok(), shard_y.text());
      CHECK_MESSAGE(shard_dx.ok(), shard_dx.text());
    }
  } else {
    SUBCASE("a layer that couples rows: split over 1 to 4 replicas through a row exchange, bitwise one device") {
      lt::detail::split_reports reports;
      for (const std::size_t rows : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{29}})
        for (std::size_t n = 1; n <= 4; ++n) {
          CAPTURE(rows);
          CAPTURE(n);
          lt::detail::coupled_split_check<B>(rows, n, reports);
        }
      CHECK_MESSAGE(reports.outputs.ok(), reports.outputs.text());
      CHECK_MESSAGE(reports.inputs.ok(), reports.inputs.text());
      CHECK_MESSAGE(reports.grads.ok(), reports.grads.text());
    }
  }
}
