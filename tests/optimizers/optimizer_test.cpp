// Tests of optimizers/: each optimiser over several steps against scalar reference code written
// from PyTorch's definitions, the gradient scale, the schedules, and user-defined optimisers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

static_assert(ls::optimizer<ls::sgd> && ls::optimizer<ls::adam> && ls::optimizer<ls::adamw>);
static_assert(!ls::optimizer<int>);

namespace {

constexpr std::size_t n = 13;
constexpr int steps = 6;

/// The gradient SUM of element i at step t (t from 1), and the scale that turns it into a mean.
double grad_sum(std::size_t i, int t) {
  return ls::counter_rng(4, static_cast<std::uint64_t>(t)).uniform_double(i) * 8 - 4;
}
double start(std::size_t i) { return ls::counter_rng(9, 0).uniform_double(i) * 2 - 1; }
constexpr double scale = 1.0 / 4.0;  // the sums come from 4 samples

/// Runs `steps` updates of optimiser o on T parameters; the lr of step t is lr * (1 + 0.1 t).
template <class T, class O>
std::vector<T> run(const O& o) {
  const ls::host_context ctx;
  std::vector<T> p(n), g(n), state(o.state_size(n) + 1, T(0));
  state.back() = T(77);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<T>(start(i));
  for (int t = 1; t <= steps; ++t) {
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<T>(grad_sum(i, t));
    o.update(ctx, p.data(), g.data(), state.data(), n,
             ls::update_info{static_cast<float>(o.lr * (1 + 0.1 * t)), static_cast<std::uint64_t>(t), scale});
  }
  CHECK(state.back() == T(77));  // the state is exactly state_size long
  return p;
}

// ---- references: torch.optim.SGD / Adam / AdamW, one element at a time, in double ----
double ref_sgd(std::size_t i, double lr, double momentum, double dampening, bool nesterov, double wd) {
  double p = start(i), buf = 0;
  for (int t = 1; t <= steps; ++t) {
    double d = grad_sum(i, t) * scale;
    if (wd != 0) d = d + wd * p;
    if (momentum != 0) {
      buf = t == 1 ? d : momentum * buf + (1 - dampening) * d;
      d = nesterov ? d + momentum * buf : buf;
    }
    p = p - lr * (1 + 0.1 * t) * d;
  }
  return p;
}

double ref_adam(std::size_t i, double lr, double b1, double b2, double eps, double wd, bool decoupled) {
  double p = start(i), m = 0, v = 0;
  for (int t = 1; t <= steps; ++t) {
    const double rate = lr * (1 + 0.1 * t);
    double g = grad_sum(i, t) * scale;
    if (decoupled) p = p * (1 - rate * wd);  // AdamW: decay the weights first
    else if (wd != 0) g = g + wd * p;        // Adam: L2 in the gradient
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    const double step_size = rate / bc1;
    const double denom = std::sqrt(v) / std::sqrt(bc2) + eps;
    p = p - step_size * m / denom;
  }
  return p;
}

template <class T, class O, class Ref>
void compare(const O& o, Ref ref) {
  const std::vector<T> got = run<T>(o);
  const double tol = std::is_same_v<T, double> ? 1e-6 : 1e-4;  // float: hyper-parameters are floats
  for (std::size_t i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(double(got[i]) == doctest::Approx(ref(i)).epsilon(tol).scale(1.0));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("sgd matches the reference over several steps", T, float, double) {
  // hyper-parameters exactly representable in float, so float and double runs share a reference
  SUBCASE("plain") {
    compare<T>(ls::sgd{.lr = 0.125f}, [](std::size_t i) { return ref_sgd(i, 0.125, 0, 0, false, 0); });
  }
  SUBCASE("momentum") {
    compare<T>(ls::sgd{.lr = 0.125f, .momentum = 0.875f},
               [](std::size_t i) { return ref_sgd(i, 0.125, 0.875, 0, false, 0); });
  }
  SUBCASE("nesterov") {
    compare<T>(ls::sgd{.lr = 0.125f, .momentum = 0.75f, .nesterov = true},
               [](std::size_t i) { return ref_sgd(i, 0.125, 0.75, 0, true, 0); });
  }
  SUBCASE("weight decay") {
    compare<T>(ls::sgd{.lr = 0.25f, .weight_decay = 0.0625f},
               [](std::size_t i) { return ref_sgd(i, 0.25, 0, 0, false, 0.0625); });
  }
  SUBCASE("momentum + nesterov + weight decay") {
    compare<T>(ls::sgd{.lr = 0.125f, .momentum = 0.5f, .nesterov = true, .weight_decay = 0.125f},
               [](std::size_t i) { return ref_sgd(i, 0.125, 0.5, 0, true, 0.125); });
  }
  CHECK(ls::sgd{}.state_size(n) == 0);
  CHECK(ls::sgd{.momentum = 0.9f}.state_size(n) == n);
}

TEST_CASE_TEMPLATE("adam and adamw match the reference over several steps", T, float, double) {
  SUBCASE("adam") {
    compare<T>(ls::adam{.lr = 0.0625f, .beta1 = 0.875f, .beta2 = 0.9921875f, .eps = 0.0009765625f},
               [](std::size_t i) { return ref_adam(i, 0.0625, 0.875, 0.9921875, 0.0009765625, 0, false); });
  }
  SUBCASE("adam, default hyper-parameters") {
    const ls::adam o;
    compare<T>(o, [&](std::size_t i) { return ref_adam(i, o.lr, o.beta1, o.beta2, o.eps, 0, false); });
  }
  SUBCASE("adam with L2 weight decay") {
    compare<T>(ls::adam{.lr = 0.0625f, .beta1 = 0.75f, .beta2 = 0.96875f, .eps = 0.0009765625f,
                        .weight_decay = 0.25f},
               [](std::size_t i) { return ref_adam(i, 0.0625, 0.75, 0.96875, 0.0009765625, 0.25, false); });
  }
  SUBCASE("adamw") {
    compare<T>(ls::adamw{.lr = 0.0625f, .beta1 = 0.875f, .beta2 = 0.9921875f, .eps = 0.0009765625f,
                         .weight_decay = 0.125f},
               [](std::size_t i) { return ref_adam(i, 0.0625, 0.875, 0.9921875, 0.0009765625, 0.125, true); });
  }
  SUBCASE("adamw, default hyper-parameters") {
    const ls::adamw o;
    compare<T>(o, [&](std::size_t i) { return ref_adam(i, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, true); });
  }
  CHECK(ls::adam{}.state_size(n) == 2 * n);
  CHECK(ls::adamw{}.state_size(n) == 2 * n);
}

TEST_CASE("grad_scale turns gradient sums into means: k copies of a gradient equal one") {
  const ls::host_context ctx;
  for (int k : {1, 3, 8}) {
    CAPTURE(k);
    std::vector<double> p1(n), pk(n), g1(n), gk(n), s1(2 * n, 0.0), sk(2 * n, 0.0);
    for (std::size_t i = 0; i < n; ++i) {
      p1[i] = pk[i] = start(i);
      g1[i] = grad_sum(i, 1);
      gk[i] = k * g1[i];
    }
    const ls::adam o{.lr = 0.01f};
    o.update(ctx, p1.data(), g1.data(), s1.data(), n, ls::update_info{0.01f, 1, 1.0});
    o.update(ctx, pk.data(), gk.data(), sk.data(), n, ls::update_info{0.01f, 1, 1.0 / k});
    for (std::size_t i = 0; i < n; ++i) CHECK(pk[i] == doctest::Approx(p1[i]).epsilon(1e-14));
  }
}

TEST_CASE("schedules give the documented rate at chosen steps") {
  const float base = 0.5f;
  CHECK(ls::constant_schedule{}(base, 0) == base);
  CHECK(ls::constant_schedule{}(base, 123456) == base);

  const ls::step_schedule st{.every = 10, .factor = 0.5f};
  CHECK(st(base, 0) == base);
  CHECK(st(base, 9) == base);
  CHECK(st(base, 10) == doctest::Approx(0.25f));
  CHECK(st(base, 19) == doctest::Approx(0.25f));
  CHECK(st(base, 25) == doctest::Approx(0.125f));
  CHECK_THROWS_AS((void)ls::step_schedule{.every = 0}(base, 1), ls::config_error);

  const ls::cosine_schedule cs{.total = 100, .min_lr = 0.1f};
  CHECK(cs(base, 0) == doctest::Approx(base));
  CHECK(cs(base, 50) == doctest::Approx(0.3f));
  CHECK(cs(base, 25) == doctest::Approx(0.1 + 0.5 * 0.4 * (1 + std::cos(M_PI / 4))));
  CHECK(cs(base, 75) == doctest::Approx(0.1 + 0.5 * 0.4 * (1 + std::cos(3 * M_PI / 4))));
  CHECK(cs(base, 100) == doctest::Approx(0.1f));
  CHECK(cs(base, 1000) == doctest::Approx(0.1f));
  for (std::uint64_t s = 1; s < 100; ++s) CHECK(cs(base, s) <= cs(base, s - 1));  // decreasing
  CHECK_THROWS_AS((void)ls::cosine_schedule{.total = 0}(base, 1), ls::config_error);

  const ls::warmup_schedule<ls::step_schedule> ws{.steps = 4, .after = {.every = 2, .factor = 0.5f}};
  CHECK(ws(base, 0) == doctest::Approx(base / 5));
  CHECK(ws(base, 1) == doctest::Approx(2 * base / 5));
  CHECK(ws(base, 3) == doctest::Approx(4 * base / 5));
  CHECK(ws(base, 4) == doctest::Approx(base));
  CHECK(ws(base, 5) == doctest::Approx(base));
  CHECK(ws(base, 6) == doctest::Approx(base / 2));
  const ls::warmup_schedule<> wc{.steps = 3};
  CHECK(wc(base, 2) == doctest::Approx(0.75f * base));
  CHECK(wc(base, 3) == base);
  CHECK(wc(base, 1000) == base);

  // A field out of range is refused at the first step (fit's first update), not when the decay
  // reaches it; a warm-up checks the schedule after it from its first step too.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const float bad : {-0.1f, -inf, inf, nan}) {
    CAPTURE(bad);
    const ls::step_schedule decay{.every = 10, .factor = bad};
    const ls::cosine_schedule cosine{.total = 10, .min_lr = bad};
    CHECK_THROWS_WITH_AS((void)decay(base, 0), doctest::Contains("`factor` is"), ls::config_error);
    CHECK_THROWS_WITH_AS((void)cosine(base, 0), doctest::Contains("`min_lr` is"), ls::config_error);
    const ls::warmup_schedule<ls::step_schedule> warm_step{.steps = 4, .after = {.every = 2, .factor = bad}};
    const ls::warmup_schedule<ls::cosine_schedule> warm_cosine{.steps = 4, .after = {.min_lr = bad}};
    CHECK_THROWS_AS((void)warm_step(base, 0), ls::config_error);
    CHECK_THROWS_AS((void)warm_cosine(base, 0), ls::config_error);
    // lr_schedule refuses them when the callback is made, before any fit.
    CHECK_THROWS_WITH_AS((void)ls::lr_schedule(decay), doctest::Contains("`factor` is"), ls::config_error);
    CHECK_THROWS_WITH_AS((void)ls::lr_schedule(cosine), doctest::Contains("`min_lr` is"), ls::config_error);
    CHECK_THROWS_WITH_AS((void)ls::lr_schedule(warm_step), doctest::Contains("`factor` is"), ls::config_error);
    CHECK_THROWS_WITH_AS((void)ls::lr_schedule(warm_cosine), doctest::Contains("`min_lr` is"), ls::config_error);
  }
  CHECK_THROWS_WITH_AS((void)ls::lr_schedule(ls::step_schedule{.every = 0}), doctest::Contains("`every` must be > 0"),
                       ls::config_error);
  CHECK_THROWS_WITH_AS((void)ls::lr_schedule(ls::cosine_schedule{.total = 0}), doctest::Contains("`total` must be > 0"),
                       ls::config_error);
  CHECK_NOTHROW((void)ls::lr_schedule(ls::warmup_schedule<ls::cosine_schedule>{.steps = 4}));
  CHECK(ls::step_schedule{.every = 1, .factor = 0.0f}(base, 1) == 0.0f);  // factor 0: a rate of 0 after the first decay
}

namespace {
/// A user-defined optimiser outside the library: sign descent with a step counter per element.
struct sign_descent {
  using optimizer_concept = ls::optimizer_tag;
  float lr = 0.5f;
  std::size_t state_size(std::size_t k) const noexcept { return k; }
  template <class T, class Ctx>
  void update(Ctx&, T* p, const T* g, T* state, std::size_t k, const ls::update_info& u) const {
    for (std::size_t i = 0; i < k; ++i) {
      p[i] -= u.lr * (g[i] > 0 ? T(1) : g[i] < 0 ? T(-1) : T(0));
      state[i] += T(1);
    }
  }
};
static_assert(ls::optimizer<sign_descent>);
}  // namespace

TEST_CASE("replica::apply runs any optimiser on the flat buffers and keeps its state") {
  using net = ls::sequential<ls::dense<3, 2>>;
  ls::replica<net> rep(ls::host_context{1}, ls::seed{1});
  constexpr std::size_t P = decltype(rep)::model_type::param_count;
  for (std::size_t i = 0; i < P; ++i) rep.model().gradients()[i] = float(i % 3) - 1.0f;
  std::vector<float> before(rep.model().parameters().span().begin(), rep.model().parameters().span().end());
  rep.apply(sign_descent{}, ls::update_info{0.5f, 1, 1.0});
  rep.apply(sign_descent{}, ls::update_info{0.25f, 2, 1.0});
  REQUIRE(rep.optimizer_state().size() == P);
  for (std::size_t i = 0; i < P; ++i) {
    const float sgn = float(i % 3) - 1.0f;
    CHECK(rep.model().parameters()[i] == doctest::Approx(before[i] - 0.75f * sgn));
    CHECK(rep.optimizer_state()[i] == 2.0f);
  }
  // another optimiser needing a different state size is refused, unless the state is reset
  CHECK_THROWS_AS(rep.apply(ls::adam{}, ls::update_info{0.1f, 3, 1.0}), ls::config_error);
  rep.reset_optimizer_state(ls::adam{});
  CHECK(rep.optimizer_state().size() == 2 * P);
  for (float s : rep.optimizer_state().span()) CHECK(s == 0.0f);
  rep.apply(ls::adam{}, ls::update_info{0.1f, 1, 1.0});
}

namespace {
// The message of the config_error `f` throws ("" when it throws none).
template <class F>
std::string config_error_of(F&& f) {
  try {
    f();
  } catch (const ls::config_error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("optimisers refuse hyper-parameters out of range, naming them, before any parameter changes") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  CHECK_NOTHROW(ls::adam{}.check());
  CHECK_NOTHROW(ls::adamw{.beta1 = 0.0f, .beta2 = 0.0f, .eps = 1e-30f, .weight_decay = 0.0f}.check());
  CHECK_NOTHROW(ls::sgd{.momentum = 1.0f}.check());
  // eps 0 divides an untouched parameter's zero moments (0 / 0); momentum above 1 grows geometrically
  // (a subnormal eps is 0 where denormals are treated as zero, the host replicas' default)
  const std::string eps_range = "eps must be finite and at least 1.17549435e-38 (the smallest normal float)";
  CHECK(config_error_of([] { ls::adam{.eps = 0.0f}.check(); }) == "lockstep::adam: " + eps_range + ", got 0");
  CHECK(config_error_of([] { ls::adamw{.eps = -0.0f}.check(); }).find(eps_range) != std::string::npos);
  CHECK(config_error_of([] { ls::adamw{.eps = 1e-40f}.check(); }) == "lockstep::adamw: " + eps_range + ", got 9.9999461e-41");
  CHECK(config_error_of([] { ls::adam{.eps = std::nextafter(std::numeric_limits<float>::min(), 0.0f)}.check(); }).find(eps_range) != std::string::npos);
  CHECK_NOTHROW(ls::adam{.eps = std::numeric_limits<float>::min()}.check());
  // A value too small for six decimals is shown as itself, not as "-0.000000".
  CHECK(config_error_of([] { ls::sgd{.lr = -1e-7f}.check(); }) == "lockstep::sgd: lr must be finite and >= 0, got -1.00000001e-07");
  for (const float bad : {1.0001f, 1.5f, 1e30f}) {
    CAPTURE(bad);
    CHECK(config_error_of([&] { ls::sgd{.momentum = bad}.check(); }).find("momentum must be in [0, 1]") != std::string::npos);
  }
  CHECK_NOTHROW(ls::sgd{.lr = 0.0f, .momentum = 0.9f, .nesterov = true}.check());
  CHECK(config_error_of([] { ls::adam{.beta2 = 1.0f}.check(); }) == "lockstep::adam: beta2 must be in [0, 1), got 1");
  CHECK(config_error_of([] { ls::adamw{.beta1 = 1.0f}.check(); }) == "lockstep::adamw: beta1 must be in [0, 1), got 1");
  for (const float bad : {-0.5f, 1.0f, 1.5f, nan}) {
    CAPTURE(bad);
    CHECK(config_error_of([&] { ls::adam{.beta1 = bad}.check(); }).find("beta1") != std::string::npos);
    CHECK(config_error_of([&] { ls::adamw{.beta2 = bad}.check(); }).find("beta2") != std::string::npos);
  }
  for (const float bad : {-1e-8f, inf, nan}) {
    CAPTURE(bad);
    CHECK(config_error_of([&] { ls::adam{.eps = bad}.check(); }).find("eps") != std::string::npos);
    CHECK(config_error_of([&] { ls::adamw{.weight_decay = bad}.check(); }).find("weight_decay") != std::string::npos);
    CHECK(config_error_of([&] { ls::sgd{.momentum = bad}.check(); }).find("momentum") != std::string::npos);
    CHECK(config_error_of([&] { ls::sgd{.weight_decay = bad}.check(); }).find("weight_decay") != std::string::npos);
  }
  for (const float bad : {inf, -inf, nan, -1e-8f, -0.5f}) {  // a negative rate would ascend the loss
    CAPTURE(bad);
    CHECK(config_error_of([&] { ls::sgd{.lr = bad}.check(); }).find("lr") != std::string::npos);
    CHECK(config_error_of([&] { ls::adam{.lr = bad}.check(); }).find("lr") != std::string::npos);
    CHECK(config_error_of([&] { ls::adamw{.lr = bad}.check(); }).find("lr") != std::string::npos);
  }
  CHECK_NOTHROW(ls::sgd{.lr = 0.0f}.check());  // a rate of 0 is meaningful (a schedule's end)
  CHECK_NOTHROW(ls::adam{.lr = 0.0f}.check());
  CHECK(config_error_of([] { ls::sgd{.nesterov = true}.check(); }) == "lockstep::sgd: nesterov needs momentum > 0");
  // update number 0 (the count is 1-based) would divide by 1 - beta^0 = 0
  std::vector<float> p{1}, g{1}, s(2, 0.0f);
  const ls::host_context ctx;
  CHECK(config_error_of([&] { ls::adam{}.update(ctx, p.data(), g.data(), s.data(), 1, ls::update_info{1e-3f, 0, 1.0}); })
            .find("update_info::step") != std::string::npos);
  CHECK(p[0] == 1.0f);

  // A strategy checks before the step: the model is not changed, and the next step trains.
  using net = ls::sequential<ls::dense<3, 2>>;
  ls::mirrored<ls::cpu<0>> strat;
  auto m = strat.replicate<net>(ls::seed{3});
  ls::data::batch b;
  b.width = 3;
  b.features = {1, 2, 3, 4, 5, 6};
  b.labels = {0, 1};
  b.indices = {0, 1};
  ls::data::distributed_batch db;
  db.global = std::make_shared<const ls::data::batch>(b);
  db.shards = ls::data::split(*db.global, 1);
  const std::vector<float> before(m.replica(0).model().parameters().span().begin(),
                                  m.replica(0).model().parameters().span().end());
  CHECK(config_error_of([&] { strat.train_step(m, ls::adam{.beta2 = 1.0f}, ls::softmax_cross_entropy{}, db); })
            .find("beta2") != std::string::npos);
  CHECK(m.step() == 0);
  CHECK(std::equal(before.begin(), before.end(), m.replica(0).model().parameters().span().begin()));
  strat.train_step(m, ls::adam{}, ls::softmax_cross_entropy{}, db);
  CHECK(m.step() == 1);
}

TEST_CASE("hyperparameters() tells apart every value other than lr, bit for bit, and nothing else") {
  // Each optimiser, then a copy with one value changed (the smallest change a float allows).
  const auto next = [](float v) { return std::nextafter(v, 1.0f); };
  const ls::sgd s{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-4f};
  CHECK(ls::optimizer_hyperparameters(s) == ls::optimizer_hyperparameters(ls::sgd{.lr = 0.2f, .momentum = 0.9f, .weight_decay = 1e-4f}));
  CHECK(ls::optimizer_hyperparameters(s) != ls::optimizer_hyperparameters(ls::sgd{.lr = 0.1f, .momentum = next(0.9f), .weight_decay = 1e-4f}));
  CHECK(ls::optimizer_hyperparameters(s) != ls::optimizer_hyperparameters(ls::sgd{.lr = 0.1f, .momentum = 0.9f, .nesterov = true, .weight_decay = 1e-4f}));
  CHECK(ls::optimizer_hyperparameters(s) != ls::optimizer_hyperparameters(ls::sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = next(1e-4f)}));
  const auto adam_like = [&]<class O>(O o) {
    const std::string base = ls::optimizer_hyperparameters(o);
    CHECK_FALSE(base.empty());
    O c = o;
    c.lr = next(o.lr);
    CHECK(ls::optimizer_hyperparameters(c) == base);
    for (float O::*field : {&O::beta1, &O::beta2, &O::eps, &O::weight_decay}) {
      c = o;
      c.*field = next(o.*field);
      CHECK(ls::optimizer_hyperparameters(c) != base);
    }
  };
  adam_like(ls::adam{});
  adam_like(ls::adamw{});
  // -0 and +0 update alike: workers holding one and the other agree.
  CHECK(ls::optimizer_hyperparameters(ls::sgd{.weight_decay = -0.0f}) == ls::optimizer_hyperparameters(ls::sgd{.weight_decay = 0.0f}));
  CHECK(ls::optimizer_hyperparameters(ls::adamw{.beta1 = -0.0f}) == ls::optimizer_hyperparameters(ls::adamw{.beta1 = 0.0f}));
  // An optimiser without hyperparameters() has nothing to compare.
  CHECK(ls::optimizer_hyperparameters(sign_descent{}).empty());
}
