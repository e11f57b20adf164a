// The shape error docs/layers.md shows: pooling after flatten. One error, naming the pooling
// layer at position 2, the flat shape<784> it cannot take, and flatten at position 1 before it.
// expect: shape_mismatch::layer<lockstep::layer_path<2>, lockstep::max_pool2d<2.*::cannot_take<lockstep::shape<784> ?>::from_layer<lockstep::layer_path<1>, lockstep::flatten>
// errors: 1
#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

// example-begin layers-bad-pool
using bad = ls::sequential<ls::reshape<1, 28, 28>, ls::flatten, ls::max_pool2d<2>, ls::dense<196, 10>>;
// example-end layers-bad-pool

int main() { ls::model<bad> m; }
