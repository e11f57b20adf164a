#pragma once
/// @file batch_pool.hpp
/// Recycling of batch buffers: `batch_pool` keeps the vectors of finished batches and
/// `pooled_batch` (a `batch` that remembers its pool) gives them back when it is destroyed, so the
/// steady state of a pipeline allocates and first-touches no new batch memory. The pool also hands
/// out `row_buffer`s (the decoded rows of index-first pipelines) from a memory resource that a GPU
/// backend may replace by page-locked (pinned) host memory.

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <utility>
#include <vector>

#include <lockstep/data/batch.hpp>

namespace lockstep::data {

class batch_pool;

/// A block of decoded rows from a batch_pool's memory resource (ordinary heap memory unless the
/// pool was given another resource, such as pinned host memory for device staging). Move-only;
/// goes back to its pool when destroyed.
class row_buffer {
public:
  /// An empty buffer.
  row_buffer() = default;
  row_buffer(const row_buffer&) = delete;
  row_buffer& operator=(const row_buffer&) = delete;
  /// Takes over the other's block.
  row_buffer(row_buffer&& o) noexcept
      : pool_(std::move(o.pool_)), data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}
  /// Gives the current block back, then takes over the other's.
  row_buffer& operator=(row_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      pool_ = std::move(o.pool_);
      data_ = std::exchange(o.data_, nullptr);
      capacity_ = std::exchange(o.capacity_, 0);
    }
    return *this;
  }
  /// Gives the block back to its pool.
  ~row_buffer() { reset(); }

  /// The first byte (aligned to 64 bytes), or nullptr when empty.
  [[nodiscard]] std::byte* data() const noexcept { return data_; }
  /// Bytes available.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  /// The block as elements of T (T trivially copyable, at most 64-byte aligned).
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return reinterpret_cast<T*>(data_);
  }
  /// Returns the block to the pool now.
  void reset() noexcept;

private:
  friend class batch_pool;
  row_buffer(std::shared_ptr<batch_pool> pool, std::byte* data, std::size_t capacity) noexcept
      : pool_(std::move(pool)), data_(data), capacity_(capacity) {}
  std::shared_ptr<batch_pool> pool_;
  std::byte* data_ = nullptr;
  std::size_t capacity_ = 0;
};

/// A thread-safe free list of batches whose vectors keep their capacity, and of row buffers.
class batch_pool : public std::enable_shared_from_this<batch_pool> {
public:
  /// A pool that keeps at most `max_free` idle batches, or as many as were ever out of it at once
  /// when more (a pipeline `prefetch(n)` with n + 2 batches in flight gets them all back at an
  /// epoch's end and reuses them in the next, allocating nothing); the same for row buffers. Row
  /// buffers come from `memory` (a hook: pass a resource of pinned host memory when the rows go to
  /// a device; the default is operator new). The resource must outlive the pool.
  explicit batch_pool(std::size_t max_free = 16, std::pmr::memory_resource* memory = std::pmr::new_delete_resource())
      : max_free_(max_free), memory_(memory ? memory : std::pmr::new_delete_resource()) {}
  batch_pool(const batch_pool&) = delete;
  batch_pool& operator=(const batch_pool&) = delete;
  /// Frees the idle row buffers.
  ~batch_pool() {
    for (auto& [p, n] : free_rows_) memory_->deallocate(p, n, alignment);
  }

  /// Alignment of every row buffer.
  static constexpr std::size_t alignment = 64;

  /// A row buffer of at least `bytes` bytes (an idle one that is large enough, or a new one). Call
  /// through a shared_ptr: the buffer keeps the pool alive.
  [[nodiscard]] row_buffer acquire_rows(std::size_t bytes) {
    bytes = std::max<std::size_t>(bytes, alignment);
    {
      std::lock_guard lock(mutex_);
      // The smallest idle block that fits.
      auto best = free_rows_.end();
      for (auto it = free_rows_.begin(); it != free_rows_.end(); ++it)
        if (it->second >= bytes && (best == free_rows_.end() || it->second < best->second)) best = it;
      if (best != free_rows_.end()) {
        auto self = shared_from_this();
        const auto [p, n] = *best;
        free_rows_.erase(best);
        rows_out_.take();
        return row_buffer(std::move(self), p, n);
      }
    }
    auto self = shared_from_this();
    auto* p = static_cast<std::byte*>(memory_->allocate(bytes, alignment));
    {
      std::lock_guard lock(mutex_);
      rows_out_.take();  // counted once it exists
    }
    const auto held = row_bytes_.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
    std::int64_t peak = peak_row_bytes_.load();
    while (held > peak && !peak_row_bytes_.compare_exchange_weak(peak, held)) {
    }
    return row_buffer(std::move(self), p, bytes);
  }
  /// Bytes of row buffers allocated and not freed (in use or idle).
  [[nodiscard]] std::size_t row_bytes() const noexcept { return static_cast<std::size_t>(row_bytes_.load()); }
  /// The largest row_bytes() seen.
  [[nodiscard]] std::size_t peak_row_bytes() const noexcept { return static_cast<std::size_t>(peak_row_bytes_.load()); }
  /// The resource row buffers come from.
  [[nodiscard]] std::pmr::memory_resource* memory() const noexcept { return memory_; }

  /// An idle batch (contents unspecified, sizes kept) or a new empty one.
  [[nodiscard]] batch acquire() {
    std::lock_guard lock(mutex_);
    batches_out_.take();
    if (free_.empty()) return batch{};
    batch b = std::move(free_.back());
    free_.pop_back();
    b.first_held = 0;
    b.held_rows = batch::every_row;
    return b;
  }
  /// Takes a batch back for reuse (dropped when the pool is full).
  void release(batch&& b) noexcept {
    std::lock_guard lock(mutex_);
    batches_out_.give_back();
    if (b.features.capacity() == 0 && b.indices.capacity() == 0) return;
    if (free_.size() < std::max(max_free_, batches_out_.peak)) {
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
  friend class row_buffer;
  void release_rows(std::byte* p, std::size_t n) noexcept {
    {
      std::lock_guard lock(mutex_);
      rows_out_.give_back();
      if (free_rows_.size() < std::max(max_free_, rows_out_.peak)) {
        try {
          free_rows_.emplace_back(p, n);
          return;
        } catch (...) {  // out of memory while recycling: free the block below
        }
      }
    }
    memory_->deallocate(p, n, alignment);
    row_bytes_.fetch_sub(static_cast<std::int64_t>(n));
  }

  /// How many of a kind are out of the pool (acquired, not released), and the most ever at once.
  struct out_count {
    std::size_t now = 0, peak = 0;
    void take() noexcept { peak = std::max(peak, ++now); }
    void give_back() noexcept { now -= now > 0 ? 1 : 0; }  // a batch that did not come from acquire
  };

  mutable std::mutex mutex_;
  out_count batches_out_, rows_out_;  // guarded by mutex_
  std::vector<batch> free_;
  std::vector<std::pair<std::byte*, std::size_t>> free_rows_;
  std::size_t max_free_;
  std::pmr::memory_resource* memory_;
  std::atomic<std::int64_t> row_bytes_{0}, peak_row_bytes_{0};
};

inline void row_buffer::reset() noexcept {
  if (data_ && pool_) pool_->release_rows(data_, capacity_);
  data_ = nullptr;
  capacity_ = 0;
  pool_.reset();
}

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
