#pragma once
/// @file mpi.hpp
/// MPI for multi-worker training (link lockstep::mpi; needs <mpi.h>):
///  - `mpi_environment`: RAII MPI_Init_thread / MPI_Finalize for programs that want lockstep to
///    start MPI (the library never initialises MPI on its own);
///  - `detail::mpi_channel`: one communication thread per worker that issues every MPI call of a
///    strategy (so MPI_THREAD_SERIALIZED suffices while the program makes no MPI calls of its own
///    during a strategy's calls), runs jobs in the order they were posted, polls non-blocking
///    collectives with a deadline, and on a timeout asks the other workers how far they got, so
///    the timeout_error names the missing rank. Under MPI_THREAD_MULTIPLE an idle channel also
///    answers such questions, so a rank stalled outside the strategy is named as not arrived
///    rather than as silent.

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <new>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/core/error.hpp>

namespace lockstep {

/// The name of an MPI thread level ("MPI_THREAD_SERIALIZED", ...).
inline const char* mpi_thread_level_name(int level) noexcept {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    default: return "an unknown MPI thread level";
  }
}

/// True when this process was started by an MPI launcher (mpirun, mpiexec, srun with PMI/PMIx).
inline bool launched_by_mpi() noexcept {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

/// Checks, before MPI is started, that a program asked to run on `workers` workers was launched
/// by an MPI launcher. @throws config_error saying how to launch it.
inline void require_mpi_launch(std::size_t workers, const std::string& program = "<program>") {
  if (workers > 1 && !launched_by_mpi())
    throw config_error("lockstep: " + std::to_string(workers) + " workers need one process each, started by MPI: run `mpirun -np " +
                       std::to_string(workers) + " " + program + " ...` (Open MPI: apt-get install openmpi-bin)");
}

/// Checks that `comm` has exactly `workers` processes. @throws config_error naming both counts.
inline void require_world_size(std::size_t workers, MPI_Comm comm = MPI_COMM_WORLD) {
  int n = 0;
  MPI_Comm_size(comm, &n);
  if (static_cast<std::size_t>(n) != workers)
    throw config_error("lockstep: asked for " + std::to_string(workers) + " workers, but the MPI job has " +
                       std::to_string(n) + " processes; launch it with `mpirun -np " + std::to_string(workers) + "`");
}

/// RAII MPI: MPI_Init_thread asking for MPI_THREAD_MULTIPLE (lockstep's multi-worker strategies
/// need at least MPI_THREAD_SERIALIZED; MULTIPLE also lets the program call MPI while a strategy's
/// communication thread exists) in the constructor; MPI_Finalize in the destructor, or MPI_Abort when the
/// destructor runs during stack unwinding or after abort_on_exit(), so that no rank waits forever
/// for a peer that failed. Does nothing when MPI was already initialised by someone else.
class mpi_environment {
public:
  /// Initialises MPI with the program's arguments.
  /// @throws config_error when MPI cannot provide at least MPI_THREAD_SERIALIZED.
  mpi_environment(int& argc, char**& argv) { init(&argc, &argv); }
  /// Initialises MPI without arguments.
  mpi_environment() { init(nullptr, nullptr); }
  mpi_environment(const mpi_environment&) = delete;
  mpi_environment& operator=(const mpi_environment&) = delete;
  /// Finalises MPI (or aborts the job, see the class comment).
  ~mpi_environment() {
    if (!owns_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (abort_ || std::uncaught_exceptions() > uncaught_) MPI_Abort(MPI_COMM_WORLD, exit_code_);
    MPI_Finalize();
  }

  /// The thread level MPI provides.
  [[nodiscard]] int thread_level() const noexcept { return level_; }
  /// This process's rank in MPI_COMM_WORLD.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// The number of processes in MPI_COMM_WORLD.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// Makes the destructor abort the whole job with `code` instead of finalising (call it after a
  /// failure: the other ranks may be inside a collective that will never complete).
  void abort_on_exit(int code = 1) noexcept {
    abort_ = true;
    exit_code_ = code;
  }
  /// Aborts every rank of the job now with exit code `code`.
  [[noreturn]] void abort(int code = 1) const noexcept {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

private:
  void init(int* argc, char*** argv) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &level_) != MPI_SUCCESS)
        throw config_error("lockstep::mpi_environment: MPI_Init_thread failed");
      owns_ = true;
    } else {
      MPI_Query_thread(&level_);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (level_ < MPI_THREAD_SERIALIZED)
      throw config_error(std::string("lockstep::mpi_environment: MPI provides only ") + mpi_thread_level_name(level_) +
                         "; lockstep needs MPI_THREAD_SERIALIZED (its communication thread issues the MPI calls)");
  }

  bool owns_ = false;
  bool abort_ = false;
  int exit_code_ = 1;
  int level_ = MPI_THREAD_SINGLE;
  int rank_ = 0, size_ = 1;
  int uncaught_ = std::uncaught_exceptions();
};

namespace detail {

/// Throws mpi's error text for a failed call.
inline void mpi_check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw device_error(std::string("lockstep: ") + call + " failed: " + std::string(text, static_cast<std::size_t>(len)));
}

/// Thrown in a worker whose collective was abandoned because of a failure on this worker.
class worker_aborted : public replica_error {
public:
  using replica_error::replica_error;
};

/// The communication thread of one worker: every MPI call of a multi-worker strategy runs here.
class mpi_channel {
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
    alltoallv_floats   ///< all-to-all of floats: `data` with counts/displs to send, `recv` with recv_counts/recv_displs
  };
  /// One job: the data and what to call once it completed (on the communication thread).
  struct job {
    op kind = op::barrier;                        ///< what to do
    void* data = nullptr;                         ///< the buffer
    std::size_t count = 0;                        ///< elements (bytes for broadcast_bytes)
    std::size_t bucket = 0;                       ///< named in a timeout message
    const std::vector<int>* counts = nullptr;     ///< gather_floats_v: elements per rank
    const std::vector<int>* displs = nullptr;     ///< gather_floats_v: offsets per rank
    void* recv = nullptr;                         ///< alltoallv_floats: where the received floats go
    const std::vector<int>* recv_counts = nullptr;  ///< alltoallv_floats: floats received from each rank
    const std::vector<int>* recv_displs = nullptr;  ///< alltoallv_floats: their offsets in `recv`
    void (*done)(void*, const job&) = nullptr;    ///< called after completion
    void* done_ctx = nullptr;                     ///< its argument
  };

  /// A channel over a duplicate of `comm` (the caller's communicator is never used directly).
  /// @throws config_error when MPI is not initialised or its thread level is below SERIALIZED.
  mpi_channel(MPI_Comm comm, std::chrono::milliseconds timeout, std::size_t max_bucket_floats) : timeout_(timeout) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      throw config_error("lockstep::multi_worker: MPI is not initialised; create a lockstep::mpi_environment (or call "
                         "MPI_Init_thread with MPI_THREAD_SERIALIZED) before the strategy");
    MPI_Query_thread(&level_);
    if (level_ < MPI_THREAD_SERIALIZED)
      throw config_error(std::string("lockstep::multi_worker: MPI was initialised with ") + mpi_thread_level_name(level_) +
                         "; multi-worker strategies need MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE");
    mpi_check(MPI_Comm_dup(comm, &data_), "MPI_Comm_dup");
    mpi_check(MPI_Comm_dup(comm, &ctrl_), "MPI_Comm_dup");
    MPI_Comm_rank(data_, &rank_);
    MPI_Comm_size(data_, &size_);
    const auto w = static_cast<std::size_t>(size_);
    send_counts_.resize(w);
    send_displs_.resize(w);
    recv_counts_.resize(w);
    recv_displs_.resize(w);
    scratch_.resize(std::max<std::size_t>(1, max_bucket_floats + 64 * w));
    // All workers on one machine: the sums run in a shared-memory window (see shm_sum).
    mpi_check(MPI_Comm_split_type(data_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_), "MPI_Comm_split_type");
    int node_size = 0;
    MPI_Comm_size(node_, &node_size);
    shm_ = node_size == size_ && size_ > 1 && std::getenv("LOCKSTEP_MPI_NO_SHM") == nullptr;
    thread_ = std::thread([this] { loop(); });
  }
  mpi_channel(const mpi_channel&) = delete;
  mpi_channel& operator=(const mpi_channel&) = delete;
  /// Stops the thread; frees the communicators unless a failure left a collective pending.
  ~mpi_channel() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (!broken_.load()) {
      if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
      MPI_Comm_free(&node_);
      MPI_Comm_free(&data_);
      MPI_Comm_free(&ctrl_);
    }
  }

  /// This worker's rank.
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// The number of workers.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The MPI thread level in force.
  [[nodiscard]] int thread_level() const noexcept { return level_; }
  /// True when the workers' sums run in a shared-memory window (every worker on one machine).
  [[nodiscard]] bool shared_memory() const noexcept { return shm_; }
  /// Scratch of the sum (resized before posting when a bucket is larger than announced).
  void reserve_floats(std::size_t n) {
    std::lock_guard lk(mu_);
    if (!queue_.empty() || busy_) throw config_error("lockstep::multi_worker: cannot grow the channel while busy");
    if (scratch_.size() < n + 64 * static_cast<std::size_t>(size_)) scratch_.resize(n + 64 * static_cast<std::size_t>(size_));
  }

  /// Queues a job; returns its ticket (jobs complete in ticket order).
  std::uint64_t post(const job& j) {
    std::uint64_t t;
    {
      std::lock_guard lk(mu_);
      if (broken_.load()) throw_broken();
      queue_.push_back(j);
      t = ++posted_;
    }
    cv_.notify_all();
    return t;
  }

  /// Waits until job `ticket` completed. @throws timeout_error or worker_aborted.
  void wait(std::uint64_t ticket) {
    std::unique_lock lk(mu_);
    const auto deadline = std::chrono::steady_clock::now() + timeout_ + std::chrono::seconds(5);
    while (completed_ < ticket && !broken_.load()) {
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout && completed_ < ticket && !broken_.load()) {
        fail_locked("lockstep: multi-worker: rank " + std::to_string(rank_) + " gave up waiting for its communication thread");
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
        reason_ = "lockstep: multi-worker: rank " + std::to_string(rank_) + " abandoned its collectives: " + why;
      } catch (...) {
      }
      broken_.store(true);
    }
    cv_.notify_all();
  }
  /// True after a failure: the workers' collectives no longer match; the strategy cannot be used again.
  [[nodiscard]] bool broken() const noexcept { return broken_.load(); }

private:
  static constexpr int tag_query = 7101, tag_reply = 7102;

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

  void loop() {
    for (;;) {
      job j;
      {
        std::unique_lock lk(mu_);
        while (queue_.empty() && !stop_) {
          cv_.wait_for(lk, std::chrono::milliseconds(2));
          if (level_ >= MPI_THREAD_MULTIPLE && queue_.empty() && !stop_ && !broken_.load()) {
            lk.unlock();
            answer_queries();
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

  // Replies to other ranks' "how far did you get?" with the number of jobs posted here.
  void answer_queries() {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, tag_query, ctrl_, &flag, &st);
      if (!flag) return;
      std::uint64_t q = 0;
      MPI_Recv(&q, 1, MPI_UINT64_T, st.MPI_SOURCE, tag_query, ctrl_, MPI_STATUS_IGNORE);
      std::uint64_t mine;
      {
        std::lock_guard lk(mu_);
        mine = posted_;
      }
      MPI_Request r;
      MPI_Isend(&mine, 1, MPI_UINT64_T, st.MPI_SOURCE, tag_reply, ctrl_, &r);
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
      int done = 0;
      while (!done && std::chrono::steady_clock::now() < until) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (!done) {
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      }
    }
  }

  // Waits for request `r` of job number `ticket` (about bucket `bucket`). Open MPI moves a
  // non-blocking collective forward only inside MPI calls, so the thread polls MPI_Test without
  // pause for the first milliseconds (while the data moves), then with short sleeps, so that a
  // late peer does not cost a core; on timeout it names the missing ranks.
  void complete(MPI_Request& r, std::uint64_t ticket, std::size_t bucket) {
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + timeout_;
    const auto spin_until = start + std::chrono::milliseconds(20);
    int done = 0;
    std::uint32_t polls = 0;
    while (true) {
      mpi_check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      if (++polls % 256 != 0) continue;
      if (broken_.load()) throw worker_aborted(reason_);
      const auto now = std::chrono::steady_clock::now();
      if (now < spin_until) continue;
      if (now > deadline) {
        std::string missing = who_is_missing(ticket);
        std::lock_guard lk(mu_);
        fail_locked("lockstep: collective timed out: rank " + std::to_string(rank_) + " waited " +
                        std::to_string(timeout_.count()) + " ms in bucket " + std::to_string(bucket) + "; " + missing +
                        " (raise strategy_options::timeout if a step legitimately takes longer)",
                    true);
      }
      answer_queries();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      polls = 255;  // check the clock after every poll from now on
    }
  }

  // Asks every other rank how many jobs it posted; those behind `ticket` (or silent) are missing.
  std::string who_is_missing(std::uint64_t ticket) {
    const auto w = static_cast<std::size_t>(size_);
    std::vector<std::uint64_t> reply(w, 0);
    std::vector<MPI_Request> reqs;
    std::vector<int> answered(w, 0);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      MPI_Request s;
      MPI_Isend(&ticket, 1, MPI_UINT64_T, p, tag_query, ctrl_, &s);
      MPI_Request_free(&s);
      MPI_Request rr;
      MPI_Irecv(&reply[static_cast<std::size_t>(p)], 1, MPI_UINT64_T, p, tag_reply, ctrl_, &rr);
      reqs.push_back(rr);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    while (std::chrono::steady_clock::now() < until) {
      bool all = true;
      std::size_t i = 0;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        if (!answered[static_cast<std::size_t>(p)]) MPI_Test(&reqs[i], &answered[static_cast<std::size_t>(p)], MPI_STATUS_IGNORE);
        all = all && answered[static_cast<std::size_t>(p)];
        ++i;
      }
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::string late, silent;
    std::size_t i = 0;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto up = static_cast<std::size_t>(p);
      if (!answered[up]) {
        silent += (silent.empty() ? "" : ", ") + std::to_string(p);
        MPI_Cancel(&reqs[i]);
        MPI_Request_free(&reqs[i]);
      } else if (reply[up] < ticket) {
        late += (late.empty() ? "" : ", ") + std::to_string(p);
      }
      ++i;
    }
    std::string out;
    if (!late.empty()) out += "rank(s) " + late + " did not arrive at it";
    if (!silent.empty()) out += (out.empty() ? "" : "; ") + std::string("rank(s) ") + silent + " did not answer (dead or hung)";
    if (out.empty()) out = "every rank arrived, but the collective did not complete";
    return out;
  }

  static int to_int(std::size_t n, const char* what) {
    if (n > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw config_error(std::string("lockstep::multi_worker: ") + what + " of " + std::to_string(n) +
                         " elements exceeds MPI's int count");
    return static_cast<int>(n);
  }

  void execute(const job& j) {
    const std::uint64_t ticket = completed_ + 1;
    MPI_Request r = MPI_REQUEST_NULL;
    switch (j.kind) {
      case op::barrier:
        mpi_check(MPI_Ibarrier(data_, &r), "MPI_Ibarrier");
        complete(r, ticket, j.bucket);
        break;
      case op::broadcast_bytes:
        mpi_check(MPI_Ibcast(j.data, to_int(j.count, "a broadcast"), MPI_BYTE, 0, data_, &r), "MPI_Ibcast");
        complete(r, ticket, j.bucket);
        break;
      case op::gather_doubles:
        mpi_check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.data, to_int(j.count, "a gather"), MPI_DOUBLE,
                                 data_, &r),
                  "MPI_Iallgather");
        complete(r, ticket, j.bucket);
        break;
      case op::gather_floats_v:
        mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.data, j.counts->data(), j.displs->data(),
                                  MPI_FLOAT, data_, &r),
                  "MPI_Iallgatherv");
        complete(r, ticket, j.bucket);
        break;
      case op::gather_doubles_v:
        mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.data, j.counts->data(), j.displs->data(),
                                  MPI_DOUBLE, data_, &r),
                  "MPI_Iallgatherv");
        complete(r, ticket, j.bucket);
        break;
      case op::gather_bytes:
        mpi_check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, j.data, to_int(j.count, "a gather"), MPI_BYTE, data_,
                                 &r),
                  "MPI_Iallgather");
        complete(r, ticket, j.bucket);
        break;
      case op::alltoallv_floats:
        mpi_check(MPI_Ialltoallv(j.data, j.counts->data(), j.displs->data(), MPI_FLOAT, j.recv, j.recv_counts->data(),
                                 j.recv_displs->data(), MPI_FLOAT, data_, &r),
                  "MPI_Ialltoallv");
        complete(r, ticket, j.bucket);
        break;
      case op::sum_floats: sum_floats(static_cast<float*>(j.data), j.count, ticket, j.bucket); break;
    }
  }

  // Reduce-scatter as an all-to-all of slices (rank p gets every rank's slice p), a sum over the
  // ranks in order 0..W-1, then an all-gather of the summed slices: the same bits on every rank,
  // run after run, in 2 (W-1)/W of the bucket's bytes per rank.
  void sum_floats(float* data, std::size_t count, std::uint64_t ticket, std::size_t bucket) {
    const auto w = static_cast<std::size_t>(size_);
    if (w == 1 || count == 0) return;
    if (shm_) {
      shm_sum(data, count, bucket);
      return;
    }
    constexpr std::size_t align = 16;  // 64-byte slice boundaries
    const std::size_t units = (count + align - 1) / align;
    for (std::size_t p = 0; p < w; ++p) {
      const std::size_t lo = std::min(count, units * p / w * align), hi = std::min(count, units * (p + 1) / w * align);
      send_counts_[p] = to_int(hi - lo, "a bucket");
      send_displs_[p] = to_int(lo, "a bucket");
    }
    const auto me = static_cast<std::size_t>(rank_);
    const int mine = send_counts_[me];
    if (scratch_.size() < static_cast<std::size_t>(mine) * w) scratch_.resize(static_cast<std::size_t>(mine) * w);
    for (std::size_t p = 0; p < w; ++p) {
      recv_counts_[p] = mine;
      recv_displs_[p] = to_int(static_cast<std::size_t>(mine) * p, "a bucket");
    }
    MPI_Request r = MPI_REQUEST_NULL;
    mpi_check(MPI_Ialltoallv(data, send_counts_.data(), send_displs_.data(), MPI_FLOAT, scratch_.data(),
                             recv_counts_.data(), recv_displs_.data(), MPI_FLOAT, data_, &r),
              "MPI_Ialltoallv");
    complete(r, ticket, bucket);
    float* out = data + send_displs_[me];
    const float* s = scratch_.data();
    const auto m = static_cast<std::size_t>(mine);
    std::memcpy(out, s, m * sizeof(float));
    for (std::size_t p = 1; p < w; ++p)
      for (std::size_t i = 0; i < m; ++i) out[i] += s[p * m + i];
    mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, send_counts_.data(), send_displs_.data(),
                              MPI_FLOAT, data_, &r),
              "MPI_Iallgatherv");
    complete(r, ticket, bucket);
  }

  // The control words of one rank in the shared window (each on its own cache line).
  struct alignas(64) shm_flag {
    std::atomic<std::uint64_t> value;
  };
  static constexpr std::size_t shm_header = 3 * sizeof(shm_flag);  // arrived, summed, read

  std::atomic<std::uint64_t>& flag(std::size_t rank, std::size_t which) const noexcept {
    return reinterpret_cast<shm_flag*>(shm_base_[rank])[which].value;
  }
  float* slot(std::size_t rank) const noexcept { return reinterpret_cast<float*>(shm_base_[rank] + shm_header); }

  // (Re)allocates the shared window for `floats` per rank (collective over the workers: every
  // worker grows at the same sum, since all sum the same bucket sizes).
  void shm_reserve(std::size_t floats) {
    if (floats <= shm_cap_) return;
    if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
    shm_cap_ = std::max(floats, shm_cap_ * 2);
    void* base = nullptr;
    mpi_check(MPI_Win_allocate_shared(static_cast<MPI_Aint>(shm_header + shm_cap_ * sizeof(float)), 1, MPI_INFO_NULL,
                                      node_, &base, &win_),
              "MPI_Win_allocate_shared");
    auto* mine = static_cast<shm_flag*>(base);
    for (std::size_t i = 0; i < 3; ++i) new (&mine[i].value) std::atomic<std::uint64_t>(0);
    shm_gen_ = 0;
    shm_base_.assign(static_cast<std::size_t>(size_), nullptr);
    for (int p = 0; p < size_; ++p) {
      MPI_Aint sz = 0;
      int disp = 0;
      void* b = nullptr;
      mpi_check(MPI_Win_shared_query(win_, p, &sz, &disp, &b), "MPI_Win_shared_query");
      shm_base_[static_cast<std::size_t>(p)] = static_cast<std::byte*>(b);
    }
    MPI_Barrier(node_);  // every rank's flags are initialised before anyone reads them
  }

  // Waits until control word `which` of every rank reached `gen`; names the late ranks on timeout.
  void shm_await(std::size_t which, std::uint64_t gen, std::size_t bucket) {
    const auto start = std::chrono::steady_clock::now();
    const auto spin_until = start + std::chrono::milliseconds(20), deadline = start + timeout_;
    for (std::uint32_t polls = 1;; ++polls) {
      bool all = true;
      for (std::size_t p = 0; p < shm_base_.size() && all; ++p) all = flag(p, which).load(std::memory_order_acquire) >= gen;
      if (all) return;
      if (polls % 256 != 0) continue;
      if (broken_.load()) throw worker_aborted(reason_);
      const auto now = std::chrono::steady_clock::now();
      if (now < spin_until) continue;
      if (now > deadline) {
        std::string late;
        for (std::size_t p = 0; p < shm_base_.size(); ++p)
          if (flag(p, which).load(std::memory_order_acquire) < gen) late += (late.empty() ? "" : ", ") + std::to_string(p);
        std::lock_guard lk(mu_);
        fail_locked("lockstep: collective timed out: rank " + std::to_string(rank_) + " waited " +
                        std::to_string(timeout_.count()) + " ms in bucket " + std::to_string(bucket) + "; rank(s) " + late +
                        " did not arrive at it (raise strategy_options::timeout if a step legitimately takes longer)",
                    true);
      }
      answer_queries();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      polls = 255;
    }
  }

  // The shared-memory sum of the workers of one machine: each copies the slices that the others
  // sum into its slot; rank p sums slice p over the ranks in order 0..W-1 (its own part straight
  // from its buffer; the same order as the MPI path) and publishes it in its slot; each copies
  // every other summed slice back. Three counters per rank order the phases.
  void shm_sum(float* data, std::size_t count, std::size_t bucket) {
    shm_reserve(count);
    const std::uint64_t g = ++shm_gen_;
    const auto w = static_cast<std::size_t>(size_), me = static_cast<std::size_t>(rank_);
    constexpr std::size_t align = 16, chunk = 1024;
    const std::size_t units = (count + align - 1) / align;
    const auto range = [&](std::size_t p) {
      return std::pair<std::size_t, std::size_t>{std::min(count, units * p / w * align),
                                                 std::min(count, units * (p + 1) / w * align)};
    };
    if (g > 1) shm_await(2, g - 1, bucket);  // nobody still reads our slot from the last sum
    for (std::size_t p = 0; p < w; ++p) {
      const auto [plo, phi] = range(p);
      if (p != me && phi > plo) std::memcpy(slot(me) + plo, data + plo, (phi - plo) * sizeof(float));
    }
    flag(me, 0).store(g, std::memory_order_release);
    shm_await(0, g, bucket);
    const auto [lo, hi] = range(me);
    float acc[chunk];
    for (std::size_t b = lo; b < hi; b += chunk) {
      const std::size_t m = std::min(chunk, hi - b);
      std::memcpy(acc, (me == 0 ? data : slot(0)) + b, m * sizeof(float));
      for (std::size_t p = 1; p < w; ++p) {
        const float* src = (p == me ? data : slot(p)) + b;
        for (std::size_t i = 0; i < m; ++i) acc[i] += src[i];
      }
      std::memcpy(slot(me) + b, acc, m * sizeof(float));
      std::memcpy(data + b, acc, m * sizeof(float));
    }
    flag(me, 1).store(g, std::memory_order_release);
    shm_await(1, g, bucket);
    for (std::size_t p = 0; p < w; ++p) {
      if (p == me) continue;
      const auto [plo, phi] = range(p);
      if (phi > plo) std::memcpy(data + plo, slot(p) + plo, (phi - plo) * sizeof(float));
    }
    flag(me, 2).store(g, std::memory_order_release);
  }

  std::chrono::milliseconds timeout_;
  MPI_Comm node_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  bool shm_ = false;
  std::size_t shm_cap_ = 0;
  std::uint64_t shm_gen_ = 0;
  std::vector<std::byte*> shm_base_;
  int level_ = MPI_THREAD_SINGLE;
  MPI_Comm data_ = MPI_COMM_NULL, ctrl_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int> send_counts_, send_displs_, recv_counts_, recv_displs_;
  std::vector<float> scratch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<job> queue_;
  std::uint64_t posted_ = 0, completed_ = 0;
  bool busy_ = false, stop_ = false, timed_out_ = false;
  std::atomic<bool> broken_{false};
  std::string reason_;
  std::thread thread_;
};

}  // namespace detail
}  // namespace lockstep
