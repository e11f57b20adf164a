#pragma once
/// @file batch_pool.hpp
/// Recycling of batch buffers: `batch_pool` keeps the vectors of finished batches and
/// `pooled_batch` (a `batch` that remembers its pool) gives them back when it is destroyed, so the
/// steady state of a pipeline allocates and first-touches no new batch memory.

#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <lockstep/data/batch.hpp>

namespace lockstep::data {

/// A thread-safe free list of batches whose vectors keep their capacity.
class batch_pool {
public:
  /// A pool that keeps at most `max_free` idle batches.
  explicit batch_pool(std::size_t max_free = 16) : max_free_(max_free) {}

  /// An idle batch (contents unspecified, sizes kept) or a new empty one.
  [[nodiscard]] batch acquire() {
    std::lock_guard lock(mutex_);
    if (free_.empty()) return batch{};
    batch b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  /// Takes a batch back for reuse (dropped when the pool is full).
  void release(batch&& b) noexcept {
    if (b.features.capacity() == 0 && b.indices.capacity() == 0) return;
    std::lock_guard lock(mutex_);
    if (free_.size() < max_free_) {
      try {
        free_.push_back(std::move(b));
      } catch (...) {  // out of memory while recycling: just free the batch
      }
    }
  }
  /// Number of idle batches held.
  [[nodiscard]] std::size_t idle() const {
    std::lock_guard lock(mutex_);
    return free_.size();
  }

private:
  mutable std::mutex mutex_;
  std::vector<batch> free_;
  std::size_t max_free_;
};

/// A `batch` that returns its buffers to a `batch_pool` when destroyed. It is-a batch: use it
/// wherever a `batch` is expected. Copies do not belong to the pool.
class pooled_batch : public batch {
public:
  /// An empty batch outside any pool.
  pooled_batch() = default;
  /// Wraps a batch that goes back to `pool` on destruction.
  pooled_batch(batch&& b, std::shared_ptr<batch_pool> pool) noexcept : batch(std::move(b)), pool_(std::move(pool)) {}
  /// Copies the rows (the copy is not pooled).
  pooled_batch(const pooled_batch& other) : batch(other) {}
  /// Takes over the buffers and the pool membership.
  pooled_batch(pooled_batch&& other) noexcept : batch(std::move(other)), pool_(std::exchange(other.pool_, nullptr)) {}
  /// Copies the rows; the current buffers go back to the pool.
  pooled_batch& operator=(const pooled_batch& other) {
    if (this != &other) {
      pooled_batch tmp(other);
      *this = std::move(tmp);
    }
    return *this;
  }
  /// Releases the current buffers, then takes over the other's.
  pooled_batch& operator=(pooled_batch&& other) noexcept {
    if (this != &other) {
      recycle();
      static_cast<batch&>(*this) = std::move(static_cast<batch&>(other));
      pool_ = std::exchange(other.pool_, nullptr);
    }
    return *this;
  }
  /// Gives the buffers back to the pool.
  ~pooled_batch() { recycle(); }

private:
  void recycle() noexcept {
    if (pool_) pool_->release(std::move(static_cast<batch&>(*this)));
    pool_.reset();
  }
  std::shared_ptr<batch_pool> pool_;
};

}  // namespace lockstep::data
