// A convolution on flat rows (no reshape), inside a nested block, in one error: the message names
// the layer's path (outer position 2, inner position 0), the convolution, the flat shape it was
// given and the layer before it (the outer relu at position 1).
// expect: shape_mismatch::layer<lockstep::layer_path<2, 0>, lockstep::conv2d<4, 3.*::cannot_take<lockstep::shape<64> ?>::from_layer<lockstep::layer_path<1>, lockstep::activation<lockstep::relu_fn> ?>
// errors: 1
#include <lockstep/layers.hpp>
#include <lockstep/layers/conv.hpp>

namespace ls = lockstep;
using block = ls::sequential<ls::conv2d<4, 3>, ls::relu, ls::flatten>;
using net = ls::sequential<ls::dense<64, 64>, ls::relu, block, ls::dense<144, 10>>;

int main() { ls::model<net> m; }
