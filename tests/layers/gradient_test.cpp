// Finite-difference gradient checks, in double precision, of every layer, of user-defined
// layers and of whole (nested) sequentials: parameter gradients and input gradients.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <lockstep/layers.hpp>
#include <lockstep/testing/drive.hpp>

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

namespace {

enum class inputs { any, away_from_zero };

/// Relative error of an analytic against a numeric derivative; components far below the largest
/// gradient are measured against `floor` instead of their own (near-zero) size.
double rel_error(double a, double n, double floor) {
  return std::abs(a - n) / std::max({std::abs(a), std::abs(n), floor});
}

/// Checks a bound layer B on `batch` rows: analytic parameter and input gradients of the objective
/// sum(proj * forward(x)) against 5-point central differences.
template <class B>
struct gradient_check {
  static constexpr std::size_t I = B::input_size, O = B::output_size, P = B::param_count,
                               W = B::workspace_per_sample;
  ls::host_context ctx{1};
  std::size_t batch;
  ls::pass_info info;
  std::vector<double> p, x, proj, y, ws;

  gradient_check(std::size_t rows, const ls::pass_info& pi, std::uint64_t seed, inputs kind)
      : batch(rows), info(pi), p(P), x(rows * I), proj(rows * O), y(rows * O + 1), ws(rows * W + 1) {
    const ls::counter_rng rng(seed, 17);
    std::uint64_t k = 0;
    for (double& v : p) v = (rng.uniform_double(k++) * 2 - 1) * 0.8;
    for (double& v : x) {
      const double u = rng.uniform_double(k++) * 2 - 1;
      v = kind == inputs::any ? 1.5 * u : (u < 0 ? -0.2 + 0.8 * u : 0.2 + 0.8 * u);  // |x| >= 0.2
    }
    for (double& v : proj) v = rng.uniform_double(k++) * 2 - 1;
  }

  double objective() {
    lockstep::testing::run_forward<B>(ctx, p.data(), x.data(), y.data(), ws.data(), batch, info);
    double s = 0;
    for (std::size_t i = 0; i < batch * O; ++i) s += proj[i] * y[i];
    return s;
  }

  template <class F>
  double numeric(double& v, double h, F&& f) {
    const double v0 = v;
    auto at = [&](double d) {
      v = v0 + d;
      return f();
    };
    const double g = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
    v = v0;
    return g;
  }

  /// Runs the check; returns the worst relative error seen (parameters and inputs).
  double run(double h = 1e-5) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> dp(P + 1, nan), dx(batch * I + 1, nan);
    dp[P] = 12345.0;
    dx[batch * I] = 12345.0;
    objective();
    lockstep::testing::run_backward<B>(ctx, p.data(), x.data(), y.data(), proj.data(), dx.data(), dp.data(), ws.data(), batch, info);
    CHECK(dp[P] == 12345.0);          // nothing written past the parameters
    CHECK(dx[batch * I] == 12345.0);  // nor past the input gradient

    // the same parameter gradients when the input gradient is not asked for
    std::vector<double> dp2(P + 1, nan);
    objective();
    lockstep::testing::run_backward<B>(ctx, p.data(), x.data(), y.data(), proj.data(), static_cast<double*>(nullptr), dp2.data(), ws.data(),
                batch, info);
    for (std::size_t i = 0; i < P; ++i) CHECK(dp2[i] == dp[i]);

    std::vector<double> np(P), nx(batch * I);
    for (std::size_t i = 0; i < P; ++i) np[i] = numeric(p[i], h, [&] { return objective(); });
    for (std::size_t i = 0; i < batch * I; ++i) nx[i] = numeric(x[i], h, [&] { return objective(); });

    double scale = 0;
    for (std::size_t i = 0; i < P; ++i) scale = std::max(scale, std::abs(np[i]));
    for (std::size_t i = 0; i < batch * I; ++i) scale = std::max(scale, std::abs(nx[i]));
    const double floor = std::max(1e-3 * scale, 1e-12);
    double worst = 0;
    for (std::size_t i = 0; i < P; ++i) {
      REQUIRE(std::isfinite(dp[i]));  // every parameter gradient is overwritten
      worst = std::max(worst, rel_error(dp[i], np[i], floor));
    }
    for (std::size_t i = 0; i < batch * I; ++i) {
      REQUIRE(std::isfinite(dx[i]));
      worst = std::max(worst, rel_error(dx[i], nx[i], floor));
    }
    return worst;
  }
};

/// Checks unbound layer L bound at width In for several batch sizes.
template <class L, std::size_t In>
void check_layer(inputs kind, const ls::pass_info& info = {}, double h = 1e-5) {
  using B = ls::bind_t<L, In>;
  for (std::size_t rows : {1u, 2u, 5u}) {
    CAPTURE(In);
    CAPTURE(rows);
    gradient_check<B> g(rows, info, 1000 * In + rows, kind);
    const double err = g.run(h);
    CHECK(err < 1e-6);
  }
}

template <class L>
void check_widths(inputs kind, const ls::pass_info& info = {}) {
  check_layer<L, 1>(kind, info);
  check_layer<L, 3>(kind, info);
  check_layer<L, 7>(kind, info);
}

}  // namespace

TEST_CASE("dense: gradients match finite differences over several shapes") {
  check_layer<ls::dense<1, 1>, 1>(inputs::any);
  check_layer<ls::dense<3, 5>, 3>(inputs::any);
  check_layer<ls::dense<7, 2>, 7>(inputs::any);
  check_layer<ls::dense<4, 13>, 4>(inputs::any);
  check_layer<ls::dense<11, 1, ls::glorot_normal>, 11>(inputs::any);
}

TEST_CASE("activations: gradients match finite differences") {
  SUBCASE("relu (inputs away from the kink)") { check_widths<ls::relu>(inputs::away_from_zero); }
  SUBCASE("leaky_relu (inputs away from the kink)") {
    check_widths<ls::leaky_relu<>>(inputs::away_from_zero);
    check_widths<ls::leaky_relu<1, 5>>(inputs::away_from_zero);
  }
  SUBCASE("gelu") { check_widths<ls::gelu>(inputs::any); }
  SUBCASE("tanh") { check_widths<ls::tanh>(inputs::any); }
  SUBCASE("sigmoid") { check_widths<ls::sigmoid>(inputs::any); }
}

TEST_CASE("dropout: gradients match finite differences with its fixed training mask") {
  const ls::pass_info train{true, 42, 3, 5, 11};
  check_widths<ls::dropout<1, 2>>(inputs::any, train);
  check_widths<ls::dropout<1, 10>>(inputs::any, train);
  check_widths<ls::dropout<1, 2>>(inputs::any, ls::pass_info{});  // evaluation: the identity
}

TEST_CASE("user-defined layers: gradients match finite differences") {
  check_widths<scale_shift>(inputs::any);
  check_widths<square_cached>(inputs::any);
}

TEST_CASE("sequential: gradients of whole and nested networks match finite differences") {
  const ls::pass_info train{true, 7, 2, 3, 0};
  SUBCASE("smooth") {
    using net = ls::sequential<ls::dense<5, 7>, ls::tanh, ls::dense<7, 3>, ls::sigmoid, ls::dense<3, 4>>;
    check_layer<net, 5>(inputs::any);
  }
  SUBCASE("nested, with dropout and workspace-using layers") {
    using inner = ls::sequential<ls::dense<6, 9>, ls::gelu, ls::dropout<3, 10>, square_cached>;
    using net = ls::sequential<scale_shift, ls::dense<3, 6>, ls::sigmoid,
                               ls::sequential<inner, ls::dense<9, 2>>, ls::tanh, ls::dense<2, 3>>;
    check_layer<net, 3>(inputs::any, train);
  }
  SUBCASE("relu and leaky_relu inside a network") {
    using net = ls::sequential<ls::dense<4, 8>, ls::relu, ls::dense<8, 5>, ls::leaky_relu<1, 10>, ls::dense<5, 3>>;
    check_layer<net, 4>(inputs::any);
  }
  SUBCASE("a single layer") { check_layer<ls::sequential<ls::dense<2, 3>>, 2>(inputs::any); }
}

TEST_CASE("dropout: training zeroes about Rate of the features and scales the rest") {
  using B = ls::bind_t<ls::dropout<1, 4>, 64>;
  const ls::host_context ctx;
  const std::size_t rows = 100;
  std::vector<float> x(rows * 64), y(rows * 64);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 1.0f + float(i % 7);
  lockstep::testing::run_forward<B>(ctx, static_cast<const float*>(nullptr), x.data(), y.data(), static_cast<float*>(nullptr), rows,
             ls::pass_info{true, 1, 0, 0, 0});
  std::size_t zeros = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (y[i] == 0.0f) ++zeros;
    else CHECK(y[i] == doctest::Approx(x[i] / 0.75f));
  }
  CHECK(std::abs(double(zeros) / double(x.size()) - 0.25) < 0.02);  // sigma 0.0054

  // another step, seed or layer draws another mask
  auto mask = [&](const ls::pass_info& info) {
    std::vector<float> out(x.size());
    lockstep::testing::run_forward<B>(ctx, static_cast<const float*>(nullptr), x.data(), out.data(), static_cast<float*>(nullptr), rows, info);
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
