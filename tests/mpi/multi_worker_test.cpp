// multi_worker_mirrored under mpirun (-np 2 and -np 3): training equals single-process training
// on the same global batches, exactly-once delivery across workers, evaluate over every worker
// (and its refusal of workers given different data),
// chief-only outputs and a checkpoint written by W workers resumed by one; gradient accumulation
// with clipping bitwise the big batch of one process, and the non-finite guard's decision on
// every worker; after a failed step, config_error from every later call; fit refuses workers that
// would start at different positions or were given different options.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <sys/mman.h>

#include <doctest/doctest.h>

#include <lockstep/distribute/multi_worker.hpp>
#include <lockstep/lockstep.hpp>
#include <lockstep/testing/recipe.hpp>

#include "distribute/common.hpp"
#include "support/mpi.hpp"
#include "support/plain_sgd.hpp"
#include "support/user_reducer.hpp"

namespace {

namespace ls = lockstep;
using dist_test::make_batch;
using dist_test::mlp;
using dist_test::mlp_dropout;
using test_support::same_on_every_rank;
using test_support::world_rank;
using test_support::world_size;



// Global batch sizes of the 20 steps: full, uneven, fewer rows than replicas, an uneven last one.
const std::vector<std::size_t> sizes{64, 64, 48, 33, 64, 17, 64, 64, 5, 64, 64, 3, 64, 64, 1, 64, 2, 64, 64, 37};

// 20 steps through strategy s (its own shards of each global batch); every replica identical.
template <class Net, class S, class Opt>
std::vector<float> train20(S& s, const Opt& opt) {
  auto m = s.template replicate<Net>(ls::seed{42});
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const ls::shard_plan p = s.plan();
    const auto db = ls::data::detail::make_sharded(make_batch(sizes[i], i), p.parts, p.first, s.num_replicas());
    const auto st = ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, db);
    CHECK(st.count == sizes[i]);
    CHECK(std::isfinite(st.loss_sum));
  }
  auto p = m.parameters_to_host();
  for (std::size_t r = 1; r < m.size(); ++r)
    CHECK(std::equal(p.begin(), p.end(), m.replica(r).model().parameters().data()));
  return p;
}

// The largest |a - b| of two parameter vectors.
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::fabs(a[i] - b[i])));
  return d;
}

}  // namespace

TEST_CASE("multi_worker: MPI provides the thread level it needs; the strategy describes the job") {
  ls::multi_worker_mirrored<ls::cpus> s;
  CHECK(s.world().thread_level() >= MPI_THREAD_SERIALIZED);
  CHECK(s.world().size() == static_cast<std::size_t>(world_size()));
  CHECK(s.world().rank() == static_cast<std::size_t>(world_rank()));
  CHECK(s.world().is_chief() == (world_rank() == 0));
  CHECK(s.world().global_replicas() == s.world().size());
  // mpirun here starts every worker on this machine: the shared-memory path unless told otherwise
  CHECK(s.world().shares_memory() == (world_size() > 1 && std::getenv("LOCKSTEP_MPI_NO_SHM") == nullptr));
  static_assert(ls::strategy<ls::multi_worker_mirrored<ls::cpus>>);
  MESSAGE("MPI thread level: " << std::string(ls::mpi_thread_level_name(s.world().thread_level())));
}

TEST_CASE("multi_worker run_to_run: 20 steps equal one process on the same global batches (1e-5)") {
  const ls::adam opt{.lr = 1e-3f};
  ls::one_device<ls::cpu<0>> single;
  const auto ref = train20<mlp_dropout>(single, opt);
  for (std::size_t local : {1u, 2u}) {
    CAPTURE(local);
    ls::strategy_options o;
    o.bucket_bytes = 4096;  // several buckets: their reductions overlap the backward pass
    ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(local), o);
    const auto got = train20<mlp_dropout>(s, opt);
    CHECK(max_diff(got, ref) < 1e-5);
    CHECK(same_on_every_rank(got));
    // run to run: a second run gives the same bits
    ls::multi_worker_mirrored<ls::cpus> again(ls::device_selection::first(local), o);
    CHECK(train20<mlp_dropout>(again, opt) == got);
  }
}

TEST_CASE("multi_worker replica_count_invariant: workers x replicas give bitwise one process's parameters") {
  const ls::adam opt{.lr = 1e-3f};
  ls::strategy_options o;
  o.micro_shard_rows = 8;
  ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus> single(
      ls::device_selection::first(1), o);
  const auto ref = train20<mlp_dropout>(single, opt);
  ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus> four(
      ls::device_selection::first(4), o);
  CHECK(train20<mlp_dropout>(four, opt) == ref);  // 1 x 4
  for (std::size_t local : {1u, 2u}) {            // W x 1 and W x 2 (with -np 2: 2 x 1, 2 x 2; -np 4: 4 x 1)
    CAPTURE(local);
    ls::multi_worker_mirrored<ls::cpus, ls::determinism::replica_count_invariant> s(ls::device_selection::first(local), o);
    CHECK(train20<mlp_dropout>(s, opt) == ref);
  }
}

// A CNN with batch norm on 28 x 28 rows: its statistics span every replica of every worker.
using cnn_bn = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<2, 5, 3, 0>, ls::batch_norm<>, ls::relu,
                              ls::max_pool2d<2>, ls::flatten, ls::dense<32, 10>>;

TEST_CASE("multi_worker run_to_run: batch norm over the global batch of every worker equals one process (1e-5)") {
  // SGD: the convolution's biases, followed by batch norm, have gradients that are zero up to
  // rounding, which Adam would scale up to full steps.
  const ls::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  ls::one_device<ls::cpu<0>> single;
  const auto ref = train20<cnn_bn>(single, opt);  // parameters, then the running statistics
  for (std::size_t local : {1u, 2u}) {
    CAPTURE(local);
    ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(local));
    const auto got = train20<cnn_bn>(s, opt);
    CHECK(max_diff(got, ref) < 1e-5);
    CHECK(same_on_every_rank(got));
  }
}

TEST_CASE("multi_worker run_to_run: batch norm below a reduced bucket, with workers of 1 and 2 replicas, equals one process (1e-5)") {
  // A bucket per layer: the dense layer's bucket is reduced while batch norm's backward exchanges rows
  // with the other workers. A worker of one replica hands the bucket to its communication thread
  // at once; one of two replicas only when both finished their local part, which the exchange
  // must not overtake (else the workers' collectives differ and both wait until the timeout).
  const ls::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  ls::one_device<ls::cpu<0>> single;
  const auto ref = train20<cnn_bn>(single, opt);
  ls::strategy_options o;
  o.bucket_bytes = 0;  // every layer with parameters its own bucket
  o.timeout = std::chrono::seconds(20);
  const std::size_t local = world_rank() % 2 == 0 ? 1 : 2;
  CAPTURE(local);
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(local), o);
  const auto got = train20<cnn_bn>(s, opt);
  CHECK(max_diff(got, ref) < 1e-5);
  CHECK(same_on_every_rank(got));
}

TEST_CASE("multi_worker replica_count_invariant: a network with batch norm is a config_error naming it") {
  ls::multi_worker_mirrored<ls::cpus, ls::determinism::replica_count_invariant> s(ls::device_selection::first(1));
  auto m = s.replicate<cnn_bn>(ls::seed{1});
  const ls::shard_plan p = s.plan();
  const auto db = ls::data::detail::make_sharded(make_batch(8, 0), p.parts, p.first, s.num_replicas());
  try {
    (void)ls::train_step(s, m, ls::adam{}, ls::softmax_cross_entropy{}, db);
    FAIL("no exception");
  } catch (const ls::replica_error& e) {
    CHECK(std::string(e.what()).find("batch_norm") != std::string::npos);
  }
}

TEST_CASE("multi_worker: every sample of an epoch reaches exactly one replica of one worker") {
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(2));
  std::vector<std::uint64_t> all = test_support::gather_all(
      test_support::indices_seen(s, sizes.size(), [](std::size_t i) { return make_batch(sizes[i], i); }));
  std::sort(all.begin(), all.end());
  CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());
  std::vector<std::uint64_t> want;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    for (std::size_t r = 0; r < sizes[i]; ++r) want.push_back(i * 1000 + r);
  CHECK(all == want);

  // strategy.shard() cuts the same way (plan()): a custom loop over it covers every sample once
  // (it cut each batch over this worker's replicas only: every worker trained every sample).
  std::vector<ls::data::batch> batches;
  for (std::size_t i = 0; i < sizes.size(); ++i) batches.push_back(make_batch(sizes[i], i));
  std::vector<std::uint64_t> mine;
  for (auto&& db : s.shard(batches)) {
    CHECK(db.shards.size() == s.num_replicas());
    const auto seen = s.run([](std::size_t, const ls::data::shard& sh) {
      return std::vector<std::uint64_t>(sh.indices, sh.indices + sh.size);
    }, db);
    for (const auto& v : seen) mine.insert(mine.end(), v.begin(), v.end());
  }
  std::vector<std::uint64_t> through_shard = test_support::gather_all(mine);
  std::sort(through_shard.begin(), through_shard.end());
  CHECK(through_shard == want);
}

namespace {
// A dataset of the 20 test batches (every epoch the same), for fit and evaluate.
struct twenty_batches {
  ls::data::generator<ls::data::batch> epoch(std::uint64_t) const {
    for (std::size_t i = 0; i < sizes.size(); ++i) co_yield make_batch(sizes[i], i);
  }
};
}  // namespace

TEST_CASE("multi_worker: fit and evaluate cover every worker's samples; only rank 0 writes; a checkpoint of W workers resumes on one") {
  const ls::adam opt{.lr = 1e-3f};
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1));
  // One directory for the whole job: rank 0's name, broadcast.
  const auto dir = test_support::fresh_job_directory("lockstep-mpi-test-");

  ls::one_device<ls::cpu<0>> single;
  auto ref = single.replicate<mlp>(ls::seed{7});
  const auto ref_hist = ls::fit(single, ref, opt, ls::softmax_cross_entropy{}, twenty_batches{},
                                {.epochs = 2, .validation = twenty_batches{}, .quiet = true});

  auto m = s.replicate<mlp>(ls::seed{7});
  ls::fit_options fo{.epochs = 1, .validation = twenty_batches{}, .quiet = true};
  fo.checkpoint_dir = (dir / "ckpt").string();
  fo.metrics_file = (dir / ("metrics-" + std::to_string(s.world().rank()) + ".jsonl")).string();
  const auto h1 = ls::fit(s, m, opt, ls::softmax_cross_entropy{}, twenty_batches{}, fo);
  s.barrier();
  REQUIRE(h1.epochs.size() == 1);
  CHECK(h1.epochs[0].samples == ref_hist.epochs[0].samples);
  CHECK(h1.epochs[0].val_samples == ref_hist.epochs[0].val_samples);
  CHECK(std::fabs(h1.epochs[0].train_loss - ref_hist.epochs[0].train_loss) < 1e-6);
  CHECK(std::fabs(h1.epochs[0].train_accuracy - ref_hist.epochs[0].train_accuracy) < 1e-12);
  CHECK(std::fabs(h1.epochs[0].val_loss - ref_hist.epochs[0].val_loss) < 1e-5);
  CHECK(std::filesystem::exists(dir / "metrics-0.jsonl"));
  for (int r = 1; r < world_size(); ++r) CHECK_FALSE(std::filesystem::exists(dir / ("metrics-" + std::to_string(r) + ".jsonl")));

  const auto ev = ls::evaluate(s, m, ls::softmax_cross_entropy{}, twenty_batches{});
  std::uint64_t total = 0;
  for (const auto n : sizes) total += n;
  CHECK(ev.samples == total);
  CHECK(std::fabs(ev.loss - ls::evaluate(single, ref, ls::softmax_cross_entropy{}, twenty_batches{}).loss) < 1.0);

  // Resume the 2-worker checkpoint in one process (each rank on its own), finish epoch 2.
  auto solo_m = single.replicate<mlp>(ls::seed{7});
  ls::fit_options ro{.epochs = 2, .quiet = true};
  ro.checkpoint_dir = (dir / "ckpt").string();
  ro.resume = true;
  // Resuming writes a checkpoint; give every rank its own copy of the directory.
  const auto mine = dir / ("resume-" + std::to_string(s.world().rank()));
  std::filesystem::copy(dir / "ckpt", mine);
  ro.checkpoint_dir = mine.string();
  const auto h2 = ls::fit(single, solo_m, opt, ls::softmax_cross_entropy{}, twenty_batches{}, ro);
  CHECK(h2.resumed_from_step == 20);
  CHECK(max_diff(solo_m.parameters_to_host(), ref.parameters_to_host()) < 1e-5);
  test_support::remove_job_directory(dir);
}

// softmax cross-entropy whose evaluation throws a data_error.
struct throwing_loss {
  using loss_concept = ls::loss_tag;
  static constexpr std::size_t scratch_per_row = ls::softmax_cross_entropy::scratch_per_row;
  template <class T, class Ctx, class Shape>
  ls::loss_sum evaluate(Ctx&, const ls::loss_args<T, Ctx, Shape>&) const {
    throw ls::data_error("injected failure in the loss");
  }
};

namespace {
// The first `count` of the 20 test batches, batch i drawn with key i + `shift` (other rows).
struct some_batches {
  std::size_t count = 20;
  std::uint64_t shift = 0;
  ls::data::generator<ls::data::batch> epoch(std::uint64_t) const {
    for (std::size_t i = 0; i < count; ++i) co_yield make_batch(sizes[i], i + shift);
  }
};
}  // namespace

TEST_CASE("multi_worker: evaluate refuses workers given different data (config_error on every worker, not mixed metrics)") {
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1));
  auto m = s.replicate<mlp>(ls::seed{7});
  const auto refused = [&](const some_batches& d) {
    std::string message;
    try {
      (void)ls::evaluate(s, m, ls::softmax_cross_entropy{}, d);
      FAIL("the workers' different data was evaluated");
    } catch (const ls::config_error& e) {
      message = e.what();
    }
    s.barrier();  // the check's collective completed on every worker
    return message;
  };
  const int last = world_size() - 1;
  // The last worker's dataset is one batch shorter.
  std::string message = refused(some_batches{.count = world_rank() == last ? 19u : 20u});
  CAPTURE(message);
  CHECK(message.find("worker rank " + std::to_string(last) + "'s number of evaluation batches is 19, rank 0's is 20") !=
        std::string::npos);
  CHECK(message.find("every worker must evaluate the same data") != std::string::npos);
  // As many batches of the same sizes, but other rows.
  message = refused(some_batches{.shift = world_rank() == last ? 1u : 0u});
  CHECK(message.find("worker rank " + std::to_string(last) +
                     "'s evaluation rows (the dataset index of every row, batch by batch) differs from rank 0's") !=
        std::string::npos);
  // The same data everywhere: every sample counted once, the same result on every worker.
  const auto ev = ls::evaluate(s, m, ls::softmax_cross_entropy{}, some_batches{});
  std::uint64_t total = 0;
  for (const auto n : sizes) total += n;
  CHECK(ev.samples == total);
  CHECK(same_on_every_rank(std::vector<float>{static_cast<float>(ev.loss)}));
}

TEST_CASE("multi_worker: fit refuses workers whose pipelines gave different batches, at the end of the epoch (config_error, not mixed batches)") {
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1));
  const ls::adam opt{.lr = 1e-3f};
  const int last = world_size() - 1;
  // The last worker's pipeline gives as many batches of the same sizes, but other rows (as a
  // shuffle seeded per worker would): every collective matches, the global batches do not.
  auto m = s.replicate<mlp>(ls::seed{7});
  std::string message;
  try {
    (void)ls::fit(s, m, opt, ls::softmax_cross_entropy{}, some_batches{.shift = world_rank() == last ? 1u : 0u},
                  {.epochs = 2, .quiet = true});
    FAIL("workers whose pipelines differ were trained");
  } catch (const ls::config_error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("worker rank " + std::to_string(last) + "'s the dataset indices of epoch 0's batches differs from rank 0's") !=
        std::string::npos);
  CHECK(message.find("the same dataset, batch size and shuffle seed") != std::string::npos);
  CHECK(m.step() == sizes.size());  // found at the end of the first epoch, on every worker
  s.barrier();
  // The same pipeline on every worker: accepted.
  auto again = s.replicate<mlp>(ls::seed{7});
  (void)ls::fit(s, again, opt, ls::softmax_cross_entropy{}, some_batches{}, {.epochs = 2, .quiet = true});
  CHECK(again.step() == 2 * sizes.size());
  CHECK(same_on_every_rank(again.parameters_to_host()));
}

TEST_CASE("multi_worker: broadcast gives rank 0's optimiser state to a worker that has made none yet") {
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1));
  auto m = s.replicate<mlp>(ls::seed{7});
  const ls::adam opt{.lr = 1e-3f};
  const auto value = [](std::size_t i) { return static_cast<float>(i % 7) * 0.25f; };
  if (world_rank() == 0) {  // only rank 0 has made its state (the others would make theirs at their first update)
    m.replica(0).reset_optimizer_state(opt);
    auto& st = m.replica(0).optimizer_state();
    for (std::size_t i = 0; i < st.size(); ++i) st.data()[i] = value(i);
  }
  s.broadcast(m);
  const auto& st = m.replica(0).optimizer_state();
  CHECK(st.size() == opt.state_size(ls::model<mlp>::param_count));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < st.size(); ++i) wrong += st.data()[i] != value(i);
  CHECK(wrong == 0);
  CHECK(same_on_every_rank(m.parameters_to_host()));
}

TEST_CASE("multi_worker: broadcast with workers of 1 and 2 replicas: a mixed sharding or a root rank 0 lacks is a config_error on every worker") {
  // Adam under automatic sharding: the workers of 2 replicas shard their update, those of 1 do not
  // (a broadcast of rank 0's whole state into a slice overflowed it).
  const std::size_t local = world_rank() % 2 == 0 ? 1 : 2;
  const ls::adam opt{.lr = 1e-3f};
  const auto trained = [&](ls::strategy_options o) {
    auto s = std::make_unique<ls::multi_worker_mirrored<ls::cpus>>(ls::device_selection::first(local), o);
    auto m = s->replicate<mlp>(ls::seed{7});
    const ls::shard_plan p = s->plan();
    (void)ls::train_step(*s, m, opt, ls::softmax_cross_entropy{},
                         ls::data::detail::make_sharded(make_batch(16, 0), p.parts, p.first, s->num_replicas()));
    return std::make_pair(std::move(s), std::move(m));
  };
  {
    auto [s, m] = trained({});
    CHECK(m.optimizer_sharded() == (local == 2));
    CHECK_THROWS_WITH_AS(s->broadcast(m), doctest::Contains("workers shard their optimiser update and the others do not"),
                         ls::config_error);
    s->barrier();  // refused before any broadcast: every worker still usable
  }
  ls::strategy_options unsharded;
  unsharded.shard_optimizer = false;
  auto [s, m] = trained(unsharded);
  CHECK_THROWS_WITH_AS(s->broadcast(m, 1), doctest::Contains("root 1 is not a replica of worker rank 0"), ls::config_error);
  s->broadcast(m);
  CHECK(same_on_every_rank(m.parameters_to_host()));
  CHECK(same_on_every_rank(m.optimizer_state_to_host()));
  s->barrier();
}

TEST_CASE("multi_worker: after a failed step the strategy refuses further use with a config_error, barrier() too") {
  // Every worker's replica fails in the same step before any collective of it starts, so no
  // worker waits for another; each worker's step reports a replica_error naming its rank.
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1));
  auto m = s.replicate<mlp>(ls::seed{42});
  const ls::shard_plan p = s.plan();
  const auto db = ls::data::detail::make_sharded(make_batch(8, 0), p.parts, p.first, s.num_replicas());
  std::string message;
  try {
    (void)ls::train_step(s, m, ls::sgd{.lr = 0.1f}, throwing_loss{}, db);
    FAIL("the failing step returned");
  } catch (const ls::replica_error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("rank " + std::to_string(world_rank())) != std::string::npos);
  CHECK(message.find("injected failure in the loss") != std::string::npos);
  CHECK_THROWS_AS(s.barrier(), ls::config_error);
  CHECK_THROWS_AS((void)ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, db), ls::config_error);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("multi_worker: a timeout that is not positive is a config_error on every worker, before any collective") {
  // Checked when the strategy was made, after the communication thread's first collective, which
  // then timed out on some workers only (a timeout_error there, a config_error elsewhere).
  for (const long ms : {0L, -5L}) {
    CAPTURE(ms);
    ls::strategy_options o;
    o.timeout = std::chrono::milliseconds(ms);
    CHECK_THROWS_WITH_AS(ls::multi_worker_mirrored<ls::cpus>(ls::device_selection::first(1), o),
                         doctest::Contains("strategy_options::timeout must be positive"), ls::config_error);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1));  // MPI is still usable
  s.barrier();
}

TEST_CASE("multi_worker: workers whose collective plans differ get a config_error naming the field, not a hang") {
  ls::strategy_options o;
  if (world_rank() == 1) o.bucket_bytes = 4096;  // rank 1 would cut its gradients into other buckets
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1), o);
  std::string message;
  try {
    (void)s.replicate<mlp>(ls::seed{42});
    FAIL("the workers' differing plans were accepted");
  } catch (const ls::config_error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("rank 1's bucket_bytes is 4096") != std::string::npos);
  CHECK(message.find("rank 0's is 4194304") != std::string::npos);
  // The check's collective completed on every worker: the strategy is still usable.
  s.barrier();
}

namespace {
// Adam whose hyperparameters() fails on rank 1 (the start plan cannot be made there).
struct picky_adam : ls::adam {
  std::string hyperparameters() const {
    if (world_rank() == 1) throw std::runtime_error("picky_adam: no hyperparameters on rank 1");
    return ls::adam::hyperparameters();
  }
};
}  // namespace

TEST_CASE("multi_worker: fit refuses workers that would start at different steps or count updates differently (config_error, not a hang)") {
  const ls::adam opt{.lr = 1e-3f};
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1));
  const auto dir = test_support::fresh_job_directory("lockstep-mpi-agree-");
  const std::string rank = std::to_string(world_rank());
  // Each worker names its own checkpoint directory: only the chief writes, so the others' stay empty.
  const auto own = dir / ("ckpt-" + rank);
  auto m = s.replicate<mlp>(ls::seed{7});
  ls::fit_options fo{.epochs = 1, .quiet = true};
  fo.checkpoint_dir = own.string();
  (void)ls::fit(s, m, opt, ls::softmax_cross_entropy{}, twenty_batches{}, fo);
  s.barrier();
  REQUIRE(m.step() == 20);

  // A fit of a fresh model with options `o`, optimizer `op` and loss `loss`, refused on every worker.
  const auto refused_with = [&](ls::fit_options o, const auto& op, const auto& loss) {
    auto fresh = s.replicate<mlp>(ls::seed{7});
    const std::vector<float> before = fresh.parameters_to_host();
    std::string message;
    try {
      (void)ls::fit(s, fresh, op, loss, twenty_batches{}, o);
      FAIL("the workers' differing runs were accepted");
    } catch (const ls::config_error& e) {
      message = e.what();
    }
    CHECK(fresh.step() == 0);  // nothing trained, nothing restored on the worker that found a checkpoint
    CHECK(fresh.parameters_to_host() == before);
    s.barrier();  // the check's collective completed on every worker: the strategy is still usable
    return message;
  };
  const auto refused = [&](ls::fit_options o) { return refused_with(std::move(o), opt, ls::softmax_cross_entropy{}); };
  // A resume on workers that do not share checkpoint_dir: rank 0 would continue from step 20,
  // the others from step 0, and wait at the end for collectives rank 0 never starts.
  ls::fit_options ro{.epochs = 2, .quiet = true};
  ro.checkpoint_dir = own.string();
  ro.resume = true;
  std::string message = refused(ro);
  CAPTURE(message);
  CHECK(message.find("rank 1's step to start from (the checkpoint's, when resuming) is 0, rank 0's is 20") !=
        std::string::npos);
  CHECK(message.find("keep checkpoint_dir on a file system that every worker shares") != std::string::npos);
  // Options that change the number of updates.
  ls::fit_options eo{.epochs = world_rank() == 1 ? 3u : 2u, .quiet = true};
  message = refused(eo);
  CHECK(message.find("rank 1's fit_options::epochs is 3, rank 0's is 2") != std::string::npos);
  ls::fit_options ao{.epochs = 1, .quiet = true};
  ao.accumulate = world_rank() == 1 ? 2 : 1;
  message = refused(ao);
  CHECK(message.find("rank 1's fit_options::accumulate is 2, rank 0's is 1") != std::string::npos);
  // The pipeline's seed: the workers' shards would come from different orders (samples trained
  // twice or never), and a resume would be refused on some workers only.
  ls::fit_options so{.epochs = 1, .quiet = true};
  so.data_seed = world_rank() == 1 ? 5 : 4;
  message = refused(so);
  CHECK(message.find("rank 1's fit_options::data_seed is 5, rank 0's is 4") != std::string::npos);
  // Options that change the update: the replicas would drift apart without a word.
  ls::fit_options co{.epochs = 1, .quiet = true};
  co.clip_global_norm = world_rank() == 1 ? 1.0 : 0.0;
  message = refused(co);
  CHECK(message.find("rank 1's fit_options::clip_global_norm differs from rank 0's") != std::string::npos);
  // The optimizer's other hyperparameters: rank 1's Adam has another beta2.
  message = refused_with({.epochs = 1, .quiet = true}, ls::adam{.lr = 1e-3f, .beta2 = world_rank() == 1 ? 0.99f : 0.999f},
                         ls::softmax_cross_entropy{});
  CHECK(message.find("rank 1's the optimizer's other hyperparameters differs from rank 0's") != std::string::npos);
  // The loss's options: rank 1 smooths its labels, so the all-reduce would add two losses' gradients.
  message = refused_with({.epochs = 1, .quiet = true}, ls::sgd{.lr = 1e-2f},
                         ls::softmax_cross_entropy{.label_smoothing = world_rank() == 1 ? 0.1f : 0.0f});
  CHECK(message.find("rank 1's the loss's hyperparameters differs from rank 0's") != std::string::npos);

  // A setup that fails on some workers only: they raise their own error, the others a
  // config_error naming the first of them, and none waits for another.
  ls::fit_options zo{.epochs = 1, .quiet = true};
  zo.accumulate = world_rank() == 1 ? 0 : 1;
  message = refused(zo);
  CHECK(message.find(world_rank() == 1 ? "fit_options::accumulate must be >= 1"
                                       : "rank 1's fit's setup failed (1: yes; that worker raises its own error) is 1, "
                                         "rank 0's is 0") != std::string::npos);
  // The start plan itself fails to be made on rank 1 (a user optimiser's hyperparameters() throws):
  // rank 1 raises that error, the others a config_error naming it.
  {
    auto fresh = s.replicate<mlp>(ls::seed{7});
    std::string what;
    try {
      (void)ls::fit(s, fresh, picky_adam{}, ls::softmax_cross_entropy{}, twenty_batches{},
                    ls::fit_options{.epochs = 1, .quiet = true});
      FAIL("a plan that failed on one worker was accepted");
    } catch (const std::exception& e) {
      what = e.what();
    }
    CHECK(fresh.step() == 0);
    CHECK(what.find(world_rank() == 1 ? "picky_adam: no hyperparameters on rank 1"
                                      : "rank 1's fit's setup failed (1: yes; that worker raises its own error) is 1") !=
          std::string::npos);
    s.barrier();
  }
  // Without resume, only rank 0 finds the earlier run's checkpoints in its directory.
  ls::fit_options no{.epochs = 1, .quiet = true};
  no.checkpoint_dir = own.string();
  message = refused(no);
  CHECK(message.find(world_rank() == 0 ? "holds checkpoints of another run" : "setup failed (1: yes; that worker "
                                                                              "raises its own error) is 0, rank 0's is 1") !=
        std::string::npos);

  // A checkpoint of the same step but of another run (another learning rate) in rank 1's own
  // directory, written by a run of rank 1 alone: the steps agree, the parameters do not.
  if (world_rank() == 1) {
    ls::one_device<ls::cpu<0>> alone;
    auto other = alone.replicate<mlp>(ls::seed{7});
    ls::fit_options lo{.epochs = 1, .quiet = true};
    lo.checkpoint_dir = own.string();
    (void)ls::fit(alone, other, ls::adam{.lr = 2e-3f}, ls::softmax_cross_entropy{}, twenty_batches{}, lo);
    REQUIRE(other.step() == 20);
  }
  s.barrier();
  message = refused(ro);
  CHECK(message.find("rank 1's the parameters of the checkpoint resumed differs from rank 0's") != std::string::npos);

  // Options that cannot act in the run may differ: top_k without validation, max_consecutive_skips
  // without the skip policy, the EMA's schedule without an EMA.
  {
    ls::fit_options io{.epochs = 1, .quiet = true};
    io.top_k = world_rank() == 1 ? 3 : 5;
    io.max_consecutive_skips = world_rank() == 1 ? 7 : 20;
    io.ema.every = world_rank() == 1 ? 2 : 1;
    auto fresh = s.replicate<mlp>(ls::seed{7});
    (void)ls::fit(s, fresh, opt, ls::softmax_cross_entropy{}, twenty_batches{}, io);
    CHECK(fresh.step() == 20);
    CHECK(same_on_every_rank(fresh.parameters_to_host()));
  }

  // One directory that every worker sees: every worker resumes at step 20.
  ro.checkpoint_dir = (dir / "ckpt-0").string();
  auto resumed = s.replicate<mlp>(ls::seed{7});
  const auto h = ls::fit(s, resumed, opt, ls::softmax_cross_entropy{}, twenty_batches{}, ro);
  CHECK(h.resumed_from_step == 20);
  CHECK(resumed.step() == 40);
  CHECK(same_on_every_rank(resumed.parameters_to_host()));
  test_support::remove_job_directory(dir);
}

TEST_CASE("multi_worker: a user's reducer of local replicas trains the workers like one process (1e-5)") {
  const ls::adam opt{.lr = 1e-3f};
  ls::one_device<ls::cpu<0>> single;
  const auto ref = train20<mlp_dropout>(single, opt);
  for (std::size_t local : {1u, 2u}) {
    CAPTURE(local);
    ls::strategy_options o;
    o.bucket_bytes = 4096;
    ls::multi_worker_mirrored<ls::cpus, ls::determinism::run_to_run, user::rendezvous_reducer> s(
        ls::device_selection::first(local), o);
    static_assert(std::is_same_v<typename decltype(s)::reducer_type, ls::over_workers<user::rendezvous_reducer>>);
    const auto got = train20<mlp_dropout>(s, opt);
    CHECK(max_diff(got, ref) < 1e-5);
    CHECK(same_on_every_rank(got));
  }
}

TEST_CASE("multi_worker: the sharded optimiser update over each worker's replicas is bitwise the unsharded one") {
  const ls::adam opt{.lr = 1e-3f};
  ls::strategy_options o;
  o.bucket_bytes = 4096;
  ls::multi_worker_mirrored<ls::cpus> plain(ls::device_selection::first(2), o);
  const auto ref = train20<mlp_dropout>(plain, opt);
  o.shard_optimizer = true;
  ls::multi_worker_mirrored<ls::cpus> sharded(ls::device_selection::first(2), o);
  CHECK(train20<mlp_dropout>(sharded, opt) == ref);
}

TEST_CASE("multi_worker replica_count_invariant: a worker holds its micro-shards and its slice, not every slot") {
  // The step policy on its own, over this job's world: 2 local replicas, 512 rows in micro-shards
  // of 8 (K = 64). Each worker holds its K/W slots of P floats, the K rows of its slice of the
  // parameters and the P-float sum; the old all-gather held K x P floats on every worker.
  ls::strategy_options o;
  o.micro_shard_rows = 8;
  ls::detail::mpi_channel channel(MPI_COMM_WORLD, o.timeout, 1024);
  ls::mpi_world world(channel, 2);
  ls::micro_shard_step<ls::mpi_world> step(2, o, world);
  std::vector<ls::host_context> contexts;
  for (int r = 0; r < 2; ++r) contexts.emplace_back(1, false);
  auto m = ls::replicated<mlp>(std::move(contexts), ls::seed{3}, o.bucket_bytes);
  ls::executor ex(2, false, [](void*) noexcept {}, [](void*) noexcept {}, nullptr);
  ls::single_device_reducer unused;
  const ls::shard_plan p = world.plan();
  const auto db = ls::data::detail::make_sharded(make_batch(512, 0), p.parts, p.first, 2);
  const ls::step_stats st =
      ls::run_update(step, ex, unused, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, db,
                     ls::pass_info::for_training(3, 0), ls::update_info{0.1f, 1, 1.0 / 512});
  CHECK(std::isfinite(st.loss_sum));
  constexpr std::size_t P = decltype(m)::param_count, K = 64;
  const std::size_t W = world.size();
  const auto [klo, khi] = world.micro_shards(K);
  const auto [mlo, mhi] = world.param_slice(P);
  CHECK(step.slot_bytes() == ((khi - klo) * P + K * (mhi - mlo) + P) * sizeof(float));
  CHECK(mhi - mlo <= P / W + 16);
  if (W >= 3) CHECK(step.slot_bytes() < K * P * sizeof(float));  // less than every slot on every worker
  MESSAGE("micro-shard step memory per worker: " << step.slot_bytes() << " bytes; every slot: " << K * P * sizeof(float));
}

namespace {

// Rows [lo, hi) of global batch b, sharded for strategy s.
template <class S>
ls::data::distributed_batch shards_of(S& s, const ls::data::batch& b, std::size_t lo, std::size_t hi) {
  const ls::shard_plan p = s.plan();
  return ls::data::detail::make_sharded(ls::testing::detail::rows_of(b, lo, hi), p.parts, p.first, s.num_replicas());
}

// A regression batch (6 features in [-1, 1), 3 targets), keyed by `key`.
ls::data::batch regression_batch(std::size_t rows, std::uint64_t key) {
  ls::data::batch b;
  b.width = 6;
  b.target_width = 3;
  const ls::counter_rng rng(91, key);
  for (std::size_t i = 0; i < rows * 6; ++i) b.features.push_back(2 * rng.uniform(i) - 1);
  for (std::size_t i = 0; i < rows * 3; ++i) b.targets.push_back(2 * rng.uniform(100000 + i) - 1);
  for (std::size_t r = 0; r < rows; ++r) b.indices.push_back(key * 1000 + r);
  return b;
}
using reg_net = ls::sequential<ls::dense<6, 8>, ls::relu, ls::dense<8, 3>>;

}  // namespace

TEST_CASE("multi_worker replica_count_invariant: gradient accumulation with clipping gives bitwise one process's big batch") {
  // 6 updates of 64 rows; micro-shards of 8 rows, so every batch of 64 / k rows is a multiple.
  // With -np 2: 2 x 1 x 2, 2 x 1 x 4, 2 x 2 x 2, 2 x 2 x 4 (workers x replicas x batches); -np 3 and
  // -np 4 (4 x 1 x 2, 4 x 1 x 4) likewise.
  const ls::adam opt{.lr = 2e-3f};
  ls::strategy_options o;
  o.micro_shard_rows = 8;
  ls::update_recipe recipe;
  recipe.clip_global_norm = 0.05;  // below these gradients' norms: every update clips
  recipe.nonfinite = ls::nonfinite_policy::skip;
  constexpr std::size_t updates = 6, rows = 64;
  ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus> single(
      ls::device_selection::first(1), o);
  auto ref = single.replicate<mlp_dropout>(ls::seed{42});
  std::vector<double> ref_norms, ref_losses;
  for (std::size_t u = 0; u < updates; ++u) {
    const auto b = make_batch(rows, 500 + u);
    const auto st = ls::train_step(single, ref, opt, ls::softmax_cross_entropy{}, shards_of(single, b, 0, rows), recipe);
    CHECK(st.clip_factor < 1);
    ref_norms.push_back(st.grad_norm);
    ref_losses.push_back(st.loss_sum);
  }
  const auto want = ref.parameters_to_host();
  for (const std::size_t local : {1u, 2u})
    for (const std::size_t k : {2u, 4u}) {
      CAPTURE(local);
      CAPTURE(k);
      ls::multi_worker_mirrored<ls::cpus, ls::determinism::replica_count_invariant> s(ls::device_selection::first(local), o);
      auto m = s.replicate<mlp_dropout>(ls::seed{42});
      for (std::size_t u = 0; u < updates; ++u) {
        const auto b = make_batch(rows, 500 + u);
        for (std::size_t j = 0; j + 1 < k; ++j)
          (void)ls::accumulate(s, m, ls::softmax_cross_entropy{}, shards_of(s, b, rows * j / k, rows * (j + 1) / k));
        const auto st = ls::train_step(s, m, opt, ls::softmax_cross_entropy{},
                                       shards_of(s, b, rows * (k - 1) / k, rows), recipe);
        CAPTURE(u);
        CHECK(st.count == rows);
        CHECK(st.grad_norm == ref_norms[u]);  // the same bits
        CHECK(st.loss_sum == ref_losses[u]);
      }
      const auto got = m.parameters_to_host();
      CHECK(got == want);
      CHECK(same_on_every_rank(got));
      for (std::size_t r = 1; r < m.size(); ++r) CHECK(std::equal(got.begin(), got.end(), m.replica(r).model().parameters().data()));
    }
}

TEST_CASE("multi_worker: a NaN in the last worker's shard skips the update on every worker; raise names that worker") {
  const auto batches = [](std::size_t u, std::size_t rows) { return regression_batch(rows, 700 + u); };
  const std::size_t last_row = 23;  // the last row of 24: the last replica of the last worker
  for (const std::size_t local : {1u, 2u}) {
    CAPTURE(local);
    ls::testing::recipe_check c;
    c.updates = 4;
    c.rows = 24;
    c.recipe.ema.decay = 0.5;
    {
      ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(local));
      CHECK(ls::testing::skip_decisions_agree<reg_net>(s, ls::adam{.lr = 1e-2f}, ls::mse{}, batches, 2, last_row, c));
    }
    {
      ls::multi_worker_mirrored<ls::cpus, ls::determinism::replica_count_invariant> s(
          ls::device_selection::first(local), ls::strategy_options{.micro_shard_rows = 2});
      CHECK(ls::testing::skip_decisions_agree<reg_net>(s, ls::adam{.lr = 1e-2f}, ls::mse{}, batches, 2, last_row, c));
    }
    // raise: a numerics_error on every worker, naming the last worker's last replica.
    ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(local));
    auto m = s.replicate<reg_net>(ls::seed{3});
    ls::update_recipe recipe;
    recipe.nonfinite = ls::nonfinite_policy::raise;
    auto b = batches(0, 24);
    b.features[last_row * 6] = std::numeric_limits<float>::quiet_NaN();
    const auto before = m.parameters_to_host();
    std::string msg;
    try {
      (void)ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::mse{}, shards_of(s, b, 0, 24), recipe);
      FAIL("no numerics_error");
    } catch (const ls::numerics_error& e) {
      msg = e.what();
    }
    CAPTURE(msg);
    const std::string who = "replica " + std::to_string(local - 1) + " of worker " + std::to_string(world_size() - 1);
    CHECK(msg.find(who) != std::string::npos);
    CHECK(m.parameters_to_host() == before);
    CHECK(m.step() == 0);
  }
}

TEST_CASE("multi_worker: fit's trace is written once, by the chief, with every worker's spans on its clock") {
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1));
  const auto dir = test_support::job_directory("lockstep-mpi-trace-");
  if (s.world().is_chief()) std::filesystem::create_directories(dir);
  s.barrier();
  auto m = s.replicate<mlp>(ls::seed{7});
  ls::fit_options fo{.epochs = 1, .quiet = true};
  // Each rank names its own file: only the chief's may exist afterwards.
  fo.trace_file = (dir / ("trace-" + std::to_string(s.world().rank()) + ".json")).string();
  fo.trace_steps = {2, 5};
  // The other workers start their clocks 300 ms after the chief's: only the offsets measured at
  // the start-up barrier put their spans next to the chief's.
  if (!s.world().is_chief()) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  (void)ls::fit(s, m, ls::sgd{.lr = 0.05f}, ls::softmax_cross_entropy{}, twenty_batches{}, fo);
  s.barrier();
  for (int r = 1; r < world_size(); ++r) CHECK_FALSE(std::filesystem::exists(dir / ("trace-" + std::to_string(r) + ".json")));
  if (s.world().is_chief()) {
    std::ifstream in(dir / "trace-0.json");
    std::ostringstream text;
    text << in.rdbuf();
    const std::string json = text.str();
    const auto count = [&](const std::string& what) {
      std::size_t n = 0;
      for (auto p = json.find(what); p != std::string::npos; p = json.find(what, p + what.size())) ++n;
      return n;
    };
    CHECK(count("\"name\":\"train_step\"") == 3 * static_cast<std::size_t>(world_size()));  // steps 2..4, every worker
    for (int r = 0; r < world_size(); ++r) {
      CAPTURE(r);
      CHECK(json.find("{\"name\":\"worker " + std::to_string(r) + "\"}") != std::string::npos);
      CHECK(json.find("\"ph\":\"X\",\"pid\":" + std::to_string(r) + ",") != std::string::npos);
    }
    // The workers' steps end together (a collective ends each): on the chief's clock, the k-th
    // train_step span of every worker ends within 100 ms of the chief's.
    std::vector<std::vector<double>> ends(static_cast<std::size_t>(world_size()));
    for (auto p = json.find("\"name\":\"train_step\""); p != std::string::npos;
         p = json.find("\"name\":\"train_step\"", p + 1)) {
      const auto open = json.rfind('{', p);
      const std::string ev = json.substr(open, p - open);
      const auto field = [&](const char* k) { return std::stod(ev.substr(ev.find(k) + std::strlen(k))); };
      ends[static_cast<std::size_t>(field("\"pid\":"))].push_back(field("\"ts\":") + field("\"dur\":"));
    }
    for (std::size_t w = 1; w < ends.size(); ++w) {
      REQUIRE(ends[w].size() == ends[0].size());
      for (std::size_t k = 0; k < ends[0].size(); ++k) CHECK(std::fabs(ends[w][k] - ends[0][k]) < 100e3);  // µs
    }
    std::filesystem::remove_all(dir);
  }
  s.barrier();
}

TEST_CASE("multi_worker mixed<fp16>: an overflow in the last worker's shard skips the update everywhere and halves the scale") {
  for (const std::size_t local : {1u, 2u}) {
    CAPTURE(local);
    ls::multi_worker_mirrored<ls::cpus, ls::determinism::replica_count_invariant> s(ls::device_selection::first(local),
                                                                                  ls::strategy_options{.micro_shard_rows = 4});
    auto m = s.replicate<mlp, ls::mixed<ls::fp16>>(ls::seed{9});
    std::size_t tries = 0;  // the first updates at 2^16 may overflow: train until one applies
    for (; tries < 20; ++tries)
      if (!ls::train_step(s, m, ls::adamw{.lr = 1e-3f}, ls::softmax_cross_entropy{},
                          shards_of(s, make_batch(24, 300 + tries), 0, 24))
               .skipped)
        break;
    REQUIRE(tries < 20);
    const double scale = m.scaler().scale();
    const auto before = m.parameters_to_host();
    // The last two rows (the last replica of the last worker) saturate the softmax at two labels:
    // a gradient of -1 times 2^16 overflows fp16 in that replica's backward GEMM.
    auto b = make_batch(24, 400);
    for (std::size_t f = 0; f < 784; ++f) b.features[22 * 784 + f] = b.features[23 * 784 + f] = 30.0f;
    b.labels[22] = 0;
    b.labels[23] = 1;
    const auto st = ls::train_step(s, m, ls::adamw{.lr = 1e-3f}, ls::softmax_cross_entropy{}, shards_of(s, b, 0, 24));
    CHECK(st.skipped);
    CHECK(m.scaler().scale() == scale / 2);
    CHECK(same_on_every_rank(std::vector<float>{static_cast<float>(m.scaler().scale())}));
    const auto after = m.parameters_to_host();
    CHECK(after == before);
    CHECK(same_on_every_rank(after));
    const auto next = ls::train_step(s, m, ls::adamw{.lr = 1e-3f}, ls::softmax_cross_entropy{},
                                     shards_of(s, make_batch(24, 401), 0, 24));
    CHECK(!next.skipped);
    CHECK(same_on_every_rank(m.parameters_to_host()));
  }
}

namespace {

// Value i of local replica r on this worker: not exactly representable sums, so the order shows.
float window_value(std::size_t r, std::size_t i) {
  return 1.0f / static_cast<float>(1 + i % 97 + 3 * static_cast<std::size_t>(world_rank()) + 11 * r) +
         static_cast<float>(i % 5) * 0.37f;
}

}  // namespace

TEST_CASE("multi_worker: on one machine local replica 0's gradients live in the shared window and are summed in place, the bits of the copying sum") {
  const bool shm = world_size() > 1 && std::getenv("LOCKSTEP_MPI_NO_SHM") == nullptr;
  constexpr std::size_t P = ls::model<mlp>::param_count;
  for (std::size_t local : {1u, 2u}) {
    CAPTURE(local);
    ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(local));
    auto m = s.replicate<mlp>(ls::seed{5});
    CHECK(m.replica(0).model().gradients().owns_memory() == !shm);
    for (std::size_t r = 1; r < local; ++r) CHECK(m.replica(r).model().gradients().owns_memory());
    float* window = m.replica(0).model().gradients().data();
    for (const auto& [offset, count] : {std::pair<std::size_t, std::size_t>{0, 1}, {0, 15}, {3, 16}, {5, 17}, {16, 1000},
                                        {1, 4099}, {P - 31, 31}, {0, P}}) {
      CAPTURE(offset);
      CAPTURE(count);
      // in place in the window (replica 0) and, as a reference, the same values from private memory
      std::vector<std::vector<float>> own(local, std::vector<float>(count)), copied(local, std::vector<float>(count));
      for (std::size_t r = 0; r < local; ++r)
        for (std::size_t i = 0; i < count; ++i) own[r][i] = copied[r][i] = window_value(r, offset + i);
      std::fill(window, window + P, -3.0f);
      std::copy(own[0].begin(), own[0].end(), window + offset);
      s.run_each([&](std::size_t r) {
        ls::host_context ctx;
        s.all_reduce(r, ctx, r == 0 ? window + offset : own[r].data(), count);
      });
      s.run_each([&](std::size_t r) {
        ls::host_context ctx;
        s.all_reduce(r, ctx, copied[r].data(), count);
      });
      CHECK(std::equal(copied[0].begin(), copied[0].end(), window + offset));  // the same bits
      std::size_t outside = 0, far = 0;
      for (std::size_t i = 0; i < P; ++i) outside += (i < offset || i >= offset + count) && window[i] != -3.0f;
      CHECK(outside == 0);  // nothing outside the bucket was written
      for (std::size_t i = 0; i < count; ++i) {
        double want = 0;  // every local replica of every worker
        for (int w = 0; w < world_size(); ++w)
          for (std::size_t r = 0; r < local; ++r)
            want += 1.0 / static_cast<double>(1 + (offset + i) % 97 + 3 * static_cast<std::size_t>(w) + 11 * r) +
                    static_cast<double>((offset + i) % 5) * 0.37;
        far += std::fabs(static_cast<double>(window[offset + i]) - want) > 1e-5 * std::max(1.0, std::fabs(want));
      }
      CHECK(far == 0);
      for (std::size_t r = 1; r < local; ++r) CHECK(own[r] == copied[0]);
      CHECK(same_on_every_rank(copied[0]));
    }
  }
  {
    // a model that outlives its strategy keeps its window until it is dropped (on every worker alike)
    auto m = [] {
      ls::multi_worker_mirrored<ls::cpus> s;
      return s.replicate<mlp>(ls::seed{6});
    }();
    m.replica(0).model().gradients()[P - 1] = 1.0f;
    CHECK(m.parameters_to_host().size() == m.stored_count);
  }
  if (shm) {
    // workers summing different parts of their windows: an error naming both, not wrong sums
    ls::multi_worker_mirrored<ls::cpus> s;
    auto m = s.replicate<mlp>(ls::seed{7});
    float* g = m.replica(0).model().gradients().data() + (world_rank() == 0 ? 0 : 16);
    ls::host_context ctx;
    CHECK_THROWS_WITH_AS(s.all_reduce(0, ctx, g, 64), doctest::Contains("the workers' collectives do not match"),
                         ls::replica_error);
  }
}

TEST_CASE("multi_worker: per-value clipping for a user optimiser leaves every local replica the same update") {
  // Local replica 0's reduced gradient is what the others copy; the strategy clamps it in place
  // for an optimiser that does not clip itself, so the copies must be complete before it does.
  using wide = ls::sequential<ls::dense<784, 256>, ls::relu, ls::dense<256, 10>>;
  ls::strategy_options o;
  o.shard_optimizer = false;
  ls::update_recipe recipe;
  recipe.clip_value = 1e-3f;
  const auto run = [&](auto opt) {
    ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(2), o);
    auto m = s.replicate<wide>(ls::seed{12});
    for (std::size_t u = 0; u < 12; ++u) {
      const ls::shard_plan p = s.plan();
      const auto db = ls::data::detail::make_sharded(make_batch(64, 700 + u), p.parts, p.first, s.num_replicas());
      (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, db, recipe);
      const auto p0 = m.parameters_to_host();
      CAPTURE(u);
      for (std::size_t r = 1; r < m.size(); ++r)
        CHECK(std::equal(p0.begin(), p0.end(), m.replica(r).model().parameters().data()));  // CHECK: every rank goes on
    }
    return m.parameters_to_host();
  };
  const auto separate = run(user::plain_sgd{.lr = 0.5f});
  CHECK(separate == run(ls::sgd{.lr = 0.5f}));  // the library's fused clamp: the same bits
  CHECK(same_on_every_rank(separate));
}

// Run by its own CTest (mpi/broadcast_over_2gib, -np 2 with --no-skip): 2 GiB per worker.
TEST_CASE("multi_worker: a broadcast of more than 2 GiB carries every byte" * doctest::skip()) {
  // 2^31 + 4099 bytes: past MPI's int count of bytes, whole mebibytes and a rest.
  const std::size_t n = (std::size_t{1} << 31) + 4099;
  void* mapped = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(mapped != MAP_FAILED);
  (void)madvise(mapped, n, MADV_HUGEPAGE);  // fewer page faults where the kernel allows
  auto* bytes = static_cast<unsigned char*>(mapped);
  const auto pattern = [](std::size_t i) {
    return static_cast<unsigned char>((i * 2654435761u) >> 13 ^ (i >> 31));
  };
  if (world_rank() == 0)
    for (std::size_t i = 0; i < n; ++i) bytes[i] = pattern(i);
  else
    std::memset(bytes, 0, n);
  {
    ls::detail::mpi_channel channel(MPI_COMM_WORLD, std::chrono::seconds(120), 1024);
    channel.run(ls::detail::mpi_channel::broadcast(bytes, n));
  }
  std::size_t wrong = 0, first_wrong = n;
  for (std::size_t i = 0; i < n; ++i)
    if (bytes[i] != pattern(i)) {
      if (wrong++ == 0) first_wrong = i;
    }
  munmap(mapped, n);
  CAPTURE(first_wrong);
  CHECK(wrong == 0);
}
