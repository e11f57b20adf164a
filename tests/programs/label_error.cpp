// A common mistake of a first program: a model with 5 outputs trained on data with 10 classes,
// through lockstep::run_main. It prints a line to stdout first (that line must survive
// a redirected stdout), then fit fails on the first step: the program ends with exit code 2,
// `error: ...` naming the replica and step, and the nested cause naming the label and sample.
#include <cstdint>
#include <cstdio>
#include <vector>

#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

int main() {
  return ls::run_main([] {
    std::printf("training a 5-output model on 10 classes\n");
    using net = ls::sequential<ls::dense<4, 8>, ls::relu, ls::dense<8, 5>>;
    ls::mirrored<ls::cpu<0>, ls::cpu<1>> strategy;
    auto model = strategy.replicate<net>(ls::seed{1});
    std::vector<float> x(48 * 4, 0.5f);
    std::vector<std::int32_t> y(48);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>(i % 5);
    y[5] = 9;  // row 5 of replica 0's shard of the first batch
    auto data = ls::data::from_memory(x, 4, y) | ls::data::batched(16);
    (void)ls::fit(strategy, model, ls::adam{}, ls::softmax_cross_entropy{}, data, {.quiet = true});
    std::printf("not reached\n");
  });
}
