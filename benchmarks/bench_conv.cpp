// bench_conv: the convolutions of TensorFlow's layers-tutorial CNN (MNIST, 28 x 28 grey images) on
// one CPU core with one BLAS thread, against the SGEMM rate measured in the same run, and the whole
// CNN's training step with 1 and 2 CPU replicas.
//
//   conv1 = conv2d<32, 5, 1, 2> on shape<1, 28, 28>, conv2 = conv2d<64, 5, 1, 2> on shape<32, 14, 14>,
//   batch 64, forward + backward with the input gradient dx.
//
// A layer's gflops counts the useful flops of forward, weight gradient and input gradient:
// 3 x 2 OH OW F C K^2 per image. fraction_of_sgemm_peak is that rate over the best OpenBLAS sgemm
// rate measured in this run on large shapes (1024^3 and 2048 x 1024 x 1024); the rate of the conv2
// forward GEMM shape itself (64 x 196 x 800, one image) is printed beside it. Layer and GEMM times
// are the calling thread's CPU time (other processes' slices do not count), the median of several
// repeats after a warm-up.
//
// The network (softmax cross-entropy, Adam):
//   reshape<1,28,28> conv2d<32,5,1,2> relu max_pool2d<2> conv2d<64,5,1,2> relu max_pool2d<2>
//   flatten dense<3136,1024> relu dropout<2,5> dense<1024,10>
// trained on one_device<cpu<0>> at batch 64 and on mirrored<cpu<0>, cpu<1>> at global batch 128;
// samples/s from wall time, the median of several repeats.
//
// Prints `openblas_core=... cpu=...`, then
//   sgemm m=<m> n=<n> k=<k> gflops=<n>          (each GEMM shape)
//   sgemm_peak_gflops=<n>
//   layer=<conv1|conv2> impl=<onednn|im2col> gflops=<n> fraction_of_sgemm_peak=<f> ms=<t> forward_ms=<t> backward_ms=<t>
//   layer=conv2 onednn_over_im2col=<speedup>     (the oneDNN build: conv2 through both paths, side by side)
//   config=cnn replicas=<n> batch=<b> samples_per_s=<n> step_ms=<t> precision=fp32|bf16 [kernels=native|emulated]
// (fp32 on 1 and 2 replicas, then mixed<bf16> on 1 replica).
// With --breakdown, before the steps, each layer of the CNN alone at batch 64 (thread CPU time):
//   breakdown layer=<name> ms=<t> forward_ms=<t> backward_ms=<t>
//   breakdown layers_ms=<sum>
//   breakdown layer=avg_pool_as_pool1 ...       (avg_pool2d<2> in pool1's place, not in the sum)
// Options: --repeats N (layer and GEMM repeats, default 15), --steps N (training repeats, default 11),
// --only-layers, --only-step, --breakdown.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include <lockstep/layers/conv.hpp>
#include <lockstep/lockstep.hpp>

#include "conv_bench_common.hpp"

namespace {

namespace ls = lockstep;
using conv_bench::median;

using cnn = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<32, 5, 1, 2>, ls::relu, ls::max_pool2d<2>,
                           ls::conv2d<64, 5, 1, 2>, ls::relu, ls::max_pool2d<2>, ls::flatten, ls::dense<3136, 1024>,
                           ls::relu, ls::dropout<2, 5>, ls::dense<1024, 10>>;

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

// Median samples/s of strategy S training the CNN, made under precision policy P, on one global
// batch of `rows`.
template <class S, class P = ls::fp32>
void bench_step(std::size_t rows, int repeats) {
  S s;
  auto m = s.template replicate<cnn, P>(ls::seed{1});
  const auto g = std::make_shared<const ls::data::batch>(make_batch(rows));
  ls::data::distributed_batch d{g, ls::data::split(*g, S::replica_count)};
  const ls::adam opt{.lr = 1e-4f};
  auto step = [&] { ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, d); };
  for (int i = 0; i < 3; ++i) step();  // warm up: buffers allocated and touched
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const double sec = median(t);
  const bool bf16 = m.precision() == ls::compute_precision::bf16;
  fmt::print("config=cnn replicas={} batch={} samples_per_s={:.1f} step_ms={:.2f} precision={}{}\n", S::replica_count,
             rows, static_cast<double>(rows) / sec, sec * 1e3, bf16 ? "bf16" : "fp32",
             bf16 ? (ls::host_bf16_native() ? " kernels=native" : " kernels=emulated") : "");
  std::fflush(stdout);
}

// One line per layer of the CNN at batch 64 on one core (forward, backward; the first layer without
// dx, as in the network) and their sum; beside the one-replica step line that follows, the rest of
// the step is the loss, the update and the glue.
template <class L, class S>
double breakdown_line(const char* name, int repeats, bool with_dx = true) {
  const auto t = conv_bench::time_lockstep_layer<L, S>(64, repeats, with_dx);
  fmt::print("breakdown layer={} ms={:.3f} forward_ms={:.3f} backward_ms={:.3f}\n", name, t.total * 1e3,
             t.forward * 1e3, t.backward * 1e3);
  std::fflush(stdout);
  return t.total;
}

void breakdown(int repeats) {
  double sum = 0;
  sum += breakdown_line<ls::conv2d<32, 5, 1, 2>, ls::shape<1, 28, 28>>("conv1", repeats, false);
  sum += breakdown_line<ls::relu, ls::shape<32, 28, 28>>("relu1", repeats);
  sum += breakdown_line<ls::max_pool2d<2>, ls::shape<32, 28, 28>>("pool1", repeats);
  sum += breakdown_line<ls::conv2d<64, 5, 1, 2>, ls::shape<32, 14, 14>>("conv2", repeats);
  sum += breakdown_line<ls::relu, ls::shape<64, 14, 14>>("relu2", repeats);
  sum += breakdown_line<ls::max_pool2d<2>, ls::shape<64, 14, 14>>("pool2", repeats);
  sum += breakdown_line<ls::dense<3136, 1024>, ls::shape<3136>>("dense1", repeats);
  sum += breakdown_line<ls::relu, ls::shape<1024>>("relu3", repeats);
  sum += breakdown_line<ls::dropout<2, 5>, ls::shape<1024>>("dropout", repeats);
  sum += breakdown_line<ls::dense<1024, 10>, ls::shape<1024>>("dense2", repeats);
  fmt::print("breakdown layers_ms={:.3f}\n", sum * 1e3);
  std::fflush(stdout);
  breakdown_line<ls::avg_pool2d<2>, ls::shape<32, 28, 28>>("avg_pool_as_pool1", repeats);  // not in the CNN: for comparison
}

}  // namespace

int main(int argc, char** argv) {
  int repeats = 15, steps = 11;
  bool layers = true, training = true, per_layer = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--steps" && i + 1 < argc) {
      steps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--only-layers") {
      training = false;
    } else if (arg == "--only-step") {
      layers = false;
    } else if (arg == "--breakdown") {
      per_layer = true;
    } else {
      std::fprintf(stderr, "usage: %s [--repeats N] [--steps N] [--only-layers] [--only-step] [--breakdown]\n", argv[0]);
      return 2;
    }
  }
  try {
    conv_bench::print_machine();
    if (layers) {
      const double peak = conv_bench::sgemm_peak(repeats);
      using conv1 = ls::conv2d<32, 5, 1, 2>;
      using conv2 = ls::conv2d<64, 5, 1, 2>;
      conv_bench::print_layer("conv1", "im2col", conv_bench::conv_flops(64, 1, 32, 5, 28, 28),
                              conv_bench::time_lockstep_layer<conv1, ls::shape<1, 28, 28>>(64, repeats), peak);
      const double conv2_flops = conv_bench::conv_flops(64, 32, 64, 5, 14, 14);
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
      // conv2 (32 input channels) takes oneDNN's primitives by default in this build.
      const auto onednn = conv_bench::time_lockstep_layer<conv2, ls::shape<32, 14, 14>>(64, repeats);
      conv_bench::print_layer("conv2", "onednn", conv2_flops, onednn, peak);
#endif
      const auto im2col = conv_bench::time_lockstep_layer<conv2, ls::shape<32, 14, 14>>(64, repeats, true, false);
      conv_bench::print_layer("conv2", "im2col", conv2_flops, im2col, peak);
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
      fmt::print("layer=conv2 onednn_over_im2col={:.2f}\n", im2col.total / onednn.total);
      std::fflush(stdout);
#endif
    }
    if (per_layer) breakdown(repeats);
    if (training) {
      bench_step<ls::one_device<ls::cpu<0>>>(64, steps);
      bench_step<ls::mirrored<ls::cpu<0>, ls::cpu<1>>>(128, steps);
      bench_step<ls::one_device<ls::cpu<0>>, ls::mixed<ls::bf16>>(64, steps);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_conv: %s\n", e.what());
    return 1;
  }
  return 0;
}
