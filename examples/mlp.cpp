// A small multi-layer perceptron trained on synthetic data on one CPU device.
//
// The data are points of several classes in a 16-dimensional space: each class is a Gaussian
// cloud around its own centre, drawn from lockstep's counter-based generator, so every run is
// identical. The example shows the pieces a training loop is made of: a network type, a replica
// (one device's parameters, gradients and optimiser state), global batches cut into shards, a
// loss that returns sums, and an optimiser step scaled by the batch size.
//
// usage: mlp [epochs]   (default 8)
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <string>
#include <system_error>
#include <vector>

#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

namespace {

constexpr std::size_t features = 16;
constexpr std::size_t classes = 5;

/// The network: its shapes are checked when it is compiled.
using mlp = ls::sequential<ls::dense<features, 64>, ls::relu, ls::dropout<1, 10>, ls::dense<64, 32>, ls::relu,
                           ls::dense<32, classes>>;

/// `rows` labelled points: class c is a Gaussian cloud (sigma `noise`) around centre c.
ls::data::batch make_points(std::size_t rows, double noise, std::uint64_t seed) {
  const ls::counter_rng centres(1, 0);  // the same centres for the training and the test set
  const ls::counter_rng draw(seed, 1);
  ls::data::batch b;
  b.width = features;
  b.features.resize(rows * features);
  b.labels.resize(rows);
  b.indices.resize(rows);
  for (std::size_t r = 0; r < rows; ++r) {
    const auto c = static_cast<std::int32_t>(draw.u32(r) % classes);
    for (std::size_t f = 0; f < features; ++f) {
      const double centre = centres.normal(static_cast<std::uint64_t>(c) * features + f);
      b.features[r * features + f] = static_cast<float>(centre + noise * draw.normal(1'000'000 + r * features + f));
    }
    b.labels[r] = c;
    b.indices[r] = r;
  }
  return b;
}

/// Copies the rows `order[first .. first + n)` of `src` into `dst` (a mini-batch reused every step).
void gather(const ls::data::batch& src, const std::vector<std::size_t>& order, std::size_t first, std::size_t n,
            ls::data::batch& dst) {
  dst.width = src.width;
  dst.features.resize(n * src.width);
  dst.labels.resize(n);
  dst.indices.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t r = order[first + i];
    std::copy_n(src.features.begin() + static_cast<std::ptrdiff_t>(r * src.width), src.width,
                dst.features.begin() + static_cast<std::ptrdiff_t>(i * src.width));
    dst.labels[i] = src.labels[r];
    dst.indices[i] = src.indices[r];
  }
}

/// Fraction of the rows of `b` the replica classifies correctly (evaluation mode).
template <class Replica>
double accuracy(Replica& rep, const ls::data::batch& b) {
  const float* out = rep.predict(ls::data::whole(b), ls::pass_info{});
  std::size_t correct = 0;
  for (std::size_t r = 0; r < b.rows(); ++r) {
    const float* row = out + r * classes;
    correct += static_cast<std::int32_t>(std::max_element(row, row + classes) - row) == b.labels[r];
  }
  return static_cast<double>(correct) / static_cast<double>(b.rows());
}

/// The epochs of the command line (default 8). @throws config_error for anything but an integer >= 1,
/// or more than one argument.
std::size_t epochs_of(int argc, char** argv) {
  if (argc > 2) throw ls::config_error("usage: mlp [epochs]: one argument at most, got " + std::to_string(argc - 1));
  if (argc < 2) return 8;
  const std::string text = argv[1];
  std::size_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc{} || end != text.data() + text.size() || n == 0)
    throw ls::config_error("usage: mlp [epochs]: '" + text + "' is not a number of epochs (an integer >= 1)");
  return n;
}

int train(int argc, char** argv) {
  const std::size_t epochs = epochs_of(argc, argv);
  const std::size_t batch_size = 64;
  const std::uint64_t seed = 42;

  const ls::data::batch train = make_points(4096, 1.2, 2), test = make_points(1024, 1.2, 3);
  ls::replica<mlp> rep(ls::host_context{1}, ls::seed{seed});
  const ls::softmax_cross_entropy loss;
  const ls::adam opt{.lr = 2e-3f};
  const ls::cosine_schedule schedule{.total = epochs * ((train.rows() + batch_size - 1) / batch_size),
                                     .min_lr = 1e-4f};

  fmt::print("lockstep {}.{}.{} mlp example: {} parameters, {} training and {} test points, {} classes\n",
             ls::version_major, ls::version_minor, ls::version_patch, ls::replica<mlp>::model_type::param_count,
             train.rows(), test.rows(), classes);
  fmt::print("before training: test accuracy {:.1f}%\n", 100 * accuracy(rep, test));

  std::vector<std::size_t> order(train.rows());
  ls::data::batch mini;
  std::uint64_t step = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t epoch = 0; epoch < epochs; ++epoch) {
    // a shuffle that depends only on (seed, epoch)
    std::iota(order.begin(), order.end(), std::size_t{0});
    const ls::counter_rng shuffle(seed, ls::mix_stream(7, epoch));
    for (std::size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[shuffle.u32(i) % (i + 1)]);

    double loss_sum = 0;
    std::size_t seen = 0;
    for (std::size_t first = 0; first < train.rows(); first += batch_size) {
      gather(train, order, first, std::min(batch_size, train.rows() - first), mini);
      const ls::data::shard shard = ls::data::whole(mini);
      const ls::loss_sum l = rep.forward_backward(loss, shard, ls::pass_info{true, seed, step, 0, 0});
      // the loss is a SUM over the batch: the update divides by the batch size
      rep.apply(opt, ls::update_info{schedule(opt.lr, step), step + 1, 1.0 / static_cast<double>(l.count)});
      loss_sum += l.sum;
      seen += l.count;
      ++step;
    }
    const double test_loss = rep.evaluate(loss, ls::data::whole(test), ls::pass_info{}).sum / double(test.rows());
    fmt::print("epoch {:2}/{}: train loss {:.4f}  test loss {:.4f}  test accuracy {:.1f}%\n", epoch + 1, epochs,
               loss_sum / double(seen), test_loss, 100 * accuracy(rep, test));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double final_accuracy = accuracy(rep, test);
  fmt::print("trained {} steps in {:.2f} s; final test accuracy {:.2f}%\n", step, seconds, 100 * final_accuracy);
  return final_accuracy > 0.5 ? 0 : 1;
}

}  // namespace

// An error ends the program with `error: <what>` on stderr and exit code 2 (1 for an error that is
// not lockstep's). --help (or -h) prints the usage.
int main(int argc, char** argv) {
  if (argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    fmt::print("usage: mlp [epochs]   (default 8)\n");
    return 0;
  }
  return ls::run_main([&] { return train(argc, argv); });
}
