// A bound layer without backward: the model names the missing member.
// expect: a bound layer needs `static void backward\(Ctx& ctx
#include <lockstep/layers.hpp>

struct no_backward {
  using layer_concept = lockstep::layer_tag;
  static constexpr std::size_t expected_input = 0;
  template <std::size_t In>
  struct bind {
    static constexpr std::size_t input_size = In, output_size = In, param_count = 0, workspace_per_sample = 0;
    template <class T>
    static void init(T*, const lockstep::counter_rng&) {}
    template <class T, class Ctx>
    static void forward(Ctx&, const lockstep::forward_args<T, Ctx, lockstep::shape<In>, lockstep::shape<In>>&) {}
  };
};

int main() { lockstep::model<lockstep::sequential<lockstep::dense<3, 2>, no_backward>> m; }
