// The code blocks of docs/layers.md that compile (the shape errors are in tests/compile_fail/).
#include <doctest/doctest.h>

#include "docs/common.hpp"

namespace layers_page {
// example-begin layers-cnn
#include <lockstep/lockstep.hpp>
namespace ls = lockstep;

// TensorFlow's layers-tutorial CNN on 28 x 28 grey images stored as flat rows of 784.
using cnn = ls::sequential<ls::reshape<1, 28, 28>,                            // rows become shape<1, 28, 28>
                           ls::conv2d<32, 5, 1, 2>, ls::relu, ls::max_pool2d<2>,  // shape<32, 14, 14>
                           ls::conv2d<64, 5, 1, 2>, ls::relu, ls::max_pool2d<2>,  // shape<64, 7, 7>
                           ls::flatten, ls::dense<3136, 1024>, ls::relu, ls::dropout<2, 5>,
                           ls::dense<1024, 10>>;
// example-end layers-cnn

// example-begin layers-resnet
template <std::size_t C>
using basic_block = ls::residual<ls::conv2d<C, 3, 1, 1>, ls::batch_norm<>, ls::relu,
                                 ls::conv2d<C, 3, 1, 1>, ls::batch_norm<>>;
using resnet = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<16, 3, 1, 1>, ls::batch_norm<>, ls::relu,
                              basic_block<16>, ls::relu, basic_block<16>, ls::relu,
                              ls::global_avg_pool, ls::dense<16, 10>>;
// example-end layers-resnet
}  // namespace layers_page

TEST_CASE("docs/layers.md: the CNN and the residual network are models") {
  using namespace layers_page;
  using cnn_model = ls::model<cnn>;
  using resnet_model = ls::model<resnet>;
  CHECK(cnn_model::input_size == 784);
  CHECK(cnn_model::output_size == 10);
  CHECK(resnet_model::input_size == 784);
  CHECK(resnet_model::output_size == 10);
  // conv 5x5: 32 * 25 + 32, 64 * 32 * 25 + 64; dense 3136 x 1024 + 1024; dense 1024 x 10 + 10
  CHECK(cnn_model::param_count == 832 + 51264 + 3212288 + 10250);
}
