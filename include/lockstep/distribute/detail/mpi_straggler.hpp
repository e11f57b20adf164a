#pragma once
/// @file mpi_straggler.hpp
/// Internal: the straggler diagnosis of a multi-worker strategy. On a timeout a worker asks every
/// other rank, on a control communicator of its own, how many jobs it has posted; those behind the
/// job that timed out are named as not arrived, those that do not answer within 1.5 s as dead or
/// hung. Every communication thread answers such questions while it waits (and, under
/// MPI_THREAD_MULTIPLE, while idle).

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
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

  /// Replies to every pending question with `posted()`, the number of jobs posted here.
  void answer(const std::function<std::uint64_t()>& posted) {
    settle(false);
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, tag_query, ctrl_, &flag, &st);
      if (!flag) return;
      std::uint64_t q = 0;
      MPI_Recv(&q, 1, MPI_UINT64_T, st.MPI_SOURCE, tag_query, ctrl_, MPI_STATUS_IGNORE);
      send(st.MPI_SOURCE, tag_reply, posted());
    }
  }

  /// Asks every other rank how many jobs it posted; returns who is behind job `ticket` (or
  /// silent), in words.
  [[nodiscard]] std::string missing(std::uint64_t ticket) {
    settle(false);
    const auto w = static_cast<std::size_t>(size_);
    std::vector<std::uint64_t> reply(w, 0);
    std::vector<MPI_Request> reqs(w, MPI_REQUEST_NULL);
    std::vector<int> answered(w, 0);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      send(p, tag_query, ticket);
      MPI_Irecv(&reply[static_cast<std::size_t>(p)], 1, MPI_UINT64_T, p, tag_reply, ctrl_, &reqs[static_cast<std::size_t>(p)]);
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
    std::string late, silent;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto up = static_cast<std::size_t>(p);
      if (!answered[up])
        silent += (silent.empty() ? "" : ", ") + std::to_string(p);
      else if (reply[up] < ticket)
        late += (late.empty() ? "" : ", ") + std::to_string(p);
    }
    std::string out;
    if (!late.empty()) out += "rank(s) " + late + " did not arrive at it";
    if (!silent.empty()) out += (out.empty() ? "" : "; ") + std::string("rank(s) ") + silent + " did not answer (dead or hung)";
    if (out.empty()) out = "every rank arrived, but the collective did not complete";
    return out;
  }

private:
  static constexpr int tag_query = 7101, tag_reply = 7102;

  /// A send in flight and the value it reads (on the heap: its address must not move).
  struct outgoing {
    std::uint64_t value = 0;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  /// Sends `value` to rank `to` without waiting; its slot is kept until the send completes.
  void send(int to, int tag, std::uint64_t value) {
    auto& o = sends_.emplace_back(std::make_unique<outgoing>());
    o->value = value;
    MPI_Isend(&o->value, 1, MPI_UINT64_T, to, tag, ctrl_, &o->request);
  }

  /// Drops the slots of completed sends; when `closing`, cancels the others and waits up to
  /// 100 ms for each; a send that still has not completed keeps its slot for good (8 bytes
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
  std::vector<std::unique_ptr<outgoing>> sends_;
};

}  // namespace lockstep::detail
