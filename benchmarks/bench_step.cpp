// bench_step: one single-device training step (forward, backward, SGD update) on one CPU
// replica with one BLAS thread, against the GEMM-only ceiling measured in the same run.
//
// Three networks (ReLU between dense layers, softmax cross-entropy, plain SGD):
//   S = 784-128-10 batch 64, M = 784-512-512-10 batch 256, L = 1024-4096-4096-1024 batch 512.
// For each, the GEMMs the step performs (forward x W per layer, backward dW = x^T dy per layer,
// dx = dy W^T for every layer but the first) are timed on their own with the same host GEMM
// (`gemm(host_context, ...)`: cblas_sgemm, or oneDNN's matmul primitive in the
// LOCKSTEP_HOST_GEMM=onednn build) at exactly the same shapes, transpositions and beta, and the
// sum of their times gives the ceiling: the samples/s the step would reach if it did nothing but
// its GEMMs at the measured speeds. Prints once `openblas_core=<name> blas_threads=<n>` and
// `host_gemm=<kernels>`, and per config
//   config=<c> samples_per_s=<n> gflops=<n> fraction_of_sgemm_peak=<f> gemm_ceiling_samples_per_s=<n>
//   config=<c> ratio_to_gemm_ceiling=<x> step_ms=<t> gemm_ms=<t> sgemm_gflops=<n>
//   config=<c> breakdown step_ms=<t> gemm_ms=<t> update_ms=<t> other_ms=<t> gemm_and_update_ratio=<x>
//   config=<c> trace=off step_ms=<t>
//   config=<c> trace=on step_ms=<t> overhead=<p>%
//   config=<c> accumulate=4 update_ms=<t> ratio_to_one_batch=<x> gemm_ms=<t> gemm_ratio_to_one_batch=<x>
//   config=<c> accumulate=4 deferral=off update_ms=<t> ratio_to_one_batch=<x>
//   config=<c> clip=1 step_ms=<t> plain_step_ms=<t> ratio_to_no_clip=<x>
//   config=<c> precision=fp32 step_ms=<t> samples_per_s=<n>
//   config=<c> precision=bf16 step_ms=<t> samples_per_s=<n> speedup_over_fp32=<x> kernels=native|emulated
// (breakdown: the step's time split into its GEMMs, timed alone as above, its optimiser pass
// (replica::apply), timed alone in the same repeats, and the rest; trace=on: the same step
// recording a span per layer's forward and backward; accumulate=4: the same rows as 4 batches
// of a quarter, added into one gradient, then one update; both timed in
// the same interleaved repeats; its gemm_ms sums the GEMMs of those 4 batches at their own shapes
// and betas, timed alone like the step's, so gemm_ratio_to_one_batch is what the GEMM kernels
// alone make accumulation cost when every batch adds its weight gradients (deferral=off, timed in
// the same repeats); the plain accumulate=4 line keeps the rows and forms those once per update,
// as a strategy's run_to_run step does. clip=1: the step through one_device<cpu<0>> with clipping by
// global norm against the same without, in wall time. precision: the step through
// one_device<cpu<0>> on a model made under mixed<bf16> against one made under fp32, in wall time;
// kernels says whether the bf16 GEMMs ran natively or emulated.)
// gflops is the step's GEMM flops over the step time; fraction_of_sgemm_peak is that rate over the
// measured SGEMM rate (= GEMM time / step time = ratio_to_gemm_ceiling). Times are the calling
// thread's CPU time; the step and every GEMM shape are timed in many short interleaved repeats and
// each keeps its best one, so other processes on the machine bias neither side.
// Options: --config S|M|L (repeatable; default all), --repeats N, --verbose (per-GEMM rates).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <cblas.h>
#include <time.h>

#include <fmt/core.h>

#include <lockstep/lockstep.hpp>

#include "timing.hpp"

namespace {

namespace ls = lockstep;
// CPU time of the calling thread: the step and its GEMMs run on this one thread (one BLAS
// thread), and unlike wall time it does not count the slices other processes take from the core.
struct clock_type {
  using time_point = double;
  static double now() { return bench_timing::thread_seconds(); }
};

double seconds_since(double start) { return clock_type::now() - start; }

// One GEMM call of the step: row-major C (m x n) = op(A) op(B) (+ C when beta is 1).
struct gemm_shape {
  const char* what;
  bool ta, tb;
  std::size_t m, n, k;
  float beta;
  [[nodiscard]] double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// Operands of one GEMM shape, allocated and touched once.
struct gemm_operands {
  gemm_shape s;
  std::vector<float> a, b, c;
  explicit gemm_operands(const gemm_shape& shape)
      : s(shape), a(shape.m * shape.k, 0.01f), b(shape.k * shape.n, 0.02f), c(shape.m * shape.n, 0.0f) {}
  // The step's own GEMM kernel (the context caches oneDNN's primitives in the onednn build).
  void run(const ls::host_context& ctx) {
    using ls::backend::trans;
    gemm(ctx, s.ta ? trans::yes : trans::no, s.tb ? trans::yes : trans::no, s.m, s.n, s.k, 1.0f, a.data(),
         s.ta ? s.m : s.k, b.data(), s.tb ? s.k : s.n, s.beta, c.data(), s.n);
  }
};

// The GEMMs of one step of a dense stack with widths w[0..L] at `batch` rows, in the order the
// step runs them; `dw_beta` 1 is a batch after the first of an accumulated update (dW added).
// The forward of a layer followed by ReLU writes x.W (beta 0: it adds the bias as it applies the
// ReLU); the last layer's adds x.W onto its broadcast bias (beta 1).
std::vector<gemm_shape> step_gemms(const std::vector<std::size_t>& w, std::size_t batch, float dw_beta = 0.0f) {
  std::vector<gemm_shape> g;
  for (std::size_t l = 0; l + 1 < w.size(); ++l)
    g.push_back({"fwd x.W", false, false, batch, w[l + 1], w[l], l + 2 < w.size() ? 0.0f : 1.0f});
  for (std::size_t l = w.size() - 1; l-- > 0;) {
    g.push_back({"bwd dW=xT.dy", true, false, w[l], w[l + 1], batch, dw_beta});
    if (l > 0) g.push_back({"bwd dx=dy.WT", false, true, batch, w[l], w[l + 1], 0.0f});
  }
  return g;
}

struct result {
  double step_s = 1e30;         // best time per step
  double gemm_s = 1e30;         // best summed GEMM time per step
  double traced_step_s = 1e30;  // best time per step while a trace records every layer's spans
  double accumulate_s = 1e30;   // best time per update of the same rows as 4 accumulated batches
  double accumulate_gemm_s = 0;  // best summed GEMM time of those 4 batches (their own shapes and betas)
  double accumulate_undeferred_s = 1e30;  // the same with every batch adding its weight gradients
  double apply_s = 1e30;        // best time of the step's optimiser pass alone (replica::apply)
};

template <class Net>
result measure(const std::vector<std::size_t>& widths, std::size_t batch, int steps_per_repeat, int repeats,
               bool verbose) {
  ls::replica<Net> rep(ls::host_context(1), ls::seed{42});
  rep.context().activate();
  const std::size_t in = widths.front(), classes = widths.back();

  ls::data::batch b;
  b.width = in;
  b.features.resize(batch * in);
  b.labels.resize(batch);
  b.indices.resize(batch);
  ls::counter_rng rng(7, 0);
  for (std::size_t i = 0; i < b.features.size(); ++i) b.features[i] = rng.uniform(i);
  for (std::size_t r = 0; r < batch; ++r) {
    b.labels[r] = static_cast<std::int32_t>(rng.u32(b.features.size() + r) % classes);
    b.indices[r] = r;
  }
  const ls::data::shard sh = ls::data::whole(b);
  rep.reserve(batch);

  const ls::sgd opt{.lr = 1e-4f};
  const ls::softmax_cross_entropy loss;
  std::uint64_t step = 0;
  double sink = 0;
  // trace=on: the same step with a recorder taking a span per layer's forward and backward.
  ls::trace_recorder rec(1, {.steps = {0, std::numeric_limits<std::uint64_t>::max()}});
  rec.begin_step(0);
  ls::trace_recorder* tracing = nullptr;
  auto one_step = [&] {
    ++step;
    ls::pass_info info{.training = true, .seed = 42, .step = step};
    info.trace = tracing;
    sink += rep.forward_backward(loss, sh, info).sum;
    rep.apply(opt, ls::update_info{.lr = opt.lr, .step = step, .grad_scale = 1.0 / static_cast<double>(batch)});
  };
  // The step's optimiser pass alone: the same replica's update over its parameters and the
  // gradients of its last step (applied once more; at lr 1e-4 the parameters barely move).
  auto update_only = [&] {
    rep.apply(opt, ls::update_info{.lr = opt.lr, .step = step, .grad_scale = 1.0 / static_cast<double>(batch)});
  };

  // accumulate=4: the same rows as 4 batches of batch / 4 added into one gradient (the GEMMs'
  // beta = 1 after the first), then one update.
  const std::vector<ls::data::shard> quarters = ls::data::split(b, 4);
  // As a strategy's run_to_run step does, the dense layers keep their rows and form their weight
  // gradients once per update (strategy_options::deferred_gradient_bytes); deferral=off adds them
  // batch by batch instead.
  const std::size_t default_budget = ls::strategy_options{}.deferred_gradient_bytes;
  std::size_t deferral_budget = default_budget;
  auto accumulated_update = [&] {
    ++step;
    for (std::size_t q = 0; q < quarters.size(); ++q) {
      ls::pass_info info{.training = true, .seed = 42, .step = step};
      info.accumulate = q > 0;
      info.last_of_update = q + 1 == quarters.size();
      info.deferral_budget = deferral_budget;
      sink += rep.forward_backward(loss, quarters[q], info).sum;
    }
    rep.apply(opt, ls::update_info{.lr = opt.lr, .step = step, .grad_scale = 1.0 / static_cast<double>(batch)});
  };

  std::vector<gemm_operands> ops;
  for (const auto& s : step_gemms(widths, batch)) ops.emplace_back(s);
  // accumulate=4's GEMMs: the first quarter's (dW overwritten), then one of the 3 others' (added).
  const std::size_t quarter_rows = quarters.front().size;
  const std::size_t first_quarter = ops.size();
  for (const auto& s : step_gemms(widths, quarter_rows)) ops.emplace_back(s);
  const std::size_t later_quarters = ops.size();
  for (const auto& s : step_gemms(widths, quarter_rows, 1.0f)) ops.emplace_back(s);
  std::vector<double> best_gemm(ops.size(), 1e30);

  // Warm up both (first touch, OpenBLAS buffers, caches; the recorder's buffer).
  one_step();
  tracing = &rec;
  one_step();
  tracing = nullptr;
  accumulated_update();
  const ls::host_context gemm_ctx(1);
  for (auto& o : ops) o.run(gemm_ctx);

  // Short repeats, the step and each GEMM shape interleaved; each keeps its best repeat (the
  // minimum filters out other processes' cache and memory traffic). A shape's repeat runs it
  // steps_per_repeat times back to back, as a GEMM benchmark does.
  result r;
  for (int rp = 0; rp < repeats; ++rp) {
    double t0 = clock_type::now();
    for (int i = 0; i < steps_per_repeat; ++i) one_step();
    r.step_s = std::min(r.step_s, seconds_since(t0) / steps_per_repeat);
    rec.clear();  // the spans of earlier repeats (the buffer stays)
    tracing = &rec;
    t0 = clock_type::now();
    for (int i = 0; i < steps_per_repeat; ++i) one_step();
    r.traced_step_s = std::min(r.traced_step_s, seconds_since(t0) / steps_per_repeat);
    tracing = nullptr;
    t0 = clock_type::now();
    for (int i = 0; i < steps_per_repeat; ++i) accumulated_update();
    r.accumulate_s = std::min(r.accumulate_s, seconds_since(t0) / steps_per_repeat);
    deferral_budget = 0;
    t0 = clock_type::now();
    for (int i = 0; i < steps_per_repeat; ++i) accumulated_update();
    r.accumulate_undeferred_s = std::min(r.accumulate_undeferred_s, seconds_since(t0) / steps_per_repeat);
    deferral_budget = default_budget;
    one_step();  // the gradients of a one-batch step again, for the update's timing
    t0 = clock_type::now();
    for (int i = 0; i < steps_per_repeat; ++i) update_only();
    r.apply_s = std::min(r.apply_s, seconds_since(t0) / steps_per_repeat);
    for (std::size_t g = 0; g < ops.size(); ++g) {
      t0 = clock_type::now();
      for (int i = 0; i < steps_per_repeat; ++i) ops[g].run(gemm_ctx);
      best_gemm[g] = std::min(best_gemm[g], seconds_since(t0) / steps_per_repeat);
    }
  }
  r.gemm_s = 0;
  for (std::size_t g = 0; g < first_quarter; ++g) r.gemm_s += best_gemm[g];
  for (std::size_t g = first_quarter; g < ops.size(); ++g)
    r.accumulate_gemm_s += best_gemm[g] * (g < later_quarters ? 1.0 : static_cast<double>(quarters.size() - 1));
  if (verbose)
    for (std::size_t g = 0; g < ops.size(); ++g)
      fmt::print("  gemm {:<13} m={:<5} n={:<5} k={:<5} beta={} time_us={:.1f} gflops={:.1f}\n", ops[g].s.what,
                 ops[g].s.m, ops[g].s.n, ops[g].s.k, ops[g].s.beta, best_gemm[g] * 1e6,
                 ops[g].s.flops() / best_gemm[g] / 1e9);
  if (sink != sink) fmt::print("loss diverged\n");
  return r;
}

/// One global batch of `batch` random rows of `in` features and `classes` classes, split for one replica.
ls::data::distributed_batch one_replica_batch(std::size_t in, std::size_t classes, std::size_t batch) {
  auto g = std::make_shared<ls::data::batch>();
  g->width = in;
  const ls::counter_rng rng(7, 0);
  for (std::size_t i = 0; i < batch * in; ++i) g->features.push_back(rng.uniform(i));
  for (std::size_t r = 0; r < batch; ++r) {
    g->labels.push_back(static_cast<std::int32_t>(rng.u32(batch * in + r) % classes));
    g->indices.push_back(r);
  }
  return ls::data::distributed_batch{g, ls::data::split(*g, 1)};
}

/// Seconds per train_step of model `m` on strategy `s`, over `steps` steps back to back.
template <class S, class M>
double seconds_per_step(S& s, M& m, const ls::data::distributed_batch& d, const ls::update_recipe& recipe, int steps) {
  const ls::sgd opt{.lr = 1e-4f};
  const auto t0 = bench_timing::wall_clock::now();
  for (int i = 0; i < steps; ++i) (void)s.train_step(m, opt, ls::softmax_cross_entropy{}, d, recipe);
  return bench_timing::seconds_since(t0) / steps;
}

/// clip=1: the same step through one_device<cpu<0>> with and without clipping by global norm
/// (the epilogue's sum of squares and the clip factor folded into the update), wall time, in
/// interleaved repeats; returns {plain, clipped} seconds per step.
template <class Net>
std::pair<double, double> measure_clip(std::size_t in, std::size_t classes, std::size_t batch, int steps_per_repeat,
                                       int repeats) {
  ls::one_device<ls::cpu<0>> s;
  auto m = s.replicate<Net>(ls::seed{42});
  const auto d = one_replica_batch(in, classes, batch);
  const ls::update_recipe clipped{.clip_global_norm = 1.0};
  (void)seconds_per_step(s, m, d, {}, steps_per_repeat);
  (void)seconds_per_step(s, m, d, clipped, steps_per_repeat);
  double plain = 1e30, clip = 1e30;
  for (int rp = 0; rp < repeats; ++rp) {
    plain = std::min(plain, seconds_per_step(s, m, d, {}, steps_per_repeat));
    clip = std::min(clip, seconds_per_step(s, m, d, clipped, steps_per_repeat));
  }
  return {plain, clip};
}

/// precision=fp32|bf16: the same step through one_device<cpu<0>> on a model made under fp32 and
/// one made under mixed<bf16>, wall time, in interleaved repeats; returns {fp32, bf16} seconds.
template <class Net>
std::pair<double, double> measure_precision(std::size_t in, std::size_t classes, std::size_t batch,
                                            int steps_per_repeat, int repeats) {
  ls::one_device<ls::cpu<0>> s;
  auto fp = s.replicate<Net>(ls::seed{42});
  auto bf = s.replicate<Net, ls::mixed<ls::bf16>>(ls::seed{42});
  const auto d = one_replica_batch(in, classes, batch);
  (void)seconds_per_step(s, fp, d, {}, steps_per_repeat);
  (void)seconds_per_step(s, bf, d, {}, steps_per_repeat);
  double fp_s = 1e30, bf_s = 1e30;
  for (int rp = 0; rp < repeats; ++rp) {
    fp_s = std::min(fp_s, seconds_per_step(s, fp, d, {}, steps_per_repeat));
    bf_s = std::min(bf_s, seconds_per_step(s, bf, d, {}, steps_per_repeat));
  }
  return {fp_s, bf_s};
}

template <class Net>
void run_config(const char* name, const std::vector<std::size_t>& widths, std::size_t batch, int steps_per_repeat,
                int repeats, bool verbose) {
  const result r = measure<Net>(widths, batch, steps_per_repeat, repeats, verbose);
  double flops = 0;
  for (const auto& s : step_gemms(widths, batch)) flops += s.flops();
  const double samples = static_cast<double>(batch);
  const double ratio = r.gemm_s / r.step_s;
  fmt::print("config={} samples_per_s={:.0f} gflops={:.2f} fraction_of_sgemm_peak={:.3f} gemm_ceiling_samples_per_s={:.0f}\n",
             name, samples / r.step_s, flops / r.step_s / 1e9, ratio, samples / r.gemm_s);
  fmt::print("config={} ratio_to_gemm_ceiling={:.3f} step_ms={:.3f} gemm_ms={:.3f} sgemm_gflops={:.2f}\n", name, ratio,
             r.step_s * 1e3, r.gemm_s * 1e3, flops / r.gemm_s / 1e9);
  // Where the step's time goes: its GEMMs (timed alone, above), the optimiser's pass (timed alone:
  // an elementwise pass over parameters and gradients, bound by cache bandwidth), and the rest
  // (bias, activation, loss, their gradients); gemm_and_update_ratio is what the step would reach
  // with nothing but those two.
  fmt::print("config={} breakdown step_ms={:.4f} gemm_ms={:.4f} update_ms={:.4f} other_ms={:.4f} "
             "gemm_and_update_ratio={:.3f}\n",
             name, r.step_s * 1e3, r.gemm_s * 1e3, r.apply_s * 1e3, (r.step_s - r.gemm_s - r.apply_s) * 1e3,
             (r.gemm_s + r.apply_s) / r.step_s);
  fmt::print("config={} trace=off step_ms={:.4f}\n", name, r.step_s * 1e3);
  fmt::print("config={} trace=on step_ms={:.4f} overhead={:.2f}%\n", name, r.traced_step_s * 1e3,
             100.0 * (r.traced_step_s / r.step_s - 1.0));
  fmt::print("config={} accumulate=4 update_ms={:.4f} ratio_to_one_batch={:.3f} gemm_ms={:.4f} gemm_ratio_to_one_batch={:.3f}\n",
             name, r.accumulate_s * 1e3, r.accumulate_s / r.step_s, r.accumulate_gemm_s * 1e3,
             r.accumulate_gemm_s / r.gemm_s);
  fmt::print("config={} accumulate=4 deferral=off update_ms={:.4f} ratio_to_one_batch={:.3f}\n", name,
             r.accumulate_undeferred_s * 1e3, r.accumulate_undeferred_s / r.step_s);
  const auto [plain, clipped] =
      measure_clip<Net>(widths.front(), widths.back(), batch, steps_per_repeat, std::max(2, repeats / 2));
  fmt::print("config={} clip=1 step_ms={:.4f} plain_step_ms={:.4f} ratio_to_no_clip={:.3f}\n", name, clipped * 1e3,
             plain * 1e3, clipped / plain);
  const auto [fp32_s, bf16_s] =
      measure_precision<Net>(widths.front(), widths.back(), batch, steps_per_repeat, std::max(2, repeats / 2));
  fmt::print("config={} precision=fp32 step_ms={:.4f} samples_per_s={:.0f}\n", name, fp32_s * 1e3, samples / fp32_s);
  fmt::print("config={} precision=bf16 step_ms={:.4f} samples_per_s={:.0f} speedup_over_fp32={:.3f} kernels={}\n",
             name, bf16_s * 1e3, samples / bf16_s, fp32_s / bf16_s, ls::host_bf16_native() ? "native" : "emulated");
  std::fflush(stdout);
}

using net_s = ls::sequential<ls::dense<784, 128>, ls::relu, ls::dense<128, 10>>;
using net_m = ls::sequential<ls::dense<784, 512>, ls::relu, ls::dense<512, 512>, ls::relu, ls::dense<512, 10>>;
using net_l = ls::sequential<ls::dense<1024, 4096>, ls::relu, ls::dense<4096, 4096>, ls::relu, ls::dense<4096, 1024>>;

}  // namespace

int main(int argc, char** argv) {
  std::string configs;
  int repeats = 0;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) {
      configs += argv[++i];
    } else if (arg == "--repeats" && i + 1 < argc) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--verbose") {
      verbose = true;
    } else {
      std::fprintf(stderr, "usage: %s [--config S|M|L]... [--repeats N] [--verbose]\n", argv[0]);
      return 2;
    }
  }
  if (configs.empty()) configs = "SML";
  try {
    openblas_set_num_threads(1);
    fmt::print("openblas_core={} blas_threads={}\n", ls::blas_core_name(), openblas_get_num_threads());
    fmt::print("host_gemm={}\n", ls::host_gemm_name());
    // Repeats are short (S: 20 steps of ~26 MFLOP, M: one step of ~0.82 GFLOP, L: one step of
    // ~73 GFLOP) and many, so the best ones fall between other processes' time slices; the whole
    // run takes about 30 s on one core.
    for (char c : configs) {
      if (c == 'S') run_config<net_s>("S", {784, 128, 10}, 64, 20, repeats ? repeats : 200, verbose);
      else if (c == 'M') run_config<net_m>("M", {784, 512, 512, 10}, 256, 1, repeats ? repeats : 150, verbose);
      else if (c == 'L') run_config<net_l>("L", {1024, 4096, 4096, 1024}, 512, 1, repeats ? repeats : 8, verbose);
      else throw std::runtime_error(std::string("unknown config ") + c);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
