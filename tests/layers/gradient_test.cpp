// Finite-difference gradient checks (through the public layer conformance suite) of every
// elementwise and dense layer, of user-defined layers and of whole (nested) sequentials, and
// dropout's own properties.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <lockstep/layers.hpp>
#include <lockstep/testing/drive.hpp>
#include <lockstep/testing/layer.hpp>

namespace ls = lockstep;

// A user-defined layer outside the library: y = a * x + b per feature (2 * width parameters).
struct scale_shift {
  using layer_concept = ls::layer_tag;
  static constexpr std::size_t expected_input = 0;
  template <std::size_t I>
  struct bind {
    static constexpr std::size_t input_size = I, output_size = I, param_count = 2 * I, workspace_per_sample = 0;
    template <class T>
    static void init(T* p, const ls::counter_rng&) {
      for (std::size_t i = 0; i < I; ++i) p[i] = T(1), p[I + i] = T(0);
    }
    template <class T, class Ctx>
    static void forward(Ctx&, const ls::forward_args<T, Ctx, ls::shape<I>, ls::shape<I>>& a) {
      for (std::size_t r = 0; r < a.batch(); ++r)
        for (std::size_t i = 0; i < I; ++i) a.y(r, i) = a.params[i] * a.x(r, i) + a.params[I + i];
    }
    template <class T, class Ctx>
    static void backward(Ctx&, const ls::backward_args<T, Ctx, ls::shape<I>, ls::shape<I>>& a) {
      T* dp = a.dparams;
      for (std::size_t i = 0; i < 2 * I; ++i) dp[i] = T(0);
      for (std::size_t r = 0; r < a.batch(); ++r)
        for (std::size_t i = 0; i < I; ++i) {
          dp[i] += a.dy(r, i) * a.x(r, i);
          dp[I + i] += a.dy(r, i);
          if (a.dx) a.dx(r, i) = a.dy(r, i) * a.params[i];
        }
    }
  };
};

// A user-defined layer that needs workspace: y = x^2 (stores 2x for backward in its scratch).
struct square_cached {
  using layer_concept = ls::layer_tag;
  static constexpr std::size_t expected_input = 0;
  template <std::size_t I>
  struct bind {
    static constexpr std::size_t input_size = I, output_size = I, param_count = 0, workspace_per_sample = I;
    template <class T>
    static void init(T*, const ls::counter_rng&) {}
    template <class T, class Ctx>
    static void forward(Ctx&, const ls::forward_args<T, Ctx, ls::shape<I>, ls::shape<I>>& a) {
      const T* x = a.x.data();
      for (std::size_t i = 0; i < a.x.size(); ++i) a.y.data()[i] = x[i] * x[i], a.workspace[i] = 2 * x[i];
    }
    template <class T, class Ctx>
    static void backward(Ctx&, const ls::backward_args<T, Ctx, ls::shape<I>, ls::shape<I>>& a) {
      if (a.dx)
        for (std::size_t i = 0; i < a.dx.size(); ++i) a.dx.data()[i] = a.dy.data()[i] * a.workspace[i];
    }
  };
};

static_assert(ls::layer<scale_shift> && ls::layer<square_cached>);

// The library's layers, the user-defined ones above and whole (nested) sequentials, through the
// public layer conformance suite: finite-difference gradients of inputs and parameters in double
// over batches 0, 1, 7 and 64, train and evaluation mode, init, determinism and split invariance.
TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, ls::bind_t<ls::dense<3, 5>, 3>, ls::bind_t<ls::dense<7, 2>, 7>,
                          ls::bind_t<ls::dense<4, 13>, 4>, ls::bind_t<ls::dense<11, 1, ls::glorot_normal>, 11>);
TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, ls::bind_t<ls::relu, 1>, ls::bind_t<ls::relu, 7>,
                          ls::bind_t<ls::leaky_relu<>, 3>, ls::bind_t<ls::leaky_relu<1, 5>, 7>, ls::bind_t<ls::gelu, 1>,
                          ls::bind_t<ls::gelu, 7>, ls::bind_t<ls::tanh, 7>, ls::bind_t<ls::sigmoid, 1>,
                          ls::bind_t<ls::sigmoid, 7>);
TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, ls::bind_t<ls::dropout<1, 2>, 1>, ls::bind_t<ls::dropout<1, 2>, 7>,
                          ls::bind_t<ls::dropout<1, 10>, 3>);
TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, ls::bind_t<scale_shift, 1>, ls::bind_t<scale_shift, 7>,
                          ls::bind_t<square_cached, 3>, ls::bind_t<square_cached, 7>);
namespace nets {
using smooth = ls::sequential<ls::dense<5, 7>, ls::tanh, ls::dense<7, 3>, ls::sigmoid, ls::dense<3, 4>>;
using inner = ls::sequential<ls::dense<6, 9>, ls::gelu, ls::dropout<3, 10>, square_cached>;
using nested = ls::sequential<scale_shift, ls::dense<3, 6>, ls::sigmoid, ls::sequential<inner, ls::dense<9, 2>>, ls::tanh,
                              ls::dense<2, 3>>;
using kinks = ls::sequential<ls::dense<4, 8>, ls::relu, ls::dense<8, 5>, ls::leaky_relu<1, 10>, ls::dense<5, 3>>;
using single = ls::sequential<ls::dense<2, 3>>;
}  // namespace nets
TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, ls::bind_t<nets::smooth, 5>, ls::bind_t<nets::nested, 3>,
                          ls::bind_t<nets::kinks, 4>, ls::bind_t<nets::single, 2>);

TEST_CASE("dropout: training zeroes about Rate of the features and scales the rest") {
  using B = ls::bind_t<ls::dropout<1, 4>, 64>;
  const ls::host_context ctx;
  const std::size_t rows = 100;
  std::vector<float> x(rows * 64), y(rows * 64), ws(rows * B::workspace_per_sample);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + float(i % 7);
  lockstep::testing::run_forward<B>(ctx, static_cast<const float*>(nullptr), x.data(), y.data(), ws.data(), rows,
                                    ls::pass_info::for_training(1, 0));
  std::size_t zeros = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (y[i] == 0.0f) ++zeros;
    else CHECK(y[i] == doctest::Approx(x[i] / 0.75f));
  }
  CHECK(std::abs(double(zeros) / double(x.size()) - 0.25) < 0.02);  // sigma 0.0054

  // another step, seed or layer draws another mask
  auto mask = [&](const ls::pass_info& info) {
    std::vector<float> out(x.size());
    lockstep::testing::run_forward<B>(ctx, static_cast<const float*>(nullptr), x.data(), out.data(), ws.data(), rows, info);
    return out;
  };
  CHECK(mask({true, 1, 0, 0, 0}) == y);
  CHECK(mask({true, 1, 1, 0, 0}) != y);
  CHECK(mask({true, 2, 0, 0, 0}) != y);
  CHECK(mask({true, 1, 0, 0, 1}) != y);
  CHECK(mask({false, 1, 0, 0, 0}) == x);  // evaluation mode
}

TEST_CASE("dropout: the mask does not depend on how the global batch is split") {
  using drop = ls::dropout<2, 5>;
  const ls::host_context ctx;
  const std::size_t rows = 23;
  auto run = [&]<class B>(std::size_t width_check, B*) {
    constexpr std::size_t W = B::input_size;
    REQUIRE(W == width_check);
    std::vector<double> x(rows * W), whole(rows * W), parts(rows * W);
    // each pass keeps its own workspace: backward reads the activations its forward stored
    std::vector<double> ws(rows * B::workspace_per_sample + 1), ws_a(ws.size()), ws_b(ws.size());
    const ls::counter_rng rng(3, 3);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform_double(i) + 0.5;
    const ls::pass_info info{true, 99, 17, 0, 4};
    lockstep::testing::run_forward<B>(ctx, static_cast<const double*>(nullptr), x.data(), whole.data(), ws.data(), rows, info);
    for (std::size_t cut : {0u, 1u, 10u, 22u, 23u}) {
      CAPTURE(cut);
      std::fill(parts.begin(), parts.end(), -1.0);
      ls::pass_info a = info, b = info;
      a.sample_offset = 0;
      b.sample_offset = cut;
      lockstep::testing::run_forward<B>(ctx, static_cast<const double*>(nullptr), x.data(), parts.data(), ws_a.data(), cut, a);
      lockstep::testing::run_forward<B>(ctx, static_cast<const double*>(nullptr), x.data() + cut * W, parts.data() + cut * W, ws_b.data(),
                 rows - cut, b);
      CHECK(parts == whole);  // bitwise
      // backward: the same mask applied to the gradient
      std::vector<double> dx_whole(rows * W), dx_parts(rows * W);
      lockstep::testing::run_backward<B>(ctx, static_cast<const double*>(nullptr), x.data(), whole.data(), x.data(), dx_whole.data(),
                  static_cast<double*>(nullptr), ws.data(), rows, info);
      lockstep::testing::run_backward<B>(ctx, static_cast<const double*>(nullptr), x.data(), parts.data(), x.data(), dx_parts.data(),
                  static_cast<double*>(nullptr), ws_a.data(), cut, a);
      lockstep::testing::run_backward<B>(ctx, static_cast<const double*>(nullptr), x.data() + cut * W, parts.data() + cut * W,
                  x.data() + cut * W, dx_parts.data() + cut * W, static_cast<double*>(nullptr), ws_b.data(), rows - cut,
                  b);
      CHECK(dx_parts == dx_whole);
    }
  };
  run(9, static_cast<ls::bind_t<drop, 9>*>(nullptr));
  // a sequential of dropouts keys each by its own position
  using seq = ls::sequential<drop, ls::sigmoid, drop>;
  run(5, static_cast<ls::bind_t<seq, 5>*>(nullptr));
}
