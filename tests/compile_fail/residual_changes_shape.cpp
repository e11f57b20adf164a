// A residual block whose body maps 2 x 6 x 6 images to 3 x 6 x 6 ones: y = x + f(x) cannot add
// them, and the one error names the body and both shapes.
// expect: shape_mismatch::residual_body<lockstep::sequential<lockstep::conv2d<3, 3, 1, 1.*::maps<lockstep::shape<2, 6, 6> ?>::to<lockstep::shape<3, 6, 6> ?>
// errors: 1
#include <lockstep/layers.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/layers/residual.hpp>

namespace ls = lockstep;
using block = ls::residual<ls::conv2d<3, 3, 1, 1>, ls::relu>;
using bound = ls::bind_shape_t<block, ls::shape<2, 6, 6>>;

int main() { return static_cast<int>(bound::output_size); }
