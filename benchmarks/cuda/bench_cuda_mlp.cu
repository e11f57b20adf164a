// GPU benchmark: training throughput of MLP config L (1024-4096-4096-1024, ReLU, batch 512, one
// step = forward + backward + SGD) on one_device<gpu<0>>, and a CUB sum reduction against the
// device's copy bandwidth measured in the same run. Prints key=value lines.
#include <cuda_runtime.h>

#include <cub/device/device_reduce.cuh>

#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include <lockstep/backend/cuda.hpp>
#include <lockstep/distribute/mirrored.hpp>
#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

namespace {

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

void bandwidth() {
  const std::size_t n = std::size_t{1} << 28;  // 1 GiB of floats
  const std::size_t bytes = n * sizeof(float);
  ls::cuda_context ctx(0);
  ls::buffer<float, ls::gpu<0>> a(n), b(n);
  ls::buffer<float, ls::gpu<0>> out(1);
  fill(ctx, a.data(), n, 1.0f);
  const cudaStream_t s = ctx.compute_stream();
  const int reps = 10;
  LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s));
  const float copy_ms = time_ms(s, reps, [&] {
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice, s));
  });
  // A copy moves each byte twice (read and write).
  const double copy_gbs = 2.0 * static_cast<double>(bytes) * reps / (copy_ms * 1e-3) / 1e9;

  std::size_t temp_bytes = 0;
  float* d_sum = out.data();
  LOCKSTEP_CUDA_CHECK(cub::DeviceReduce::Sum(nullptr, temp_bytes, a.data(), d_sum, static_cast<int>(n), s));
  ls::buffer<unsigned char, ls::gpu<0>> temp(temp_bytes);
  LOCKSTEP_CUDA_CHECK(cub::DeviceReduce::Sum(temp.data(), temp_bytes, a.data(), d_sum, static_cast<int>(n), s));
  const float reduce_ms = time_ms(s, reps, [&] {
    LOCKSTEP_CUDA_CHECK(cub::DeviceReduce::Sum(temp.data(), temp_bytes, a.data(), d_sum, static_cast<int>(n), s));
  });
  float check = 0;
  copy_to_host(ctx, &check, d_sum, 1);
  const double reduce_gbs = static_cast<double>(bytes) * reps / (reduce_ms * 1e-3) / 1e9;
  // printf, not {fmt}: nvcc cannot evaluate fmt's consteval format-string checks.
  std::printf("device_memcpy_gb_per_s=%.1f\n", copy_gbs);
  std::printf("cub_reduce_gb_per_s=%.1f ratio_to_memcpy=%.2f (sum check %.0f, expected %zu)\n", reduce_gbs,
              reduce_gbs / copy_gbs, static_cast<double>(check), n);
}

void mlp() {
  using net = ls::sequential<ls::dense<1024, 4096>, ls::relu, ls::dense<4096, 4096>, ls::relu, ls::dense<4096, 1024>>;
  constexpr std::size_t batch = 512;
  ls::one_device<ls::gpu<0>> strategy;
  auto model = strategy.replicate<net>(ls::seed{1});
  auto b = std::make_shared<ls::data::batch>();
  b->width = 1024;
  b->features.resize(batch * 1024);
  b->labels.resize(batch);
  b->indices.resize(batch);
  const ls::counter_rng rng(5, 6);
  for (std::size_t i = 0; i < b->features.size(); ++i) b->features[i] = rng.uniform(i) - 0.5f;
  for (std::size_t i = 0; i < batch; ++i) {
    b->labels[i] = static_cast<std::int32_t>(rng.u32(i) % 1024);
    b->indices[i] = i;
  }
  const ls::data::distributed_batch db{b, ls::data::split(*b, 1)};
  const ls::sgd opt{.lr = 0.01f};
  const ls::softmax_cross_entropy loss;
  for (int i = 0; i < 3; ++i) (void)ls::train_step(strategy, model, opt, loss, db);
  model.replica(0).context().synchronize();
  const int steps = 20;
  const auto t0 = std::chrono::steady_clock::now();
  double last = 0;
  for (int i = 0; i < steps; ++i) last = ls::train_step(strategy, model, opt, loss, db).mean_loss();
  model.replica(0).context().synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // FLOPs per step: forward 2 B (1024*4096 + 4096*4096 + 4096*1024); backward twice that, less
  // the first layer's input gradient, which is not computed.
  const double fwd = 2.0 * batch * (1024.0 * 4096 + 4096.0 * 4096 + 4096.0 * 1024);
  const double flops = 3 * fwd - 2.0 * batch * 1024 * 4096;
  std::printf("gpu_config=L samples_per_s=%.0f tflops=%.2f step_ms=%.3f loss=%.4f\n", steps * batch / s,
              steps * flops / s / 1e12, 1e3 * s / steps, last);
}

}  // namespace

int main() {
  try {
    if (ls::backend::cuda_device_count() == 0) {
      std::printf("skipped: no CUDA device: %s\n", ls::backend::cuda_unavailable_reason().c_str());
      return 0;
    }
    cudaDeviceProp p{};
    LOCKSTEP_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    std::printf("device=%s sm=%d%d\n", p.name, p.major, p.minor);
    bandwidth();
    mlp();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_mlp: %s\n", e.what());
    return 1;
  }
  return 0;
}
