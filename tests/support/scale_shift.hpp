#pragma once
// y = x * a + b per feature, a user layer with two parameters per feature and one planted defect
// in its backward pass: the programs that run the layer conformance suite on planted defects
// (tests/programs) bind it, and the suite must fail in the check made for the defect.

#include <cstddef>

#include <lockstep/core/random.hpp>
#include <lockstep/layers/layer.hpp>

namespace test_support {

/// What scale_shift's backward pass gets wrong.
enum class scale_shift_defect {
  dx_without_scale,         ///< the input gradient is dy (the factor a is missing)
  overwrites_accumulation,  ///< says `accumulates_gradients`, yet overwrites dparams under pass_info::accumulate
};

/// y = x * a + b per feature (a in [0.75, 1.25), b = 0.1 at init), with defect D in backward.
template <scale_shift_defect D>
struct scale_shift {
  using layer_concept = lockstep::layer_tag;      ///< opts in to the layer concept
  static constexpr std::size_t expected_input = 0;  ///< any width

  /// The layer bound to In features.
  template <std::size_t In>
  struct bind {
    static constexpr std::size_t input_size = In, output_size = In, param_count = 2 * In, workspace_per_sample = 0;
    /// Claimed only by the defect that breaks the claim.
    static constexpr bool accumulates_gradients = D == scale_shift_defect::overwrites_accumulation;

    template <class T>
    static void init(T* p, const lockstep::counter_rng& rng) {
      for (std::size_t j = 0; j < In; ++j) {
        p[j] = T(0.75) + T(0.5) * static_cast<T>(rng.uniform(j));
        p[In + j] = T(0.1);
      }
    }
    template <class T, class Ctx>
    static void forward(Ctx&, const lockstep::forward_args<T, Ctx, lockstep::shape<In>, lockstep::shape<In>>& a) {
      for (std::size_t r = 0; r < a.batch(); ++r)
        for (std::size_t j = 0; j < In; ++j)
          a.y.data()[r * In + j] = a.x.data()[r * In + j] * a.params[j] + a.params[In + j];
    }
    template <class T, class Ctx>
    static void backward(Ctx&, const lockstep::backward_args<T, Ctx, lockstep::shape<In>, lockstep::shape<In>>& a) {
      constexpr bool scale_dx = D != scale_shift_defect::dx_without_scale;
      for (std::size_t j = 0; j < In; ++j) {
        T da = 0, db = 0;
        for (std::size_t r = 0; r < a.batch(); ++r) {
          da += a.x.data()[r * In + j] * a.dy.data()[r * In + j];
          db += a.dy.data()[r * In + j];
          if (a.dx) a.dx.data()[r * In + j] = a.dy.data()[r * In + j] * (scale_dx ? a.params[j] : T(1));
        }
        // Neither defect adds under a.info.accumulate; only overwrites_accumulation claims it should.
        a.dparams[j] = da;
        a.dparams[In + j] = db;
      }
    }
  };
};

}  // namespace test_support
