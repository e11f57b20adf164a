#pragma once
/// @file mpi_straggler.hpp
/// Internal: the straggler diagnosis of a multi-worker strategy. On a timeout a worker asks every
/// other rank, on a control communicator of its own, how many jobs it has posted and which
/// collective its job of the same number is; those behind the job that timed out are named as
/// not arrived, those in another collective there as diverged (the workers called different
/// collectives), those that do not answer within 1.5 s as dead or hung. Every communication
/// thread answers such questions while it waits (and, under MPI_THREAD_MULTIPLE, while idle).

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace lockstep::detail {

/// Asks and answers "how far did you get?" over a control communicator. Every buffer a pending
/// send or receive reads or writes lives until MPI is done with it: a send's value in a slot kept
/// until the send completes, a receive that got no answer cancelled and completed before its
/// buffer goes.
class mpi_straggler_probe {
public:
  /// A probe over `ctrl` (a communicator no collective uses) for rank `rank` of `size`.
  mpi_straggler_probe(MPI_Comm ctrl, int rank, int size) noexcept : ctrl_(ctrl), rank_(rank), size_(size) {}
  mpi_straggler_probe(const mpi_straggler_probe&) = delete;
  mpi_straggler_probe& operator=(const mpi_straggler_probe&) = delete;
  /// Cancels the sends still pending (the channel has freed the control communicator by then:
  /// requests on a freed communicator still complete).
  ~mpi_straggler_probe() { settle(true); }

  /// What a rank answers about job number `asked`: the number of jobs it posted, and that job's
  /// collective as a code (0: not posted, or too old to say).
  using state_fn = std::function<std::array<std::uint64_t, 2>(std::uint64_t asked)>;

  /// Sets what this rank answers (set before the first question can arrive).
  void set_state(state_fn state) { state_ = std::move(state); }

  /// Replies to every pending question with the state (set_state) of the job number asked about.
  void answer() {
    settle(false);
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, tag_query, ctrl_, &flag, &st);
      if (!flag) return;
      std::uint64_t q = 0;
      MPI_Recv(&q, 1, MPI_UINT64_T, st.MPI_SOURCE, tag_query, ctrl_, MPI_STATUS_IGNORE);
      send(st.MPI_SOURCE, tag_reply, state_ ? state_(q) : std::array<std::uint64_t, 2>{0, 0}, 2);
    }
  }

  /// What every rank answered about one job number: its state (set_state), or none from a rank
  /// that did not answer within 1.5 s (and none for this rank). Indexed by rank.
  using replies = std::vector<std::optional<std::array<std::uint64_t, 2>>>;

  /// Asks every other rank about job number `ticket` (how many jobs it posted, and that job's
  /// collective). Answers the others' questions while it waits (two ranks that time out together
  /// ask each other).
  [[nodiscard]] replies ask(std::uint64_t ticket) {
    settle(false);
    const auto w = static_cast<std::size_t>(size_);
    std::vector<std::array<std::uint64_t, 2>> reply(w);
    std::vector<MPI_Request> reqs(w, MPI_REQUEST_NULL);
    std::vector<int> answered(w, 0);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      send(p, tag_query, {ticket, 0}, 1);
      MPI_Irecv(reply[static_cast<std::size_t>(p)].data(), 2, MPI_UINT64_T, p, tag_reply, ctrl_,
                &reqs[static_cast<std::size_t>(p)]);
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    while (std::chrono::steady_clock::now() < until) {
      bool all = true;
      for (int p = 0; p < size_; ++p) {
        const auto up = static_cast<std::size_t>(p);
        if (p == rank_) continue;
        if (!answered[up]) MPI_Test(&reqs[up], &answered[up], MPI_STATUS_IGNORE);
        all = all && answered[up];
      }
      if (all) break;
      answer();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    // A receive still pending is cancelled and completed (MPI guarantees that this wait returns),
    // so no late reply lands in `reply` after it is gone; one that arrived meanwhile counts.
    for (int p = 0; p < size_; ++p) {
      const auto up = static_cast<std::size_t>(p);
      if (p == rank_ || answered[up]) continue;
      MPI_Cancel(&reqs[up]);
      MPI_Status st;
      MPI_Wait(&reqs[up], &st);
      int cancelled = 0;
      MPI_Test_cancelled(&st, &cancelled);
      answered[up] = cancelled ? 0 : 1;
    }
    replies out(w);
    for (std::size_t p = 0; p < w; ++p)
      if (static_cast<int>(p) != rank_ && answered[p]) out[p] = reply[p];
    return out;
  }

  /// From the answers `r` about job `ticket` (ask): who is behind it (or silent), in words.
  [[nodiscard]] std::string missing(const replies& r, std::uint64_t ticket) const {
    std::string late, silent;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto& a = r[static_cast<std::size_t>(p)];
      if (!a)
        silent += (silent.empty() ? "" : ", ") + std::to_string(p);
      else if ((*a)[0] < ticket)
        late += (late.empty() ? "" : ", ") + std::to_string(p);
    }
    std::string out;
    if (!late.empty()) out += "rank(s) " + late + " did not arrive at it";
    if (!silent.empty()) out += (out.empty() ? "" : "; ") + std::string("rank(s) ") + silent + " did not answer (dead or hung)";
    if (out.empty()) out = "every rank arrived, but the collective did not complete";
    return out;
  }

  /// From the answers `r` about job `ticket` (ask): the ranks whose job there is another
  /// collective than `mine`, in words (through `name`, from a collective's code), or "" when none is.
  [[nodiscard]] std::string diverged(const replies& r, std::uint64_t ticket, std::uint64_t mine,
                                     const std::function<std::string(std::uint64_t)>& name) const {
    std::string others;
    for (int p = 0; p < size_; ++p) {
      const auto& a = r[static_cast<std::size_t>(p)];
      if (p == rank_ || !a || (*a)[0] < ticket || (*a)[1] == 0 || (*a)[1] == mine) continue;
      others += (others.empty() ? "rank " : ", rank ") + std::to_string(p) + " is in " + name((*a)[1]);
    }
    if (others.empty()) return {};
    return "at this collective (the job numbered " + std::to_string(ticket) + " on every worker) " + others +
           ", not " + name(mine) +
           ": the workers called different collectives, as when one worker's input pipeline gives more batches in an "
           "epoch than another's, or a collective is called on some workers only";
  }

private:
  static constexpr int tag_query = 7101, tag_reply = 7102;

  /// A send in flight and the values it reads (on the heap: their address must not move).
  struct outgoing {
    std::array<std::uint64_t, 2> value{};
    MPI_Request request = MPI_REQUEST_NULL;
  };

  /// Sends the first `count` (1 or 2) of `value` to rank `to` without waiting; their slot is kept
  /// until the send completes.
  void send(int to, int tag, const std::array<std::uint64_t, 2>& value, int count) {
    auto& o = sends_.emplace_back(std::make_unique<outgoing>());
    o->value = value;
    MPI_Isend(o->value.data(), count, MPI_UINT64_T, to, tag, ctrl_, &o->request);
  }

  /// Drops the slots of completed sends; when `closing`, cancels the others and waits up to
  /// 100 ms for each; a send that still has not completed keeps its slot for good (16 bytes
  /// leaked rather than freed while MPI may still read them).
  void settle(bool closing) noexcept {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      for (auto& o : sends_) (void)o.release();
      sends_.clear();
      return;
    }
    std::erase_if(sends_, [](const std::unique_ptr<outgoing>& o) {
      int done = 0;
      MPI_Test(&o->request, &done, MPI_STATUS_IGNORE);
      return done != 0;
    });
    if (!closing) return;
    for (auto& o : sends_) {
      MPI_Cancel(&o->request);
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      int done = 0;
      while (!done && std::chrono::steady_clock::now() < until) {
        MPI_Test(&o->request, &done, MPI_STATUS_IGNORE);
        if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (!done) {
        MPI_Request_free(&o->request);
        (void)o.release();
      }
    }
    sends_.clear();
  }

  MPI_Comm ctrl_;
  int rank_, size_;
  state_fn state_;
  std::vector<std::unique_ptr<outgoing>> sends_;
};

}  // namespace lockstep::detail
