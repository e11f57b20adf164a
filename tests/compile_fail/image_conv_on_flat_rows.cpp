// A convolution on flat rows (no reshape), inside a nested block: the message names the layer's
// path (outer position 2, inner position 0), the flat shape it was given and the convolution.
// expect: layer_input_shape_mismatch<lockstep::layer_path<2, 0>, lockstep::shape<64>, lockstep::conv2d<4, 3
#include <lockstep/layers.hpp>
#include <lockstep/layers/conv.hpp>

namespace ls = lockstep;
using block = ls::sequential<ls::conv2d<4, 3>, ls::relu, ls::flatten>;
using net = ls::sequential<ls::dense<64, 64>, ls::relu, block, ls::dense<144, 10>>;

int main() { ls::model<net> m; }
