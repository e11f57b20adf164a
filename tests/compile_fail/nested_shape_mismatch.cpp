// A mismatch inside a nested sequential, in one error: the message names the layer's path (outer
// position 1, inner position 2) and type, the width it expects (5), the layer before it (relu at
// 1, 1) and the width that one gives (4).
// expect: shape_mismatch::layer<lockstep::layer_path<1, 2>, lockstep::dense<5, 2.*::expects_inputs<5>::but_layer<lockstep::layer_path<1, 1>, lockstep::activation<lockstep::relu_fn> ?>::gives<4>
// errors: 1
#include <lockstep/layers.hpp>

namespace ls = lockstep;
using block = ls::sequential<ls::dense<4, 4>, ls::relu, ls::dense<5, 2>>;
using net = ls::sequential<ls::dense<3, 4>, block, ls::dense<2, 1>>;

int main() { ls::model<net> m; }
