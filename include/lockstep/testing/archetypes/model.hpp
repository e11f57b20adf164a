#pragma once
/// @file model.hpp (testing/archetypes)
/// The archetypes of the layer, loss, optimiser, learning-rate schedule and callback concepts:
/// types with exactly the members their concepts list — the compiled, readable specification of
/// what the library calls — as non-template functions of one element type (float) and one context
/// (host_context). They live outside the namespace lockstep, as users' types do, so nothing of
/// theirs is found by being in it. tests/train/archetypes_test.cpp trains them with fit.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <lockstep/backend/host/context.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/core/shape.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/optimizers/optimizer.hpp>
#include <lockstep/train/callbacks.hpp>

namespace lockstep_archetypes {

namespace ls = lockstep;

/// Layer: y = x * w elementwise (one weight per feature), any input width.
struct layer {
  using layer_concept = ls::layer_tag;
  static constexpr std::size_t expected_input = 0;
  template <std::size_t In>
  struct bind {
    static constexpr std::size_t input_size = In;
    static constexpr std::size_t output_size = In;
    static constexpr std::size_t param_count = In;
    static constexpr std::size_t workspace_per_sample = 0;
    static void init(float* p, const ls::counter_rng& rng) {
      for (std::size_t j = 0; j < In; ++j) p[j] = 0.5f + rng.uniform(j);
    }
    static void forward(ls::host_context&, const ls::forward_args<float, ls::host_context, ls::shape<In>, ls::shape<In>>& a) {
      for (std::size_t r = 0; r < a.batch(); ++r)
        for (std::size_t j = 0; j < In; ++j) a.y(r, j) = a.x(r, j) * a.params[j];
    }
    static void backward(ls::host_context&, const ls::backward_args<float, ls::host_context, ls::shape<In>, ls::shape<In>>& a) {
      for (std::size_t j = 0; j < In; ++j) a.dparams[j] = 0;
      for (std::size_t r = 0; r < a.batch(); ++r)
        for (std::size_t j = 0; j < In; ++j) {
          a.dparams[j] += a.x(r, j) * a.dy(r, j);
          if (a.dx) a.dx(r, j) = a.dy(r, j) * a.params[j];
        }
    }
  };
};

/// Loss: half the squared distance to the one-hot label, summed over rows (generic only over the
/// output row's shape, which the loss sees at compile time).
struct loss {
  using loss_concept = ls::loss_tag;
  static constexpr std::size_t scratch_per_row = 0;
  template <class Shape>
  ls::loss_sum evaluate(ls::host_context&, const ls::loss_args<float, ls::host_context, Shape>& a) const {
    double s = 0;
    for (std::size_t r = 0; r < a.rows(); ++r)
      for (std::size_t c = 0; c < Shape::size; ++c) {
        const float d = a.out.row(r)[c] - (static_cast<std::size_t>(a.target.labels[r]) == c ? 1.0f : 0.0f);
        s += 0.5 * static_cast<double>(d) * d;
        if (a.grad) a.grad.row(r)[c] = d;
      }
    return {s, a.rows(), 0};
  }
};

/// Optimiser: plain SGD on the mean gradient.
struct optimizer {
  using optimizer_concept = ls::optimizer_tag;
  float lr = 0.1f;
  std::size_t state_size(std::size_t) const { return 0; }
  void update(ls::host_context&, float* p, const float* g, float*, std::size_t n, const ls::update_info& u) const {
    for (std::size_t i = 0; i < n; ++i) p[i] -= u.lr * static_cast<float>(g[i] * u.grad_scale);
  }
};

/// Learning-rate schedule: halves the rate every 4 steps.
struct schedule {
  float operator()(float base, std::uint64_t step) const { return base * std::pow(0.5f, static_cast<float>(step / 4)); }
};

/// Epoch-end callback: counts its calls.
struct epoch_counter {
  std::shared_ptr<int> calls;
  void operator()(const ls::epoch_stats&) const { ++*calls; }
};

/// Step-end callback: records each update's loss.
struct step_recorder {
  std::shared_ptr<std::vector<double>> losses;
  void operator()(double l) const { losses->push_back(l); }
};

}  // namespace lockstep_archetypes
