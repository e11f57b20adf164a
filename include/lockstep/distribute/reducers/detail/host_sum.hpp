#pragma once
/// @file host_sum.hpp
/// Internal: the summation loops of the host reducers (and of the micro-shard steps): fixed
/// order 0..N-1 for every element, in chunks that keep the accumulator in L1; the slices each
/// replica sums; and what the shared-memory reducers share.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>

#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/distribute/reducer.hpp>

namespace lockstep::detail {

/// Elements per chunk of the host reduction loops (the accumulator stays in L1).
inline constexpr std::size_t reduce_chunk_bytes = 4096;

/// Sums elements [lo, hi) of the n buffers ptrs[0..n) in order 0..n-1 into `out` pointers.
template <class T, class Write>
void sum_range(const host_comm& c, std::size_t bucket, std::size_t lo, std::size_t hi, const Write& write) {
  constexpr std::size_t chunk = reduce_chunk_bytes / sizeof(T);
  T acc[chunk];
  const std::size_t n = c.replicas();
  for (std::size_t b = lo; b < hi; b += chunk) {
    const std::size_t m = std::min(chunk, hi - b);
    std::memcpy(acc, static_cast<const T*>(c.pointer(bucket, 0)) + b, m * sizeof(T));
    for (std::size_t j = 1; j < n; ++j) {
      const T* p = static_cast<const T*>(c.pointer(bucket, j)) + b;
      for (std::size_t i = 0; i < m; ++i) acc[i] += p[i];
    }
    write(b, acc, m);
  }
}

/// Replica r's slice of `count` elements, with boundaries on 64-byte multiples.
template <class T>
std::pair<std::size_t, std::size_t> slice_of(std::size_t count, std::size_t r, std::size_t n) noexcept {
  constexpr std::size_t align = std::max<std::size_t>(1, 64 / sizeof(T));
  const std::size_t units = (count + align - 1) / align;
  const std::size_t lo = std::min(count, units * r / n * align);
  const std::size_t hi = std::min(count, units * (r + 1) / n * align);
  return {lo, hi};
}

template <class T>
void allreduce_work(host_comm& c, std::size_t r, std::size_t bucket, std::size_t count, std::uint64_t) {
  const std::size_t n = c.replicas();
  if (n == 1) return;
  const auto [lo, hi] = slice_of<T>(count, r, n);
  sum_range<T>(c, bucket, lo, hi, [&](std::size_t b, const T* acc, std::size_t m) {
    for (std::size_t j = 0; j < n; ++j) std::memcpy(static_cast<T*>(c.pointer(bucket, j)) + b, acc, m * sizeof(T));
  });
}

/// What replica r's part of a collective on the update's slices reads (host_comm::argument): where
/// its bucket starts in the flat parameter vector and every replica's slice [first, last) of it.
struct slice_job {
  std::size_t offset = 0;                                       ///< the bucket's first element
  std::span<const std::pair<std::size_t, std::size_t>> slices;  ///< every replica's slice, in replica order
};

/// Slice `s` of the flat vector as a range of the bucket [offset, offset + count) (empty where
/// they do not meet).
inline std::pair<std::size_t, std::size_t> slice_in_bucket(std::pair<std::size_t, std::size_t> s, std::size_t offset,
                                                            std::size_t count) noexcept {
  const std::size_t lo = std::clamp(s.first, offset, offset + count) - offset;
  const std::size_t hi = std::clamp(s.second, offset, offset + count) - offset;
  return {lo, std::max(lo, hi)};
}

/// The reduce-scatter onto the update's slices: replica r sums, in order 0..N-1, the part of the
/// bucket its own slice holds, into its own buffer only (the sums allreduce_work writes, bit for
/// bit; the rest of its buffer keeps its own gradient).
template <class T>
void reduce_to_slices_work(host_comm& c, std::size_t r, std::size_t bucket, std::size_t count, std::uint64_t) {
  if (c.replicas() == 1) return;
  const auto& job = *static_cast<const slice_job*>(c.argument(bucket, r));
  const auto [lo, hi] = slice_in_bucket(job.slices[r], job.offset, count);
  T* const mine = static_cast<T*>(c.pointer(bucket, r));
  sum_range<T>(c, bucket, lo, hi, [&](std::size_t b, const T* acc, std::size_t m) { std::memcpy(mine + b, acc, m * sizeof(T)); });
}

/// The all-gather of the updated slices: replica r writes its own slice into every other
/// replica's buffer. Writing (not reading the others') leaves each slice's lines in its owner's
/// cache alone, so the owner's next update does not wait for other cores to give them up.
template <class T>
void push_slices_work(host_comm& c, std::size_t r, std::size_t bucket, std::size_t, std::uint64_t) {
  const auto& job = *static_cast<const slice_job*>(c.argument(bucket, r));
  const auto [lo, hi] = job.slices[r];
  if (hi <= lo) return;
  const T* const mine = static_cast<const T*>(c.pointer(bucket, r));
  for (std::size_t j = 0; j < c.replicas(); ++j)
    if (j != r) std::memcpy(static_cast<T*>(c.pointer(bucket, j)) + lo, mine + lo, (hi - lo) * sizeof(T));
}

/// reduce_to_one_device's work: the root sums the bucket (order 0..N-1) and writes the sum into
/// every replica's buffer; the others have nothing to do, so their work never waits (a replica
/// whose work waited for the root's could hold up a root that waits elsewhere for it, as in batch
/// norm's row exchange, until the timeout). A replica's wait() returns once the root finished.
template <class T>
void reduce_to_root_work(host_comm& c, std::size_t r, std::size_t bucket, std::size_t count, std::uint64_t) {
  const std::size_t root = c.root();
  if (c.replicas() == 1 || r != root) return;
  sum_range<T>(c, bucket, 0, count, [&](std::size_t b, const T* acc, std::size_t m) {
    for (std::size_t j = 0; j < c.replicas(); ++j) std::memcpy(static_cast<T*>(c.pointer(bucket, j)) + b, acc, m * sizeof(T));
  });
}

/// What both host reducers share: the engine, broadcast, abort and reset.
class host_reducer_base {
public:
  explicit host_reducer_base(const reducer_config& c, std::size_t root)
      : comm_(c.replicas, c.timeout, c.ids, root) {}
  /// Host memory needs no workspace.
  [[nodiscard]] std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }
  /// Nothing to bind.
  void bind(std::size_t, void*, std::size_t) noexcept {}
  /// Completes the bucket on every replica.
  template <class Ctx>
  void wait(std::size_t replica, Ctx&, std::size_t bucket) {
    comm_.wait(replica, bucket);
  }
  /// Copies `count` elements of the root's data to every replica (synchronous).
  template <class Ctx, class T>
  void broadcast(std::size_t replica, Ctx&, T* data, std::size_t count, std::size_t root) {
    comm_.broadcast(replica, data, count, sizeof(T), root);
  }
  /// Releases every waiter.
  void abort() noexcept { comm_.abort(); }
  /// Ready again after a failure.
  void reset() noexcept { comm_.reset(); }

protected:
  host_comm comm_;
};

}  // namespace lockstep::detail
