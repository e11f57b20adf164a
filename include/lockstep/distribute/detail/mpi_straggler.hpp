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
#include <string>
#include <thread>
#include <vector>

namespace lockstep::detail {

/// Asks and answers "how far did you get?" over a control communicator.
class mpi_straggler_probe {
public:
  /// A probe over `ctrl` (a communicator no collective uses) for rank `rank` of `size`.
  mpi_straggler_probe(MPI_Comm ctrl, int rank, int size) noexcept : ctrl_(ctrl), rank_(rank), size_(size) {}

  /// Replies to every pending question with `posted()`, the number of jobs posted here.
  void answer(const std::function<std::uint64_t()>& posted) {
    for (;;) {
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, tag_query, ctrl_, &flag, &st);
      if (!flag) return;
      std::uint64_t q = 0;
      MPI_Recv(&q, 1, MPI_UINT64_T, st.MPI_SOURCE, tag_query, ctrl_, MPI_STATUS_IGNORE);
      std::uint64_t mine = posted();
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

  /// Asks every other rank how many jobs it posted; returns who is behind job `ticket` (or
  /// silent), in words.
  [[nodiscard]] std::string missing(std::uint64_t ticket) {
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

private:
  static constexpr int tag_query = 7101, tag_reply = 7102;
  MPI_Comm ctrl_;
  int rank_, size_;
};

}  // namespace lockstep::detail
