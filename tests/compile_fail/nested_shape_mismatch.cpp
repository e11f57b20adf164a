// A mismatch inside a nested sequential: the message names the outer position (1), the inner
// position (2) and the two widths that differ (4 given, 5 expected).
// expect: nested_layer_shape_mismatch<lockstep::layer_path<1, 2>, 4, 5>
#include <lockstep/layers.hpp>

namespace ls = lockstep;
using block = ls::sequential<ls::dense<4, 4>, ls::relu, ls::dense<5, 2>>;
using net = ls::sequential<ls::dense<3, 4>, block, ls::dense<2, 1>>;

int main() { ls::model<net> m; }
