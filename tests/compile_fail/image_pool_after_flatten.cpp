// Pooling after flatten, inside a nested block, in one error: the message names the layer's path
// (outer position 2, inner position 1), the pooling layer that needs an image, the flat shape it
// was given (4 x 8 x 8 = 256 features) and the layer before it (flatten at 2, 0).
// expect: shape_mismatch::layer<lockstep::layer_path<2, 1>, lockstep::max_pool2d<2.*::cannot_take<lockstep::shape<256> ?>::from_layer<lockstep::layer_path<2, 0>, lockstep::flatten>
// errors: 1
#include <lockstep/layers.hpp>
#include <lockstep/layers/conv.hpp>

namespace ls = lockstep;
using block = ls::sequential<ls::flatten, ls::max_pool2d<2>>;
using net = ls::sequential<ls::reshape<1, 8, 8>, ls::conv2d<4, 3, 1, 1>, block, ls::dense<64, 10>>;

int main() { ls::model<net> m; }
