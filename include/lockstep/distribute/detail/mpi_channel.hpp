#pragma once
/// @file mpi_channel.hpp
/// Internal: the communication thread of one worker. Every MPI call of a multi-worker strategy
/// runs here (so MPI_THREAD_SERIALIZED suffices while the program makes no MPI calls of its own
/// during a strategy's calls): jobs run in the order they were posted; non-blocking collectives
/// are polled with a deadline; on a timeout the other workers are asked how far they got
/// (mpi_straggler.hpp), so the timeout_error names the missing rank. Under MPI_THREAD_MULTIPLE an
/// idle channel also answers such questions, so a rank stalled outside the strategy is named as
/// not arrived rather than as silent. The float sums run in a shared-memory window when every
/// worker is on one machine (mpi_window_sum.hpp), through MPI's messages otherwise (mpi_sum.hpp).

#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/detail/mpi_error.hpp>
#include <lockstep/distribute/detail/mpi_straggler.hpp>
#include <lockstep/distribute/detail/mpi_sum.hpp>
#include <lockstep/distribute/detail/mpi_window_sum.hpp>

namespace lockstep::detail {

/// `n` bytes as an MPI count and datatype: MPI_BYTE while n fits an int; above, one committed
/// datatype of the whole mebibytes and the rest (so a broadcast of more than 2 GiB needs no
/// pieces). The datatype is freed when this goes (after the operation that uses it completed).
class mpi_bytes {
public:
  /// The count and datatype of `n` bytes.
  explicit mpi_bytes(std::size_t n) {
    if (n <= static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      count_ = static_cast<int>(n);
      return;
    }
    constexpr std::size_t mib = std::size_t{1} << 20;
    const int lengths[2] = {mpi_int_count(n / mib, "a transfer's mebibytes"), static_cast<int>(n % mib)};
    const MPI_Aint at[2] = {0, static_cast<MPI_Aint>(n / mib * mib)};
    try {
      mpi_check(MPI_Type_contiguous(static_cast<int>(mib), MPI_BYTE, &block_), "MPI_Type_contiguous");
      MPI_Datatype types[2] = {block_, MPI_BYTE};
      mpi_check(MPI_Type_create_struct(2, lengths, at, types, &whole_), "MPI_Type_create_struct");
      mpi_check(MPI_Type_commit(&whole_), "MPI_Type_commit");
    } catch (...) {
      release();
      throw;
    }
    count_ = 1;
    type_ = whole_;
  }
  mpi_bytes(const mpi_bytes&) = delete;
  mpi_bytes& operator=(const mpi_bytes&) = delete;
  ~mpi_bytes() { release(); }
  /// The MPI count.
  [[nodiscard]] int count() const noexcept { return count_; }
  /// The MPI datatype.
  [[nodiscard]] MPI_Datatype type() const noexcept { return type_; }

private:
  void release() noexcept {
    if (whole_ != MPI_DATATYPE_NULL) MPI_Type_free(&whole_);
    if (block_ != MPI_DATATYPE_NULL) MPI_Type_free(&block_);
  }
  MPI_Datatype block_ = MPI_DATATYPE_NULL, whole_ = MPI_DATATYPE_NULL, type_ = MPI_BYTE;
  int count_ = 0;
};

/// The communication thread of one worker (see the file comment).
class mpi_channel final : private mpi_progress {
public:
  /// What a job does.
  enum class op {
    sum_floats,        ///< deterministic in-place sum of floats (reduce-scatter by alltoallv, fixed order, all-gather)
    gather_doubles,    ///< in-place all-gather of `count` doubles per rank (rank r's at r * count)
    gather_floats_v,   ///< in-place all-gather of floats, rank r's part at displs[r] with counts[r]
    gather_doubles_v,  ///< in-place all-gather of doubles, rank r's part at displs[r] with counts[r]
    broadcast_bytes,   ///< bytes from rank 0 to every rank
    barrier,           ///< every rank arrives
    gather_bytes,      ///< in-place all-gather of `count` bytes per rank (rank r's at r * count)
    alltoallv_floats,  ///< all-to-all of floats: `data` with counts/displs to send, `recv` with recv_counts/recv_displs
    gradient_window    ///< a shared window of `count` gradient floats per rank, into *recv (a shared_ptr<mpi_gradient_window>)
  };
  /// One job: the data and what to call once it completed (on the communication thread).
  struct job {
    op kind = op::barrier;                          ///< what to do
    void* data = nullptr;                           ///< the buffer
    std::size_t count = 0;                          ///< elements (bytes for broadcast_bytes and gather_bytes)
    std::size_t bucket = 0;                         ///< the collective id, named in a timeout message
    const std::vector<int>* counts = nullptr;       ///< *_v and alltoallv: elements per rank
    const std::vector<int>* displs = nullptr;       ///< *_v and alltoallv: offsets per rank
    void* recv = nullptr;                           ///< alltoallv_floats: where the received floats go
    const std::vector<int>* recv_counts = nullptr;  ///< alltoallv_floats: floats received from each rank
    const std::vector<int>* recv_displs = nullptr;  ///< alltoallv_floats: their offsets in `recv`
    void (*done)(void*, const job&) = nullptr;      ///< called after completion
    void* done_ctx = nullptr;                       ///< its argument
  };

  /// A channel over a duplicate of `comm` (the caller's communicator is never used directly).
  /// @throws config_error when MPI is not initialised or its thread level is below SERIALIZED.
  mpi_channel(MPI_Comm comm, std::chrono::milliseconds timeout, std::size_t max_bucket_floats)
      : timeout_(timeout), comms_(comm), level_(comms_.level), probe_(comms_.ctrl, comms_.rank, comms_.size),
        sum_(comms_.size, max_bucket_floats), window_(comms_.node, comms_.rank, comms_.size) {
    // All workers on one machine: the sums run in a shared-memory window.
    int node_size = 0;
    MPI_Comm_size(comms_.node, &node_size);
    shm_ = node_size == comms_.size && comms_.size > 1 && std::getenv("LOCKSTEP_MPI_NO_SHM") == nullptr;
    probe_.set_state([this](std::uint64_t asked) { return state(asked); });
    thread_ = std::thread([this] { loop(); });
  }
  mpi_channel(const mpi_channel&) = delete;
  mpi_channel& operator=(const mpi_channel&) = delete;
  /// Stops the thread; frees the windows and the communicators when every worker drops its
  /// channel in step (leave_together). Otherwise (a failure left a collective pending, or some
  /// worker's channel goes while it unwinds a failure of its own) nothing collective is freed:
  /// freeing a window waits for every worker, so a failing worker would hang there instead of
  /// reporting its error, and the others would wait for it. A gradient window that a model still
  /// holds is then abandoned too; else it is freed by its last owner (collectively, so every
  /// worker drops its models at the same point, as they do in one program).
  ~mpi_channel() override {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    const bool together = leave_together();
    if (!together)
      for (auto& g : gradient_windows_) g->abandon();
    gradient_windows_.clear();
    if (together) {
      window_.free();
      comms_.free();
    }
  }

  /// This worker's rank.
  [[nodiscard]] int rank() const noexcept { return comms_.rank; }
  /// The number of workers.
  [[nodiscard]] int size() const noexcept { return comms_.size; }
  /// The MPI thread level in force.
  [[nodiscard]] int thread_level() const noexcept { return level_; }
  /// True when the workers' sums run in a shared-memory window (every worker on one machine).
  [[nodiscard]] bool shared_memory() const noexcept { return shm_; }
  /// Scratch of the sum (grown before posting when a bucket is larger than announced).
  void reserve_floats(std::size_t n) {
    std::lock_guard lk(mu_);
    if (!queue_.empty() || busy_) throw config_error("lockstep::multi_worker: cannot grow the channel while busy");
    sum_.reserve(n);
  }

  /// A shared window of `floats` gradient floats per worker, zero-filled, that the float sums of
  /// buffers inside it run in place (mpi_gradient_window). Collective; only when shared_memory().
  /// Windows no longer held outside the channel are freed first (on every worker alike).
  [[nodiscard]] std::shared_ptr<mpi_gradient_window> allocate_gradient_window(std::size_t floats) {
    std::shared_ptr<mpi_gradient_window> out;
    run(job{.kind = op::gradient_window, .count = floats, .recv = &out});
    return out;
  }

  /// The job that sums `count` floats at `data` in place over the workers (collective id `id`).
  static job sum(void* data, std::size_t count, std::size_t id) {
    return {.kind = op::sum_floats, .data = data, .count = count, .bucket = id};
  }
  /// The job that copies `bytes` bytes at `data` from rank 0 to every rank (collective id `id`).
  static job broadcast(void* data, std::size_t bytes, std::size_t id = 0) {
    return {.kind = op::broadcast_bytes, .data = data, .count = bytes, .bucket = id};
  }

  /// Queues a job; returns its ticket (jobs complete in ticket order).
  std::uint64_t post(const job& j) {
    std::uint64_t t;
    {
      std::lock_guard lk(mu_);
      if (broken_.load()) throw_broken();
      queue_.push_back(j);
      t = ++posted_;
      recent_[t % recent_.size()] = {t, code_of(j)};
    }
    cv_.notify_all();
    return t;
  }

  /// Waits until job `ticket` completed. @throws timeout_error or worker_aborted. The thread
  /// gives each job up to the timeout, so this wait gives up only when no job completed for the
  /// timeout and 5 s more (the jobs queued before the ticket may together take longer).
  void wait(std::uint64_t ticket) {
    std::unique_lock lk(mu_);
    const auto patience = timeout_ + std::chrono::seconds(5);
    auto deadline = std::chrono::steady_clock::now() + patience;
    std::uint64_t seen = completed_;
    while (completed_ < ticket && !broken_.load()) {
      const bool expired = cv_.wait_until(lk, deadline) == std::cv_status::timeout;
      if (completed_ != seen) {  // progress: the thread is alive, the next job gets its own time
        seen = completed_;
        deadline = std::chrono::steady_clock::now() + patience;
      } else if (expired && completed_ < ticket && !broken_.load()) {
        fail_locked("lockstep: multi-worker: rank " + std::to_string(comms_.rank) +
                    " gave up waiting for its communication thread");
      }
    }
    if (completed_ < ticket) throw_broken();
  }

  /// post + wait.
  void run(const job& j) { wait(post(j)); }

  /// Marks the channel unusable (a local failure left collectives unmatched); waiters throw.
  void abort(const std::string& why = "a replica of this worker failed") noexcept {
    std::lock_guard lk(mu_);
    if (!broken_.load()) {
      try {
        reason_ = "lockstep: multi-worker: rank " + std::to_string(comms_.rank) + " abandoned its collectives: " + why;
      } catch (...) {
      }
      broken_.store(true);
    }
    cv_.notify_all();
  }
  /// True after a failure: the workers' collectives no longer match; the strategy cannot be used again.
  [[nodiscard]] bool broken() const noexcept { return broken_.load(); }

private:
  // The duplicated communicators: data (collectives), ctrl (straggler questions), node (the
  // processes sharing this machine's memory).
  struct communicators {
    MPI_Comm data = MPI_COMM_NULL, ctrl = MPI_COMM_NULL, node = MPI_COMM_NULL;
    int rank = 0, size = 1, level = MPI_THREAD_SINGLE;
    explicit communicators(MPI_Comm comm) {
      int initialized = 0;
      MPI_Initialized(&initialized);
      if (!initialized)
        throw config_error("lockstep::multi_worker: MPI is not initialised; create a lockstep::mpi_environment (or call "
                           "MPI_Init_thread with MPI_THREAD_SERIALIZED) before the strategy");
      MPI_Query_thread(&level);
      if (level < MPI_THREAD_SERIALIZED)
        throw config_error(std::string("lockstep::multi_worker: MPI was initialised with ") + mpi_thread_level_name(level) +
                           "; multi-worker strategies need MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE");
      mpi_check(MPI_Comm_dup(comm, &data), "MPI_Comm_dup");
      mpi_check(MPI_Comm_dup(comm, &ctrl), "MPI_Comm_dup");
      MPI_Comm_rank(data, &rank);
      MPI_Comm_size(data, &size);
      mpi_check(MPI_Comm_split_type(data, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    }
    void free() noexcept {
      MPI_Comm_free(&node);
      MPI_Comm_free(&data);
      MPI_Comm_free(&ctrl);
    }
  };

  // At the channel's end (the communication thread has stopped): whether every worker drops its
  // channel in step. Each gives 1, or 0 when its channel is broken or this thread unwinds an
  // exception thrown since the channel was made (a failure outside the strategy's collectives,
  // such as this worker's own input pipeline, while the others may wait in one), to an
  // all-reduce (minimum) on the control communicator, which no collective of the strategy uses.
  // A worker that gives 0 does not wait for it (it goes on to report its failure; its two ints
  // stay on the heap, where MPI may still write them). One that gives 1 waits for every worker,
  // as freeing the windows would: a worker that gave 1 and stopped waiting could not take it
  // back, and a later one would then free while it does not. A worker whose peers fail in a
  // collective sees them give 0 once their own timeouts end it.
  bool leave_together() noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return false;  // a strategy that outlived MPI: nothing can be freed any more
    const bool failing = broken_.load() || std::uncaught_exceptions() > uncaught_at_start_;
    auto* v = new (std::nothrow) int[2]{failing ? 0 : 1, 0};
    if (v == nullptr) return false;
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Iallreduce(v, v + 1, 1, MPI_INT, MPI_MIN, comms_.ctrl, &req) != MPI_SUCCESS) return false;
    if (failing) return false;  // the request stays pending: v stays allocated
    if (MPI_Wait(&req, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    const bool all = v[1] == 1;
    delete[] v;
    return all;
  }

  [[noreturn]] void throw_broken() const {
    if (timed_out_) throw timeout_error(reason_);
    throw worker_aborted(reason_);
  }

  void fail_locked(std::string why, bool timeout = false) {
    if (!broken_.load()) {
      reason_ = std::move(why);
      timed_out_ = timeout;
      broken_.store(true);
    }
    cv_.notify_all();
    throw_broken();
  }

  std::uint64_t posted() {
    std::lock_guard lk(mu_);
    return posted_;
  }

  // A job's collective as a nonzero code: its kind and collective id (the straggler probe's answer).
  static std::uint64_t code_of(const job& j) noexcept {
    return ((static_cast<std::uint64_t>(j.kind) + 1) << 32) | (static_cast<std::uint64_t>(j.bucket) & 0xffffffffu);
  }

  // The code of job number `ticket`, 0 when it was not posted or is too old to be remembered.
  std::uint64_t code_of_job(std::uint64_t ticket) {
    std::lock_guard lk(mu_);
    const auto& r = recent_[ticket % recent_.size()];
    return r.first == ticket ? r.second : 0;
  }

  // What this rank answers the straggler probe about job number `asked`.
  std::array<std::uint64_t, 2> state(std::uint64_t asked) {
    std::lock_guard lk(mu_);
    const auto& r = recent_[asked % recent_.size()];
    return {posted_, r.first == asked ? r.second : 0};
  }

  // A collective's code in words, for messages: "bucket 3" (a sum: its collective id's name),
  // "a broadcast", "an all-gather", ...
  static std::string describe(std::uint64_t code) {
    const auto kind = static_cast<op>((code >> 32) - 1);
    const auto id = static_cast<std::size_t>(code & 0xffffffffu);
    switch (kind) {
      case op::sum_floats: return collective_name(id);
      case op::gather_doubles:
      case op::gather_floats_v:
      case op::gather_doubles_v:
      case op::gather_bytes: return "an all-gather";
      case op::broadcast_bytes: return "a broadcast";
      case op::barrier: return "a barrier";
      case op::alltoallv_floats: return "an all-to-all";
      case op::gradient_window: return "the allocation of a gradient window";
    }
    return "collective code " + std::to_string(code);
  }

  void loop() {
    for (;;) {
      job j;
      {
        std::unique_lock lk(mu_);
        while (queue_.empty() && !stop_) {
          cv_.wait_for(lk, std::chrono::milliseconds(2));
          if (level_ >= MPI_THREAD_MULTIPLE && queue_.empty() && !stop_ && !broken_.load()) {
            lk.unlock();
            probe_.answer();
            lk.lock();
          }
        }
        if (stop_) return;
        j = queue_.front();
        queue_.pop_front();
        busy_ = true;
      }
      bool ok = !broken_.load();
      if (ok) {
        try {
          execute(j);
          if (j.done) j.done(j.done_ctx, j);
        } catch (const std::exception& e) {
          std::lock_guard lk(mu_);
          ok = false;
          if (!broken_.load()) {
            reason_ = e.what();
            timed_out_ = dynamic_cast<const timeout_error*>(&e) != nullptr;
            broken_.store(true);
          }
        }
      }
      {
        std::lock_guard lk(mu_);
        busy_ = false;
        if (ok) ++completed_;
      }
      cv_.notify_all();
    }
  }

  // mpi_progress: waits for request `r` of the job in progress. Open MPI moves a non-blocking
  // collective forward only inside MPI calls, so the thread polls MPI_Test without pause for the
  // first milliseconds (while the data moves), then with short sleeps, so that a late peer does
  // not cost a core; on timeout it names the missing ranks.
  void complete(MPI_Request& r, std::size_t bucket) override {
    const auto start = std::chrono::steady_clock::now();
    const auto spin_until = start + std::chrono::milliseconds(20);
    int done = 0;
    std::uint32_t polls = 0;
    while (true) {
      mpi_check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      if (++polls % 256 != 0) continue;
      if (std::chrono::steady_clock::now() < spin_until) continue;
      idle(start, bucket, {});  // on timeout, the probe's answers say who is late
      polls = 255;  // check the clock after every poll from now on
    }
  }

  // mpi_progress: between two polls.
  void idle(std::chrono::steady_clock::time_point start, std::size_t bucket,
            const std::function<std::string()>& late) override {
    if (broken_.load()) throw worker_aborted(reason_);
    if (std::chrono::steady_clock::now() > start + timeout_) {
      // The job in progress (this thread's), its collective named by its kind where it is known.
      const std::uint64_t ticket = completed_ + 1;
      const std::uint64_t mine = code_of_job(ticket);
      const mpi_straggler_probe::replies answers = probe_.ask(ticket);  // one question to every rank
      std::string missing = late ? late() : probe_.missing(answers, ticket);
      if (mine != 0)
        if (const std::string other = probe_.diverged(answers, ticket, mine, &describe); !other.empty())
          missing += "; " + other;
      std::lock_guard lk(mu_);
      fail_locked("lockstep: collective timed out: rank " + std::to_string(comms_.rank) + " waited " +
                      std::to_string(timeout_.count()) + " ms in " + (mine != 0 ? describe(mine) : collective_name(bucket)) +
                      "; " + missing + " (raise strategy_options::timeout if a step legitimately takes longer)",
                  true);
    }
    probe_.answer();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  static std::string collective_name(std::size_t id) { return collective_ids::name(id); }

  // The gradient window that holds [data, data + count) on this rank, or null.
  mpi_gradient_window* gradient_window_of(const float* data, std::size_t count) const noexcept {
    for (const auto& g : gradient_windows_)
      if (g->holds(data, count)) return g.get();
    return nullptr;
  }

  void execute(const job& j) {
    MPI_Request r = MPI_REQUEST_NULL;
    const MPI_Comm c = comms_.data;
    std::optional<mpi_bytes> bytes;  // a broadcast's datatype, kept until the broadcast completes
    switch (j.kind) {
      case op::barrier: mpi_check(MPI_Ibarrier(c, &r), "MPI_Ibarrier"); break;
      case op::broadcast_bytes: {
        const mpi_bytes& b = bytes.emplace(j.count);
        mpi_check(MPI_Ibcast(j.data, b.count(), b.type(), 0, c, &r), "MPI_Ibcast");
        break;
      }
      case op::gather_doubles:
        mpi_check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.data, mpi_int_count(j.count, "a gather"), MPI_DOUBLE,
                                 c, &r),
                  "MPI_Iallgather");
        break;
      case op::gather_bytes:
        mpi_check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.data, mpi_int_count(j.count, "a gather"), MPI_BYTE, c,
                                 &r),
                  "MPI_Iallgather");
        break;
      case op::gather_floats_v:
        mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.data, j.counts->data(), j.displs->data(), MPI_FLOAT,
                                  c, &r),
                  "MPI_Iallgatherv");
        break;
      case op::gather_doubles_v:
        mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.data, j.counts->data(), j.displs->data(),
                                  MPI_DOUBLE, c, &r),
                  "MPI_Iallgatherv");
        break;
      case op::alltoallv_floats:
        mpi_check(MPI_Ialltoallv(j.data, j.counts->data(), j.displs->data(), MPI_FLOAT, j.recv, j.recv_counts->data(),
                                 j.recv_displs->data(), MPI_FLOAT, c, &r),
                  "MPI_Ialltoallv");
        break;
      case op::sum_floats:
        if (comms_.size > 1 && j.count > 0) {
          auto* data = static_cast<float*>(j.data);
          if (mpi_gradient_window* g = shm_ ? gradient_window_of(data, j.count) : nullptr)
            g->sum(data, j.count, j.bucket, *this);
          else if (shm_)
            window_.run(data, j.count, j.bucket, *this);
          else
            sum_.run(data, j.count, c, comms_.rank, *this, j.bucket);
        }
        return;
      case op::gradient_window: {
        if (!shm_) throw config_error("lockstep::multi_worker: gradient windows need every worker on one machine");
        std::erase_if(gradient_windows_, [](const auto& g) { return g.use_count() == 1; });  // nobody else holds it
        auto g = std::make_shared<mpi_gradient_window>(comms_.node, comms_.rank, comms_.size, j.count);
        gradient_windows_.push_back(g);
        *static_cast<std::shared_ptr<mpi_gradient_window>*>(j.recv) = std::move(g);
        return;
      }
    }
    complete(r, j.bucket);
  }

  std::chrono::milliseconds timeout_;
  int uncaught_at_start_ = std::uncaught_exceptions();  // exceptions in flight when the channel was made
  communicators comms_;
  int level_;
  mpi_straggler_probe probe_;
  mpi_ordered_sum sum_;
  mpi_window_sum window_;
  std::vector<std::shared_ptr<mpi_gradient_window>> gradient_windows_;  // touched on the communication thread only (and after it ended)
  bool shm_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<job> queue_;
  std::uint64_t posted_ = 0, completed_ = 0;
  // (job number, code) of the last jobs posted: more than one step of a model with the most buckets
  std::array<std::pair<std::uint64_t, std::uint64_t>, 512> recent_{};
  bool busy_ = false, stop_ = false, timed_out_ = false;
  std::atomic<bool> broken_{false};
  std::string reason_;
  std::thread thread_;
};

}  // namespace lockstep::detail
