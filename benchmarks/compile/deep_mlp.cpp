// A 40-layer network (20 x dense<256, 256> + relu) trained with fit on synthetic data: the
// compile-cost probe of benchmarks/compile_cost.sh for deep compile-time networks.
#include <cstdio>
#include <vector>

#include <lockstep/data.hpp>
#include <lockstep/lockstep.hpp>
namespace ls = lockstep;

using block = ls::sequential<ls::dense<256, 256>, ls::relu>;
using net = ls::sequential<ls::dense<64, 256>, ls::relu, block, block, block, block, block, block, block, block, block,
                           block, block, block, block, block, block, block, block, block, block,
                           ls::dense<256, 10>>;

int main() {
  std::vector<float> x(512 * 64, 0.5f);
  std::vector<std::int32_t> y(512, 3);
  auto train = ls::data::from_memory(std::move(x), 64, std::move(y)) | ls::data::batched(64);
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> strategy;
  auto model = strategy.replicate<net>(ls::seed{1});
  auto h = ls::fit(strategy, model, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{}, train, {.epochs = 1, .quiet = true});
  std::printf("loss %.4f\n", h.last().train_loss);
}
