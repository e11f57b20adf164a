// A mismatch inside a residual block's body (a pooling window larger than the image): the path
// goes into the body (block at outer position 1, its body's layer 1).
// expect: layer_input_shape_mismatch<lockstep::layer_path<1, 1>, lockstep::shape<2, 6, 6>, lockstep::max_pool2d<7
#include <lockstep/layers.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/layers/residual.hpp>

namespace ls = lockstep;
using net = ls::sequential<ls::reshape<2, 6, 6>, ls::residual<ls::conv2d<2, 3, 1, 1>, ls::max_pool2d<7>>, ls::flatten,
                           ls::dense<72, 3>>;

int main() { ls::model<net> m; }
