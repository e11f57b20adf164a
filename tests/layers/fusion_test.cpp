// A dense layer or a convolution applies the relu after it in its own forward
// (fuses_activation_v): which pairs fuse, the workspace the fused outputs no longer take, and a
// fused network against the same network with a relu that does not fuse, in float and double, for
// outputs and parameter gradients over many batch sizes (a convolution's, bit for bit); the GPU's
// per-element form of the dense layer's fused pass against the host's.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <lockstep/layers.hpp>

#include "../support/plain_relu.hpp"
#include "../support/random.hpp"

namespace ls = lockstep;

namespace fusion_test {  // named: the layers' members are used only in unevaluated contexts

using test_support::plain_relu;  // relu that never fuses

// A user layer built on dense's bound layer (it could change forward or backward): it inherits
// no fusion.
struct derived_dense {
  using layer_concept = ls::layer_tag;
  static constexpr std::size_t expected_input = 4;
  template <std::size_t In>
  struct bind : ls::bind_t<ls::dense<4, 3>, In> {};
};

// A user activation built on relu's bound layer: it inherits no fusion either.
struct derived_relu {
  using layer_concept = ls::layer_tag;
  static constexpr std::size_t expected_input = 0;
  template <std::size_t In>
  struct bind : ls::bind_t<ls::relu, In> {};
};

template <class Relu>
using net_with = ls::sequential<ls::dense<6, 5>, Relu, ls::dropout<1, 4>, ls::dense<5, 4>, ls::tanh, ls::dense<4, 3>, Relu>;
using fused_net = net_with<ls::relu>;
using plain_net = net_with<plain_relu>;

// Convolutions followed by relu: the first on 2 channels (im2col + GEMM), the second on 8 (oneDNN's
// primitives where oneDNN is the host GEMM).
template <class Relu>
using conv_net_with = ls::sequential<ls::reshape<2, 6, 6>, ls::conv2d<8, 3, 1, 1>, Relu, ls::conv2d<4, 3, 1, 1>, Relu,
                                     ls::max_pool2d<2>, ls::flatten, ls::dense<36, 3>>;
using fused_conv_net = conv_net_with<ls::relu>;
using plain_conv_net = conv_net_with<plain_relu>;

// Batch norm followed by relu, on images (lane sums: 72 positions per channel) and on flat rows.
template <class Relu>
using bn_net_with = ls::sequential<ls::reshape<2, 6, 12>, ls::conv2d<3, 3, 1, 1>, ls::batch_norm<>, Relu, ls::flatten,
                                   ls::dense<216, 5>, ls::batch_norm<1, 3>, Relu, ls::dense<5, 3>>;
using fused_bn_net = bn_net_with<ls::relu>;
using plain_bn_net = bn_net_with<plain_relu>;

}  // namespace fusion_test

using fusion_test::derived_dense;
using fusion_test::derived_relu;
using fusion_test::fused_bn_net;
using fusion_test::fused_conv_net;
using fusion_test::fused_net;
using fusion_test::plain_bn_net;
using fusion_test::plain_conv_net;
using fusion_test::plain_net;
using fusion_test::plain_relu;

using dense43 = ls::bind_t<ls::dense<4, 3>, 4>;
static_assert(ls::fuses_activation_v<dense43, ls::bind_t<ls::relu, 3>>);
static_assert(!ls::fuses_activation_v<dense43, ls::bind_t<ls::tanh, 3>>);  // tanh has no grad_from_output
static_assert(!ls::fuses_activation_v<dense43, ls::bind_t<plain_relu, 3>>);
static_assert(!ls::fuses_activation_v<ls::bind_t<derived_dense, 4>, ls::bind_t<ls::relu, 3>>);
static_assert(!ls::fuses_activation_v<dense43, ls::bind_t<derived_relu, 3>>);
static_assert(!ls::fuses_activation_v<ls::bind_t<ls::relu, 3>, ls::bind_t<ls::relu, 3>>);
// Which pairs of the network fuse: dense<6, 5> with its relu and dense<4, 3> with the last one
// (the model's output); dense<5, 4> is followed by tanh.
static_assert(ls::bind_t<fused_net, 6>::fused == std::array<bool, 7>{true, false, false, false, false, true, false});
static_assert(ls::bind_t<plain_net, 6>::fused == std::array<bool, 7>{});
// The fused dense layers' outputs take no workspace: 5 + 3 values per row (the last relu's output
// is the model's, kept outside the workspace either way).
static_assert(ls::bind_t<plain_net, 6>::workspace_per_sample - ls::bind_t<fused_net, 6>::workspace_per_sample == 5 + 3);

// A convolution applies the relu after it too; its output is the same bits either way.
static_assert(ls::bind_t<fused_conv_net, 72>::fused ==
              std::array<bool, 8>{false, true, false, true, false, false, false, false});
static_assert(ls::bind_t<plain_conv_net, 72>::workspace_per_sample -
                  ls::bind_t<fused_conv_net, 72>::workspace_per_sample ==
              (8 + 4) * 6 * 6);

// Batch norm applies the relu after it too (the layers before it, followed by batch norm, fuse
// nothing); its outputs, which the relu that does not fuse reads in backward, then take no workspace.
static_assert(ls::bind_t<fused_bn_net, 144>::fused ==
              std::array<bool, 9>{false, false, true, false, false, false, true, false, false});
static_assert(ls::bind_t<plain_bn_net, 144>::workspace_per_sample - ls::bind_t<fused_bn_net, 144>::workspace_per_sample ==
              3 * 6 * 12 + 5);

namespace {

template <class T>
void check_fused_against_plain(double tolerance) {
  for (const std::size_t rows : {0u, 1u, 2u, 7u, 31u, 64u}) {
    CAPTURE(rows);
    ls::model<fused_net, T> fused(ls::seed{7});
    ls::model<plain_net, T> plain(ls::seed{7});
    REQUIRE(fused.param_count == plain.param_count);
    // The same random parameters in both, biases included (they start at zero).
    const auto p = test_support::random_vector<T>(fused.param_count, 5, T(-0.9), T(0.9));
    for (std::size_t i = 0; i < fused.param_count; ++i) fused.parameters()[i] = plain.parameters()[i] = p[i];
    ls::host_context ctx;
    auto x = test_support::random_vector<T>(rows * 6, 40 + rows, T(-2), T(2));
    for (std::size_t i = 0; i < x.size(); i += 11) x[i] = T(0);  // exact zeros reach the relus' edge
    const auto dy = test_support::random_vector<T>(rows * 3, 90 + rows);
    const ls::pass_info train{true, 11, 4, 0, 0};  // dropout active, the same masks in both
    const T* yf = fused.forward(ctx, x.data(), rows, train);
    const T* yp = plain.forward(ctx, x.data(), rows, train);
    std::size_t bad = 0;
    const auto close = [&](T a, T b) { return std::fabs(static_cast<double>(a) - b) <= tolerance * (1 + std::fabs(static_cast<double>(b))); };
    for (std::size_t i = 0; i < rows * 3; ++i) bad += !close(yf[i], yp[i]);
    CHECK(bad == 0);
    fused.backward(ctx, dy.data());
    plain.backward(ctx, dy.data());
    bad = 0;
    for (std::size_t i = 0; i < fused.param_count; ++i) bad += !close(fused.gradients()[i], plain.gradients()[i]);
    CHECK(bad == 0);
    if (rows > 0) {  // a layer had something to learn from
      double norm = 0;
      for (std::size_t i = 0; i < fused.param_count; ++i) norm += std::fabs(static_cast<double>(fused.gradients()[i]));
      CHECK(norm > 0);
    }
  }
}

}  // namespace

TEST_CASE("a dense layer followed by relu applies it in its forward: outputs and gradients are the unfused network's, float and double") {
  check_fused_against_plain<float>(1e-5);
  check_fused_against_plain<double>(1e-12);
}

namespace {

// Network Fused against Plain (the same layers with a relu that does not fuse), from the same
// random parameters, on `rows` random rows of In features in pass `info`: outputs and parameter
// gradients bit for bit, and some gradient not zero from `min_rows` rows on.
template <class Fused, class Plain, std::size_t In>
void check_fused_bits(std::size_t rows, const ls::pass_info& info, std::uint64_t seed, std::size_t min_rows) {
  constexpr std::size_t out = ls::bind_t<Fused, In>::output_size;
  ls::model<Fused> fused(ls::seed{seed});
  ls::model<Plain> plain(ls::seed{seed});
  REQUIRE(fused.param_count == plain.param_count);
  const auto p = test_support::random_vector<float>(fused.param_count, seed + 5, -0.5f, 0.5f);
  for (std::size_t i = 0; i < fused.param_count; ++i) fused.parameters()[i] = plain.parameters()[i] = p[i];
  ls::host_context ctx;
  const auto x = test_support::random_vector<float>(rows * In, seed + 57 + rows, -2.0f, 2.0f);
  const auto dy = test_support::random_vector<float>(rows * out, seed + 67 + rows);
  const float* yf = fused.forward(ctx, x.data(), rows, info);
  const float* yp = plain.forward(ctx, x.data(), rows, info);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < rows * out; ++i) bad += std::memcmp(&yf[i], &yp[i], sizeof(float)) != 0;
  CHECK(bad == 0);
  fused.backward(ctx, dy.data());
  plain.backward(ctx, dy.data());
  bad = 0;
  double norm = 0;
  for (std::size_t i = 0; i < fused.param_count; ++i) {
    bad += std::memcmp(&fused.gradients()[i], &plain.gradients()[i], sizeof(float)) != 0;
    norm += std::fabs(static_cast<double>(fused.gradients()[i]));
  }
  CHECK(bad == 0);
  CHECK((rows < min_rows || norm > 0));
}

}  // namespace

TEST_CASE("a convolution followed by relu applies it in its forward: outputs and gradients are the unfused network's bit for bit") {
  for (const std::size_t rows : {0u, 1u, 3u, 8u}) {
    CAPTURE(rows);
    check_fused_bits<fused_conv_net, plain_conv_net, 72>(rows, {}, 3, 1);
  }
}

TEST_CASE("batch norm followed by relu applies it in its forward: outputs and gradients are the unfused network's bit for bit, training and evaluation") {
  for (const bool training : {true, false})
    for (const std::size_t rows : {0u, 1u, 3u, 8u}) {
      CAPTURE(training);
      CAPTURE(rows);
      ls::pass_info info{};
      info.training = training;
      // One row in training: batch norm's outputs are all β and its input gradient 0.
      check_fused_bits<fused_bn_net, plain_bn_net, 144>(rows, info, 5, training ? 2 : 1);
    }
}

namespace fusion_test {
/// The pass over rows x Cols by rows (the host's loop) and by element (the GPU's functor, run
/// here), both against the formula.
template <std::size_t Cols>
void check_bias_activation() {
  for (const std::size_t rows : {0u, 1u, 3u, 17u}) {
    CAPTURE(rows);
    CAPTURE(Cols);
    auto y = test_support::random_vector<float>(rows * Cols, 7 + rows * 100 + Cols, -3.0f, 3.0f);
    const auto b = test_support::random_vector<float>(Cols, 3 + Cols, -1.0f, 1.0f);
    if (!y.empty()) y[0] = std::nanf("");
    auto by_rows = y, by_element = y;
    ls::host_context ctx;
    ls::detail::bias_activation<ls::relu_fn, Cols>(ctx, by_rows.data(), b.data(), rows);
    for_each_index(ctx, rows * Cols, ls::detail::bias_activation_op<ls::relu_fn, float, Cols>{by_element.data(), b.data()});
    std::size_t bad = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      const float want = ls::relu_fn::f(y[i] + b[i % Cols]);
      bad += by_rows[i] != want || by_element[i] != want;
    }
    CHECK(bad == 0);
  }
}
}  // namespace fusion_test

TEST_CASE("the fused bias and activation pass: the GPU's per-element form is bitwise the host's row loop") {
  fusion_test::check_bias_activation<1>();
  fusion_test::check_bias_activation<5>();
  fusion_test::check_bias_activation<10>();
  fusion_test::check_bias_activation<64>();
  fusion_test::check_bias_activation<1031>();
}
