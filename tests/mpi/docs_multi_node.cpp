// The first program of docs/multi-node.md, compiled as it is shown (on synthetic data; the MPI
// tests run the same calls under mpirun). Run it as `mpirun -np 2 docs_multi_node`.
#include <cstdint>
#include <vector>

#include <lockstep/lockstep.hpp>

namespace {

using mlp = lockstep::sequential<lockstep::dense<16, 32>, lockstep::relu, lockstep::dense<32, 10>>;

/// The same pipeline on every worker: the same data and seed, the same global batch.
auto training_data() {
  std::vector<float> x(512 * 16);
  std::vector<std::int32_t> y(512);
  const lockstep::counter_rng rng(11, 0);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i);
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>(i % 10);
  return lockstep::data::from_memory(std::move(x), 16, std::move(y)) | lockstep::data::shuffle(512, 7) |
         lockstep::data::batched(64);
}

}  // namespace

// example-begin multi-node-cpu
#include <lockstep/lockstep.hpp>
#include <lockstep/distribute/multi_worker.hpp>   // link lockstep::mpi
namespace ls = lockstep;

int main(int argc, char** argv) {
  ls::mpi_environment mpi(argc, argv);                       // MPI_Init_thread(MULTIPLE) ... MPI_Finalize
  ls::multi_worker_mirrored<ls::cpus> strategy(ls::device_selection::first(1));  // 1 local replica
  auto model = strategy.replicate<mlp>(ls::seed{42});       // identical on every worker
  auto train = training_data();  // the SAME pipeline on every worker: same files, seeds, global batch
  ls::fit(strategy, model, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{}, train,
          {.epochs = 10, .checkpoint_dir = "ckpt"});           // rank 0 alone writes progress and checkpoints
}
// example-end multi-node-cpu
