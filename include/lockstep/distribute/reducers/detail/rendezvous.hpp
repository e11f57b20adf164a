#pragma once
/// @file rendezvous.hpp
/// Internal: the host-side meeting point of the GPU reducers of one process. Host code only (no
/// CUDA): a collective id completes a generation once every replica has arrived at it; the last
/// arriver runs the launch action; waits are bounded by a timeout and released by abort().

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>

namespace lockstep::detail {

/// The host-side meeting point of device collectives: collective `id` completes generation g once
/// every replica has arrived for the g-th time; the last arriver runs the launch action. Waits are
/// bounded by the timeout and released by abort().
class device_rendezvous {
public:
  /// A meeting point for `replicas` replicas and collective ids [0, ids).
  device_rendezvous(std::size_t replicas, std::chrono::milliseconds timeout, std::size_t ids)
      : n_(replicas), timeout_(timeout), ids_(ids), arrivals_(ids, 0), completed_(ids, 0),
        generation_(replicas * ids, 0), ptrs_(replicas * ids, nullptr), counts_(replicas * ids, 0) {
    if (replicas == 0) throw config_error("lockstep: a reducer needs at least one replica");
  }

  /// Number of replicas.
  [[nodiscard]] std::size_t replicas() const noexcept { return n_; }
  /// Replica j's data at collective id (valid inside the launch action).
  [[nodiscard]] void* pointer(std::size_t id, std::size_t j) const noexcept { return ptrs_[id * n_ + j]; }

  /// Replica r arrives at collective `id` with `count` elements at `data`; the last arriver runs
  /// launch() under the lock, which completes the generation.
  template <class Launch>
  void arrive(std::size_t r, std::size_t id, void* data, std::size_t count, const Launch& launch) {
    check_slot(r, id);
    std::unique_lock<std::mutex> lock(m_);
    throw_if_aborted(r, id);
    const std::uint64_t g = ++generation_[id * n_ + r];
    ptrs_[id * n_ + r] = data;
    counts_[id * n_ + r] = count;
    if (++arrivals_[id] == g * n_) {
      for (std::size_t j = 0; j < n_; ++j)
        if (counts_[id * n_ + j] != count) {
          aborted_ = true;
          cv_.notify_all();
          throw shape_error("lockstep: replicas disagree on the length of bucket " + std::to_string(id) + ": " +
                            std::to_string(count) + " on replica " + std::to_string(r) + ", " +
                            std::to_string(counts_[id * n_ + j]) + " on replica " + std::to_string(j));
        }
      try {
        launch();
      } catch (...) {
        aborted_ = true;
        cv_.notify_all();
        throw;
      }
      completed_[id] = g;
      cv_.notify_all();
    }
  }

  /// Blocks replica r until the collective it last arrived at on `id` has been launched.
  void await(std::size_t r, std::size_t id) {
    check_slot(r, id);
    std::unique_lock<std::mutex> lock(m_);
    const std::uint64_t g = generation_[id * n_ + r];
    if (g == 0)  // nothing to wait for (a caller would then read the results of no collective)
      throw config_error("lockstep: replica " + std::to_string(r) + " waits for bucket " + std::to_string(id) +
                         ", which it never started");
    const bool ok = cv_.wait_for(lock, timeout_, [&] { return aborted_ || completed_[id] >= g; });
    throw_if_aborted(r, id);
    if (!ok) {
      std::string missing;
      for (std::size_t j = 0; j < n_; ++j)
        if (generation_[id * n_ + j] < g) missing += (missing.empty() ? "" : ", ") + std::to_string(j);
      aborted_ = true;
      cv_.notify_all();
      throw timeout_error("lockstep: collective timed out: replica " + std::to_string(r) + " waited " +
                          std::to_string(timeout_.count()) + " ms in bucket " + std::to_string(id) + "; replica(s) " +
                          missing + " did not arrive (raise strategy_options::timeout if a step legitimately takes longer)");
    }
  }

  /// Releases every waiter (they throw collective_aborted); callable from any thread.
  void abort() noexcept {
    std::lock_guard<std::mutex> lock(m_);
    aborted_ = true;
    cv_.notify_all();
  }

  /// Ready again after a failure; call only while no replica is inside.
  void reset() noexcept {
    std::lock_guard<std::mutex> lock(m_);
    std::fill(arrivals_.begin(), arrivals_.end(), 0);
    std::fill(completed_.begin(), completed_.end(), 0);
    std::fill(generation_.begin(), generation_.end(), 0);
    aborted_ = false;
  }

private:
  void check_id(std::size_t id) const {
    if (id >= ids_)
      throw config_error("lockstep: bucket id " + std::to_string(id) + " is beyond the reducer's " +
                         std::to_string(ids_) + " collective ids");
  }

public:
  /// Refuses (config_error) a replica or collective id beyond the rendezvous's, before a caller
  /// indexes its own per-replica, per-id tables with them.
  void check_slot(std::size_t r, std::size_t id) const {
    check_id(id);
    if (r >= n_)
      throw config_error("lockstep: replica " + std::to_string(r) + " is beyond the reducer's " + std::to_string(n_) +
                         " replicas");
  }

private:
  void throw_if_aborted(std::size_t r, std::size_t id) const {
    if (aborted_)
      throw collective_aborted("lockstep: replica " + std::to_string(r) + " left bucket " + std::to_string(id) +
                               " because another replica failed");
  }

  std::size_t n_;
  std::chrono::milliseconds timeout_;
  std::size_t ids_;
  std::vector<std::uint64_t> arrivals_, completed_, generation_;
  std::vector<void*> ptrs_;
  std::vector<std::size_t> counts_;
  bool aborted_ = false;
  std::mutex m_;
  std::condition_variable cv_;
};

}  // namespace lockstep::detail
