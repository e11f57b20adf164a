#pragma once
// Shared helpers of the GPU tests: skipping without a device, host/device transfers and
// tolerant comparison against the host backend.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <string>
#include <vector>

#include <lockstep/cuda.hpp>
#include <lockstep/lockstep.hpp>

#include "../support/random.hpp"

namespace lockstep_test {

namespace ls = lockstep;

// The name of the running doctest case.
inline std::string current_case_name() {
  const auto* t = doctest::getContextOptions()->currentTest;
  return t && t->m_name ? std::string(t->m_name) : std::string();
}

// Ends the current test case, reporting it skipped, when fewer than `need` CUDA devices are usable.
// CTest turns the "skipped:" message into a skipped test (SKIP_REGULAR_EXPRESSION). A case that
// goes on prints "lockstep-gpu-case: ran <name>", which scripts/gpu-check.sh matches against the
// cases `test_cuda --list-test-cases --test-case='gpu:*'` (and 'multigpu:*' with two GPUs)
// lists: the check fails unless every one of them ran. The name says what a case needs (checked
// here, so the lists cannot drift): "gpu: ..." one device, "multigpu: ..." two; a case that needs
// none is named "host: ..." and does not use this macro.
#define LOCKSTEP_REQUIRE_GPUS(need)                                                                     \
  do {                                                                                                  \
    const std::string lockstep_case_ = ::lockstep_test::current_case_name();                            \
    REQUIRE_MESSAGE(lockstep_case_.rfind((need) >= 2 ? "multigpu: " : "gpu: ", 0) == 0,                \
                    "a case that needs " << (need) << " CUDA device(s) is named \""                      \
                                         << ((need) >= 2 ? "multigpu: " : "gpu: ") << "...\"");         \
    const int lockstep_have_ = ::lockstep::backend::cuda_device_count();                                \
    if (lockstep_have_ < (need)) {                                                                      \
      const std::string lockstep_why_ =                                                                 \
          lockstep_have_ == 0 ? "skipped: no CUDA device: " + ::lockstep::backend::cuda_unavailable_reason() \
                              : "skipped: needs " + std::to_string(need) + " CUDA devices, found " +  \
                                    std::to_string(lockstep_have_);                                     \
      MESSAGE(lockstep_why_);                                                                           \
      return;                                                                                           \
    }                                                                                                   \
    std::printf("lockstep-gpu-case: ran %s (with %d CUDA device(s))\n", lockstep_case_.c_str(), lockstep_have_); \
    std::fflush(stdout);                                                                                \
  } while (0)

namespace detail {
// Spins for `ns` nanoseconds of the GPU's global timer, then copies n floats from src to dst
// (null src: copies nothing): queued work that provably runs late. (A template: defined in every
// translation unit that includes this header, without a clash.)
template <int = 0>
__global__ void spin_then_copy_kernel(unsigned long long ns, const float* src, float* dst, std::size_t n) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
  if (src)
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
      dst[i] = src[i];
}
}  // namespace detail

// Queues on stream s a kernel that spins for `ms` milliseconds and then copies n floats from src to
// dst (both device memory of the current device; src may be null).
template <int = 0>
void spin_then_copy(cudaStream_t s, int ms, const float* src = nullptr, float* dst = nullptr, std::size_t n = 0) {
  detail::spin_then_copy_kernel<><<<4, 256, 0, s>>>(static_cast<unsigned long long>(ms) * 1000000ull, src, dst, n);
  LOCKSTEP_CUDA_CHECK(cudaGetLastError());
}

// A collective timeout for a test: `ms` times LOCKSTEP_TEST_TIMEOUT_SCALE (a positive integer,
// default 1). scripts/gpu-check.sh raises it under compute-sanitizer, which slows kernels and the
// host calls around them alike.
inline std::chrono::milliseconds test_timeout(long ms) {
  const char* s = std::getenv("LOCKSTEP_TEST_TIMEOUT_SCALE");
  const long scale = s ? std::strtol(s, nullptr, 10) : 1;
  return std::chrono::milliseconds(ms * (scale > 0 ? scale : 1));
}

// n pseudo-random floats in [lo, hi) from a counter-based stream (reproducible).
inline std::vector<float> random_vector(std::size_t n, std::uint64_t stream, float lo = -1.0f, float hi = 1.0f) {
  return test_support::random_vector<float>(n, stream, lo, hi);
}

// A device buffer holding a copy of host data.
template <class T>
ls::buffer<T, ls::gpu<0>> to_device(ls::cuda_context& ctx, const std::vector<T>& h) {
  ls::buffer<T, ls::gpu<0>> d(h.size());
  copy_from_host(ctx, d.data(), h.data(), h.size());
  return d;
}

// The contents of a device buffer (first n elements).
template <class T>
std::vector<T> to_host(ls::cuda_context& ctx, const T* d, std::size_t n) {
  std::vector<T> h(n);
  copy_to_host(ctx, h.data(), d, n);
  return h;
}

// Checks |got - want| <= rel * max(|want|, max over want of |want_j|, 1e-30): relative to the
// array's magnitude, so that elements near zero after cancellation do not dominate.
inline void check_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                        const char* what) {
  REQUIRE(got.size() == want.size());
  double scale = 1e-30;
  for (float w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  std::size_t bad = 0, first_bad = 0;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    const bool ok = d <= rel * scale && std::isfinite(got[i]) == std::isfinite(want[i]);
    if (!ok && bad++ == 0) first_bad = i;
    worst = std::max(worst, d / scale);
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements differ; first at " << first_bad
            << ", worst relative difference " << worst);
  CHECK(bad == 0);
}

}  // namespace lockstep_test
