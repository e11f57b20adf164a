// The timing pieces the benchmarks share: wall and thread-CPU clocks, seconds since a start, the
// best of several runs, and memcpy bandwidth (the yardstick several benchmarks measure in the same
// run). Header of the benchmarks only, not of the library.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace bench_timing {

/// Wall-clock time.
using wall_clock = std::chrono::steady_clock;

/// Seconds of wall time since `start`.
inline double seconds_since(wall_clock::time_point start) {
  return std::chrono::duration<double>(wall_clock::now() - start).count();
}

/// CPU time of the calling thread, in seconds: unlike wall time it does not count the slices other
/// processes take from the core (for work that runs on this one thread).
inline double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

/// The shortest wall time of `reps` calls of f(), in seconds.
template <class F>
double best_seconds(int reps, const F& f) {
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = wall_clock::now();
    f();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

/// memcpy bandwidth in GB/s over `bytes` bytes (buffers allocated and touched before timing),
/// the best of `reps` copies; each copy is checked, so none can be optimised away.
inline double memcpy_gb_per_s(std::size_t bytes, int reps = 8) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  int rep = 0;
  const double best = best_seconds(reps, [&] {
    src[static_cast<std::size_t>(rep) % bytes] = static_cast<char>(rep);
    std::memcpy(dst.data(), src.data(), bytes);
    if (dst[static_cast<std::size_t>(rep) % bytes] != static_cast<char>(rep)) std::abort();
    ++rep;
  });
  return static_cast<double>(bytes) / best / 1e9;
}

}  // namespace bench_timing
