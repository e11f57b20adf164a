// A LeNet-size CNN trained with fit on two CPU replicas: the compile-cost yardstick of an image
// network (benchmarks/compile_cost.sh), the network of dlib's LeNet example in lockstep's layers.
#include <cstdio>

#include <lockstep/data.hpp>
#include <lockstep/lockstep.hpp>
namespace ls = lockstep;

using lenet = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<6, 5, 1, 2>, ls::relu, ls::max_pool2d<2>,
                             ls::conv2d<16, 5>, ls::relu, ls::max_pool2d<2>, ls::flatten, ls::dense<400, 120>,
                             ls::relu, ls::dense<120, 84>, ls::relu, ls::dense<84, 10>>;

int main() {
  const std::string dir = "/usr/share/datasets/fashion-mnist/";
  auto load = [&](const char* split) {
    return ls::data::idx(dir + split + "-images-idx3-ubyte.gz", dir + split + "-labels-idx1-ubyte.gz") |
           ls::data::map(ls::data::scale(1.0f / 255));
  };
  auto train = load("train") | ls::data::shuffle(60'000, 7) | ls::data::batched(128) | ls::data::prefetch(2);
  auto test = load("t10k") | ls::data::batched(1000);

  ls::mirrored<ls::cpus> strategy(ls::device_selection::first(2));
  auto model = strategy.replicate<lenet>(ls::seed{42});
  (void)ls::fit(strategy, model, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{}, train, {.epochs = 1, .validation = test});
  const auto result = ls::evaluate(strategy, model, ls::softmax_cross_entropy{}, test);
  std::printf("test_accuracy=%.4f\n", result.accuracy);
}
