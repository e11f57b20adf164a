// A mismatch inside a residual block's body (a pooling window larger than the image), in one
// error: the path goes into the body (block at outer position 1, its body's layer 1), and the
// layer before it is the body's convolution.
// expect: shape_mismatch::layer<lockstep::layer_path<1, 1>, lockstep::max_pool2d<7.*::cannot_take<lockstep::shape<2, 6, 6> ?>::from_layer<lockstep::layer_path<1, 0>, lockstep::conv2d<2, 3, 1, 1
// errors: 1
#include <lockstep/layers.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/layers/residual.hpp>

namespace ls = lockstep;
using net = ls::sequential<ls::reshape<2, 6, 6>, ls::residual<ls::conv2d<2, 3, 1, 1>, ls::max_pool2d<7>>, ls::flatten,
                           ls::dense<72, 3>>;

int main() { ls::model<net> m; }
