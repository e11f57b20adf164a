#pragma once
/// @file mpi.hpp
/// MPI for multi-worker training (link lockstep::mpi; needs <mpi.h>): `mpi_environment` (RAII
/// MPI_Init_thread / MPI_Finalize for programs that want lockstep to start MPI; the library never
/// initialises MPI on its own) and the launch checks. The pieces of the strategy's communication
/// are internal, one job per file: detail/mpi_channel.hpp (the thread and its queue),
/// detail/mpi_straggler.hpp (who did not arrive), detail/mpi_sum.hpp (the ordered sum over MPI's
/// messages) and detail/mpi_window_sum.hpp (the same sum in a shared-memory window).

#include <mpi.h>

#include <cstddef>
#include <cstdlib>
#include <exception>
#include <string>

#include <lockstep/core/error.hpp>
#include <lockstep/distribute/detail/mpi_channel.hpp>
#include <lockstep/distribute/detail/mpi_error.hpp>
#include <lockstep/distribute/mpi_launch.hpp>

namespace lockstep {

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
    if (level_ < MPI_THREAD_SERIALIZED) {
      if (owns_) {  // the destructor will not run: finalise here, so the process ends cleanly
        MPI_Finalize();
        owns_ = false;
      }
      throw config_error(std::string("lockstep::mpi_environment: MPI provides only ") + mpi_thread_level_name(level_) +
                         "; lockstep needs MPI_THREAD_SERIALIZED (its communication thread issues the MPI calls)");
    }
  }

  bool owns_ = false;
  bool abort_ = false;
  int exit_code_ = 1;
  int level_ = MPI_THREAD_SINGLE;
  int rank_ = 0, size_ = 1;
  int uncaught_ = std::uncaught_exceptions();
};

}  // namespace lockstep
