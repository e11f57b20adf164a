#pragma once
/// @file host_comm.hpp
/// Internal: the shared-memory collective engine behind the host reducers. Every replica issues
/// the same sequence of collectives (each one a numbered "sequence"); a collective's work runs on
/// each replica's own thread once every replica has arrived, and a replica may keep computing
/// while earlier collectives wait for the others (start is asynchronous, wait completes).
///
/// Each replica publishes two monotonic counters (cache-line padded): the last sequence it
/// arrived at and the last it finished. A collective's work never waits for another replica's
/// work (a replica held up there could hold up one that waits for it elsewhere).
/// Waits are bounded by a timeout (timeout_error naming the missing replicas) and abortable
/// (collective_aborted), so a failing replica never leaves the others blocked.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/detail/wake.hpp>

namespace lockstep::detail {

/// Thrown in a replica whose collective was abandoned because another replica failed.
class collective_aborted : public replica_error {
public:
  using replica_error::replica_error;
};

/// A 64-bit counter alone on its cache line.
struct alignas(64) padded_counter {
  std::atomic<std::uint64_t> value{0};  ///< the counter
};

/// The shared-memory collective engine (one instance per reducer).
class host_comm {
public:
  /// Work of one collective on one replica: (engine, replica, bucket, count, sequence).
  using work_fn = void (*)(host_comm&, std::size_t, std::size_t, std::size_t, std::uint64_t);

  /// An engine for `replicas` threads serving collective ids [0, ids) (collective_ids; its
  /// barrier and broadcast use the reserved ids, so `ids` must cover them).
  host_comm(std::size_t replicas, std::chrono::milliseconds timeout, std::size_t ids = collective_ids::count,
            std::size_t root = 0)
      : n_(replicas),
        timeout_(timeout),
        ids_(ids),
        root_(root),
        arrived_(new padded_counter[replicas]),
        finished_(new padded_counter[replicas]),
        ptrs_(ids * replicas, nullptr),
        counts_(ids * replicas, 0),
        args_(ids * replicas, nullptr),
        local_(replicas),
        hub_(replicas <= std::max(1u, std::thread::hardware_concurrency()) ? 1024u : 0u) {
    if (replicas == 0) throw config_error("lockstep: a reducer needs at least one replica");
    if (ids < collective_ids::count)
      throw config_error("lockstep: a reducer must serve collective ids [0, " + std::to_string(collective_ids::count) +
                         ") (lockstep::collective_ids), got " + std::to_string(ids));
    if (root >= replicas)
      throw config_error("lockstep: the reducer's root replica " + std::to_string(root) + " is not below the replica count " +
                         std::to_string(replicas));
    for (auto& l : local_) {
      l.ring.resize(1 + ids);  // every id in flight at once, and a free slot
      l.bucket_seq.assign(ids, 0);
    }
  }

  /// Number of replicas.
  [[nodiscard]] std::size_t replicas() const noexcept { return n_; }
  /// The replica two-phase algorithms aggregate on.
  [[nodiscard]] std::size_t root() const noexcept { return root_; }
  /// Collective deadline.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }

  /// Replica r's data pointer for bucket b (valid inside the collective's work).
  [[nodiscard]] void* pointer(std::size_t bucket, std::size_t r) const noexcept { return ptrs_[bucket * n_ + r]; }
  /// Replica r's argument for the work of its collective on bucket b (start's `arg`; valid inside
  /// the collective's work).
  [[nodiscard]] const void* argument(std::size_t bucket, std::size_t r) const noexcept { return args_[bucket * n_ + r]; }

  /// Replica r arrives at a collective on `bucket` over `count` elements at `data`; `work` runs on
  /// this thread once everyone has arrived (here if they already have, else in a later start or
  /// wait), and may read `arg` through argument().
  void start(std::size_t r, std::size_t bucket, void* data, std::size_t count, work_fn work, const void* arg = nullptr) {
    throw_if_aborted(r, bucket);
    if (bucket >= ids_)
      throw config_error("lockstep: collective id " + std::to_string(bucket) + " is beyond the reducer's " +
                         std::to_string(ids_) + " ids");
    local_state& l = local_[r];
    if (l.tail - l.head >= l.ring.size())
      throw config_error("lockstep: too many collectives in flight on replica " + std::to_string(r) +
                         " (wait for a bucket before starting it again)");
    const std::uint64_t seq = ++l.issued;
    ptrs_[bucket * n_ + r] = data;
    counts_[bucket * n_ + r] = count;
    args_[bucket * n_ + r] = arg;
    l.ring[l.tail++ % l.ring.size()] = pending{seq, bucket, count, work};
    l.bucket_seq[bucket] = seq;
    arrived_[r].value.store(seq, std::memory_order_release);
    hub_.notify();
    progress(r, 0);
  }

  /// Completes replica r's part of the last collective started on `bucket` and waits until every
  /// replica has finished it (so its buffers may be reused).
  void wait(std::size_t r, std::size_t bucket) {
    const std::uint64_t seq = local_[r].bucket_seq[bucket];
    progress(r, seq);
    await(finished_.get(), seq, r, bucket, "finish");
  }

  /// Runs every collective of replica r whose participants have all arrived, in order; blocks for
  /// those with sequence <= `until`.
  void progress(std::size_t r, std::uint64_t until) {
    local_state& l = local_[r];
    while (l.head != l.tail) {
      pending& op = l.ring[l.head % l.ring.size()];
      if (!all_at_least(arrived_.get(), op.seq)) {
        if (op.seq > until) return;
        await(arrived_.get(), op.seq, r, op.bucket, "arrive at");
      }
      if (op.work) {
        for (std::size_t j = 0; j < n_; ++j)
          if (counts_[op.bucket * n_ + j] != op.count)
            throw shape_error("lockstep: replicas disagree on the length of bucket " + std::to_string(op.bucket) + ": " +
                              std::to_string(op.count) + " on replica " + std::to_string(r) + ", " +
                              std::to_string(counts_[op.bucket * n_ + j]) + " on replica " + std::to_string(j));
        op.work(*this, r, op.bucket, op.count, op.seq);
      }
      finished_[r].value.store(op.seq, std::memory_order_release);
      hub_.notify();
      ++l.head;
    }
  }

  /// Completes every collective replica r has started and waits until every replica has finished
  /// them (each replica calls it at the same point of its sequence): whatever their work does
  /// (a reducer's hand-off to another thread) is done on return.
  void settle(std::size_t r) {
    const local_state& l = local_[r];
    if (l.tail == 0) return;  // nothing started since the last reset
    wait(r, l.ring[(l.tail - 1) % l.ring.size()].bucket);
  }

  /// Every replica calls this; returns once all have arrived.
  void barrier(std::size_t r) {
    start(r, collective_ids::barrier, nullptr, 0, nullptr);
    wait(r, collective_ids::barrier);
  }

  /// Copies `count` elements of `bytes_each` from the root replica's `data` to every replica's
  /// `data` (every replica calls it; synchronous).
  void broadcast(std::size_t r, void* data, std::size_t count, std::size_t bytes_each, std::size_t root) {
    if (root >= n_) throw config_error("lockstep: broadcast root " + std::to_string(root) + " is not a replica");
    const std::size_t id = collective_ids::broadcast;
    start(r, id, data, count, nullptr);
    wait(r, id);
    if (r != root && count) std::memcpy(data, pointer(id, root), count * bytes_each);
    barrier(r);
  }

  /// Releases every waiter (they throw collective_aborted); callable from any thread.
  void abort() noexcept {
    aborted_.store(true, std::memory_order_release);
    hub_.notify();
  }

  /// True after abort() until reset().
  [[nodiscard]] bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

  /// Makes the engine usable again after a failure. Call only while no replica is inside it.
  void reset() noexcept {
    std::uint64_t m = 0;
    for (std::size_t j = 0; j < n_; ++j) {
      m = std::max({m, arrived_[j].value.load(), finished_[j].value.load(), local_[j].issued});
    }
    for (std::size_t j = 0; j < n_; ++j) {
      arrived_[j].value.store(m);
      finished_[j].value.store(m);
      local_[j].issued = m;
      local_[j].head = local_[j].tail = 0;
      std::fill(local_[j].bucket_seq.begin(), local_[j].bucket_seq.end(), m);
    }
    aborted_.store(false, std::memory_order_release);
  }

private:
  struct pending {
    std::uint64_t seq = 0;
    std::size_t bucket = 0;
    std::size_t count = 0;
    work_fn work = nullptr;
  };
  struct alignas(64) local_state {
    std::uint64_t issued = 0;
    std::vector<pending> ring;
    std::size_t head = 0, tail = 0;
    std::vector<std::uint64_t> bucket_seq;
  };

  bool all_at_least(const padded_counter* c, std::uint64_t seq) const noexcept {
    for (std::size_t j = 0; j < n_; ++j)
      if (c[j].value.load(std::memory_order_acquire) < seq) return false;
    return true;
  }

  static std::string bucket_name(std::size_t bucket) { return collective_ids::name(bucket); }

  void throw_if_aborted(std::size_t r, std::size_t bucket) const {
    if (aborted_.load(std::memory_order_acquire))
      throw collective_aborted("lockstep: replica " + std::to_string(r) + " left " + bucket_name(bucket) +
                               " because another replica failed");
  }

  [[noreturn]] void fail_timeout(std::size_t r, std::size_t bucket, const std::string& who) {
    abort();
    throw timeout_error("lockstep: collective timed out: replica " + std::to_string(r) + " waited " +
                        std::to_string(timeout_.count()) + " ms in " + bucket_name(bucket) + "; " + who +
                        " (raise strategy_options::timeout if a step legitimately takes longer)");
  }

  void await(const padded_counter* c, std::uint64_t seq, std::size_t r, std::size_t bucket, const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    const bool ok =
        hub_.wait_until([&] { return aborted_.load(std::memory_order_acquire) || all_at_least(c, seq); }, deadline);
    throw_if_aborted(r, bucket);
    if (!ok) {
      std::string missing;
      for (std::size_t j = 0; j < n_; ++j)
        if (c[j].value.load(std::memory_order_acquire) < seq) missing += (missing.empty() ? "" : ", ") + std::to_string(j);
      fail_timeout(r, bucket, "replica(s) " + missing + " did not " + what + " it");
    }
  }

  std::size_t n_;
  std::chrono::milliseconds timeout_;
  std::size_t ids_;
  std::size_t root_;
  std::unique_ptr<padded_counter[]> arrived_, finished_;
  std::vector<void*> ptrs_;
  std::vector<std::size_t> counts_;
  std::vector<const void*> args_;
  std::vector<local_state> local_;
  std::atomic<bool> aborted_{false};
  wake_hub hub_;
};

}  // namespace lockstep::detail
