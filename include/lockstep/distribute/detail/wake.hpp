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
  void notify() noexcept {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_relaxed) > 0) {
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
    sleepers_.fetch_add(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
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
