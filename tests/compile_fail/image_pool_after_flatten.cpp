// Pooling after flatten, inside a nested block: the message names the layer's path (outer
// position 2, inner position 1), the flat shape it was given (4 x 8 x 8 = 256 features) and the
// pooling layer that needs an image.
// expect: layer_input_shape_mismatch<lockstep::layer_path<2, 1>, lockstep::shape<256>, lockstep::max_pool2d<2
#include <lockstep/layers.hpp>
#include <lockstep/layers/conv.hpp>

namespace ls = lockstep;
using block = ls::sequential<ls::flatten, ls::max_pool2d<2>>;
using net = ls::sequential<ls::reshape<1, 8, 8>, ls::conv2d<4, 3, 1, 1>, block, ls::dense<64, 10>>;

int main() { ls::model<net> m; }
