#pragma once
/// @file mpi_launch.hpp
/// `launched_by_mpi()`: whether an MPI launcher started this process, read from the environment
/// the launchers set. Needs no MPI: a program built without it can refuse to run as one of N
/// copies that would each train alone.

#include <cstdlib>
#include <initializer_list>

namespace lockstep {

/// True when this process was started by an MPI launcher (mpirun, mpiexec, srun with PMI/PMIx).
inline bool launched_by_mpi() noexcept {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"})
    if (std::getenv(v)) return true;
  return false;
}

}  // namespace lockstep
