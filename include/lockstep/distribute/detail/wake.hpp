#pragma once
/// @file wake.hpp
/// Internal: how threads of a strategy wait for each other — spin briefly, then sleep on a
/// condition variable, waking periodically to notice aborts and deadlines.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#if defined(__SANITIZE_THREAD__)
#define LOCKSTEP_DETAIL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOCKSTEP_DETAIL_TSAN 1
#endif
#endif

namespace lockstep::detail {

/// One pause of a spin loop.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// A meeting point for threads that wait on shared atomics: a waiter spins, then sleeps; whoever
/// changes an atomic calls notify(). Sleepers also wake every 20 ms to re-check their condition.
class wake_hub {
public:
  /// A hub whose waiters spin `spins` pauses before sleeping (0 when threads outnumber cores).
  explicit wake_hub(unsigned spins = 1024) noexcept : spins_(spins) {}

  /// Wakes sleeping waiters; call after storing the value they wait for.
  ///
  /// The store of that value and the load of `sleepers_` must not be reordered (nor the waiter's
  /// increment of `sleepers_` and its check of the value), or a waiter that has just counted
  /// itself could sleep through the wake-up until its next 20 ms tick. Two seq_cst fences order
  /// them. ThreadSanitizer does not model fences (g++ refuses them under -fsanitize=thread), so
  /// there both sides use read-modify-writes of `sleepers_` instead: they are totally ordered on
  /// that one atomic, and the later one acquires what the earlier one released — the same
  /// guarantee, in a form the sanitizer checks.
  void notify() noexcept {
#if defined(LOCKSTEP_DETAIL_TSAN)
    if (sleepers_.fetch_add(0, std::memory_order_acq_rel) > 0) {
#else
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_relaxed) > 0) {
#endif
      std::lock_guard<std::mutex> lock(mutex_);
      cv_.notify_all();
    }
  }

  /// Waits until pred() holds or `deadline` passes; returns pred().
  template <class Pred>
  bool wait_until(const Pred& pred, std::chrono::steady_clock::time_point deadline) {
    for (unsigned i = 0; i < spins_; ++i) {
      if (pred()) return true;
      cpu_relax();
    }
    if (pred()) return true;
    std::unique_lock<std::mutex> lock(mutex_);
#if defined(LOCKSTEP_DETAIL_TSAN)
    sleepers_.fetch_add(1, std::memory_order_acq_rel);
#else
    sleepers_.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
    bool ok = true;
    while (!pred()) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        ok = false;
        break;
      }
      cv_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(20)));
    }
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    return ok;
  }

  /// Waits until pred() holds, however long it takes.
  template <class Pred>
  void wait(const Pred& pred) {
    wait_until(pred, std::chrono::steady_clock::time_point::max());
  }

private:
  unsigned spins_;
  std::atomic<int> sleepers_{0};
  std::mutex mutex_;
  std::condition_variable cv_;
};

}  // namespace lockstep::detail
