// The mistake of a first program (docs/layers.md shows it): a layer whose input width is not the
// previous layer's output, in a whole training program (strategy, fit). One error, naming layer 2 (dense<128, 10>; layers
// count from 0, activations included), the 128 inputs it expects, layer 1 (relu) and the 256 it
// gives; nothing cascades from it in the strategy or in fit.
// expect: shape_mismatch::layer<lockstep::layer_path<2>, lockstep::dense<128, 10.*::expects_inputs<128>::but_layer<lockstep::layer_path<1>, lockstep::activation<lockstep::relu_fn> ?>::gives<256>
// errors: 1
#include <cstdint>
#include <vector>

#include <lockstep/lockstep.hpp>

namespace ls = lockstep;
// example-begin layers-bad-width
using bad = ls::sequential<ls::dense<784, 256>, ls::relu, ls::dense<128, 10>>;
// example-end layers-bad-width

int main() {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> strategy;
  auto model = strategy.replicate<bad>(ls::seed{1});
  auto data = ls::data::from_memory(std::vector<float>(784), 784, std::vector<std::int32_t>(1)) | ls::data::batched(1);
  (void)ls::fit(strategy, model, ls::adam{}, ls::softmax_cross_entropy{}, data);
}
