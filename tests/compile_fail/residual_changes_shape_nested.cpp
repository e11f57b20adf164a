// The same residual block inside a network: the message names the block's path (outer position
// 1, inner position 1), the shape it was given and the block, whose body (its template
// arguments) changes that shape.
// expect: layer_input_shape_mismatch<lockstep::layer_path<1, 1>, lockstep::shape<2, 6, 6>, lockstep::residual<
#include <lockstep/layers.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/layers/residual.hpp>

namespace ls = lockstep;
using block = ls::sequential<ls::relu, ls::residual<ls::conv2d<3, 3, 1, 1>, ls::relu>>;
using net = ls::sequential<ls::reshape<2, 6, 6>, block, ls::flatten, ls::dense<72, 3>>;

int main() { ls::model<net> m; }
