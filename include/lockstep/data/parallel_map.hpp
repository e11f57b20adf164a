#pragma once
/// @file parallel_map.hpp
/// `parallel_map(f, workers)`: applies f on a pool of worker threads and yields the results in
/// the input order. The consumer's thread pulls the upstream and keeps at most 2 * workers
/// elements in flight. An exception thrown by f reaches the consumer at that element's position;
/// leaving early stops and joins the workers.

#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/generator.hpp>

namespace lockstep::data {

namespace detail {

/// Worker threads applying copies of F to numbered jobs; results land in a ring of slots.
template <class T, class R, class F>
class ordered_workers {
public:
  ordered_workers(const F& f, std::size_t workers, std::size_t window) : slots_(window) {
    threads_.reserve(workers);
    try {
      for (std::size_t w = 0; w < workers; ++w) threads_.emplace_back([this, f] { run(f); });
    } catch (...) {
      shutdown();
      throw;
    }
  }
  ordered_workers(const ordered_workers&) = delete;
  ordered_workers& operator=(const ordered_workers&) = delete;
  ~ordered_workers() { shutdown(); }

  void submit(std::uint64_t seq, T&& value) {
    {
      std::lock_guard lock(mutex_);
      jobs_.emplace_back(seq, std::move(value));
    }
    work_.notify_one();
  }

  /// Waits for the result of job `seq` (in order); rethrows what f threw for it.
  R take(std::uint64_t seq) {
    std::unique_lock lock(mutex_);
    slot& s = slots_[seq % slots_.size()];
    done_.wait(lock, [&] { return s.ready; });
    s.ready = false;
    if (s.error) std::rethrow_exception(std::exchange(s.error, nullptr));
    R out = std::move(*s.value);
    s.value.reset();
    return out;
  }

private:
  struct slot {
    std::optional<R> value;
    std::exception_ptr error;
    bool ready = false;
  };

  void run(F f) {
    while (true) {
      std::unique_lock lock(mutex_);
      work_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (stop_) return;
      auto [seq, value] = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      std::optional<R> result;
      std::exception_ptr error;
      try {
        result.emplace(std::invoke(f, std::move(value)));
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      slot& s = slots_[seq % slots_.size()];
      s.value = std::move(result);
      s.error = std::move(error);
      s.ready = true;
      lock.unlock();
      done_.notify_all();
    }
  }

  void shutdown() noexcept {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    work_.notify_all();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

  std::mutex mutex_;
  std::condition_variable work_, done_;
  std::deque<std::pair<std::uint64_t, T>> jobs_;
  std::vector<slot> slots_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

template <class T, class R, class F>
generator<R> parallel_map_gen(generator<T> up, F f, std::size_t workers) {
  const std::size_t window = 2 * workers;
  ordered_workers<T, R, F> pool(f, workers, window);
  std::uint64_t submitted = 0, next = 0;
  std::exception_ptr upstream;  // what the upstream threw: rethrown after the elements before it
  auto it = std::ranges::begin(up);
  const auto end = std::ranges::end(up);
  while (true) {
    try {
      while (!upstream && submitted - next < window && it != end) {
        T value = std::move(*it);
        pool.submit(submitted, std::move(value));
        ++submitted;
        ++it;
      }
    } catch (...) {
      upstream = std::current_exception();
    }
    if (next == submitted) {
      if (upstream) std::rethrow_exception(upstream);
      co_return;
    }
    co_yield pool.take(next++);
  }
}

}  // namespace detail

/// Stage: applies f on worker threads, keeping the order (see parallel_map()).
template <class F>
struct parallel_map_closure : closure<parallel_map_closure<F>> {
  F f;                      ///< the transform (each worker calls its own copy)
  std::size_t workers = 1;  ///< worker threads
  /// Applies the stage to a dataset.
  template <class T>
    requires std::invocable<F&, T&&> && std::move_constructible<T>
  auto operator()(dataset<T> d) const {
    using R = std::remove_cvref_t<std::invoke_result_t<F&, T&&>>;
    return dataset<R>{[d = std::move(d), f = f, n = workers](std::uint64_t e) {
      return detail::parallel_map_gen<T, R, F>(d.epoch(e), f, n);
    }};
  }
};
/// The most threads one parallel_map stage starts.
inline constexpr std::size_t max_parallel_map_workers = 1024;

/// Applies f to every element on `workers` threads, yielding results in input order. Each worker
/// holds its own copy of f. @throws config_error when workers is 0 or above max_parallel_map_workers.
template <class F>
  requires std::copy_constructible<std::decay_t<F>>
parallel_map_closure<std::decay_t<F>> parallel_map(F&& f, std::size_t workers) {
  if (workers == 0) throw config_error("lockstep::data::parallel_map: workers must be >= 1");
  if (workers > max_parallel_map_workers)
    throw config_error("lockstep::data::parallel_map: " + std::to_string(workers) + " workers are more than " +
                       std::to_string(max_parallel_map_workers) + " threads");
  return {{}, std::forward<F>(f), workers};
}

}  // namespace lockstep::data
