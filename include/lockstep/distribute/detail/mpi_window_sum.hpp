#pragma once
/// @file mpi_window_sum.hpp
/// Internal: the same ordered sum as mpi_sum.hpp, for workers that all run on one machine, in MPI
/// shared-memory windows (MPI_Win_allocate_shared) without MPI's message layer. Rank p sums slice
/// p of a bucket over the ranks in order 0..W-1, so both forms below give the bits of the message
/// path:
///  - mpi_window_sum, for a buffer in the rank's own memory: each rank copies the slices the
///    others sum into its slot; rank p sums slice p (its own part straight from its buffer) and
///    publishes it in its slot; each copies every other summed slice back. Three counters per
///    rank order the phases.
///  - mpi_gradient_window, for gradients that live in the window themselves (local replica 0's,
///    see mpi_host_allreduce::gradient_storage): rank p reads slice p of every rank's bucket where
///    backward wrote it and writes the sum into every rank's bucket. Nothing is copied in or out;
///    two counters per rank order the phases.

#include <mpi.h>

#include <algorithm>
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

/// A control word of one rank in a shared window, on its own cache line.
struct alignas(64) shm_flag {
  std::atomic<std::uint64_t> value;  ///< the generation the rank reached
};

/// Waits until flag(q) of every rank q < `ranks` reached `gen`; names the late ranks on timeout
/// (through `p`, which also gives up after the strategy's timeout).
template <class Flag>
void await_ranks(std::size_t ranks, const Flag& flag, std::uint64_t gen, std::size_t bucket, mpi_progress& p) {
  const auto start = std::chrono::steady_clock::now();
  const auto spin_until = start + std::chrono::milliseconds(20);
  for (std::uint32_t polls = 1;; ++polls) {
    bool all = true;
    for (std::size_t q = 0; q < ranks && all; ++q) all = flag(q).load(std::memory_order_acquire) >= gen;
    if (all) return;
    if (polls % 256 != 0) continue;
    if (std::chrono::steady_clock::now() < spin_until) continue;
    p.idle(start, bucket, [&] {
      std::string late;
      for (std::size_t q = 0; q < ranks; ++q)
        if (flag(q).load(std::memory_order_acquire) < gen) late += (late.empty() ? "" : ", ") + std::to_string(q);
      return "rank(s) " + late + " did not arrive at it";
    });
    polls = 255;
  }
}

/// Part [first, second) of `count` floats that rank q of `w` sums: whole 16-float units, the
/// units spread evenly over the ranks.
inline std::pair<std::size_t, std::size_t> window_slice(std::size_t count, std::size_t q, std::size_t w) noexcept {
  constexpr std::size_t align = 16;
  const std::size_t units = (count + align - 1) / align;
  return {std::min(count, units * q / w * align), std::min(count, units * (q + 1) / w * align)};
}

/// The base addresses of every rank's part of shared window `win` (rank order).
inline std::vector<std::byte*> window_bases(MPI_Win win, int size, std::vector<std::size_t>* bytes = nullptr) {
  std::vector<std::byte*> base(static_cast<std::size_t>(size), nullptr);
  if (bytes) bytes->assign(base.size(), 0);
  for (int q = 0; q < size; ++q) {
    MPI_Aint sz = 0;
    int disp = 0;
    void* b = nullptr;
    mpi_check(MPI_Win_shared_query(win, q, &sz, &disp, &b), "MPI_Win_shared_query");
    base[static_cast<std::size_t>(q)] = static_cast<std::byte*>(b);
    if (bytes) (*bytes)[static_cast<std::size_t>(q)] = static_cast<std::size_t>(sz);
  }
  return base;
}

/// Sums floats [lo, hi) over the ranks' buffers in rank order 0..w-1 (source(q): rank q's buffer,
/// all indexed alike), a chunk at a time, and hands each summed chunk to store(first, sums, n):
/// both window sums go through it, so they keep the order mpi_sum.hpp's message path adds in.
template <class Source, class Store>
void ordered_slice_sum(std::size_t lo, std::size_t hi, std::size_t w, const Source& source, const Store& store) {
  constexpr std::size_t chunk = 1024;
  float acc[chunk];
  for (std::size_t b = lo; b < hi; b += chunk) {
    const std::size_t m = std::min(chunk, hi - b);
    std::memcpy(acc, source(0) + b, m * sizeof(float));
    for (std::size_t q = 1; q < w; ++q) {
      const float* src = source(q) + b;
      for (std::size_t i = 0; i < m; ++i) acc[i] += src[i];
    }
    store(b, static_cast<const float*>(acc), m);
  }
}

/// A shared window of `bytes` (rounded up to whole cache lines) per rank over `node`, each
/// rank's part on its own pages (alloc_shared_noncontig), so the control words at its start are
/// aligned whatever the other ranks' sizes. Collective over the processes of `node`.
inline MPI_Win allocate_window(std::size_t bytes, MPI_Comm node) {
  MPI_Info info = MPI_INFO_NULL;
  mpi_check(MPI_Info_create(&info), "MPI_Info_create");
  MPI_Info_set(info, "alloc_shared_noncontig", "true");
  void* base = nullptr;
  MPI_Win win = MPI_WIN_NULL;
  const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>((bytes + 63) / 64 * 64), 1, info, node, &base, &win);
  MPI_Info_free(&info);
  mpi_check(rc, "MPI_Win_allocate_shared");
  return win;
}

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
    const auto range = [&](std::size_t q) { return window_slice(count, q, w); };
    if (g > 1) await(2, g - 1, bucket, p);  // nobody still reads our slot from the last sum
    for (std::size_t q = 0; q < w; ++q) {
      const auto [qlo, qhi] = range(q);
      if (q != me && qhi > qlo) std::memcpy(slot(me) + qlo, data + qlo, (qhi - qlo) * sizeof(float));
    }
    flag(me, 0).store(g, std::memory_order_release);
    await(0, g, bucket, p);
    const auto [lo, hi] = range(me);
    ordered_slice_sum(
        lo, hi, w, [&](std::size_t q) -> const float* { return q == me ? data : slot(q); },
        [&](std::size_t b, const float* sums, std::size_t m) {
          std::memcpy(slot(me) + b, sums, m * sizeof(float));
          std::memcpy(data + b, sums, m * sizeof(float));
        });
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
    win_ = allocate_window(header + cap_ * sizeof(float), node_);
    base_ = window_bases(win_, size_);
    auto* mine = reinterpret_cast<shm_flag*>(base_[static_cast<std::size_t>(rank_)]);
    for (std::size_t i = 0; i < 3; ++i) new (&mine[i].value) std::atomic<std::uint64_t>(0);
    gen_ = 0;
    MPI_Barrier(node_);  // every rank's flags are initialised before anyone reads them
  }

  // Waits until control word `which` of every rank reached `gen`.
  void await(std::size_t which, std::uint64_t gen, std::size_t bucket, mpi_progress& p) {
    await_ranks(base_.size(), [&](std::size_t q) -> std::atomic<std::uint64_t>& { return flag(q, which); }, gen, bucket, p);
  }

  MPI_Comm node_;
  int rank_, size_;
  MPI_Win win_ = MPI_WIN_NULL;
  std::size_t cap_ = 0;
  std::uint64_t gen_ = 0;
  std::vector<std::byte*> base_;
};

/// Gradients in a shared window, summed in place across the workers of one machine (see the file
/// comment). Made and freed on the communication thread (or, for one that outlives it, by its
/// last owner: see ~mpi_channel).
class mpi_gradient_window {
public:
  /// `floats` per rank in a window over `node`, this one `rank` of `size`, zero-filled.
  /// Collective over the processes of `node`.
  mpi_gradient_window(MPI_Comm node, int rank, int size, std::size_t floats) : rank_(rank), size_(size), floats_(floats) {
    win_ = allocate_window(header + floats * sizeof(float), node);
    std::vector<std::size_t> bytes;
    base_ = window_bases(win_, size_, &bytes);
    for (const std::size_t b : bytes) capacity_.push_back(b < header ? 0 : (b - header) / sizeof(float));
    auto* mine = reinterpret_cast<control*>(base_[static_cast<std::size_t>(rank_)]);
    for (std::size_t line = 0; line < 2; ++line) new (&mine[line].arrived) std::atomic<std::uint64_t>(0);  // arrived, summed
    std::memset(local(), 0, floats * sizeof(float));
    MPI_Barrier(node);  // every rank's counters are initialised before anyone reads them
  }
  mpi_gradient_window(const mpi_gradient_window&) = delete;
  mpi_gradient_window& operator=(const mpi_gradient_window&) = delete;
  /// Frees the window (collective) unless abandon() was called or MPI is finalised.
  ~mpi_gradient_window() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (win_ != MPI_WIN_NULL && !abandoned_ && !finalized) MPI_Win_free(&win_);
  }
  /// After a failure the workers' collectives no longer match: the window is never freed.
  void abandon() noexcept { abandoned_ = true; }

  /// This rank's floats.
  [[nodiscard]] float* local() const noexcept { return at(static_cast<std::size_t>(rank_)); }
  /// True when [p, p + count) lies in this rank's floats.
  [[nodiscard]] bool holds(const float* p, std::size_t count) const noexcept {
    const float* b = local();
    return p >= b && p <= b + floats_ && count <= static_cast<std::size_t>(b + floats_ - p);
  }

  /// Sums the `count` floats at `data` (in this rank's floats, at the same offset on every rank)
  /// over the ranks, in place in every rank's floats; waits through `p`.
  /// @throws config_error when another rank sums another part of its floats.
  void sum(float* data, std::size_t count, std::size_t bucket, mpi_progress& p) {
    const auto w = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
    const auto offset = static_cast<std::size_t>(data - local());
    const std::uint64_t g = ++gen_;
    control& c = ctrl(me, 0);
    c.offset = offset;
    c.count = count;
    c.arrived.store(g, std::memory_order_release);
    await_ranks(w, [&](std::size_t q) -> std::atomic<std::uint64_t>& { return ctrl(q, 0).arrived; }, g, bucket, p);
    for (std::size_t q = 0; q < w; ++q)
      if (ctrl(q, 0).offset != offset || ctrl(q, 0).count != count || offset + count > capacity_[q])
        throw config_error("lockstep::multi_worker: rank " + std::to_string(me) + " sums floats " + std::to_string(offset) +
                           ".." + std::to_string(offset + count) + " of its gradients, rank " + std::to_string(q) +
                           " floats " + std::to_string(ctrl(q, 0).offset) + ".." +
                           std::to_string(ctrl(q, 0).offset + ctrl(q, 0).count) + " of its " +
                           std::to_string(capacity_[q]) + " (the workers' collectives do not match)");
    const auto [lo, hi] = window_slice(count, me, w);
    ordered_slice_sum(
        lo, hi, w, [&](std::size_t q) -> const float* { return at(q) + offset; },
        [&](std::size_t b, const float* sums, std::size_t m) {
          for (std::size_t q = 0; q < w; ++q) std::memcpy(at(q) + offset + b, sums, m * sizeof(float));
        });
    ctrl(me, 1).arrived.store(g, std::memory_order_release);
    await_ranks(w, [&](std::size_t q) -> std::atomic<std::uint64_t>& { return ctrl(q, 1).arrived; }, g, bucket, p);
  }

private:
  // Two cache lines per rank: the arrival (with the part of the floats it sums), then the "summed" counter.
  struct alignas(64) control {
    std::atomic<std::uint64_t> arrived;
    std::uint64_t offset, count;
  };
  static constexpr std::size_t header = 2 * sizeof(control);

  control& ctrl(std::size_t rank, std::size_t line) const noexcept { return reinterpret_cast<control*>(base_[rank])[line]; }
  float* at(std::size_t rank) const noexcept { return reinterpret_cast<float*>(base_[rank] + header); }

  int rank_, size_;
  std::size_t floats_;
  MPI_Win win_ = MPI_WIN_NULL;
  std::vector<std::byte*> base_;
  std::vector<std::size_t> capacity_;  // floats of each rank
  std::uint64_t gen_ = 0;
  bool abandoned_ = false;
};

}  // namespace lockstep::detail
