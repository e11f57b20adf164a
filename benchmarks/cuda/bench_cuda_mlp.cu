// GPU benchmark, key=value lines; every line that checks a result ends with check=pass or
// check=fail (scripts/gpu-check.sh requires pass):
//  - gpu_config=L precision=fp32|tf32|bf16: training throughput of MLP config L
//    (1024-4096-4096-1024, ReLU, batch 512, one step = forward + backward + SGD) on
//    one_device<gpu<0>>, under the fp32, tf32 and mixed<bf16> policies; check: the loss is finite
//    and falls over the timed steps; then bf16 once more with `weight_copy=off` (the weights packed
//    at every GEMM instead of read from the bf16 weight copy; copy_speedup: its time over the copy's);
//  - cublas_sgemm_ceiling: the same step's GEMMs alone, through cuBLAS SGEMM (the ceiling config L
//    is measured against);
//  - gpu_cnn: the Fashion-MNIST example's CNN (TensorFlow's tutorial CNN) at batch 256, FP32, and
//    the device operations (kernels, cuBLAS calls, copies) one step queues; check as for the MLP;
//  - gpu_cnn_bn: the same CNN with batch norm after each convolution (statistics over the batch);
//  - gpu_replicas config=M: MLP config M (784-512-512-10, batch 256) on mirrored<gpu<0>, gpu<0>>
//    against one_device<gpu<0>> at the same global batch (ratio_to_one; the best of three runs of
//    each); check as for the MLP;
//  - same_device_reducer: same_device_allreduce, the reducer mirrored<gpu<0>, gpu<0>> uses, on two
//    replicas' 256 MiB buckets, against the device's copy bandwidth measured in the same run;
//    check: the summed value is the exact expected one.
// Options: --only reducer|mlp|cnn|cnn_bn|replicas runs that part alone (to profile one of them).
// Exit code: 0 with every figure printed and every check passed, 4 when a check failed, 3 when
// there is no CUDA device ("no CUDA device: ..."), 1 on an error (2: a bad option).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <lockstep/cuda.hpp>
#include <lockstep/distribute/mirrored.hpp>
#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

namespace {

// "pass" or "fail", and remembers a failure for the exit code.
const char* verdict(bool ok, bool& all_ok) {
  all_ok = all_ok && ok;
  return ok ? "pass" : "fail";
}

// Milliseconds of `reps` calls of f on stream s, timed with events.
template <class F>
float time_ms(cudaStream_t s, int reps, const F& f) {
  ls::backend::cuda_event start(true), stop(true);
  start.record(s);
  for (int i = 0; i < reps; ++i) f();
  stop.record(s);
  stop.synchronize();
  float ms = 0;
  LOCKSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return ms;
}

// Device-to-device copy bandwidth in GB/s, counting bytes read and written.
double copy_bandwidth(ls::cuda_context& ctx, const float* a, float* b, std::size_t n) {
  const std::size_t bytes = n * sizeof(float);
  const cudaStream_t s = ctx.compute_stream();
  const int reps = 10;
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
  const float ms = time_ms(s, reps, [&] { LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s)); });
  return 2.0 * static_cast<double>(bytes) * reps / (ms * 1e-3) / 1e9;
}

void reducer_bandwidth(bool& all_ok) {
  const std::size_t n = std::size_t{1} << 26;  // 256 MiB of floats per replica
  ls::cuda_context c0(0), c1(0);
  ls::buffer<float, ls::gpu<0>> a(n), b(n);
  fill(c0, a.data(), n, 1.0f);
  fill(c0, b.data(), n, 2.0f);
  c0.synchronize();
  const double copy_gbs = copy_bandwidth(c0, a.data(), b.data(), n);
  fill(c0, b.data(), n, 2.0f);
  c0.synchronize();
  // The strategy's calls, from one thread: replica 0 joins, replica 1 joins (and launches), both wait.
  ls::same_device_allreduce red(ls::reducer_config{.replicas = 2});
  auto step = [&] {
    red.start(0, c0, a.data(), n, 0);
    red.start(1, c1, b.data(), n, 0);
    red.wait(0, c0, 0);
    red.wait(1, c1, 0);
  };
  step();
  c0.synchronize();
  c1.synchronize();
  const int reps = 10;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) step();
  c0.synchronize();
  c1.synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  float check = 0;
  copy_to_host(c1, &check, b.data() + n - 1, 1);  // 1 + 2, then doubled by every further sum
  // Every element is read from both replicas and written to both.
  const double gbs = 4.0 * static_cast<double>(n * sizeof(float)) * reps / s / 1e9;
  // printf, not {fmt}: nvcc cannot evaluate fmt's consteval format-string checks.
  std::printf("device_memcpy_gb_per_s=%.1f\n", copy_gbs);
  const double expected = 3.0 * std::pow(2.0, reps);
  std::printf("same_device_reducer replicas=2 bucket_mib=256 gb_per_s=%.1f ratio_to_memcpy=%.2f sum=%.0f expected=%.0f "
              "check=%s\n",
              gbs, gbs / copy_gbs, static_cast<double>(check), expected,
              verdict(static_cast<double>(check) == expected, all_ok));
}

// What a timed training run measured: seconds of the timed steps, and the mean loss of the first
// and the last of them.
struct timed_run {
  double seconds = 0, first = 0, last = 0;
  std::uint64_t launches = 0;  ///< device operations queued by one timed step (the mean)
  double host_syncs = 0;       ///< host waits for work of the same step, per timed step (the mean)
  /// The loss is finite, training on one batch lowered it, and no step waited for its own work.
  [[nodiscard]] bool ok() const { return std::isfinite(first) && std::isfinite(last) && last < first && host_syncs == 0; }
};

// Trains `steps` timed steps (after 3 untimed) of Net under precision policy P with Strategy
// (one_device<gpu<0>> unless named) and strategy_options::defer_readback (each step returns the
// previous one's loss, so the host never waits for the step it queues), SGD, on one fixed global
// batch of random features and labels in [0, classes). `weight_copy`: whether a mixed<bf16>
// model keeps its bf16 weight copy (the default) or packs its weights at every GEMM.
template <class Net, class P = ls::fp32, class Strategy = ls::one_device<ls::gpu<0>>>
timed_run train_timed(std::size_t batch, std::size_t classes, int steps, bool weight_copy = true) {
  Strategy strategy{ls::strategy_options{.defer_readback = true}};
  auto model = strategy.template replicate<Net, P>(ls::seed{1});
  for (std::size_t k = 0; k < strategy.num_replicas(); ++k) model.replica(k).context().set_bf16_weight_copy(weight_copy);
  constexpr std::size_t width = decltype(model)::model_type::input_size;
  auto b = std::make_shared<ls::data::batch>();
  b->width = width;
  b->features.resize(batch * width);
  b->labels.resize(batch);
  b->indices.resize(batch);
  const ls::counter_rng rng(5, 6);
  for (std::size_t i = 0; i < b->features.size(); ++i) b->features[i] = rng.uniform(i) - 0.5f;
  for (std::size_t i = 0; i < batch; ++i) {
    b->labels[i] = static_cast<std::int32_t>(rng.u32(i) % classes);
    b->indices[i] = i;
  }
  const ls::data::distributed_batch db{b, ls::data::split(*b, strategy.num_replicas())};
  const ls::sgd opt{.lr = 0.01f};
  const ls::softmax_cross_entropy loss;
  for (int i = 0; i < 3; ++i) (void)ls::train_step(strategy, model, opt, loss, db);
  (void)strategy.flush_stats(model);
  const auto& ctx = model.replica(0).context();
  const auto syncs_so_far = [&] {  // host waits of every replica's context
    std::uint64_t n = 0;
    for (std::size_t k = 0; k < strategy.num_replicas(); ++k) n += model.replica(k).context().host_syncs();
    return n;
  };
  timed_run r;
  const std::uint64_t launched = ctx.launches(), synced = syncs_so_far();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) {
    const ls::step_stats st = ls::train_step(strategy, model, opt, loss, db);  // the previous step's
    if (i == 1) r.first = st.mean_loss();
  }
  const std::uint64_t launches = ctx.launches() - launched, syncs = syncs_so_far() - synced;
  r.last = strategy.flush_stats(model).mean_loss();  // waits for the last step
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.launches = launches / static_cast<std::uint64_t>(steps);
  r.host_syncs = static_cast<double>(syncs) / steps;
  return r;
}

void mlp(bool& all_ok) {
  using net = ls::sequential<ls::dense<1024, 4096>, ls::relu, ls::dense<4096, 4096>, ls::relu, ls::dense<4096, 1024>>;
  constexpr std::size_t batch = 512;
  const int steps = 50;
  // FLOPs per step: forward 2 B (1024*4096 + 4096*4096 + 4096*1024); backward twice that, less
  // the first layer's input gradient, which is not computed.
  const double fwd = 2.0 * batch * (1024.0 * 4096 + 4096.0 * 4096 + 4096.0 * 1024);
  const double flops = 3 * fwd - 2.0 * batch * 1024 * 4096;
  const auto report = [&](const char* precision, const timed_run& r) {
    std::printf("gpu_config=L precision=%s samples_per_s=%.0f tflops=%.2f step_ms=%.3f host_syncs_per_step=%.2f "
                "loss_first=%.4f loss_last=%.4f check=%s\n",
                precision, steps * batch / r.seconds, steps * flops / r.seconds / 1e12, 1e3 * r.seconds / steps,
                r.host_syncs, r.first, r.last, verdict(r.ok(), all_ok));
  };
  const timed_run fp32 = train_timed<net>(batch, 1024, steps);
  const double fp32_seconds = fp32.seconds;
  report("fp32", fp32);
  report("tf32", train_timed<net, ls::tf32>(batch, 1024, steps));
  const timed_run bf16 = train_timed<net, ls::mixed<ls::bf16>>(batch, 1024, steps);
  report("bf16", bf16);
  // The same without the bf16 weight copy (every GEMM packs its weight operand): what the copy gains.
  const timed_run packed = train_timed<net, ls::mixed<ls::bf16>>(batch, 1024, steps, false);
  std::printf("gpu_config=L precision=bf16 weight_copy=off samples_per_s=%.0f step_ms=%.3f copy_speedup=%.3f check=%s\n",
              steps * batch / packed.seconds, 1e3 * packed.seconds / steps, packed.seconds / bf16.seconds,
              verdict(packed.ok(), all_ok));

  // The ceiling: the step's GEMMs alone (forward, weight gradients, input gradients but the first),
  // with the same shapes, through the same cuBLAS SGEMM calls.
  ls::cuda_context ctx(0);
  const std::size_t widths[4] = {1024, 4096, 4096, 1024};
  std::size_t biggest = 0;
  for (std::size_t w : widths) biggest = std::max(biggest, w);
  ls::buffer<float, ls::gpu<0>> act(batch * biggest * 4), wts(biggest * biggest * 3), grads(biggest * biggest);
  fill(ctx, act.data(), act.size(), 0.01f);
  fill(ctx, wts.data(), wts.size(), 0.01f);
  using ls::backend::trans;
  auto gemms = [&] {
    for (int l = 0; l < 3; ++l) {  // forward: y = x W^T
      const std::size_t in = widths[l], out = widths[l + 1];
      gemm(ctx, trans::no, trans::yes, batch, out, in, 1.0f, act.data() + l * batch * biggest, in, wts.data(), in, 0.0f,
           act.data() + (l + 1) * batch * biggest, out);
    }
    for (int l = 2; l >= 0; --l) {
      const std::size_t in = widths[l], out = widths[l + 1];
      gemm(ctx, trans::yes, trans::no, out, in, batch, 1.0f, act.data() + (l + 1) * batch * biggest, out,
           act.data() + l * batch * biggest, in, 0.0f, grads.data(), in);  // dW = dY^T X
      if (l > 0)
        gemm(ctx, trans::no, trans::no, batch, in, out, 1.0f, act.data() + (l + 1) * batch * biggest, out, wts.data(),
             in, 0.0f, act.data() + l * batch * biggest, in);  // dX = dY W
    }
  };
  gemms();
  const float ms = time_ms(ctx.compute_stream(), steps, gemms);
  std::printf("cublas_sgemm_ceiling config=L samples_per_s=%.0f tflops=%.2f step_ms=%.3f ratio_lockstep_to_ceiling=%.2f\n",
              steps * batch / (ms * 1e-3), steps * flops / (ms * 1e-3) / 1e12, ms / steps, (ms * 1e-3) / fp32_seconds);
}

// The Fashion-MNIST example's CNN (TensorFlow's layers tutorial) at batch 256, without and with
// batch norm after each convolution.
void cnn(bool& all_ok, bool plain, bool with_batch_norm) {
  using net = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<32, 5, 1, 2>, ls::relu, ls::max_pool2d<2>,
                             ls::conv2d<64, 5, 1, 2>, ls::relu, ls::max_pool2d<2>, ls::flatten,
                             ls::dense<3136, 1024>, ls::relu, ls::dense<1024, 10>>;
  using bn_net = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<32, 5, 1, 2>, ls::batch_norm<>, ls::relu,
                                ls::max_pool2d<2>, ls::conv2d<64, 5, 1, 2>, ls::batch_norm<>, ls::relu,
                                ls::max_pool2d<2>, ls::flatten, ls::dense<3136, 1024>, ls::relu, ls::dense<1024, 10>>;
  constexpr std::size_t batch = 256;
  const int steps = 50;
  const auto report = [&](const char* name, const timed_run& r) {
    std::printf("%s batch=%zu precision=fp32 samples_per_s=%.0f step_ms=%.3f launches_per_step=%llu "
                "host_syncs_per_step=%.2f loss_first=%.4f loss_last=%.4f check=%s\n",
                name, batch, steps * batch / r.seconds, 1e3 * r.seconds / steps,
                static_cast<unsigned long long>(r.launches), r.host_syncs, r.first, r.last, verdict(r.ok(), all_ok));
  };
  if (plain) report("gpu_cnn", train_timed<net>(batch, 10, steps));
  if (with_batch_norm) report("gpu_cnn_bn", train_timed<bn_net>(batch, 10, steps));
}

// Two replicas sharing gpu<0> against one at the same global batch: MLP config M, the best of
// three alternating runs of each (a step takes a fraction of a millisecond).
void replicas(bool& all_ok) {
  using net = ls::sequential<ls::dense<784, 512>, ls::relu, ls::dense<512, 512>, ls::relu, ls::dense<512, 10>>;
  constexpr std::size_t batch = 256;
  const int steps = 300;
  double one_s = 1e300, two_s = 1e300;
  bool ok = true;
  timed_run two;
  for (int round = 0; round < 3; ++round) {
    const timed_run one = train_timed<net>(batch, 10, steps);
    two = train_timed<net, ls::fp32, ls::mirrored<ls::gpu<0>, ls::gpu<0>>>(batch, 10, steps);
    one_s = std::min(one_s, one.seconds);
    two_s = std::min(two_s, two.seconds);
    ok = ok && one.ok() && two.ok();
  }
  std::printf("gpu_replicas config=M batch=%zu replicas=2 samples_per_s=%.0f one_replica_samples_per_s=%.0f "
              "ratio_to_one=%.2f host_syncs_per_step=%.2f loss_first=%.4f loss_last=%.4f check=%s\n",
              batch, steps * batch / two_s, steps * batch / one_s, one_s / two_s, two.host_syncs, two.first, two.last,
              verdict(ok, all_ok));
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> parts{"reducer", "mlp", "cnn", "cnn_bn", "replicas"};  // what --only may name
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--only" && i + 1 < argc) only = argv[++i];
    else {
      std::fprintf(stderr, "bench_cuda_mlp: unknown option %s (usage: bench_cuda_mlp [--only PART])\n", arg.c_str());
      return 2;
    }
  }
  if (!only.empty() && std::find(parts.begin(), parts.end(), only) == parts.end()) {
    std::string names;
    for (const auto& p : parts) names += (names.empty() ? "" : ", ") + p;
    std::fprintf(stderr, "bench_cuda_mlp: --only takes one of %s, not %s\n", names.c_str(), only.c_str());
    return 2;
  }
  const auto part = [&](const char* name) { return only.empty() || only == name; };
  try {
    if (ls::backend::cuda_device_count() == 0) {
      std::printf("no CUDA device: %s\n", ls::backend::cuda_unavailable_reason().c_str());
      return 3;
    }
    cudaDeviceProp p{};
    LOCKSTEP_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    std::printf("device=%s sm=%d%d\n", p.name, p.major, p.minor);
    bool all_ok = true;
    if (part("reducer")) reducer_bandwidth(all_ok);
    if (part("mlp")) mlp(all_ok);
    if (part("cnn") || part("cnn_bn")) cnn(all_ok, part("cnn"), part("cnn_bn"));
    if (part("replicas")) replicas(all_ok);
    if (!all_ok) {
      std::printf("bench_cuda_mlp: a check failed (check=fail above)\n");
      return 4;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_mlp: %s\n", e.what());
    return 1;
  }
  return 0;
}
