// The layer conformance suite run on a layer with one planted bug: its backward forgets the scale
// in the input gradient (dx = dy instead of dy * a). The suite must fail, and its whole report
// must stay short and give numbers: the first failing elements of the one check that fails, with
// the analytic and numeric values, their difference and the tolerance, then how many more
// (checked by programs/planted_bug_layer_report, see programs.cmake).
#include <doctest/doctest.h>

#include <cstddef>

#include <lockstep/layers/layer.hpp>
#include <lockstep/testing/layer.hpp>

namespace planted {

namespace ls = lockstep;

/// y = x * a + b per feature, with the bug in backward.
struct scale_shift_bug {
  using layer_concept = ls::layer_tag;
  static constexpr std::size_t expected_input = 0;

  template <std::size_t In>
  struct bind {
    static constexpr std::size_t input_size = In, output_size = In, param_count = 2 * In, workspace_per_sample = 0;

    template <class T>
    static void init(T* p, const ls::counter_rng& rng) {
      for (std::size_t j = 0; j < In; ++j) {
        p[j] = T(0.75) + T(0.5) * static_cast<T>(rng.uniform(j));
        p[In + j] = T(0);
      }
    }
    template <class T, class Ctx>
    static void forward(Ctx&, const ls::forward_args<T, Ctx, ls::shape<In>, ls::shape<In>>& a) {
      for (std::size_t r = 0; r < a.batch(); ++r)
        for (std::size_t j = 0; j < In; ++j) a.y.data()[r * In + j] = a.x.data()[r * In + j] * a.params[j] + a.params[In + j];
    }
    template <class T, class Ctx>
    static void backward(Ctx&, const ls::backward_args<T, Ctx, ls::shape<In>, ls::shape<In>>& a) {
      for (std::size_t j = 0; j < In; ++j) {
        T da = 0, db = 0;
        for (std::size_t r = 0; r < a.batch(); ++r) {
          da += a.x.data()[r * In + j] * a.dy.data()[r * In + j];
          db += a.dy.data()[r * In + j];
          if (a.dx) a.dx.data()[r * In + j] = a.dy.data()[r * In + j];  // the bug: * a.params[j] is missing
        }
        a.dparams[j] = da;
        a.dparams[In + j] = db;
      }
    }
  };
};

}  // namespace planted

TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, lockstep::bind_t<planted::scale_shift_bug, 7>);
