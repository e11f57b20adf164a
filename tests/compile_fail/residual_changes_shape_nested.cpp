// The same residual block inside a network, in one error: the message names the block's path
// (outer position 1, inner position 1), the block, whose body (its template arguments) changes
// the shape, the shape it was given and the layer before it (relu at 1, 0).
// expect: shape_mismatch::layer<lockstep::layer_path<1, 1>, lockstep::residual<.*::cannot_take<lockstep::shape<2, 6, 6> ?>::from_layer<lockstep::layer_path<1, 0>, lockstep::activation<lockstep::relu_fn> ?>
// errors: 1
#include <lockstep/layers.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/layers/residual.hpp>

namespace ls = lockstep;
using block = ls::sequential<ls::relu, ls::residual<ls::conv2d<3, 3, 1, 1>, ls::relu>>;
using net = ls::sequential<ls::reshape<2, 6, 6>, block, ls::flatten, ls::dense<72, 3>>;

int main() { ls::model<net> m; }
