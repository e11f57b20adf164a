#pragma once
/// @file reducer.hpp (testing/archetypes)
/// The archetype of the reducer concept: a mutex and a condition variable, summing the replicas'
/// buckets in replica order, with exactly the members a strategy calls (see model.hpp for why it
/// lives outside lockstep). The reducer conformance suite checks it, a strategy trains with it,
/// and two MPI workers train with it through over_workers.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/distribute/reducer.hpp>

namespace lockstep_archetypes {

/// Every replica posts its pointer for a bucket; the last to arrive sums in replica order and
/// writes the sum to every replica's data; waiters sleep on a condition variable.
class rendezvous_reducer {
public:
  using reducer_concept = lockstep::reducer_tag;
  template <class... Ds>
  static constexpr bool supports = (lockstep::is_cpu_v<Ds> && ...);

  explicit rendezvous_reducer(const lockstep::reducer_config& c)
      : n_(c.replicas), timeout_(c.timeout), buckets_(c.ids, bucket(c.replicas)) {}

  std::size_t workspace_bytes(std::size_t) const { return 0; }
  void bind(std::size_t, void*, std::size_t) {}

  template <class Ctx, class T>
  void start(std::size_t r, Ctx&, T* data, std::size_t count, std::size_t id) {
    std::unique_lock lock(m_);
    bucket& b = buckets_[id];
    b.seen[r] = b.generation;
    b.ptrs[r] = data;
    if (++b.arrived == n_) {  // the last one sums, in replica order, for everyone
      for (std::size_t i = 0; i < count; ++i) {
        T s = static_cast<T*>(b.ptrs[0])[i];
        for (std::size_t k = 1; k < n_; ++k) s += static_cast<T*>(b.ptrs[k])[i];
        for (std::size_t k = 0; k < n_; ++k) static_cast<T*>(b.ptrs[k])[i] = s;
      }
      ++b.generation;
      b.arrived = 0;
      std::fill(b.ptrs.begin(), b.ptrs.end(), nullptr);
      cv_.notify_all();
    }
  }

  template <class Ctx>
  void wait(std::size_t r, Ctx&, std::size_t id) {
    std::unique_lock lock(m_);
    bucket& b = buckets_[id];
    if (!cv_.wait_for(lock, timeout_, [&] { return aborted_ || b.generation > b.seen[r]; })) {
      std::string missing;
      for (std::size_t k = 0; k < n_; ++k)
        if (b.ptrs[k] == nullptr) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      throw lockstep::timeout_error("user::rendezvous_reducer: bucket " + std::to_string(id) + ": replica(s) " +
                                    missing + " did not arrive");
    }
    if (aborted_) throw lockstep::replica_error("user::rendezvous_reducer: aborted");
  }

  template <class Ctx, class T>
  void broadcast(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t root) {
    if (r != root) std::fill(data, data + count, T(0));
    start(r, ctx, data, count, buckets_.size() - 1);  // a sum where only the root contributes
    wait(r, ctx, buckets_.size() - 1);
  }

  void abort() {
    std::lock_guard lock(m_);
    aborted_ = true;
    cv_.notify_all();
  }
  void reset() {
    std::lock_guard lock(m_);
    aborted_ = false;
    for (auto& b : buckets_) b = bucket(n_);
  }

private:
  struct bucket {
    explicit bucket(std::size_t n) : ptrs(n, nullptr), seen(n, 0) {}
    std::vector<void*> ptrs;
    std::vector<std::size_t> seen;
    std::size_t arrived = 0, generation = 0;
  };
  std::size_t n_;
  std::chrono::milliseconds timeout_;
  std::vector<bucket> buckets_;
  std::mutex m_;
  std::condition_variable cv_;
  bool aborted_ = false;
};

}  // namespace lockstep_archetypes
