// The machine's arithmetic limit, measured: single-precision FMA throughput of one core (one
// thread) with the widest vectors the CPU has, as many independent accumulator chains as hide
// the FMA latency. The figure is the "FMA peak" the other benchmarks' GFLOP/s are compared with;
// divided by (lanes x 2 flops x FMA units) it gives the clock the core actually ran at.
//
//   bench_fma [--seconds S]   (default 0.5 per repeat, best of 5)

#include <immintrin.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

// Twelve independent chains of a = a * b + c: enough to cover 4-cycle latency on 2 FMA ports.
constexpr int chains = 12;

__attribute__((target("avx512f"))) float run_avx512(std::uint64_t iters) {
  __m512 acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm512_set1_ps(1.0f + 0.01f * static_cast<float>(i));
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (std::uint64_t k = 0; k < iters; ++k)
    for (int i = 0; i < chains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  __m512 s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  float t = 0;
  for (float v : out) t += v;
  return t;
}

__attribute__((target("avx2,fma"))) float run_avx2(std::uint64_t iters) {
  __m256 acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm256_set1_ps(1.0f + 0.01f * static_cast<float>(i));
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (std::uint64_t k = 0; k < iters; ++k)
    for (int i = 0; i < chains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
  __m256 s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm256_add_ps(s, acc[i]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  float t = 0;
  for (float v : out) t += v;
  return t;
}

float run_sse(std::uint64_t iters) {  // no FMA: a multiply and an add, counted as 2 flops per lane
  __m128 acc[chains];
  for (int i = 0; i < chains; ++i) acc[i] = _mm_set1_ps(1.0f + 0.01f * static_cast<float>(i));
  const __m128 b = _mm_set1_ps(0.999999f), c = _mm_set1_ps(1e-7f);
  for (std::uint64_t k = 0; k < iters; ++k)
    for (int i = 0; i < chains; ++i) acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], b), c);
  __m128 s = acc[0];
  for (int i = 1; i < chains; ++i) s = _mm_add_ps(s, acc[i]);
  alignas(16) float out[4];
  _mm_store_ps(out, s);
  return out[0] + out[1] + out[2] + out[3];
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
      if (!(seconds > 0)) {
        std::fprintf(stderr, "bench_fma: --seconds must be positive, got %s\n", argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: %s [--seconds S]\n", argv[0]);
      return 2;
    }
  }
  __builtin_cpu_init();
  int lanes = 4;
  const char* isa = "sse";
  float (*run)(std::uint64_t) = run_sse;
  if (__builtin_cpu_supports("avx512f")) {
    lanes = 16, isa = "avx512f", run = run_avx512;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    lanes = 8, isa = "avx2_fma", run = run_avx2;
  }
  using clock = std::chrono::steady_clock;
  // Calibrate the iteration count to about `seconds`, then keep the best of 5 repeats.
  std::uint64_t iters = 1 << 16;
  volatile float sink = 0;
  for (;;) {
    const auto t0 = clock::now();
    sink = sink + run(iters);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (s > seconds / 4 || iters > (std::uint64_t{1} << 40)) {
      iters = static_cast<std::uint64_t>(static_cast<double>(iters) * seconds / (s > 0 ? s : 1e-9)) + 1;
      break;
    }
    iters *= 4;
  }
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = clock::now();
    sink = sink + run(iters);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    const double gflops = 2.0 * lanes * chains * static_cast<double>(iters) / s / 1e9;
    if (gflops > best) best = gflops;
  }
  // With 2 FMA units per core (the usual count on cores with AVX-512 or AVX2+FMA), the clock is:
  const double units = lanes >= 8 ? 2.0 : 1.0;
  std::printf("isa=%s lanes=%d chains=%d fma_peak_gflops=%.2f implied_mhz_at_%g_units=%.0f\n", isa, lanes, chains, best,
              units, best * 1e3 / (2.0 * lanes * units));
  return sink == 12345.0f ? 1 : 0;  // keeps the work observable
}
