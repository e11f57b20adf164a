// Shared by bench_conv and bench_conv_onednn: the thread CPU-time clock, medians, the CPU model,
// the SGEMM yardstick and the timing of one lockstep layer (forward + backward).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <cblas.h>
#include <time.h>

#include <fmt/core.h>

#include <lockstep/layers/conv.hpp>
#include <lockstep/lockstep.hpp>
#include <lockstep/testing/drive.hpp>

namespace conv_bench {

/// CPU time of the calling thread: the layers and GEMMs run on it alone, and unlike wall time it
/// does not count the slices other processes take from the core.
inline double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// The median of v.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// The first "model name" of /proc/cpuinfo ("unknown" elsewhere).
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      std::string m = colon == std::string::npos ? line : line.substr(colon + 1);
      m.erase(0, m.find_first_not_of(' '));
      return m;
    }
  return "unknown";
}

/// Median GFLOP/s of row-major sgemm C (m x n) = A (m x k) B (k x n), printed as one line.
inline double sgemm_gflops(std::size_t m, std::size_t n, std::size_t k, int repeats) {
  std::vector<float> a(m * k, 0.01f), b(k * n, 0.02f), c(m * n, 0.0f);
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  // Small shapes are repeated inside one timed repeat so that each lasts about 10 ms.
  const int inner = std::max(1, static_cast<int>(1e9 / flops));
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                1.0f, a.data(), static_cast<int>(k), b.data(), static_cast<int>(n), 0.0f, c.data(), static_cast<int>(n));
  };
  run();
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = thread_seconds();
    for (int i = 0; i < inner; ++i) run();
    t.push_back((thread_seconds() - t0) / inner);
  }
  const double g = flops / median(t) / 1e9;
  fmt::print("sgemm m={} n={} k={} gflops={:.2f}\n", m, n, k, g);
  std::fflush(stdout);
  return g;
}

/// The SGEMM yardstick: the best of the large square-ish shapes (1024^3 and 2048 x 1024 x 1024),
/// plus the conv2 forward GEMM shape of one image (64 x 196 x 800) for information.
inline double sgemm_peak(int repeats) {
  const double a = sgemm_gflops(1024, 1024, 1024, repeats);
  const double b = sgemm_gflops(2048, 1024, 1024, repeats);
  sgemm_gflops(64, 196, 800, repeats);
  const double peak = std::max(a, b);
  fmt::print("sgemm_peak_gflops={:.2f}\n", peak);
  std::fflush(stdout);
  return peak;
}

/// Useful flops of forward + weight gradient + input gradient of a convolution: 3 x 2 OH OW F C K^2
/// per image (the bias terms not counted).
inline double conv_flops(std::size_t batch, std::size_t c, std::size_t f, std::size_t k, std::size_t oh,
                         std::size_t ow) {
  return 3.0 * 2.0 * static_cast<double>(oh * ow) * static_cast<double>(f) * static_cast<double>(c * k * k) *
         static_cast<double>(batch);
}

/// Median times of one convolution's passes.
struct pass_times {
  double total, forward, backward;  ///< seconds
};

/// Times forward() then backward(), one warm-up pass and `repeats` timed ones (the calling thread's
/// CPU time): the medians of both together and of each.
template <class Forward, class Backward>
pass_times time_passes(const Forward& forward, const Backward& backward, int repeats) {
  forward();
  backward();
  std::vector<double> tf, tb, tt;
  for (int r = 0; r < repeats; ++r) {
    const double t0 = thread_seconds();
    forward();
    const double t1 = thread_seconds();
    backward();
    const double t2 = thread_seconds();
    tf.push_back(t1 - t0);
    tb.push_back(t2 - t1);
    tt.push_back(t2 - t0);
  }
  return {median(tt), median(tf), median(tb)};
}

/// Times lockstep's L on inputs of shape S at `batch` (forward, then backward, with the input
/// gradient dx unless `with_dx` is false, as for a network's first layer), one BLAS thread, after
/// one warm-up pass; with `onednn` false, the context keeps convolutions on im2col + GEMM.
template <class L, class S>
pass_times time_lockstep_layer(std::size_t batch, int repeats, bool with_dx = true, bool onednn = true) {
  using B = lockstep::bind_shape_t<L, S>;
  lockstep::host_context ctx{1};
  ctx.set_onednn_convolutions(onednn);
  ctx.activate();
  const lockstep::counter_rng rng(11, 3);
  std::vector<float> params(B::param_count), dparams(B::param_count);
  std::vector<float> x(batch * B::input_size), dx(batch * B::input_size);
  std::vector<float> y(batch * B::output_size), dy(batch * B::output_size);
  std::vector<float> ws(batch * B::workspace_per_sample + lockstep::workspace_fixed_v<B>);
  B::init(params.data(), rng);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i) - 0.5f;
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = rng.uniform(x.size() + i) - 0.5f;
  const lockstep::pass_info info{.training = true, .seed = 1, .step = 1};
  auto fwd = [&] { lockstep::testing::run_forward<B>(ctx, params.data(), x.data(), y.data(), ws.data(), batch, info); };
  auto bwd = [&] {
    lockstep::testing::run_backward<B>(ctx, params.data(), x.data(), y.data(), dy.data(), with_dx ? dx.data() : nullptr,
                                        dparams.data(), ws.data(), batch, info);
  };
  const pass_times t = time_passes(fwd, bwd, repeats);
  double check = 0;
  for (float v : dparams) check += static_cast<double>(v);
  for (float v : dx) check += static_cast<double>(v);
  if (check != check) fmt::print("lockstep convolution produced NaN\n");
  return t;
}

/// Prints one layer line: `layer=<name> [impl=<impl>] gflops=... fraction_of_sgemm_peak=... ms=...`.
inline void print_layer(const char* name, const char* impl, double flops, const pass_times& t, double peak) {
  const double g = flops / t.total / 1e9;
  fmt::print("layer={}{}{} gflops={:.2f} fraction_of_sgemm_peak={:.3f} ms={:.3f} forward_ms={:.3f} backward_ms={:.3f}\n",
             name, impl ? " impl=" : "", impl ? impl : "", g, g / peak, t.total * 1e3, t.forward * 1e3,
             t.backward * 1e3);
  std::fflush(stdout);
}

/// Prints the kernel set and the machine: `openblas_core=... blas_threads=... cpu="..."`, then
/// lockstep's host GEMM: `host_gemm=...` (as bench_step does).
inline void print_machine() {
  openblas_set_num_threads(1);
  fmt::print("openblas_core={} blas_threads={} cpu=\"{}\"\n", lockstep::blas_core_name(), openblas_get_num_threads(),
             cpu_model());
  fmt::print("host_gemm={}\n", lockstep::host_gemm_name());
  std::fflush(stdout);
}

}  // namespace conv_bench
