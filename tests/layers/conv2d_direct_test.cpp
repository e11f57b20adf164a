// conv2d against a direct convolution (the defining sums, one loop per index) over many
// geometries: strides 1 to 5, every padding below the kernel, 1 x 1 kernels, windows larger than
// the image, prime and uneven sizes, batches 0, 1 and more. Also: nothing read from workspace the
// layer did not write in the same call (backward recomputes what it needs from x), nothing written
// past the outputs, the same parameter gradient with and without dx, and bitwise repeatable results.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <lockstep/layers.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/testing/drive.hpp>

#include "support/random.hpp"

namespace ls = lockstep;

namespace {

template <class T>
std::vector<T> random_values(std::size_t n, std::uint64_t stream) {
  return test_support::random_vector<T>(n, stream, T(-1), T(1), 91);
}

/// Everything one forward + backward of B produces, from fixed inputs.
template <class T>
struct outputs {
  std::vector<T> y, dparams, dx, dparams_without_dx;
};

/// Runs B forward and backward (with and without dx) on `batch` images. The workspace is filled
/// with `junk` (NaN by default) before each call, so a value read from it that the call did not
/// write shows up, and one guard element past each output must survive.
template <class B, class T>
outputs<T> run_layer(const std::vector<T>& params, const std::vector<T>& x, const std::vector<T>& dy, std::size_t batch,
                     ls::compute_precision policy, bool onednn, T junk = std::numeric_limits<T>::quiet_NaN()) {
  ls::host_context ctx(1, true, policy);
  ctx.set_gemm_precision(policy);
  ctx.set_onednn_convolutions(onednn);
  const T nan = std::numeric_limits<T>::quiet_NaN(), guard = T(12345);
  const std::size_t ws_size = batch * B::workspace_per_sample + B::workspace_fixed;
  std::vector<T> ws(ws_size + 1);
  auto poison = [&] { std::fill(ws.begin(), ws.end(), junk); };
  outputs<T> o;
  o.y.assign(batch * B::output_size + 1, nan);
  o.dparams.assign(B::param_count + 1, nan);
  o.dx.assign(batch * B::input_size + 1, nan);
  o.dparams_without_dx.assign(B::param_count + 1, nan);
  o.y.back() = o.dparams.back() = o.dx.back() = o.dparams_without_dx.back() = guard;
  const ls::pass_info info{.training = true, .seed = 3, .step = 1};
  poison();
  lockstep::testing::run_forward<B>(ctx, params.data(), x.data(), o.y.data(), ws.data(), batch, info);
  poison();
  lockstep::testing::run_backward<B>(ctx, params.data(), x.data(), o.y.data(), dy.data(), o.dx.data(), o.dparams.data(), ws.data(), batch,
              info);
  poison();
  lockstep::testing::run_backward<B>(ctx, params.data(), x.data(), o.y.data(), dy.data(), static_cast<T*>(nullptr),
              o.dparams_without_dx.data(), ws.data(), batch, info);
  CHECK(o.y.back() == guard);
  CHECK(o.dparams.back() == guard);
  CHECK(o.dx.back() == guard);
  CHECK(o.dparams_without_dx.back() == guard);
  o.y.pop_back();
  o.dparams.pop_back();
  o.dx.pop_back();
  o.dparams_without_dx.pop_back();
  return o;
}

bool same_bits(const auto& a, const auto& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0);
}

/// conv2d<F, K, S, Pd> on shape<C, H, W> at `batch` against the direct sums, in precision T, on a
/// context of precision policy `policy`. Under mixed<bf16> the parameters, images and output
/// gradients are bf16 values to begin with, so that the products are exact and only the fp32 sums
/// round, as under fp32. With `onednn` false the context keeps the convolution on im2col + GEMM.
template <class T, std::size_t F, std::size_t K, std::size_t S, std::size_t Pd, std::size_t C, std::size_t H,
          std::size_t W>
void check_direct(std::size_t batch, ls::compute_precision policy = ls::compute_precision::fp32, bool onednn = true) {
  using B = ls::bind_shape_t<ls::conv2d<F, K, S, Pd>, ls::shape<C, H, W>>;
  constexpr std::size_t OH = B::OH, OW = B::OW;
  static_assert(OH == (H + 2 * Pd - K) / S + 1 && OW == (W + 2 * Pd - K) / S + 1);
  static_assert(B::param_count == F * C * K * K + F && B::output_size == F * OH * OW);
  CAPTURE(F);
  CAPTURE(K);
  CAPTURE(S);
  CAPTURE(Pd);
  CAPTURE(C);
  CAPTURE(H);
  CAPTURE(W);
  CAPTURE(batch);
  auto params = random_values<T>(B::param_count, 1);
  auto x = random_values<T>(batch * B::input_size, 2);
  auto dy = random_values<T>(batch * B::output_size, 3);
  if constexpr (std::is_same_v<T, float>)
    if (policy == ls::compute_precision::bf16)
      for (auto* v : {&params, &x, &dy})
        for (float& e : *v) e = ls::round_to_bf16(e);
  CAPTURE(onednn);
  const outputs<T> got = run_layer<B>(params, x, dy, batch, policy, onednn);

  // Direct sums in long double: wi(f, c, kr, kc), xi(b, c, y, x), dyi(b, f, oy, ox).
  auto wi = [&](std::size_t f, std::size_t c, std::size_t kr, std::size_t kc) {
    return static_cast<long double>(params[((f * C + c) * K + kr) * K + kc]);
  };
  std::vector<long double> y(batch * B::output_size), dw(B::param_count, 0.0L), dx(batch * B::input_size, 0.0L);
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t f = 0; f < F; ++f)
      for (std::size_t oy = 0; oy < OH; ++oy)
        for (std::size_t ox = 0; ox < OW; ++ox) {
          const std::size_t o = ((b * F + f) * OH + oy) * OW + ox;
          long double s = params[F * C * K * K + f];
          dw[F * C * K * K + f] += dy[o];
          for (std::size_t c = 0; c < C; ++c)
            for (std::size_t kr = 0; kr < K; ++kr)
              for (std::size_t kc = 0; kc < K; ++kc) {
                const long yy = static_cast<long>(oy * S + kr) - static_cast<long>(Pd);
                const long xx = static_cast<long>(ox * S + kc) - static_cast<long>(Pd);
                if (yy < 0 || xx < 0 || yy >= static_cast<long>(H) || xx >= static_cast<long>(W)) continue;
                const std::size_t i = ((b * C + c) * H + static_cast<std::size_t>(yy)) * W + static_cast<std::size_t>(xx);
                s += wi(f, c, kr, kc) * x[i];
                dw[((f * C + c) * K + kr) * K + kc] += static_cast<long double>(dy[o]) * x[i];
                dx[i] += wi(f, c, kr, kc) * dy[o];
              }
          y[o] = s;
        }

  // Each result is a sum of at most (terms) products of values in [-1, 1].
  const double terms = static_cast<double>(std::max({C * K * K + 1, batch * OH * OW, F * K * K, std::size_t{1}}));
  const double tol = (std::is_same_v<T, float> ? 1e-6 : 1e-14) * terms;
  auto check_close = [&](const std::vector<T>& a, const std::vector<long double>& e, const std::string& what) {
    REQUIRE(a.size() == e.size());
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(a[i]) - static_cast<double>(e[i])));
    CAPTURE(what);
    CHECK(worst <= tol);
  };
  check_close(got.y, y, "y");
  check_close(got.dparams, dw, "dparams");
  check_close(got.dx, dx, "dx");
  CHECK(same_bits(got.dparams_without_dx, got.dparams));

  // Bitwise repeatable, whatever the workspace held before.
  const outputs<T> again = run_layer<B>(params, x, dy, batch, policy, onednn, T(-3.5));
  CHECK(same_bits(again.y, got.y));
  CHECK(same_bits(again.dparams, got.dparams));
  CHECK(same_bits(again.dx, got.dx));
}

template <class T>
void check_geometries(std::size_t batch, ls::compute_precision p = ls::compute_precision::fp32, bool onednn = true) {
  check_direct<T, 3, 3, 1, 1, 2, 5, 7>(batch, p, onednn);    // "same" 3 x 3
  check_direct<T, 4, 5, 1, 2, 3, 11, 13>(batch, p, onednn);  // "same" 5 x 5, prime sizes
  check_direct<T, 2, 3, 1, 0, 1, 3, 3>(batch, p, onednn);    // "valid": a single output
  check_direct<T, 5, 1, 1, 0, 3, 4, 6>(batch, p, onednn);    // 1 x 1
  check_direct<T, 3, 3, 2, 1, 2, 9, 8>(batch, p, onednn);    // stride 2
  check_direct<T, 2, 4, 3, 0, 2, 11, 16>(batch, p, onednn);  // stride 3, rows left over
  check_direct<T, 2, 4, 3, 3, 2, 11, 16>(batch, p, onednn);  // stride 3, padding K - 1
  check_direct<T, 3, 5, 2, 4, 2, 5, 5>(batch, p, onednn);    // padding wider than half the window
  check_direct<T, 2, 7, 1, 3, 1, 3, 3>(batch, p, onednn);    // window larger than the image
  check_direct<T, 2, 3, 5, 1, 3, 13, 9>(batch, p, onednn);   // stride larger than the window
  check_direct<T, 1, 2, 1, 1, 1, 1, 1>(batch, p, onednn);    // 1 x 1 image, even window
  check_direct<T, 6, 5, 1, 2, 8, 7, 7>(batch, p, onednn);    // more channels than positions
  // 8 and more input channels: oneDNN's primitives for float in the oneDNN build
  check_direct<T, 16, 3, 1, 1, 8, 5, 7>(batch, p, onednn);   // "same" 3 x 3
  check_direct<T, 5, 5, 1, 2, 9, 11, 13>(batch, p, onednn);  // "same" 5 x 5, prime sizes and channels
  check_direct<T, 4, 3, 2, 1, 16, 9, 8>(batch, p, onednn);   // stride 2
  check_direct<T, 3, 4, 3, 0, 8, 11, 16>(batch, p, onednn);  // stride 3, rows left over
  check_direct<T, 3, 4, 3, 3, 8, 11, 16>(batch, p, onednn);  // stride 3, padding K - 1
  check_direct<T, 3, 5, 2, 4, 8, 5, 5>(batch, p, onednn);    // padding wider than half the window
  check_direct<T, 2, 7, 1, 3, 8, 3, 3>(batch, p, onednn);    // window larger than the image
  check_direct<T, 3, 3, 5, 1, 12, 13, 9>(batch, p, onednn);  // stride larger than the window
  check_direct<T, 7, 1, 1, 0, 32, 4, 6>(batch, p, onednn);   // 1 x 1
  check_direct<T, 2, 2, 1, 1, 8, 1, 1>(batch, p, onednn);    // 1 x 1 image, even window
}

}  // namespace

TEST_CASE_TEMPLATE("conv2d matches the direct convolution: outputs, parameter and input gradients", T, float, double) {
  for (std::size_t batch : {0u, 1u, 2u, 5u}) check_geometries<T>(batch);
}

TEST_CASE("conv2d kept on im2col + GEMM by its context matches the direct convolution in every build") {
  // In the oneDNN build, the shapes with 8 or more input channels would otherwise take oneDNN.
  for (std::size_t batch : {0u, 1u, 2u, 5u}) check_geometries<float>(batch, ls::compute_precision::fp32, false);
}

TEST_CASE("conv2d under mixed<bf16> matches the direct convolution of bf16 operands: outputs, parameter and input gradients") {
  // oneDNN's bf16 primitives in the oneDNN build on CPUs with bf16 instructions for 8 or more
  // input channels; im2col + the bf16 GEMM otherwise.
  for (std::size_t batch : {0u, 1u, 2u, 5u}) check_geometries<float>(batch, ls::compute_precision::bf16);
}

TEST_CASE("conv2d under mixed<bf16> rounds its operands to bf16: the output is fp32's on the rounded images and filters") {
  // 16 input channels: oneDNN's bf16 primitives where the CPU has bf16 instructions.
  using B = ls::bind_shape_t<ls::conv2d<8, 3, 1, 1>, ls::shape<16, 7, 6>>;
  constexpr std::size_t batch = 3;
  auto params = random_values<float>(B::param_count, 4);
  const auto x = random_values<float>(batch * B::input_size, 5);
  // Biases that bf16 holds exactly: im2col's GEMM rounds them with the filters, oneDNN keeps fp32.
  for (std::size_t f = 0; f < 8; ++f) params[B::param_count - 1 - f] = ls::round_to_bf16(params[B::param_count - 1 - f]);
  auto rounded_params = params, rounded_x = x;
  for (float& v : rounded_params) v = ls::round_to_bf16(v);
  for (float& v : rounded_x) v = ls::round_to_bf16(v);
  auto forward = [&](ls::compute_precision policy, const std::vector<float>& p, const std::vector<float>& in) {
    ls::host_context ctx(1, true, policy);
    ctx.set_gemm_precision(policy);
    std::vector<float> y(batch * B::output_size), ws(B::workspace_fixed);
    lockstep::testing::run_forward<B>(ctx, p.data(), in.data(), y.data(), ws.data(), batch, ls::pass_info{});
    return y;
  };
  const auto y16 = forward(ls::compute_precision::bf16, params, x);
  const auto y_rounded = forward(ls::compute_precision::fp32, rounded_params, rounded_x);
  const auto y32 = forward(ls::compute_precision::fp32, params, x);
  double to_rounded = 0, to_fp32 = 0;
  for (std::size_t i = 0; i < y16.size(); ++i) {
    to_rounded = std::max(to_rounded, std::abs(static_cast<double>(y16[i]) - y_rounded[i]));
    to_fp32 = std::max(to_fp32, std::abs(static_cast<double>(y16[i]) - y32[i]));
  }
  CHECK(to_rounded <= 1e-5);  // fp32 sums of 145 terms
  CHECK(to_fp32 > 1e-4);  // bf16's rounding of 144 products shows
}

TEST_CASE("conv2d keeps nothing per image and needs one image's columns of workspace") {
  using B = ls::bind_shape_t<ls::conv2d<64, 5, 1, 2>, ls::shape<32, 14, 14>>;
  static_assert(B::workspace_per_sample == 0);
  // columns with a row of ones, one padded image, the filters with their biases
  static_assert(B::workspace_fixed == (32 * 25 + 1) * 196 + 32 * 18 * 18 + (32 * 25 + 1) * 64);
  check_direct<float, 64, 5, 1, 2, 32, 14, 14>(3);  // the tutorial CNN's second convolution
  check_direct<float, 32, 5, 1, 2, 1, 28, 28>(2);   // and its first
}

TEST_CASE("conv2d runs through oneDNN's primitives in the oneDNN build for float with 8 or more input channels, once per batch size") {
#if !defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  MESSAGE("skipped: this build's host kernels are OpenBLAS's (conv2d is im2col + GEMM for every shape)");
#else
  using wide = ls::bind_shape_t<ls::conv2d<4, 3, 1, 1>, ls::shape<ls::onednn_conv_min_channels, 6, 5>>;
  using narrow = ls::bind_shape_t<ls::conv2d<4, 3, 1, 1>, ls::shape<ls::onednn_conv_min_channels - 1, 6, 5>>;
  static_assert(wide::onednn_capable<float, ls::host_context> && !wide::onednn_capable<double, ls::host_context>);
  static_assert(!narrow::onednn_capable<float, ls::host_context>);
  auto run = [](auto bound, ls::host_context& ctx, std::size_t batch) {
    using B = decltype(bound);
    const auto params = random_values<float>(B::param_count, 1);
    const auto x = random_values<float>(batch * B::input_size, 2);
    const auto dy = random_values<float>(batch * B::output_size, 3);
    std::vector<float> y(batch * B::output_size), dparams(B::param_count), dx(batch * B::input_size);
    std::vector<float> ws(batch * B::workspace_per_sample + B::workspace_fixed);
    const ls::pass_info info{.training = true, .seed = 3, .step = 1};
    lockstep::testing::run_forward<B>(ctx, params.data(), x.data(), y.data(), ws.data(), batch, info);
    lockstep::testing::run_backward<B>(ctx, params.data(), x.data(), y.data(), dy.data(), dx.data(), dparams.data(),
                                       ws.data(), batch, info);
    y.insert(y.end(), dparams.begin(), dparams.end());  // everything the passes wrote, in one vector
    y.insert(y.end(), dx.begin(), dx.end());
    return y;
  };
  ls::host_context ctx(1);
  run(narrow{}, ctx, 3);
  CHECK(ctx.conv_cache().shapes() == 0);
  ctx.set_onednn_convolutions(false);  // im2col + GEMM for every shape
  run(wide{}, ctx, 3);
  CHECK(ctx.conv_cache().shapes() == 0);
  ctx.set_onednn_convolutions(true);
  for (std::size_t batch : {3u, 3u, 5u, 3u, 5u}) run(wide{}, ctx, batch);
  CHECK(ctx.conv_cache().shapes() == 2);  // batches 3 and 5
  MESSAGE("oneDNN convolution: ", ctx.conv_cache().last_implementation());
  // At most batch_sizes_kept batch sizes per convolution: another evicts the least recently used,
  // which comes back with the same bits.
  constexpr std::size_t kept = ls::backend::detail::onednn_conv_cache::batch_sizes_kept;
  const auto three = run(wide{}, ctx, 3);
  for (std::size_t batch : {1u, 2u, 4u, 6u, 7u, 9u, 10u, 11u, 12u}) {
    CAPTURE(batch);
    (void)run(wide{}, ctx, batch);
    CHECK(ctx.conv_cache().shapes() <= kept);
  }
  CHECK(ctx.conv_cache().shapes() == kept);
  CHECK(run(wide{}, ctx, 3) == three);
  // Under mixed<bf16>: oneDNN's bf16 primitives where the CPU has bf16 instructions, else im2col +
  // the (emulated) bf16 GEMM.
  ls::host_context bf16_ctx(1, true, ls::compute_precision::bf16);
  bf16_ctx.set_gemm_precision(ls::compute_precision::bf16);
  run(wide{}, bf16_ctx, 3);
  run(wide{}, bf16_ctx, 3);
  CHECK(bf16_ctx.conv_cache().shapes() == (ls::host_bf16_native() ? 1u : 0u));
  if (ls::host_bf16_native()) MESSAGE("oneDNN bf16 convolution: ", bf16_ctx.conv_cache().last_implementation());
  // Many batch sizes: at most `kept` entries, the markers of shapes that do not run here (bf16
  // without the CPU's bf16 instructions) included.
  for (std::size_t batch : {1u, 2u, 4u, 5u, 6u, 7u, 9u, 10u, 11u, 12u}) {
    CAPTURE(batch);
    (void)run(wide{}, bf16_ctx, batch);
    CHECK(bf16_ctx.conv_cache().entries() <= kept);
  }
  CHECK(bf16_ctx.conv_cache().entries() == kept);
  // Under mixed<fp16>: always im2col + the fp16-rounded GEMM.
  ls::host_context fp16_ctx(1, true, ls::compute_precision::fp16);
  fp16_ctx.set_gemm_precision(ls::compute_precision::fp16);
  run(wide{}, fp16_ctx, 3);
  CHECK(fp16_ctx.conv_cache().shapes() == 0);
#endif
}
