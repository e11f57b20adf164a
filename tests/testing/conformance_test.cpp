// The library's own layers, losses, optimisers and schedules through the public conformance
// suites of include/lockstep/testing/ (the suites a user runs on their own types); the pipeline
// stages are in stage_conformance_test.cpp.
#define LOCKSTEP_TESTING_COUNT_ALLOCATIONS  // this file counts heap allocations (see allocations.hpp)
#include <lockstep/testing/layer.hpp>
#include <lockstep/testing/loss.hpp>
#include <lockstep/testing/optimizer.hpp>

#include <cmath>

#include <lockstep/layers.hpp>
#include <lockstep/losses.hpp>
#include <lockstep/optimizers.hpp>

namespace ls = lockstep;

TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, ls::bind_t<ls::dense<5, 3>, 5>, ls::bind_t<ls::dense<1, 1>, 1>,
                          ls::bind_t<ls::relu, 6>, ls::bind_t<ls::leaky_relu<1, 10>, 6>, ls::bind_t<ls::gelu, 4>,
                          ls::bind_t<ls::tanh, 3>, ls::bind_t<ls::sigmoid, 3>, ls::bind_t<ls::dropout<1, 4>, 9>,
                          ls::bind_t<ls::dropout<0, 1>, 2>,
                          ls::bind_t<ls::sequential<ls::dense<4, 8>, ls::tanh, ls::dropout<3, 10>,
                                                    ls::sequential<ls::dense<8, 6>, ls::gelu>, ls::dense<6, 2>>,
                                     4>);

TEST_CASE_TEMPLATE_INVOKE(lockstep_loss_conformance, ls::softmax_cross_entropy, ls::mse);

/// PyTorch's SGD (no momentum) and Adam, element by element, as the optimiser suite's references.
template <>
struct lockstep::testing::optimizer_reference<ls::sgd> {
  static void update(const ls::sgd& o, double* p, const double* g, double*, std::size_t n, const ls::update_info& u) {
    for (std::size_t i = 0; i < n; ++i) p[i] -= double(u.lr) * (g[i] * u.grad_scale + double(o.weight_decay) * p[i]);
  }
};
template <>
struct lockstep::testing::optimizer_reference<ls::adam> {
  static void update(const ls::adam& o, double* p, const double* g, double* s, std::size_t n, const ls::update_info& u) {
    const double b1 = o.beta1, b2 = o.beta2, t = double(u.step);
    for (std::size_t i = 0; i < n; ++i) {
      const double gi = g[i] * u.grad_scale + double(o.weight_decay) * p[i];
      s[i] = b1 * s[i] + (1 - b1) * gi;
      s[n + i] = b2 * s[n + i] + (1 - b2) * gi * gi;
      const double mhat = s[i] / (1 - std::pow(b1, t)), vhat = s[n + i] / (1 - std::pow(b2, t));
      p[i] -= double(u.lr) * mhat / (std::sqrt(vhat) + double(o.eps));
    }
  }
};

TEST_CASE_TEMPLATE_INVOKE(lockstep_optimizer_conformance, ls::sgd, ls::adam, ls::adamw);

TEST_CASE_TEMPLATE_INVOKE(lockstep_schedule_conformance, ls::constant_schedule, ls::step_schedule,
                          ls::cosine_schedule, ls::warmup_schedule<ls::cosine_schedule>);
