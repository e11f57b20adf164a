#pragma once
/// @file mpi_window_sum.hpp
/// Internal: the same ordered sum as mpi_sum.hpp, for workers that all run on one machine, in an
/// MPI shared-memory window (MPI_Win_allocate_shared) without MPI's message layer: each rank
/// copies the slices the others sum into its slot; rank p sums slice p over the ranks in order
/// 0..W-1 (its own part straight from its buffer) and publishes it in its slot; each copies every
/// other summed slice back. Three counters per rank order the phases; the same bits as the
/// message path.

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/distribute/detail/mpi_error.hpp>

namespace lockstep::detail {

/// The shared-window sum of the workers of one machine (see the file comment).
class mpi_window_sum {
public:
  /// A sum over the ranks of `node` (a communicator of processes sharing memory), this one `rank` of `size`.
  mpi_window_sum(MPI_Comm node, int rank, int size) noexcept : node_(node), rank_(rank), size_(size) {}
  mpi_window_sum(const mpi_window_sum&) = delete;
  mpi_window_sum& operator=(const mpi_window_sum&) = delete;
  /// Frees the window; call before the communicator is freed, and only while every rank still
  /// takes part (not after a failure).
  void free() noexcept {
    if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
  }

  /// Sums `count` floats at `data` over the ranks, in place; waits through `p`.
  void run(float* data, std::size_t count, std::size_t bucket, mpi_progress& p) {
    reserve(count);
    const std::uint64_t g = ++gen_;
    const auto w = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
    constexpr std::size_t align = 16, chunk = 1024;
    const std::size_t units = (count + align - 1) / align;
    const auto range = [&](std::size_t q) {
      return std::pair<std::size_t, std::size_t>{std::min(count, units * q / w * align),
                                                 std::min(count, units * (q + 1) / w * align)};
    };
    if (g > 1) await(2, g - 1, bucket, p);  // nobody still reads our slot from the last sum
    for (std::size_t q = 0; q < w; ++q) {
      const auto [qlo, qhi] = range(q);
      if (q != me && qhi > qlo) std::memcpy(slot(me) + qlo, data + qlo, (qhi - qlo) * sizeof(float));
    }
    flag(me, 0).store(g, std::memory_order_release);
    await(0, g, bucket, p);
    const auto [lo, hi] = range(me);
    float acc[chunk];
    for (std::size_t b = lo; b < hi; b += chunk) {
      const std::size_t m = std::min(chunk, hi - b);
      std::memcpy(acc, (me == 0 ? data : slot(0)) + b, m * sizeof(float));
      for (std::size_t q = 1; q < w; ++q) {
        const float* src = (q == me ? data : slot(q)) + b;
        for (std::size_t i = 0; i < m; ++i) acc[i] += src[i];
      }
      std::memcpy(slot(me) + b, acc, m * sizeof(float));
      std::memcpy(data + b, acc, m * sizeof(float));
    }
    flag(me, 1).store(g, std::memory_order_release);
    await(1, g, bucket, p);
    for (std::size_t q = 0; q < w; ++q) {
      if (q == me) continue;
      const auto [qlo, qhi] = range(q);
      if (qhi > qlo) std::memcpy(data + qlo, slot(q) + qlo, (qhi - qlo) * sizeof(float));
    }
    flag(me, 2).store(g, std::memory_order_release);
  }

private:
  // The control words of one rank in the shared window (each on its own cache line).
  struct alignas(64) shm_flag {
    std::atomic<std::uint64_t> value;
  };
  static constexpr std::size_t header = 3 * sizeof(shm_flag);  // arrived, summed, read

  std::atomic<std::uint64_t>& flag(std::size_t rank, std::size_t which) const noexcept {
    return reinterpret_cast<shm_flag*>(base_[rank])[which].value;
  }
  float* slot(std::size_t rank) const noexcept { return reinterpret_cast<float*>(base_[rank] + header); }

  // (Re)allocates the window for `floats` per rank (collective over the workers: every worker
  // grows at the same sum, since all sum the same bucket sizes).
  void reserve(std::size_t floats) {
    if (floats <= cap_) return;
    free();
    cap_ = std::max(floats, cap_ * 2);
    void* base = nullptr;
    mpi_check(MPI_Win_allocate_shared(static_cast<MPI_Aint>(header + cap_ * sizeof(float)), 1, MPI_INFO_NULL, node_, &base,
                                      &win_),
              "MPI_Win_allocate_shared");
    auto* mine = static_cast<shm_flag*>(base);
    for (std::size_t i = 0; i < 3; ++i) new (&mine[i].value) std::atomic<std::uint64_t>(0);
    gen_ = 0;
    base_.assign(static_cast<std::size_t>(size_), nullptr);
    for (int q = 0; q < size_; ++q) {
      MPI_Aint sz = 0;
      int disp = 0;
      void* b = nullptr;
      mpi_check(MPI_Win_shared_query(win_, q, &sz, &disp, &b), "MPI_Win_shared_query");
      base_[static_cast<std::size_t>(q)] = static_cast<std::byte*>(b);
    }
    MPI_Barrier(node_);  // every rank's flags are initialised before anyone reads them
  }

  // Waits until control word `which` of every rank reached `gen`; names the late ranks on timeout.
  void await(std::size_t which, std::uint64_t gen, std::size_t bucket, mpi_progress& p) {
    const auto start = std::chrono::steady_clock::now();
    const auto spin_until = start + std::chrono::milliseconds(20);
    for (std::uint32_t polls = 1;; ++polls) {
      bool all = true;
      for (std::size_t q = 0; q < base_.size() && all; ++q) all = flag(q, which).load(std::memory_order_acquire) >= gen;
      if (all) return;
      if (polls % 256 != 0) continue;
      if (std::chrono::steady_clock::now() < spin_until) continue;
      p.idle(start, bucket, [&] {
        std::string late;
        for (std::size_t q = 0; q < base_.size(); ++q)
          if (flag(q, which).load(std::memory_order_acquire) < gen) late += (late.empty() ? "" : ", ") + std::to_string(q);
        return "rank(s) " + late + " did not arrive at it";
      });
      polls = 255;
    }
  }

  MPI_Comm node_;
  int rank_, size_;
  MPI_Win win_ = MPI_WIN_NULL;
  std::size_t cap_ = 0;
  std::uint64_t gen_ = 0;
  std::vector<std::byte*> base_;
};

}  // namespace lockstep::detail
