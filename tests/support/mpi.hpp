// What the MPI tests of several binaries share: this process's rank and the job's size, one
// directory name for the whole job, a check that every rank holds the same bits, and the exactly-
// once check's parts (the samples this worker's replicas saw, every worker's gathered).
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <lockstep/data/batch.hpp>
#include <lockstep/data/shard_batches.hpp>

namespace test_support {

/// This process's rank in MPI_COMM_WORLD.
inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

/// The number of processes in MPI_COMM_WORLD.
inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// A directory under the temporary directory named `prefix` and rank 0's process id, the same on
/// every rank (not created).
inline std::filesystem::path job_directory(const std::string& prefix) {
  unsigned long long tag = static_cast<unsigned long long>(::getpid());
  MPI_Bcast(&tag, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  return std::filesystem::temp_directory_path() / (prefix + std::to_string(tag));
}

/// job_directory(prefix), emptied by rank 0 before any rank goes on (collective; not created).
inline std::filesystem::path fresh_job_directory(const std::string& prefix) {
  const auto dir = job_directory(prefix);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

/// Removes a job's directory once every rank is done with it (collective; rank 0 removes it).
inline void remove_job_directory(const std::filesystem::path& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

/// True when every rank passed `v` with the same bits as rank 0 (collective).
inline bool same_on_every_rank(const std::vector<float>& v) {
  std::vector<float> root = v;
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  int same = std::equal(v.begin(), v.end(), root.begin()) ? 1 : 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

/// Every rank's `mine`, concatenated in rank order, on every rank (collective).
inline std::vector<std::uint64_t> gather_all(const std::vector<std::uint64_t>& mine) {
  const int n = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<std::size_t>(world_size())), displs(counts.size());
  MPI_Allgather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    displs[i] = total;
    total += counts[i];
  }
  std::vector<std::uint64_t> all(static_cast<std::size_t>(total));
  MPI_Allgatherv(mine.data(), n, MPI_UINT64_T, all.data(), counts.data(), displs.data(), MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}

/// The sample indices that the local replicas of strategy `s` see over batches 0..n-1 (`batch(i)`
/// makes batch i), in batch and replica order.
template <class Strategy, class MakeBatch>
std::vector<std::uint64_t> indices_seen(Strategy& s, std::size_t n, MakeBatch&& batch) {
  const auto p = s.plan();
  std::vector<std::uint64_t> mine;
  for (std::size_t i = 0; i < n; ++i) {
    const auto db = lockstep::data::detail::make_sharded(batch(i), p.parts, p.first, s.num_replicas());
    const auto seen = s.run([](std::size_t, const lockstep::data::shard& sh) {
      return std::vector<std::uint64_t>(sh.indices, sh.indices + sh.size);
    }, db);
    for (const auto& v : seen) mine.insert(mine.end(), v.begin(), v.end());
  }
  return mine;
}

}  // namespace test_support
