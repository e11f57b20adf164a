// Data-parallel scaling on the host: config M (784-512-512-10 ReLU MLP) at global batch 256,
// trained with 1 and with 2 CPU replicas (a cpu<I> replica is one core: 1 BLAS thread each).
// speedup = samples/s with n replicas over samples/s with 1, measured in the same run.

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include <fmt/core.h>

#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

namespace {

using config_m = ls::sequential<ls::dense<784, 512>, ls::relu, ls::dense<512, 512>, ls::relu, ls::dense<512, 10>>;

ls::data::batch make_batch(std::size_t rows) {
  ls::data::batch b;
  b.width = 784;
  const ls::counter_rng rng(7, 1);
  b.features.resize(rows * 784);
  for (std::size_t i = 0; i < b.features.size(); ++i) b.features[i] = rng.uniform(i);
  for (std::size_t r = 0; r < rows; ++r) {
    b.labels.push_back(static_cast<std::int32_t>(rng.u32(r) % 10));
    b.indices.push_back(r);
  }
  return b;
}

template <class S>
double samples_per_s(const ls::data::batch& b) {
  S s;
  auto m = s.template replicate<config_m>(ls::seed{1});
  auto g = std::make_shared<const ls::data::batch>(b);
  ls::data::distributed_batch d{g, ls::data::split(*g, S::replica_count)};
  const ls::sgd opt{.lr = 0.01f, .momentum = 0.9f};
  for (int i = 0; i < 5; ++i) ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, d);  // warm up
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    const int steps = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, d);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(steps * b.rows()) / sec);
  }
  return best;
}

}  // namespace

int main() {
  const auto b = make_batch(256);
  const double one = samples_per_s<ls::one_device<ls::cpu<0>>>(b);
  const double two = samples_per_s<ls::mirrored<ls::cpu<0>, ls::cpu<1>>>(b);
  fmt::print("replicas=1 samples_per_s={:.0f} speedup=1.00\n", one);
  fmt::print("replicas=2 samples_per_s={:.0f} speedup={:.2f}\n", two, two / one);
}
