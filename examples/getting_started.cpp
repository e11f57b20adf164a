// The program of docs/getting-started.md: two CPU replicas, one input pipeline, three epochs.
// usage: getting_started [data directory]   (default /usr/share/datasets/fashion-mnist)
// example-begin getting-started
#include <cstdio>
#include <string>

#include <lockstep/lockstep.hpp>
namespace ls = lockstep;

using mlp = ls::sequential<ls::dense<784, 256>, ls::relu, ls::dropout<1, 10>, ls::dense<256, 10>>;

int main(int argc, char** argv) {
  const std::string usage = "usage: getting_started [data directory]";
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf("%s   (default /usr/share/datasets/fashion-mnist)\n", usage.c_str());
    return 0;
  }
  // run_main ends the program cleanly on an error: `error: <what>` (and each cause) on stderr,
  // exit code 2 for bad input or options, 1 for anything else; stdout is flushed first.
  return ls::run_main([&] {
    if (argc > 2) throw ls::config_error(usage + ": one argument at most, got " + std::to_string(argc - 1));
    ls::mirrored<ls::cpu<0>, ls::cpu<1>> strategy;  // two replicas in lockstep
    auto model = strategy.replicate<mlp>(ls::seed{42});

    const std::string dir = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
    auto load = [&](const std::string& split) {
      return ls::data::idx(dir + "/" + split + "-images-idx3-ubyte.gz", dir + "/" + split + "-labels-idx1-ubyte.gz") |
             ls::data::map(ls::data::scale(1.0f / 255));
    };
    auto train = load("train") | ls::data::shuffle(60'000, 7) | ls::data::batched(128) | ls::data::prefetch(2);
    auto test = load("t10k") | ls::data::batched(1000);

    auto history = ls::fit(strategy, model, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{}, train,
                           {.epochs = 3, .validation = test});
    auto result = ls::evaluate(strategy, model, ls::softmax_cross_entropy{}, test);
    std::printf("test accuracy %.4f over %llu samples (last train loss %.4f)\n", result.accuracy,
                static_cast<unsigned long long>(result.samples), history.last().train_loss);
  });
}
// example-end getting-started
