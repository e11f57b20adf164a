// A multi-worker training loop that fails on purpose, for tests/mpi/check_failure.sh:
//   throw      rank 1's replica throws at step 3
//   stall      rank 1 sleeps 8 s before step 3 (the collective timeout is 2 s)
//   kill       rank 1 kills itself with SIGKILL at step 3
//   outside    rank 1 throws at step 3 outside the strategy (as its own input pipeline would),
//              unwinding the strategy and the model alone while rank 0 waits in step 3
//   alloutside every rank throws the same config_error at step 3 outside the strategy
//   afterlast  rank 1 throws a config_error after the last step and ends without MPI_Abort,
//              while rank 0 finishes and drops its strategy normally
//   lateend    no failure: rank 0 drops its strategy 3 s (more than the timeout) after rank 1
//   diverge    fit over pipelines of different lengths: rank 1's epoch has 5 batches, rank 0's
//              6, so rank 1 meets the end-of-epoch check while rank 0 sums its sixth step
//   world      asks for 3 workers (launched with 2)
//   nompirun   asks for 2 workers without mpirun
// Every rank that catches an error prints it (once: the other ranks are ended by MPI_Abort).

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include <lockstep/distribute/multi_worker.hpp>
#include <lockstep/lockstep.hpp>

namespace ls = lockstep;

namespace {

using mlp = ls::sequential<ls::dense<16, 8>, ls::relu, ls::dense<8, 4>>;

// softmax cross-entropy that throws while *fail is set.
struct failing_loss {
  using loss_concept = ls::loss_tag;
  static constexpr std::size_t scratch_per_row = ls::softmax_cross_entropy::scratch_per_row;
  const bool* fail;
  template <class T, class Ctx, class Shape>
  ls::loss_sum evaluate(Ctx& ctx, const ls::loss_args<T, Ctx, Shape>& a) const {
    if (*fail) throw ls::data_error("injected failure in the loss");
    return ls::softmax_cross_entropy{}.evaluate(ctx, a);
  }
};

ls::data::batch make_batch(std::size_t rows, std::uint64_t key) {
  ls::data::batch b;
  b.width = 16;
  const ls::counter_rng rng(5, key);
  for (std::size_t i = 0; i < rows * 16; ++i) b.features.push_back(rng.uniform(i));
  for (std::size_t r = 0; r < rows; ++r) {
    b.labels.push_back(static_cast<std::int32_t>(rng.u32(rows * 16 + r) % 4));
    b.indices.push_back(key * 100 + r);
  }
  return b;
}

// A pipeline of `count` batches of 32 rows (the same rows on every worker, up to its length).
struct counted_batches {
  std::uint64_t count;
  ls::data::generator<ls::data::batch> epoch(std::uint64_t) const {
    for (std::uint64_t i = 0; i < count; ++i) co_yield make_batch(32, i);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "nompirun") {
    try {
      ls::require_mpi_launch(2, argv[0]);
    } catch (const ls::config_error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      return 2;
    }
    return 0;
  }
  ls::mpi_environment env(argc, argv);
  try {
    if (mode == "world") ls::require_world_size(3);
    ls::strategy_options o;
    o.timeout = std::chrono::milliseconds(2000);
    ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1), o);
    auto m = s.replicate<mlp>(ls::seed{1});
    if (mode == "diverge") {
      (void)ls::fit(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{},
                    counted_batches{s.world().rank() == 1 ? 5u : 6u}, {.epochs = 1, .quiet = true});
      if (s.world().is_chief()) std::printf("probe finished\n");
      return 0;
    }
    bool fail = false;
    const failing_loss loss{&fail};
    for (std::uint64_t step = 0; step < 10; ++step) {
      if (step == 3 && mode == "alloutside") throw ls::config_error("every worker's injected configuration error");
      if (step == 3 && s.world().rank() == 1) {
        if (mode == "outside") throw ls::data_error("rank 1's injected input failure, outside the strategy");
        if (mode == "throw") fail = true;
        if (mode == "stall") std::this_thread::sleep_for(std::chrono::seconds(8));
        if (mode == "kill") ::raise(SIGKILL);
      }
      const ls::shard_plan p = s.plan();
      ls::train_step(s, m, ls::sgd{.lr = 0.1f}, loss,
                     ls::data::detail::make_sharded(make_batch(32, step), p.parts, p.first, s.num_replicas()));
    }
    if (mode == "afterlast" && s.world().rank() == 1) throw ls::config_error("rank 1's injected failure after the last step");
    if (mode == "lateend" && s.world().is_chief()) std::this_thread::sleep_for(std::chrono::seconds(3));
    if (s.world().is_chief()) std::printf("probe finished\n");
    return 0;
  } catch (const ls::config_error& e) {  // every rank finds the same configuration error: rank 0 reports it
    if (env.rank() == 0 || mode == "afterlast") std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", env.rank(), e.what());
    std::fflush(stderr);
    env.abort_on_exit(1);
    return 1;
  }
}
