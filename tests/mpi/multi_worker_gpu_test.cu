// multi_worker_mirrored<gpus> under mpirun (-np 2, and -np 1): one NCCL communicator over the GPUs of every
// worker. 20 training steps equal single-process host training on the same global batches,
// every sample reaches exactly one GPU of one worker, fit/evaluate/checkpoints behave as for
// cpus, and a worker that does not reach a collective makes the others throw timeout_error in
// bounded time.
//
// What it needs: every worker of a machine gets its own GPU(s): the GPUs this process sees are
// split between the workers of its machine (worker with local rank l of n takes ordinals
// G·l/n .. G·(l+1)/n - 1, so 3 GPUs and 2 workers give 2 and 1: uneven counts). Two workers may
// not share one GPU: NCCL refuses two ranks of one communicator on the same device ("Duplicate
// GPU detected"). With no CUDA device, or fewer GPUs than workers on some machine, every rank
// prints "skipped: ..." and exits with 77, which CTest reports as skipped (SKIP_RETURN_CODE).

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <lockstep/cuda.hpp>
#include <lockstep/distribute/multi_worker.hpp>  // with nvcc and NCCL: multi_worker_nccl.cuh
#include <lockstep/lockstep.hpp>

#include "support/mpi.hpp"

namespace {

namespace ls = lockstep;
using test_support::same_on_every_rank;
using test_support::world_rank;
using test_support::world_size;


// This worker's GPUs: its share of the GPUs of its machine (see the file comment).
struct placement {
  int local_rank = 0, local_size = 1, gpus = 0;
  std::vector<std::size_t> ordinals;
};
placement place() {
  placement p;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &p.local_rank);
  MPI_Comm_size(node, &p.local_size);
  MPI_Comm_free(&node);
  p.gpus = ls::backend::cuda_device_count();
  const auto g = static_cast<std::size_t>(p.gpus), l = static_cast<std::size_t>(p.local_rank),
             n = static_cast<std::size_t>(p.local_size);
  for (std::size_t o = g * l / n; o < g * (l + 1) / n; ++o) p.ordinals.push_back(o);
  return p;
}
ls::device_selection my_gpus() { return ls::device_selection(place().ordinals); }

// Smooth activations only (as in tests/cuda/training_test.cu): the GPU's GEMMs round differently
// from the host's, and a ReLU pre-activation within that rounding of zero would switch a unit
// off on one side only (a gradient difference of order 1, not of order 1e-7).
using net = ls::sequential<ls::dense<20, 32>, ls::gelu, ls::dropout<1, 10>, ls::dense<32, 32>, ls::tanh,
                           ls::dense<32, 5>>;

// Rows of the 20 global batches: uneven, and three smaller than any job's GPU count, so that
// some GPUs get empty shards (they contribute zero gradients and still join every collective).
const std::vector<std::size_t> sizes{13, 14, 15, 16, 17, 1, 19, 13, 14, 3, 16, 17, 18, 19, 13, 2, 15, 16, 17, 18};

ls::data::batch make_batch(std::size_t k) {
  ls::data::batch b;
  const std::size_t rows = sizes[k];
  b.width = 20;
  const ls::counter_rng rng(77, k);
  b.features.resize(rows * 20);
  for (std::size_t i = 0; i < b.features.size(); ++i) b.features[i] = 2.0f * rng.uniform(i) - 1.0f;
  b.labels.resize(rows);
  b.indices.resize(rows);
  for (std::size_t i = 0; i < rows; ++i) {
    b.labels[i] = static_cast<std::int32_t>(rng.u32(1'000'000 + i) % 5);
    b.indices[i] = k * 100 + i;
  }
  return b;
}

struct run_result {
  std::vector<double> losses;
  std::vector<float> params;
};

const ls::sgd opt{.lr = 0.05f, .momentum = 0.9f};

// 20 steps through strategy s, each worker on its own shards of every global batch; checks that
// every local replica holds the same parameters.
template <class S>
run_result train20(S& s) {
  auto m = s.template replicate<net>(ls::seed{3});
  run_result out;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    const ls::shard_plan p = s.plan();
    const auto db = ls::data::detail::make_sharded(make_batch(k), p.parts, p.first, s.num_replicas());
    const auto st = ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, db);
    CHECK(st.count == sizes[k]);
    out.losses.push_back(st.loss_sum);
  }
  out.params = m.parameters_to_host();
  if constexpr (std::is_same_v<typename S::kind_type, ls::gpus>) {
    for (std::size_t r = 1; r < s.num_replicas(); ++r) {
      std::vector<float> pr(m.param_count);
      auto& rep = m.replica(r);
      copy_to_host(rep.context(), pr.data(), rep.model().parameters().data(), pr.size());
      CHECK(pr == out.params);
    }
  }
  return out;
}

// |got - want| <= rel * (largest |want|) for every element.
void check_close(const std::vector<float>& got, const std::vector<float>& want, double rel) {
  REQUIRE(got.size() == want.size());
  double scale = 1e-30, worst = 0;
  for (const float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    worst = std::max(worst, d / scale);
    if (!(d <= rel * scale)) ++bad;
  }
  INFO(bad << " of " << got.size() << " parameters differ; worst relative difference " << worst);
  CHECK(bad == 0);
}

// The 20 batches as a dataset (every epoch the same), for fit and evaluate.
struct twenty_batches {
  ls::data::generator<ls::data::batch> epoch(std::uint64_t) const {
    for (std::size_t k = 0; k < sizes.size(); ++k) co_yield make_batch(k);
  }
};

}  // namespace

TEST_CASE("multi_worker<gpus>: the NCCL ranks follow the workers' GPU counts") {
  const placement p = place();
  ls::multi_worker_mirrored<ls::gpus> s(ls::device_selection(p.ordinals));
  static_assert(ls::strategy<ls::multi_worker_mirrored<ls::gpus>>);
  const auto mine = static_cast<unsigned long>(p.ordinals.size());
  unsigned long total = 0, before = 0;
  MPI_Allreduce(&mine, &total, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
  MPI_Exscan(&mine, &before, 1, MPI_UNSIGNED_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (world_rank() == 0) before = 0;  // MPI_Exscan leaves rank 0's result undefined
  CHECK(s.num_replicas() == p.ordinals.size());
  CHECK(s.device_ordinals() == p.ordinals);
  CHECK(s.world().size() == static_cast<std::size_t>(world_size()));
  CHECK(s.world().rank() == static_cast<std::size_t>(world_rank()));
  CHECK(s.world().is_chief() == (world_rank() == 0));
  CHECK(s.world().global_replicas() == total);
  CHECK(s.plan().parts == total);
  CHECK(s.plan().first == before);
  MESSAGE("rank " << world_rank() << ": CUDA devices " << s.description() << ", NCCL ranks " << before << ".."
                  << before + mine - 1 << " of " << total);
}

// Tolerance 1e-4 relative to the largest parameter, as for one process's NCCL strategy against
// the host (tests/cuda/training_test.cu): cuBLAS and OpenBLAS round their GEMMs differently
// (about 1e-7 relative per product) and NCCL sums the GPUs' gradient sums in its own order, not
// the host's row order; through 20 SGD steps with momentum and smooth activations such
// differences stay below 1e-5 relative, while a wrong shard, a missing or doubled GPU, or a
// gradient divided by a local instead of the global sample count moves parameters by 1e-2 and
// more within a few steps.
TEST_CASE("multi_worker<gpus>: 20 steps over every GPU of every worker equal one host device (1e-4)") {
  ls::one_device<ls::cpu<0>> host;
  const run_result want = train20(host);
  ls::strategy_options o;
  o.bucket_bytes = 1024;  // several buckets: their all-reduces overlap the backward pass
  ls::multi_worker_mirrored<ls::gpus> s(my_gpus(), o);
  const run_result got = train20(s);
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t k = 0; k < got.losses.size(); ++k) {
    CAPTURE(k);
    CHECK(std::fabs(got.losses[k] - want.losses[k]) <= 1e-4 * (1.0 + std::fabs(want.losses[k])));
  }
  check_close(got.params, want.params, 1e-4);
  // NCCL hands every GPU the same sum, so every GPU of every worker applies the same update.
  CHECK(same_on_every_rank(got.params));
}

TEST_CASE("multi_worker<gpus>: every sample of an epoch reaches exactly one GPU of one worker") {
  ls::multi_worker_mirrored<ls::gpus> s(my_gpus());
  std::vector<std::uint64_t> all =
      test_support::gather_all(test_support::indices_seen(s, sizes.size(), [](std::size_t k) { return make_batch(k); }));
  std::sort(all.begin(), all.end());
  std::vector<std::uint64_t> want;
  for (std::size_t k = 0; k < sizes.size(); ++k)
    for (std::size_t r = 0; r < sizes[k]; ++r) want.push_back(k * 100 + r);
  CHECK(all == want);
}

TEST_CASE("multi_worker<gpus>: fit sums over workers, only rank 0 writes, its checkpoint resumes on one host device") {
  ls::multi_worker_mirrored<ls::gpus> s(my_gpus());
  const auto dir = test_support::fresh_job_directory("lockstep-mpi-gpu-test-");

  ls::one_device<ls::cpu<0>> host;
  auto ref = host.replicate<net>(ls::seed{7});
  const auto ref_hist = ls::fit(host, ref, opt, ls::softmax_cross_entropy{}, twenty_batches{},
                                {.epochs = 2, .validation = twenty_batches{}, .quiet = true});

  auto m = s.replicate<net>(ls::seed{7});
  ls::fit_options fo{.epochs = 1, .validation = twenty_batches{}, .quiet = true};
  fo.checkpoint_dir = (dir / "ckpt").string();
  fo.metrics_file = (dir / ("metrics-" + std::to_string(s.world().rank()) + ".jsonl")).string();
  const auto h = ls::fit(s, m, opt, ls::softmax_cross_entropy{}, twenty_batches{}, fo);
  s.barrier();
  REQUIRE(h.epochs.size() == 1);
  CHECK(h.epochs[0].samples == ref_hist.epochs[0].samples);
  CHECK(h.epochs[0].val_samples == ref_hist.epochs[0].val_samples);
  CHECK(std::fabs(h.epochs[0].train_loss - ref_hist.epochs[0].train_loss) <= 1e-4 * (1 + ref_hist.epochs[0].train_loss));
  CHECK(std::fabs(h.epochs[0].val_loss - ref_hist.epochs[0].val_loss) <= 1e-4 * (1 + ref_hist.epochs[0].val_loss));
  CHECK(std::filesystem::exists(dir / "metrics-0.jsonl"));
  for (int r = 1; r < world_size(); ++r) CHECK_FALSE(std::filesystem::exists(dir / ("metrics-" + std::to_string(r) + ".jsonl")));

  const auto ev = ls::evaluate(s, m, ls::softmax_cross_entropy{}, twenty_batches{});
  std::uint64_t total = 0;
  for (const auto n : sizes) total += n;
  CHECK(ev.samples == total);

  // The job's checkpoint resumes in one host process (each rank on its own copy): epoch 2 there
  // ends where two host epochs end.
  auto solo = host.replicate<net>(ls::seed{7});
  const auto copy = dir / ("resume-" + std::to_string(s.world().rank()));
  std::filesystem::copy(dir / "ckpt", copy);
  ls::fit_options ro{.epochs = 2, .quiet = true};
  ro.checkpoint_dir = copy.string();
  ro.resume = true;
  const auto h2 = ls::fit(host, solo, opt, ls::softmax_cross_entropy{}, twenty_batches{}, ro);
  CHECK(h2.resumed_from_step == sizes.size());
  check_close(solo.parameters_to_host(), ref.parameters_to_host(), 1e-4);
  test_support::remove_job_directory(dir);
}

// Last: it leaves the strategy unusable; needs 2 workers. Rank 1 reaches the all-reduce 2 timeouts late: rank 0
// gives up after one timeout with timeout_error naming itself; rank 1 finds the collective
// abandoned and fails too (timeout_error, or NCCL's error when it notices that rank 0's
// communicator is gone), both in bounded time; then the strategy refuses further use.
TEST_CASE("multi_worker<gpus>: a worker that does not reach a collective makes the others time out, naming their rank") {
  using namespace std::chrono;
  if (world_size() < 2) {
    MESSAGE("needs 2 workers: not run with " << world_size());
    return;
  }
  const milliseconds limit(2000);
  ls::strategy_options o;
  o.timeout = limit;
  ls::multi_worker_mirrored<ls::gpus> s(my_gpus(), o);
  auto m = s.replicate<net>(ls::seed{1});
  const int me = world_rank();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto t0 = steady_clock::now();
  std::string what;
  try {
    s.run_each([&](std::size_t r) {
      if (me == 1) std::this_thread::sleep_for(2 * limit);
      auto& rep = m.replica(r);
      s.all_reduce(r, rep.context(), rep.model().gradients().data(), m.param_count);
    });
  } catch (const ls::error& e) {
    what = e.what();
  }
  const auto waited = duration_cast<milliseconds>(steady_clock::now() - t0);
  INFO("rank " << me << " after " << waited.count() << " ms: " << what);
  CHECK_FALSE(what.empty());
  CHECK(what.find("rank " + std::to_string(me)) != std::string::npos);
  if (me == 0) CHECK(what.find("timed out") != std::string::npos);
  CHECK(waited < 2 * limit + limit + seconds(20));  // the late rank's sleep, its own timeout, slack
  CHECK_THROWS_AS(s.barrier(), ls::config_error);   // unusable: end the job
  MPI_Barrier(MPI_COMM_WORLD);
}

// MPI first; then every rank decides together whether the job can run (see the file comment).
int main(int argc, char** argv) {
  ls::mpi_environment env(argc, argv);
  const placement p = place();
  const int ok_here = p.ordinals.empty() ? 0 : 1;
  int ok = 0;
  MPI_Allreduce(&ok_here, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!ok) {
    if (p.gpus == 0)
      std::printf("rank %d: skipped: no CUDA device: %s\n", world_rank(), ls::backend::cuda_unavailable_reason().c_str());
    else if (!ok_here)
      std::printf("rank %d: skipped: needs %d CUDA devices (one per worker of this machine; NCCL refuses two workers on "
                  "one GPU), found %d\n", world_rank(), p.local_size, p.gpus);
    else
      std::printf("rank %d: skipped: another worker's machine has fewer GPUs than workers\n", world_rank());
    std::fflush(stdout);
    return 77;
  }
  std::printf("lockstep-gpu-case: ran with %d CUDA device(s) on rank %d\n", p.gpus, world_rank());
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}
