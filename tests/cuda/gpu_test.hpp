#pragma once
// Shared helpers of the GPU tests: skipping without a device, host/device transfers and
// tolerant comparison against the host backend.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstddef>
#include <string>
#include <vector>

#include <lockstep/backend/cuda.hpp>
#include <lockstep/lockstep.hpp>

namespace lockstep_test {

namespace ls = lockstep;

// Ends the current test case, reporting it skipped, when fewer than `need` CUDA devices are usable.
// CTest turns the "skipped:" message into a skipped test (SKIP_REGULAR_EXPRESSION). A case that
// goes on prints "lockstep-gpu-case: ran ...", which scripts/gpu-check.sh counts: the check fails
// when no case ran on a GPU.
#define LOCKSTEP_REQUIRE_GPUS(need)                                                                     \
  do {                                                                                                  \
    const int lockstep_have_ = ::lockstep::backend::cuda_device_count();                                \
    if (lockstep_have_ < (need)) {                                                                      \
      const std::string lockstep_why_ =                                                                 \
          lockstep_have_ == 0 ? "skipped: no CUDA device: " + ::lockstep::backend::cuda_unavailable_reason() \
                              : "skipped: needs " + std::to_string(need) + " CUDA devices, found " +  \
                                    std::to_string(lockstep_have_);                                     \
      MESSAGE(lockstep_why_);                                                                           \
      return;                                                                                           \
    }                                                                                                   \
    std::printf("lockstep-gpu-case: ran with %d CUDA device(s)\n", lockstep_have_);                   \
  } while (0)

// n pseudo-random floats in [lo, hi) from a counter-based stream (reproducible).
inline std::vector<float> random_vector(std::size_t n, std::uint64_t stream, float lo = -1.0f, float hi = 1.0f) {
  const ls::counter_rng rng(1234, stream);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * rng.uniform(i);
  return v;
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
