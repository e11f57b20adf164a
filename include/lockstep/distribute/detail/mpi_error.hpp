#pragma once
/// @file mpi_error.hpp
/// Internal: what the MPI pieces of a multi-worker strategy throw, and how they wait. Every MPI
/// call of a strategy runs on its communication thread (mpi_channel.hpp); the sum algorithms
/// (mpi_sum.hpp, mpi_window_sum.hpp) wait through the channel's `mpi_progress`, which enforces
/// the deadline, names the ranks that did not arrive and answers the other ranks' questions.

#include <mpi.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

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
}  // namespace lockstep

namespace lockstep::detail {

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

/// How a collective on the communication thread waits (implemented by mpi_channel).
class mpi_progress {
public:
  virtual ~mpi_progress() = default;
  /// Waits until request `r` of the job in progress (about collective `bucket`) completed.
  /// @throws timeout_error naming the ranks that did not arrive, or worker_aborted after a failure.
  virtual void complete(MPI_Request& r, std::size_t bucket) = 0;
  /// Between two polls of a wait that began at `start` on `bucket`: throws worker_aborted after a
  /// failure, or timeout_error naming `late()` once the deadline passed (an empty `late`: the
  /// ranks that the straggler probe finds behind); otherwise answers the other ranks' questions
  /// and pauses briefly.
  virtual void idle(std::chrono::steady_clock::time_point start, std::size_t bucket,
                    const std::function<std::string()>& late) = 0;
};

}  // namespace lockstep::detail
