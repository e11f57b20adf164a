// The complete examples of docs/extending.md, compiled and run: a user-defined layer, loss,
// optimiser and pipeline stage, written outside the library's namespace against its concepts,
// composed with the library's own pieces, trained on two replicas, and run through the public
// conformance suites. The text between
// `example-begin NAME` and `example-end` is what the page shows (tests/extending/check_docs.cmake
// checks that the page and this file agree).

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include <lockstep/lockstep.hpp>

// example-begin layer
#include <lockstep/lockstep.hpp>

namespace my {

namespace ls = lockstep;

// Device code sees plain functors: one call per feature j, over all rows (host and GPU alike).
template <class T>
struct scale_shift_forward {
  const T *p, *x;
  T* y;
  std::size_t rows, width;
  LOCKSTEP_HD void operator()(std::size_t j) const {
    for (std::size_t r = 0; r < rows; ++r) y[r * width + j] = x[r * width + j] * p[j] + p[width + j];
  }
};
template <class T>
struct scale_shift_backward {
  const T *p, *x, *dy;
  T *dx, *dp;
  std::size_t rows, width;
  LOCKSTEP_HD void operator()(std::size_t j) const {
    T da = 0, db = 0;  // rows in order: the sums do not depend on anything but the shard
    for (std::size_t r = 0; r < rows; ++r) {
      da += x[r * width + j] * dy[r * width + j];
      db += dy[r * width + j];
      if (dx) dx[r * width + j] = dy[r * width + j] * p[j];
    }
    dp[j] = da;  // backward OVERWRITES the layer's gradient slice
    dp[width + j] = db;
  }
};

/// y = x * a + b per feature: 2 * width parameters (a, then b), any input width.
struct scale_shift {
  using layer_concept = ls::layer_tag;              // opts in to lockstep::layer
  static constexpr std::size_t expected_input = 0;  // takes any width (as activations do)

  template <std::size_t In>
  struct bind {  // the layer at input width In: a lockstep::bound_layer_for<bind<In>, T, Ctx>
    static constexpr std::size_t input_size = In;
    static constexpr std::size_t output_size = In;
    static constexpr std::size_t param_count = 2 * In;
    static constexpr std::size_t workspace_per_sample = 0;

    template <class T>
    static void init(T* p, const ls::counter_rng& rng) {  // host memory, this layer's own stream
      for (std::size_t j = 0; j < In; ++j) {
        p[j] = T(0.75) + T(0.5) * static_cast<T>(rng.uniform(j));
        p[In + j] = T(0);
      }
    }
    // a.x and a.y view a.batch() rows of shape<In> on Ctx's device; a.params is this layer's slice.
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const ls::forward_args<T, Ctx, ls::shape<In>, ls::shape<In>>& a) {
      for_each_index(ctx, In, scale_shift_forward<T>{a.params, a.x.data(), a.y.data(), a.batch(), In});  // ADL on Ctx
    }
    // a.dx is empty (data() null) when nobody needs the input gradient: the model's first layer.
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const ls::backward_args<T, Ctx, ls::shape<In>, ls::shape<In>>& a) {
      for_each_index(ctx, In,
                     scale_shift_backward<T>{a.params, a.x.data(), a.dy.data(), a.dx.data(), a.dparams, a.batch(), In});
    }
  };
};

}  // namespace my
// example-end

// example-begin loss
namespace my {

template <class T>
struct huber_row {
  const T *y, *t;
  T *grad, *loss;
  std::size_t cols;
  LOCKSTEP_HD void operator()(std::size_t r) const {
    T s = 0;
    for (std::size_t c = 0; c < cols; ++c) {
      const T d = y[r * cols + c] - t[r * cols + c];
      const T a = d < T(0) ? -d : d;
      s += a <= T(1) ? T(0.5) * d * d : a - T(0.5);
      if (grad) grad[r * cols + c] = a <= T(1) ? d : (d < T(0) ? T(-1) : T(1));
    }
    loss[r] = s;
  }
};

/// Huber loss (delta 1) against regression targets, summed over the outputs of a row.
struct huber {
  using loss_concept = lockstep::loss_tag;           // opts in to lockstep::loss
  static constexpr std::size_t scratch_per_row = 1;  // one per-row loss (at most 4)

  // const: fit and evaluate call it on a const loss. Returns the SUM over the rows and their
  // count; the replicas' sums are added and divided by the global count. Shape is the model's
  // output row; a.grad is empty when only the value is wanted (evaluation).
  template <class T, class Ctx, class Shape>
  lockstep::loss_sum evaluate(Ctx& ctx, const lockstep::loss_args<T, Ctx, Shape>& a) const {
    constexpr std::size_t cols = Shape::size;
    const std::size_t rows = a.rows();
    if (rows == 0) return {};
    if (!a.target.values || a.target.width != cols)
      throw lockstep::shape_error("my::huber: targets must be as wide as the output");
    for_each_index(ctx, rows, huber_row<T>{a.out.data(), a.target.values, a.grad.data(), a.scratch, cols});
    return {sum(ctx, a.scratch, rows), rows};
  }
};

}  // namespace my
// example-end

// example-begin optimizer
namespace my {

template <class T>
struct sign_step {
  T* p;
  const T* g;
  T* velocity;
  T lr, beta, scale;
  LOCKSTEP_HD void operator()(std::size_t i) const {
    velocity[i] = beta * velocity[i] + (T(1) - beta) * (g[i] * scale);
    p[i] -= lr * (velocity[i] > T(0) ? T(1) : velocity[i] < T(0) ? T(-1) : T(0));
  }
};

/// Sign descent on a running average of the gradient (a simplified "Lion").
struct sign_momentum {
  using optimizer_concept = lockstep::optimizer_tag;  // opts in to lockstep::optimizer
  float lr = 0.01f;                                   // fit sets it to each update's scheduled rate
  float beta = 0.9f;

  // One velocity per parameter; the library zeroes it, keeps it per replica and checkpoints it.
  std::size_t state_size(std::size_t n) const { return n; }

  // grads hold SUMS over the global batch: info.grad_scale (1 / global count) makes them means.
  template <class T, class Ctx>
  void update(Ctx& ctx, T* p, const T* g, T* state, std::size_t n, const lockstep::update_info& info) const {
    for_each_index(ctx, n, sign_step<T>{p, g, state, static_cast<T>(info.lr), static_cast<T>(beta),
                                        static_cast<T>(info.grad_scale)});
  }
};

}  // namespace my
// example-end

// example-begin stage
namespace my {

namespace ld = lockstep::data;

template <class T>
ld::generator<T> every_nth_gen(ld::generator<T> up, std::uint64_t n) {
  std::uint64_t i = 0;
  for (auto&& x : up)
    if (i++ % n == 0) co_yield std::move(x);  // lazily, one element at a time
}

/// Stage: keeps every n-th element (`dataset | every_nth{3}`).
struct every_nth : ld::closure<every_nth> {
  std::uint64_t n = 1;
  every_nth(std::uint64_t k) : n(k) {
    if (k == 0) throw lockstep::config_error("my::every_nth: n must be positive");
  }
  template <class T>
  ld::dataset<T> operator()(ld::dataset<T> d) const {  // a dataset is a factory of epochs
    return ld::dataset<T>{[d = std::move(d), n = n](std::uint64_t epoch) { return every_nth_gen(d.epoch(epoch), n); }};
  }
};

}  // namespace my
// example-end

namespace ls = lockstep;

static_assert(ls::layer<my::scale_shift>);
static_assert(ls::bound_layer_for<ls::bind_t<my::scale_shift, 7>, double, ls::host_context>);
static_assert(ls::loss_for<my::huber, float, ls::host_context>);
static_assert(ls::optimizer_for<my::sign_momentum, float, ls::host_context>);
static_assert(ls::data::pipeline_stage<my::every_nth, ls::data::sample> && ls::data::pipeline_stage<my::every_nth, int>);
static_assert(ls::data::pipeline_stage<decltype(ls::data::batched(4)), ls::data::sample>);
static_assert(!ls::data::pipeline_stage<int, int>);

namespace {

// example-begin train
ls::data::dataset<ls::data::sample> regression_data() {
  std::vector<float> x(300 * 4), y(300 * 2);
  const ls::counter_rng rng(3, 4);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i) * 2 - 1;
  for (std::size_t r = 0; r < 300; ++r) {  // a smooth target of the first two features
    y[2 * r] = std::sin(2 * x[4 * r]);
    y[2 * r + 1] = x[4 * r + 1] * x[4 * r + 1];
  }
  return ls::data::from_memory(std::move(x), 4, std::move(y), 2);
}

template <std::size_t In, std::size_t Width>
using block = ls::sequential<ls::dense<In, Width>, my::scale_shift, ls::tanh>;  // a user template

using net = ls::sequential<block<4, 16>, ls::dense<16, 2>, my::scale_shift>;  // sequentials nest

ls::history train_example() {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> strategy;
  auto model = strategy.replicate<net>(ls::seed{7});
  const auto train = regression_data() | my::every_nth{2} | ls::data::shuffle(150, 5) | ls::data::batched(16);
  return ls::fit(strategy, model, my::sign_momentum{.lr = 3e-3f}, my::huber{}, train,
                 {.epochs = 8, .quiet = true});
}
// example-end

}  // namespace

TEST_CASE("extending: the user-defined layer, loss, optimiser and stage of docs/extending.md train together") {
  const ls::history h = train_example();
  REQUIRE(h.epochs.size() == 8);
  CHECK(h.epochs[0].samples == 150);  // every second sample of 300
  CHECK(h.epochs.back().train_loss < 0.5 * h.epochs.front().train_loss);
}

TEST_CASE("extending: every_nth keeps exactly the elements at multiples of n, lazily, every epoch") {
  for (std::uint64_t n : {1u, 2u, 3u, 7u, 11u}) {
    CAPTURE(n);
    std::vector<int> v(23);
    for (int i = 0; i < 23; ++i) v[static_cast<std::size_t>(i)] = i;
    const auto d = ls::data::from_vector(v) | my::every_nth{n};
    for (std::uint64_t e = 0; e < 2; ++e) {
      std::vector<int> got;
      for (auto&& x : d.epoch(e)) got.push_back(x);
      std::vector<int> want;
      for (int i = 0; i < 23; i += static_cast<int>(n)) want.push_back(i);
      CHECK(got == want);
    }
  }
  CHECK_THROWS_AS(my::every_nth{0}, ls::config_error);
}

// example-begin conformance
#define LOCKSTEP_TESTING_COUNT_ALLOCATIONS  // in ONE file per test binary: also check "no heap allocation"
#include <lockstep/testing/layer.hpp>
#include <lockstep/testing/loss.hpp>
#include <lockstep/testing/optimizer.hpp>
#include <lockstep/testing/stage.hpp>

// The layer at two widths, the loss, the optimiser and the stage through the library's suites.
TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, lockstep::bind_t<my::scale_shift, 1>,
                          lockstep::bind_t<my::scale_shift, 7>);
TEST_CASE_TEMPLATE_INVOKE(lockstep_loss_conformance, my::huber);

// The optimiser's definition as scalar code: the suite compares update with it.
template <>
struct lockstep::testing::optimizer_reference<my::sign_momentum> {
  static void update(const my::sign_momentum& o, double* p, const double* g, double* v, std::size_t n,
                     const lockstep::update_info& u) {
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = o.beta * v[i] + (1 - o.beta) * (g[i] * u.grad_scale);
      p[i] -= u.lr * (v[i] > 0 ? 1.0 : v[i] < 0 ? -1.0 : 0.0);
    }
  }
};
TEST_CASE_TEMPLATE_INVOKE(lockstep_optimizer_conformance, my::sign_momentum);

// The stage, described for the stage suite: made from a seed (unused), drops elements.
struct every_third {
  static my::every_nth make(std::uint64_t) { return my::every_nth{3}; }
  static constexpr bool keeps_all = false;
};
TEST_CASE_TEMPLATE_INVOKE(lockstep_stage_conformance, every_third);
// example-end
