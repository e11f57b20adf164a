// End-to-end: a 3-layer MLP trained on a synthetic separable problem reaches high accuracy on
// held-out points with SGD + momentum and with Adam.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

namespace {

/// XOR of the quadrants in [-1, 1]^2, with a margin of 0.1 around both axes: class 1 when the
/// signs of x and y differ. Each point also carries two noise features.
ls::data::batch xor_points(std::size_t rows, std::uint64_t seed) {
  ls::data::batch b;
  b.width = 4;
  const ls::counter_rng rng(seed, 0);
  std::uint64_t k = 0;
  while (b.labels.size() < rows) {
    const float x = rng.uniform(k++) * 2 - 1, y = rng.uniform(k++) * 2 - 1;
    if (std::abs(x) < 0.1f || std::abs(y) < 0.1f) continue;
    b.features.insert(b.features.end(), {x, y, rng.uniform(k++) * 0.2f - 0.1f, rng.uniform(k++) * 0.2f - 0.1f});
    b.labels.push_back((x > 0) != (y > 0) ? 1 : 0);
    b.indices.push_back(b.indices.size());
  }
  return b;
}

/// Copies rows [first, first + n) of `src` into `dst` (a reused mini-batch).
void slice(const ls::data::batch& src, std::size_t first, std::size_t n, ls::data::batch& dst) {
  dst.width = src.width;
  dst.features.assign(src.features.begin() + first * src.width, src.features.begin() + (first + n) * src.width);
  dst.labels.assign(src.labels.begin() + first, src.labels.begin() + first + n);
  dst.indices.assign(src.indices.begin() + first, src.indices.begin() + first + n);
}

using mlp = ls::sequential<ls::dense<4, 32>, ls::relu, ls::dense<32, 32>, ls::relu, ls::dense<32, 2>>;

template <class Optimizer>
double train_and_test(const Optimizer& opt, std::size_t epochs) {
  const ls::data::batch train = xor_points(2048, 1), test = xor_points(1000, 2);
  ls::replica<mlp> rep(ls::host_context{1}, ls::seed{3});
  const ls::softmax_cross_entropy loss;
  const std::size_t batch = 64;
  ls::data::batch mini;
  std::uint64_t step = 0;
  double first_epoch = 0, last_epoch = 0;
  for (std::size_t e = 0; e < epochs; ++e) {
    double sum = 0;
    for (std::size_t first = 0; first < train.rows(); first += batch) {
      slice(train, first, std::min(batch, train.rows() - first), mini);
      const ls::data::shard s = ls::data::whole(mini);
      sum += rep.forward_backward(loss, s, ls::pass_info::for_training(3, step)).sum;
      rep.apply(opt, ls::update_info{opt.lr, ++step, 1.0 / double(s.size)});
    }
    (e == 0 ? first_epoch : last_epoch) = sum / double(train.rows());
  }
  CHECK(last_epoch < first_epoch);
  const float* out = rep.predict(ls::data::whole(test), ls::pass_info{});
  std::size_t correct = 0;
  for (std::size_t r = 0; r < test.rows(); ++r)
    correct += (out[2 * r + 1] > out[2 * r] ? 1 : 0) == test.labels[r];
  return double(correct) / double(test.rows());
}

}  // namespace

TEST_CASE("an MLP learns XOR quadrants with sgd + momentum") {
  const double acc = train_and_test(ls::sgd{.lr = 0.05f, .momentum = 0.9f}, 30);
  CHECK(acc > 0.95);
}

TEST_CASE("an MLP learns XOR quadrants with adam") {
  const double acc = train_and_test(ls::adam{.lr = 0.01f}, 30);
  CHECK(acc > 0.95);
}
