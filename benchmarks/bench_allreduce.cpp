// Host all-reduce bandwidth: 1, 16 and 64 MiB for 2 and 4 replicas on the strategy's persistent
// workers, against memcpy of the same bytes on pre-touched buffers in the same run.
// busbw = algbw * 2 (n - 1) / n (the nccl-tests convention). A replica count above the cores
// this process may use (lockstep::allowed_cpu_count()) would share cores and is not measured:
// it prints `replicas=<n> skipped reason=...` instead.
//
// Built with MPI and launched by mpirun (`mpirun -np 2 bench_allreduce`), it measures the
// inter-process path instead: multi_worker_mirrored's reduction of the same sizes over W
// processes of one replica each, with n = W in busbw, of a replica's gradient buffer (busbw: on
// one machine it lives in the workers' shared window and is summed in place, as in training) and
// of the same floats in the process's own memory (private_busbw: copied into the window and
// back); rank 0 prints, adding Open MPI's own MPI_Allreduce of the same floats
// (mpi_allreduce_busbw_gb_per_s) when MPI provides MPI_THREAD_MULTIPLE.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/core.h>

#include <lockstep/distribute.hpp>
#include <lockstep/layers.hpp>
#ifdef LOCKSTEP_HAS_MPI
#include <lockstep/distribute/multi_worker.hpp>
#endif

#include "timing.hpp"

namespace ls = lockstep;

namespace {

using clock_type = std::chrono::steady_clock;

double memcpy_gbps(std::size_t bytes) { return bench_timing::memcpy_gb_per_s(bytes, 10); }

template <class S>
void bench(std::size_t bytes) {
  constexpr std::size_t n = S::replica_count;
  if (const auto cores = static_cast<std::size_t>(ls::allowed_cpu_count()); n > cores) {
    fmt::print("replicas={} allreduce_bytes={} skipped reason={}_replicas_on_{}_allowed_cores\n", n, bytes, n, cores);
    return;
  }
  S s;
  const std::size_t count = bytes / sizeof(float);
  std::vector<std::vector<float>> data(n);
  s.run_each([&](std::size_t r) { data[r].assign(count, static_cast<float>(r)); });  // first touch on the worker
  const int reps = bytes >= (std::size_t{16} << 20) ? 10 : 50;
  std::vector<double> times(n);
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const auto t0 = clock_type::now();
    s.run_each([&](std::size_t r) {
      ls::host_context ctx;
      s.all_reduce(r, ctx, data[r].data(), count);
    });
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  const double algbw = static_cast<double>(bytes) / best / 1e9;
  const double busbw = algbw * 2.0 * static_cast<double>(n - 1) / static_cast<double>(n);
  fmt::print("replicas={} allreduce_bytes={} algbw_gb_per_s={:.2f} busbw_gb_per_s={:.2f} memcpy_gb_per_s={:.2f}\n", n,
             bytes, algbw, busbw, memcpy_gbps(bytes));
}

#ifdef LOCKSTEP_HAS_MPI
// The largest size's floats in one dense layer's parameters (4096 x 4096 weights and 4096 biases).
using gradient_net = ls::sequential<ls::dense<4096, 4096>>;

// The best time of `reps` all-reduces of `count` floats at `data` over the workers (one replica each).
double best_allreduce_seconds(ls::multi_worker_mirrored<ls::cpus>& s, float* data, std::size_t count, int reps) {
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    s.barrier();
    const auto t0 = clock_type::now();
    s.run_each([&](std::size_t r) {
      ls::host_context ctx;
      s.all_reduce(r, ctx, data, count);
    });
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return best;
}

void bench_workers(ls::multi_worker_mirrored<ls::cpus>& s, float* gradients, std::size_t bytes) {
  const std::size_t count = bytes / sizeof(float), n = s.world().size();
  std::vector<float> data(count, static_cast<float>(s.world().rank()));
  std::fill(gradients, gradients + count, static_cast<float>(s.world().rank()));
  const int reps = bytes >= (std::size_t{16} << 20) ? 10 : 50;
  const auto busbw = [&](double seconds) {
    return static_cast<double>(bytes) / seconds / 1e9 * 2.0 * static_cast<double>(n - 1) / static_cast<double>(n);
  };
  const double in_place = best_allreduce_seconds(s, gradients, count, reps);
  const double copied = best_allreduce_seconds(s, data.data(), count, reps);
  // Open MPI's own MPI_Allreduce of the same floats, from the main thread while the strategy's
  // communication thread is idle (needs MPI_THREAD_MULTIPLE).
  std::string mpi = " mpi_allreduce_busbw_gb_per_s=skipped";
  if (s.world().thread_level() >= MPI_THREAD_MULTIPLE) {
    double best_mpi = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      s.barrier();
      const auto t0 = clock_type::now();
      MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      best_mpi = std::min(best_mpi, std::chrono::duration<double>(clock_type::now() - t0).count());
    }
    mpi = fmt::format(" mpi_allreduce_busbw_gb_per_s={:.2f}", busbw(best_mpi));
  }
  if (s.world().is_chief())
    fmt::print("workers={} replicas=1 allreduce_bytes={} algbw_gb_per_s={:.2f} busbw_gb_per_s={:.2f} "
               "private_busbw_gb_per_s={:.2f} memcpy_gb_per_s={:.2f}{}\n",
               n, bytes, static_cast<double>(bytes) / in_place / 1e9, busbw(in_place), busbw(copied), memcpy_gbps(bytes), mpi);
}
#endif

}  // namespace

int main() {
#ifdef LOCKSTEP_HAS_MPI
  if (ls::launched_by_mpi()) {
    ls::mpi_environment env;
    ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1));
    auto m = s.replicate<gradient_net>(ls::seed{1});
    float* gradients = m.replica(0).model().gradients().data();
    if (s.world().is_chief())
      fmt::print("gradients_in_shared_window={}\n", m.replica(0).model().gradients().owns_memory() ? "no" : "yes");
    for (std::size_t mib : {1u, 16u, 64u}) bench_workers(s, gradients, mib << 20);
    return 0;
  }
#endif
  for (std::size_t mib : {1u, 16u, 64u}) {
    bench<ls::mirrored<ls::cpu<0>, ls::cpu<1>>>(mib << 20);
    bench<ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>, ls::cpu<3>>>(mib << 20);
  }
}
