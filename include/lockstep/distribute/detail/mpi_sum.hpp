#pragma once
/// @file mpi_sum.hpp
/// Internal: the deterministic sum of a float buffer over the workers through MPI's message layer
/// (what workers on several machines use): a reduce-scatter as an all-to-all of slices (rank p
/// gets every rank's slice p), a sum over the ranks in order 0..W-1, then an all-gather of the
/// summed slices — the same bits on every rank, run after run, in 2 (W-1)/W of the buffer's bytes
/// per rank. Slices start on 64-byte boundaries.

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/distribute/detail/mpi_error.hpp>

namespace lockstep::detail {

/// The MPI count of `n` elements of `what`. @throws config_error when it exceeds an int.
inline int mpi_int_count(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw config_error(std::string("lockstep::multi_worker: ") + what + " of " + std::to_string(n) +
                       " elements exceeds MPI's int count");
  return static_cast<int>(n);
}

/// The ordered reduce-scatter + all-gather sum over the ranks of a communicator (see the file comment).
class mpi_ordered_sum {
public:
  /// A sum over `size` ranks, with scratch for buckets of `floats` floats.
  mpi_ordered_sum(int size, std::size_t floats)
      : size_(static_cast<std::size_t>(size)), send_counts_(size_), send_displs_(size_), recv_counts_(size_),
        recv_displs_(size_), scratch_(std::max<std::size_t>(1, floats + 64 * size_)) {}

  /// Grows the scratch for buckets of `floats` floats (call while no sum runs).
  void reserve(std::size_t floats) {
    if (scratch_.size() < floats + 64 * size_) scratch_.resize(floats + 64 * size_);
  }

  /// Sums `count` floats at `data` over the ranks of `comm` (this one `rank`), in place; waits through `p`.
  void run(float* data, std::size_t count, MPI_Comm comm, int rank, mpi_progress& p, std::size_t bucket) {
    const std::size_t w = size_;
    if (w == 1 || count == 0) return;
    constexpr std::size_t align = 16;  // 64-byte slice boundaries
    const std::size_t units = (count + align - 1) / align;
    for (std::size_t q = 0; q < w; ++q) {
      const std::size_t lo = std::min(count, units * q / w * align), hi = std::min(count, units * (q + 1) / w * align);
      send_counts_[q] = mpi_int_count(hi - lo, "a bucket");
      send_displs_[q] = mpi_int_count(lo, "a bucket");
    }
    const auto me = static_cast<std::size_t>(rank);
    const int mine = send_counts_[me];
    if (scratch_.size() < static_cast<std::size_t>(mine) * w) scratch_.resize(static_cast<std::size_t>(mine) * w);
    for (std::size_t q = 0; q < w; ++q) {
      recv_counts_[q] = mine;
      recv_displs_[q] = mpi_int_count(static_cast<std::size_t>(mine) * q, "a bucket");
    }
    MPI_Request r = MPI_REQUEST_NULL;
    mpi_check(MPI_Ialltoallv(data, send_counts_.data(), send_displs_.data(), MPI_FLOAT, scratch_.data(),
                             recv_counts_.data(), recv_displs_.data(), MPI_FLOAT, comm, &r),
              "MPI_Ialltoallv");
    p.complete(r, bucket);
    float* out = data + send_displs_[me];
    const float* s = scratch_.data();
    const auto m = static_cast<std::size_t>(mine);
    std::memcpy(out, s, m * sizeof(float));
    for (std::size_t q = 1; q < w; ++q)
      for (std::size_t i = 0; i < m; ++i) out[i] += s[q * m + i];
    mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, send_counts_.data(), send_displs_.data(),
                              MPI_FLOAT, comm, &r),
              "MPI_Iallgatherv");
    p.complete(r, bucket);
  }

private:
  std::size_t size_;
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
  std::vector<float> scratch_;
};

}  // namespace lockstep::detail
