// Compile-time shape rules, parameter layout, and the model instance: initialisation, the
// end-to-end gradient through model<Net, double>, the first layer's skipped input gradient and the
// backward completion hook.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include <lockstep/layers.hpp>
#include <lockstep/testing/drive.hpp>

namespace ls = lockstep;
using ls::composable;
using ls::dense;
using ls::dropout;
using ls::relu;
using ls::sequential;

// ---- composition rules, checked at compile time ----------------------------------------------
static_assert(!composable<dense<4, 3>, relu, dense<5, 2>>);
static_assert(composable<dense<4, 3>, relu, dense<3, 2>>);
static_assert(composable<dense<4, 3>, relu, dropout<1, 2>, ls::gelu, dense<3, 3>, dense<3, 1>>);
static_assert(composable<relu, dense<1, 2>>);  // width-agnostic layers first: the first fixed width applies
static_assert(composable<relu, ls::tanh>);
static_assert(!composable<dense<2, 3>, dense<2, 3>>);
static_assert(!composable<>);
static_assert(!composable<int>);
static_assert(!composable<dense<2, 3>, int>);
static_assert(composable<sequential<dense<4, 3>, relu>, dense<3, 2>>);
static_assert(!composable<sequential<dense<4, 3>, relu>, dense<4, 2>>);
static_assert(composable<dense<8, 4>, sequential<relu, sequential<dense<4, 2>>>>);
static_assert(!composable<dense<8, 4>, sequential<relu, sequential<dense<5, 2>>>>);
static_assert(!sequential<dense<4, 3>, relu, dense<5, 2>>::accepts<4>);
static_assert(sequential<dense<4, 3>, relu, dense<3, 2>>::accepts<4>);
static_assert(!sequential<dense<4, 3>, relu, dense<3, 2>>::accepts<5>);
static_assert(sequential<relu, ls::sigmoid>::accepts<17>);
static_assert(sequential<relu, dense<4, 3>>::expected_input == 4);
static_assert(sequential<relu, ls::tanh>::expected_input == 0);

// ---- the layer concept: opt-in by tag ---------------------------------------------------------
struct not_tagged {
  static constexpr std::size_t expected_input = 3;
};
static_assert(ls::layer<dense<2, 3>> && ls::layer<relu> && ls::layer<sequential<relu>>);
static_assert(!ls::layer<not_tagged> && !ls::layer<int>);
static_assert(ls::bound_layer<ls::bind_t<dense<2, 3>, 2>> && ls::bound_layer<ls::bind_t<sequential<relu>, 9>>);
static_assert(ls::accepts_v<relu, 5> && !ls::accepts_v<relu, 0> && !ls::accepts_v<dense<2, 3>, 3>);

// ---- constexpr parameter layout --------------------------------------------------------------
using flat_net = sequential<dense<4, 3>, relu, dense<3, 2>>;
using flat = ls::bind_t<flat_net, 4>;
static_assert(flat::layer_count == 3);
static_assert(flat::param_count == (4 * 3 + 3) + (3 * 2 + 2));
static_assert(flat::param_offsets[0] == 0 && flat::param_offsets[1] == 15 && flat::param_offsets[2] == 15);
static_assert(flat::params[0] == 15 && flat::params[1] == 0 && flat::params[2] == 8);
static_assert(flat::outputs[0] == 3 && flat::outputs[1] == 3 && flat::outputs[2] == 2);
static_assert(flat::input_size == 4 && flat::output_size == 2);

using inner_net = sequential<relu, dense<4, 3>, ls::tanh>;
using nested_net = sequential<dense<5, 4>, inner_net, dense<3, 2>, sequential<dense<2, 6>>>;
using nested = ls::bind_t<nested_net, 5>;
static_assert(nested::layer_count == 4);
static_assert(nested::param_offsets[0] == 0);
static_assert(nested::param_offsets[1] == 24);
static_assert(nested::param_offsets[2] == 24 + 15);
static_assert(nested::param_offsets[3] == 24 + 15 + 8);
static_assert(nested::param_count == 24 + 15 + 8 + 18);
static_assert(nested::layer_type<1>::param_offsets[0] == 0 && nested::layer_type<1>::param_offsets[1] == 0 &&
              nested::layer_type<1>::param_offsets[2] == 15);
static_assert(nested::layer_type<1>::input_size == 4 && nested::layer_type<1>::output_size == 3);
static_assert(ls::model<nested_net>::param_count == nested::param_count);
static_assert(ls::model<nested_net>::input_size == 5 && ls::model<nested_net>::output_size == 6);
// usable in constant expressions (array bounds)
static_assert(sizeof(std::array<char, nested::param_offsets[3]>) == 47);

namespace {

/// A user-defined layer wrapping dense<3, 4> that records whether backward was asked for dx.
struct dx_probe {
  using layer_concept = ls::layer_tag;
  static constexpr std::size_t expected_input = 3;
  inline static int null_dx = 0;     // backward calls with dx == nullptr
  inline static int non_null_dx = 0; // backward calls with dx != nullptr
  template <std::size_t In>
  struct bind : ls::bind_t<dense<3, 4>, In> {
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const ls::backward_args<T, Ctx, ls::shape<3>, ls::shape<4>>& a) {
      ++(a.dx ? non_null_dx : null_dx);
      ls::bind_t<dense<3, 4>, In>::backward(ctx, a);
    }
  };
};

template <class Model>
void randomise(Model& m, std::uint64_t seed) {
  const ls::counter_rng rng(seed, 5);
  for (std::size_t i = 0; i < Model::param_count; ++i) m.parameters()[i] = (rng.uniform_double(i) * 2 - 1) * 0.9;
}

/// Checks model<Net, double> parameter gradients of sum(proj * forward(x)) against central differences.
template <class Net>
double model_gradient_error(std::size_t rows, const ls::pass_info& info, std::uint64_t seed) {
  using M = ls::model<Net, double>;
  M m(ls::seed{seed});
  randomise(m, seed);
  ls::host_context ctx;
  const ls::counter_rng rng(seed, 6);
  std::vector<double> x(rows * M::input_size), proj(rows * M::output_size);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform_double(i) * 3 - 1.5;
  for (std::size_t i = 0; i < proj.size(); ++i) proj[i] = rng.uniform_double(100000 + i) * 2 - 1;
  auto objective = [&] {
    const double* y = m.forward(ctx, x.data(), rows, info);
    double s = 0;
    for (std::size_t i = 0; i < proj.size(); ++i) s += proj[i] * y[i];
    return s;
  };
  objective();
  for (std::size_t i = 0; i < M::param_count; ++i) m.gradients()[i] = std::nan("");
  m.backward(ctx, proj.data());
  std::vector<double> analytic(m.gradients().span().begin(), m.gradients().span().end());
  const double h = 1e-5;
  std::vector<double> numeric(M::param_count);
  double scale = 0;
  for (std::size_t i = 0; i < M::param_count; ++i) {
    double& v = m.parameters()[i];
    const double v0 = v;
    auto at = [&](double d) {
      v = v0 + d;
      return objective();
    };
    numeric[i] = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
    v = v0;
    scale = std::max(scale, std::abs(numeric[i]));
  }
  double worst = 0;
  for (std::size_t i = 0; i < M::param_count; ++i) {
    REQUIRE(std::isfinite(analytic[i]));
    worst = std::max(worst, std::abs(analytic[i] - numeric[i]) /
                                std::max({std::abs(analytic[i]), std::abs(numeric[i]), 1e-3 * scale}));
  }
  return worst;
}

}  // namespace

TEST_CASE("model<Net, double>: parameter gradients match finite differences end to end") {
  const ls::pass_info train{true, 11, 4, 2, 0};
  for (std::size_t rows : {1u, 3u, 8u}) {
    CAPTURE(rows);
    CHECK(model_gradient_error<sequential<dense<3, 5>, ls::gelu, dense<5, 2>>>(rows, {}, 1) < 1e-6);
    CHECK(model_gradient_error<sequential<dense<6, 7>, ls::tanh, dropout<3, 10>,
                                          sequential<dense<7, 4>, ls::sigmoid, sequential<dense<4, 3>>>,
                                          ls::leaky_relu<3, 10>, dense<3, 5>>>(rows, train, 2) < 1e-6);
    CHECK(model_gradient_error<dense<4, 3>>(rows, {}, 3) < 1e-6);  // a single layer as the network
  }
}

TEST_CASE("model: the first layer computes no input gradient, and the parameter gradients stay right") {
  using net = sequential<dx_probe, ls::tanh, dense<4, 2>>;
  dx_probe::null_dx = dx_probe::non_null_dx = 0;
  CHECK(model_gradient_error<net>(4, {}, 9) < 1e-6);
  CHECK(dx_probe::null_dx > 0);
  CHECK(dx_probe::non_null_dx == 0);

  // the bound network, asked for dx, passes it on to the first layer
  using B = ls::bind_t<net, 3>;
  ls::host_context ctx;
  std::vector<double> p(B::param_count, 0.1), x(2 * 3, 0.5), y(2 * 2), dy(2 * 2, 1.0), dx(2 * 3, -1.0),
      dp(B::param_count), ws(2 * B::workspace_per_sample);
  lockstep::testing::run_forward<B>(ctx, p.data(), x.data(), y.data(), ws.data(), 2, {});
  lockstep::testing::run_backward<B>(ctx, p.data(), x.data(), y.data(), dy.data(), dx.data(), dp.data(), ws.data(), 2, {});
  CHECK(dx_probe::non_null_dx == 1);
  CHECK(dx[0] != -1.0);

  // after parameter-free layers at the start (reshape, an activation), nothing needs the probe's
  // input gradient either: it gets none, and the gradients stay right
  dx_probe::null_dx = dx_probe::non_null_dx = 0;
  CHECK(model_gradient_error<sequential<ls::reshape<3>, ls::tanh, dx_probe, ls::tanh, dense<4, 2>>>(4, {}, 11) < 1e-6);
  CHECK(dx_probe::null_dx > 0);
  CHECK(dx_probe::non_null_dx == 0);

  // a probe that is not first is asked for its input gradient by the model
  dx_probe::null_dx = dx_probe::non_null_dx = 0;
  CHECK(model_gradient_error<sequential<dense<2, 3>, dx_probe, dense<4, 1>>>(3, {}, 10) < 1e-6);
  CHECK(dx_probe::null_dx == 0);
  CHECK(dx_probe::non_null_dx > 0);
}

TEST_CASE("model: backward overwrites the gradients and calls the hook in reverse layer order") {
  using net = sequential<dense<3, 4>, relu, sequential<dense<4, 4>, ls::tanh>, dense<4, 2>>;
  using B = ls::bind_t<net, 3>;
  ls::model<net> m(ls::seed{1});
  ls::host_context ctx;
  std::vector<float> x(5 * 3), dy(5 * 2);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 5) * 0.3f - 0.6f;
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = float(i % 3) - 1.0f;
  m.forward(ctx, x.data(), 5, {});
  std::vector<std::tuple<std::size_t, std::size_t, std::size_t>> calls;
  m.backward(ctx, dy.data(), [&](std::size_t layer, std::size_t offset, std::size_t count) {
    calls.emplace_back(layer, offset, count);
  });
  REQUIRE(calls.size() == B::layer_count);
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const std::size_t layer = B::layer_count - 1 - k;
    CHECK(std::get<0>(calls[k]) == layer);
    CHECK(std::get<1>(calls[k]) == B::param_offsets[layer]);
    CHECK(std::get<2>(calls[k]) == B::params[layer]);
  }
  const std::vector<float> first(m.gradients().span().begin(), m.gradients().span().end());
  m.backward(ctx, dy.data());  // again: overwritten, not accumulated
  for (std::size_t i = 0; i < first.size(); ++i) CHECK(m.gradients()[i] == first[i]);

  // a model whose network is a single layer reports it as layer 0 holding every parameter
  ls::model<dense<3, 2>> single(ls::seed{2});
  single.forward(ctx, x.data(), 5, {});
  calls.clear();
  single.backward(ctx, dy.data(), [&](std::size_t l, std::size_t o, std::size_t c) { calls.emplace_back(l, o, c); });
  REQUIRE(calls.size() == 1);
  CHECK(calls[0] == std::tuple<std::size_t, std::size_t, std::size_t>{0, 0, 8});
}

TEST_CASE("model: initialisation depends only on the seed, and each layer draws its own values") {
  using net = sequential<dense<6, 6>, relu, dense<6, 6>>;
  ls::model<net> a(ls::seed{5}), b(ls::seed{5}), c(ls::seed{6});
  const auto pa = a.parameters().span(), pb = b.parameters().span(), pc = c.parameters().span();
  CHECK(std::equal(pa.begin(), pa.end(), pb.begin()));
  CHECK(!std::equal(pa.begin(), pa.end(), pc.begin()));
  // two identical layers get different weights; biases start at zero; weights within He bounds
  using B = ls::bind_t<net, 6>;
  CHECK(!std::equal(pa.begin(), pa.begin() + 36, pa.begin() + B::param_offsets[2]));
  const float bound = std::sqrt(6.0f / 6.0f);
  for (std::size_t layer : {0u, 2u}) {
    const std::size_t o = B::param_offsets[layer];
    for (std::size_t i = 0; i < 36; ++i) CHECK(std::abs(pa[o + i]) <= bound);
    for (std::size_t i = 36; i < 42; ++i) CHECK(pa[o + i] == 0.0f);
  }
  // gradients start at zero; init re-seeds
  for (float g : a.gradients().span()) CHECK(g == 0.0f);
  ls::host_context ctx;
  c.init(ctx, ls::seed{5});
  CHECK(std::equal(pa.begin(), pa.end(), c.parameters().span().begin()));
  // the workspace grows to the largest batch and stays
  a.reserve(ctx, 10);
  CHECK(a.capacity() == 10);
  a.reserve(ctx, 3);
  CHECK(a.capacity() == 10);
}

TEST_CASE("initialisers: moments follow their fan rule") {
  const std::size_t n = 40000, fan_in = 50, fan_out = 30;
  std::vector<double> w(n);
  auto moments = [&] {
    double s = 0, s2 = 0;
    for (double v : w) s += v, s2 += v * v;
    return std::pair{s / n, s2 / n};
  };
  const ls::counter_rng rng(1, 2);
  ls::he_uniform::fill(w.data(), n, fan_in, fan_out, rng);
  auto [m1, v1] = moments();
  CHECK(std::abs(m1) < 0.01);
  CHECK(v1 == doctest::Approx(2.0 / fan_in).epsilon(0.03));
  ls::he_normal::fill(w.data(), n, fan_in, fan_out, rng);
  auto [m2, v2] = moments();
  CHECK(std::abs(m2) < 0.01);
  CHECK(v2 == doctest::Approx(2.0 / fan_in).epsilon(0.03));
  ls::glorot_uniform::fill(w.data(), n, fan_in, fan_out, rng);
  auto [m3, v3] = moments();
  CHECK(std::abs(m3) < 0.01);
  CHECK(v3 == doctest::Approx(2.0 / (fan_in + fan_out)).epsilon(0.03));
  ls::glorot_normal::fill(w.data(), n, fan_in, fan_out, rng);
  auto [m4, v4] = moments();
  CHECK(std::abs(m4) < 0.01);
  CHECK(v4 == doctest::Approx(2.0 / (fan_in + fan_out)).epsilon(0.03));
}

TEST_CASE("model: adopt_gradients keeps the gradients in the given storage, alive as long as the model") {
  using net = sequential<dense<3, 4>, relu, dense<4, 2>>;
  constexpr std::size_t P = ls::model<net>::param_count;
  ls::host_context ctx;
  std::vector<float> x(5 * 3), dy(5 * 2);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = float(i % 5) * 0.3f - 0.6f;
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = float(i % 3) - 1.0f;
  ls::model<net> plain(ls::seed{4});
  plain.forward(ctx, x.data(), 5, {});
  plain.backward(ctx, dy.data());

  ls::model<net> m(ls::seed{4});
  std::weak_ptr<float> watch;
  float* where = nullptr;
  {
    auto storage = std::shared_ptr<float>(new float[P + 1], std::default_delete<float[]>());
    storage.get()[P] = -9.0f;  // one past the gradients: never written
    watch = storage;
    where = storage.get();
    m.adopt_gradients(ctx, std::move(storage));
  }
  CHECK(!watch.expired());  // the model keeps it alive
  CHECK(m.gradients().data() == where);
  CHECK(!m.gradients().owns_memory());
  CHECK(std::all_of(where, where + P, [](float v) { return v == 0.0f; }));  // the zeros it held before
  m.forward(ctx, x.data(), 5, {});
  m.backward(ctx, dy.data());
  CHECK(std::equal(where, where + P, plain.gradients().data()));  // backward wrote into the storage
  CHECK(where[P] == -9.0f);
  ls::model<net> moved(std::move(m));
  CHECK(moved.gradients().data() == where);
  CHECK(!watch.expired());
  { [[maybe_unused]] ls::model<net> gone(std::move(moved)); }
  CHECK(watch.expired());  // released with the last model holding it
}
