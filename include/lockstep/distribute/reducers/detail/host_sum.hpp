#pragma once
/// @file host_sum.hpp
/// Internal: the summation loops of the host reducers (and of the micro-shard steps): fixed
/// order 0..N-1 for every element, in chunks that keep the accumulator in L1; the slices each
/// replica sums; and what the shared-memory reducers share.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
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

template <class T>
void reduce_to_root_work(host_comm& c, std::size_t r, std::size_t bucket, std::size_t count, std::uint64_t seq) {
  const std::size_t root = c.root();
  if (c.replicas() == 1) return;
  if (r == root) {
    sum_range<T>(c, bucket, 0, count, [&](std::size_t b, const T* acc, std::size_t m) {
      std::memcpy(static_cast<T*>(c.pointer(bucket, root)) + b, acc, m * sizeof(T));
    });
    c.publish_stage(r, seq);
  } else {
    c.await_stage(root, seq, r, bucket);
    if (count) std::memcpy(c.pointer(bucket, r), c.pointer(bucket, root), count * sizeof(T));
  }
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
