// The MPI tests' main: MPI first (mpi_environment: MPI_THREAD_MULTIPLE when provided), then doctest on every rank.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <lockstep/distribute/mpi.hpp>

int main(int argc, char** argv) {
  lockstep::mpi_environment env(argc, argv);
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
