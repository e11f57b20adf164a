// The optimiser update on one core: SGD with momentum, Adam and AdamW over the parameters of the
// main job's model (784-512-256-10, 535 818 parameters) and of bench_step's config L
// (1024-4096-4096-1024, 25 173 000 parameters), run through the host's
// elementwise loop (for_each_index: its AVX2 copy where the CPU has AVX2) and through the baseline
// loop compiled for x86-64's SSE2 in the same run. The yardstick is memcpy bandwidth over the bytes
// the update reads and writes (measured in the same run): `fraction_of_memcpy` near 1 means the
// update is as fast as moving its data.
//
//   bench_update [--repeats N]   (best of N updates per line, default 50)

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <lockstep/backend/host.hpp>
#include <lockstep/optimizers/adam.hpp>
#include <lockstep/optimizers/sgd.hpp>

#include "timing.hpp"

namespace ls = lockstep;

namespace {

/// Parameters, gradients and state of one update, touched before timing.
struct buffers {
  std::vector<float> p, g, state;
  buffers(std::size_t n, std::size_t state_n) : p(n), g(n), state(state_n, 0.0f) {
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = 0.01f * static_cast<float>(i % 101) - 0.5f;
      g[i] = 0.001f * static_cast<float>(i % 89) - 0.04f;
    }
  }
};

/// An optimiser whose update runs elementwise ops through the baseline loop instead of
/// for_each_index: the same op, the same bits, no AVX2 copy.
struct baseline_context : ls::host_context {};

template <class F>
void for_each_index(const baseline_context&, std::size_t n, const F& f) {
  ls::backend::detail::index_loop(n, f);
}

/// Times `reps` updates of the n parameters in `b` by `opt` on context `ctx`; the best, in seconds.
template <class Opt, class Ctx>
double time_update(const Opt& opt, Ctx& ctx, buffers& b, std::uint64_t& step, int reps) {
  const std::size_t n = b.p.size();
  return bench_timing::best_seconds(reps, [&] {
    ls::update_info u;
    u.lr = 1e-3f;
    u.step = ++step;
    u.grad_scale = 1.0 / 128;
    opt.update(ctx, b.p.data(), b.g.data(), b.state.data(), n, u);
  });
}

template <class Opt>
void line(const char* name, const Opt& opt, const char* model, std::size_t n, int reps, double memcpy_gbs) {
  ls::host_context ctx;
  baseline_context base;
  buffers b(n, opt.state_size(n));  // both loops update the same buffers (touched once)
  std::uint64_t step = 0;
  // bytes moved: parameters and state read and written, gradients read
  const double bytes = 4.0 * (2.0 * static_cast<double>(n) + 2.0 * static_cast<double>(opt.state_size(n)) +
                              static_cast<double>(n));
  const double t = time_update(opt, ctx, b, step, reps);
  const double t_base = time_update(opt, base, b, step, reps);
  const double gbs = bytes / t / 1e9;
  std::printf("update=%s model=%s params=%zu us=%.1f baseline_loops_us=%.1f speedup=%.2f gb_per_s=%.1f "
              "fraction_of_memcpy=%.2f check=%g\n",
              name, model, n, 1e6 * t, 1e6 * t_base, t_base / t, gbs, gbs / memcpy_gbs,
              static_cast<double>(b.p[n / 2]));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 50;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeats" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--repeats N]\n", argv[0]);
      return 2;
    }
  }
  if (reps < 1) {
    std::fprintf(stderr, "bench_update: --repeats must be at least 1\n");
    return 2;
  }
  std::printf("loops=%s\n", ls::host_loops_name().c_str());
  const struct {
    const char* name;
    std::size_t n;
  } models[] = {{"main_job", 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10},
                {"L", 1024 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 1024 + 1024}};
  for (const auto& m : models) {
    // The yardstick: memcpy over as many bytes as AdamW moves (7 floats per parameter, read or
    // written), counting each copied byte twice (read and written) as the update's bytes are.
    const double memcpy_gbs = 2 * bench_timing::memcpy_gb_per_s(std::size_t{7} * 4 * m.n / 2, 8);
    std::printf("model=%s memcpy_moved_gb_per_s=%.1f\n", m.name, memcpy_gbs);
    line("sgd_momentum", ls::sgd{.lr = 0.1f, .momentum = 0.9f}, m.name, m.n, reps, memcpy_gbs);
    line("adam", ls::adam{}, m.name, m.n, reps, memcpy_gbs);
    line("adamw", ls::adamw{}, m.name, m.n, reps, memcpy_gbs);
  }
  return 0;
}
