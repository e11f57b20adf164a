// Uses the optional MPI component: a multi-worker strategy over this process's workers.
#include <cstdio>

#include <lockstep/distribute/multi_worker.hpp>
#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

int main(int argc, char** argv) {
  ls::mpi_environment mpi(argc, argv);
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1));
  auto m = s.replicate<ls::sequential<ls::dense<2, 8>, ls::tanh, ls::dense<8, 2>>>(ls::seed{1});
  std::printf("rank %zu of %zu, %zu parameters\n", s.world().rank(), s.world().size(), m.param_count);
  return 0;
}
