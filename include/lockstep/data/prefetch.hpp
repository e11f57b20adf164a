#pragma once
/// @file prefetch.hpp
/// `prefetch(n)`: runs the upstream pipeline on its own producer thread, n elements ahead of the
/// consumer, through a bounded queue (index batches are decoded there too: index_batch::load_ahead). Exceptions of the upstream reach the consumer (after the
/// elements produced before them); a consumer that leaves early stops the producer after its
/// current element and the thread is joined before the generator's destructor returns.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/generator.hpp>

namespace lockstep::data {

namespace detail {

/// A bounded single-producer single-consumer queue with end-of-stream, error and stop signals.
template <class T>
class channel {
public:
  explicit channel(std::size_t capacity) : ring_(capacity) {}

  /// Producer: waits for room; false when the consumer has left (the value is dropped).
  bool push(T&& value) {
    std::unique_lock lock(mutex_);
    not_full_.wait(lock, [&] { return stopped_ || count_ < ring_.size(); });
    if (stopped_) return false;
    ring_[(head_ + count_) % ring_.size()].emplace(std::move(value));
    ++count_;
    lock.unlock();
    not_empty_.notify_one();
    return true;
  }
  /// Producer: no more values; `error` (may be null) is rethrown after the queued values.
  void finish(std::exception_ptr error) noexcept {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
      error_ = std::move(error);
    }
    not_empty_.notify_one();
  }
  /// Consumer: the next value, or nullopt at the end; rethrows the producer's exception.
  std::optional<T> pop() {
    std::unique_lock lock(mutex_);
    not_empty_.wait(lock, [&] { return count_ > 0 || done_; });
    if (count_ == 0) {
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
      return std::nullopt;
    }
    std::optional<T> out = std::move(ring_[head_]);
    ring_[head_].reset();
    head_ = (head_ + 1) % ring_.size();
    --count_;
    lock.unlock();
    not_full_.notify_one();
    return out;
  }
  /// Consumer: leaving; wakes the producer so it stops.
  void stop() noexcept {
    {
      std::lock_guard lock(mutex_);
      stopped_ = true;
    }
    not_full_.notify_all();
  }

private:
  std::mutex mutex_;
  std::condition_variable not_empty_, not_full_;
  std::vector<std::optional<T>> ring_;
  std::size_t head_ = 0, count_ = 0;
  bool done_ = false, stopped_ = false;
  std::exception_ptr error_;
};

/// Runs `up` on a thread feeding `ch`; the destructor stops and joins it, then destroys `up`:
/// queued elements may view into the upstream's state (a sample into its table), so the upstream
/// lives as long as the consumer's generator, not only until it is exhausted.
template <class T>
class producer {
public:
  producer(std::shared_ptr<channel<T>> ch, generator<T> up) : channel_(ch), source_(std::move(up)) {
    thread_ = std::thread([ch = std::move(ch), source = &source_] {
      std::exception_ptr error;
      try {
        for (auto&& x : *source) {
          // An index batch decodes this process's rows here, off the consumer's thread.
          if constexpr (requires { x.load_ahead(); }) x.load_ahead();
          if (!ch->push(std::move(x))) break;
        }
      } catch (...) {
        error = std::current_exception();
      }
      ch->finish(std::move(error));
    });
  }
  producer(const producer&) = delete;
  producer& operator=(const producer&) = delete;
  ~producer() {
    channel_->stop();
    if (thread_.joinable()) thread_.join();
  }

private:
  std::shared_ptr<channel<T>> channel_;
  generator<T> source_;  // destroyed after the thread is joined
  std::thread thread_;
};

template <class T>
generator<T> prefetch_gen(generator<T> up, std::size_t depth) {
  auto ch = std::make_shared<channel<T>>(depth);
  producer<T> worker(ch, std::move(up));
  while (std::optional<T> v = ch->pop()) co_yield std::move(*v);
}

}  // namespace detail

/// Stage: runs the upstream on a producer thread (see prefetch()).
struct prefetch_closure : closure<prefetch_closure> {
  std::size_t depth = 1;  ///< elements the producer may run ahead
  /// Applies the stage to a dataset of movable elements.
  template <std::move_constructible T>
  dataset<T> operator()(dataset<T> d) const {
    return dataset<T>{[d = std::move(d), n = depth](std::uint64_t e) { return detail::prefetch_gen<T>(d.epoch(e), n); }};
  }
};
/// The largest prefetch depth (the queue's slots are allocated when an epoch starts).
inline constexpr std::size_t max_prefetch_depth = std::size_t{1} << 16;

/// Produces up to `depth` elements ahead on a separate thread (started when the epoch's generator
/// is first iterated, joined when it is destroyed).
/// @throws config_error when depth is 0 or above max_prefetch_depth.
inline prefetch_closure prefetch(std::size_t depth) {
  if (depth == 0) throw config_error("lockstep::data::prefetch: depth must be >= 1");
  if (depth > max_prefetch_depth)
    throw config_error("lockstep::data::prefetch: depth " + std::to_string(depth) + " is more than " +
                       std::to_string(max_prefetch_depth) + " elements ahead");
  return {{}, depth};
}

}  // namespace lockstep::data
