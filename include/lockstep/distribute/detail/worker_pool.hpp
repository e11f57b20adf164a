#pragma once
/// @file worker_pool.hpp
/// Internal: the persistent worker threads of a strategy. A job is a function of the replica
/// index; run() hands it to the workers of replicas 1 to N - 1, runs replica 0 itself on the
/// caller's thread (one thread fewer to wake and to put to sleep per job, and no thread left
/// waiting beside the replicas for a core), waits for all of them, and rethrows the first real
/// failure as a replica_error naming the replica, with the original nested (a replica
/// released by an abort reports collective_aborted, which is only rethrown when nothing else
/// failed). A failing worker calls the abort callback at once so that replicas blocked in a
/// collective are released.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include <lockstep/backend/host/context.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/distribute/detail/wake.hpp>

namespace lockstep::detail {

/// N - 1 persistent worker threads, for replicas 1 to N - 1; replica 0 runs on the caller's thread.
class worker_pool {
public:
  /// Callback run (on the failing thread) when a job throws: releases the other replicas.
  using abort_fn = void (*)(void*) noexcept;

  /// Starts the workers of replicas 1 to n - 1 (worker r pinned to the r-th allowed CPU when `pin`
  /// and there are n of them; the caller's thread, which runs replica 0, is then pinned to the
  /// first for the length of each job and gets its own mask back after it);
  /// `on_abort(ctx)` releases blocked collectives.
  worker_pool(std::size_t n, abort_fn on_abort, void* ctx, bool pin = false)
      : n_(n), on_abort_(on_abort), abort_ctx_(ctx), errors_(n), stamps_(n), cpus_(pin ? allowed_cpus(n) : std::vector<int>{}),
        hub_(n <= std::max(1u, std::thread::hardware_concurrency()) ? 1024u : 0u) {
    if (n_ > 1) {
      threads_.reserve(n_ - 1);
      std::size_t r = 1;
      try {
        for (; r < n_; ++r) threads_.emplace_back([this, r] { loop(r); });
      } catch (...) {
        // The threads already started are stopped and joined: a vector of joinable threads
        // destroyed here would terminate the process.
        stop_.store(true, std::memory_order_release);
        hub_.notify();
        for (auto& t : threads_) t.join();
        try {
          throw;
        } catch (const std::system_error& e) {
          throw config_error("lockstep: cannot start the thread of replica " + std::to_string(r) + " of " +
                             std::to_string(n_) + " (" + e.what() + ")");
        }
      }
    }
  }
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;
  /// Stops and joins every worker.
  ~worker_pool() {
    stop_.store(true, std::memory_order_release);
    hub_.notify();
    for (auto& t : threads_) t.join();
  }

  /// Number of replicas.
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

  /// Runs f(r) for every replica r (f(0) on the caller's thread, the others on their workers) and
  /// waits for all; rethrows the first failure as a replica_error naming its replica and `step`
  /// (replica_error::no_step outside training).
  template <class F>
  void run(F& f, std::uint64_t step = replica_error::no_step) {
    step_ = step;
    const backend::caller_thread_state keep;  // replica 0 runs here: the caller's mode is restored
    if (n_ == 1) {
      try {
        f(std::size_t{0});
      } catch (...) {
        rethrow_named(std::current_exception(), 0);
      }
      return;
    }
    job_fn_ = [](void* obj, std::size_t r) { (*static_cast<F*>(obj))(r); };
    job_obj_ = static_cast<void*>(std::addressof(f));
    for (auto& e : errors_) e = nullptr;
    next_stamp_.store(0, std::memory_order_relaxed);
    remaining_.store(n_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    hub_.notify();
    const backend::pin_scope pinned(cpus_.empty() ? -1 : cpus_[0]);  // replica 0's CPU, for this job only
    run_job(0);
    hub_.wait([&] { return remaining_.load(std::memory_order_acquire) == 0; });
    rethrow_first();
  }

private:
  // The CPUs this process may run on, when there are at least n of them (none otherwise: then
  // the workers are not pinned).
  static std::vector<int> allowed_cpus(std::size_t n) {
    std::vector<int> cpus = backend::allowed_cpus();
    if (cpus.size() < n) cpus.clear();
    return cpus;
  }

  // Pins worker r to the r-th allowed CPU (best effort: a refusal leaves it unpinned).
  void pin(std::size_t r) const noexcept {
    if (r < cpus_.size()) backend::pin_this_thread(cpus_[r]);
  }

  void loop(std::size_t r) {
    pin(r);
    std::uint64_t seen = 0;
    for (;;) {
      hub_.wait([&] {
        return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
      });
      if (stop_.load(std::memory_order_acquire)) return;
      seen = generation_.load(std::memory_order_acquire);
      run_job(r);
      if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) hub_.notify();
    }
  }

  // Runs the current job for replica r, keeping its failure (and releasing the other replicas).
  void run_job(std::size_t r) noexcept {
    try {
      job_fn_(job_obj_, r);
    } catch (...) {
      errors_[r] = std::current_exception();
      stamps_[r] = next_stamp_.fetch_add(1, std::memory_order_relaxed);
      on_abort_(abort_ctx_);
    }
  }

  void rethrow_first() {
    std::exception_ptr first, first_aborted;
    std::uint64_t best = ~std::uint64_t{0}, best_aborted = ~std::uint64_t{0};
    for (std::size_t r = 0; r < n_; ++r) {
      if (!errors_[r]) continue;
      bool aborted = false;
      try {
        std::rethrow_exception(errors_[r]);
      } catch (const collective_aborted&) {
        aborted = true;
      } catch (...) {
      }
      if (aborted ? stamps_[r] < best_aborted : stamps_[r] < best) {
        (aborted ? first_aborted : first) = errors_[r];
        (aborted ? best_aborted : best) = stamps_[r];
      }
    }
    const bool real = static_cast<bool>(first);
    if (!first) first = first_aborted;
    if (first) {
      std::size_t who = 0;
      while (errors_[who] != first) ++who;
      for (auto& e : errors_) e = nullptr;
      if (!real) std::rethrow_exception(first);
      rethrow_named(first, who);
    }
  }

  // Rethrows `e` of replica r as a replica_error naming r and the step, with `e` nested; a
  // replica_error (it already names its replica) and a timeout_error (it names the replicas that
  // did not arrive) pass unchanged.
  [[noreturn]] void rethrow_named(std::exception_ptr e, std::size_t r) const {
    try {
      std::rethrow_exception(e);
    } catch (const replica_error&) {
      throw;
    } catch (const timeout_error&) {
      throw;
    } catch (const std::exception& x) {
      std::throw_with_nested(replica_error(prefix(r) + x.what(), r, step_));
    } catch (...) {
      std::throw_with_nested(replica_error(prefix(r) + "an exception not derived from std::exception", r, step_));
    }
  }

  std::string prefix(std::size_t r) const {
    std::string p = "lockstep: replica " + std::to_string(r);
    if (step_ != replica_error::no_step) p += " at step " + std::to_string(step_);
    return p + " failed: ";
  }

  std::size_t n_;
  abort_fn on_abort_;
  void* abort_ctx_;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::uint64_t> stamps_;
  std::vector<int> cpus_;
  std::atomic<std::uint64_t> next_stamp_{0};
  void (*job_fn_)(void*, std::size_t) = nullptr;
  void* job_obj_ = nullptr;
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<std::size_t> remaining_{0};
  std::atomic<bool> stop_{false};
  std::uint64_t step_ = replica_error::no_step;
  wake_hub hub_;
  std::vector<std::thread> threads_;
};

}  // namespace lockstep::detail
