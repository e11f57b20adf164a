// Data-parallel scaling on the host: config M (784-512-512-10 ReLU MLP) at global batch 256,
// trained with 1 and with 2 CPU replicas (a cpu<I> replica is one core: 1 BLAS thread each).
// speedup = samples/s with n replicas over samples/s with 1, measured in the same run; the line
// `replicas=2` is 2 replicas with the optimiser update not sharded, the line `shard_optimizer=1`
// 2 replicas with it sharded (strategy_options::shard_optimizer; what the default setting does
// for SGD with momentum and AdamW on these replicas). The lines `config=L` repeat the three for config L
// (1024-4096-4096-1024 at global batch 512, bench_step's L) in fewer, longer rounds.
//
// Built with MPI and launched by mpirun (`mpirun -np 2 bench_scaling`), it measures W workers of
// one replica each (multi_worker_mirrored<cpus>, one process per worker) against one device
// measured in the same job on rank 0 while the other ranks wait idle, and rank 0 prints both.
// The line `replicas=2 accumulate=4` trains the same rows as 4 batches of 64 per update (one
// all-reduce per update; strategy::accumulate for the first 3); `ratio_to_one_batch` is its rate
// over `replicas=2`'s. The line `replicas=2 trace=on` is 2 replicas recording a timeline of every step
// (strategy::set_trace, the recorder emptied between rounds, untimed) against `trace=off`, the
// same strategy without a recorder, in the same rounds. The lines `optimizer=adamw` repeat
// replicas=1, replicas=2 and shard_optimizer=1 on config M with AdamW (two moments per parameter,
// as the main job trains) in place of SGD with momentum (one). The lines `independent=2` are the
// limit of 2 replicas on this machine: two one-device models on two threads pinned to two CPUs,
// each training its half of the global batch with nothing exchanged between them (the memory and
// cache the cores share are shared as in the replicas=2 run); `of_limit` is replicas=2's rate
// over it.

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/core.h>

#include <lockstep/lockstep.hpp>
#ifdef LOCKSTEP_HAS_MPI
#include <lockstep/distribute/multi_worker.hpp>
#endif

namespace ls = lockstep;

namespace {

using config_m = ls::sequential<ls::dense<784, 512>, ls::relu, ls::dense<512, 512>, ls::relu, ls::dense<512, 10>>;
using config_l =
    ls::sequential<ls::dense<1024, 4096>, ls::relu, ls::dense<4096, 4096>, ls::relu, ls::dense<4096, 1024>>;

// `rows` random rows of `width` features with labels below `classes`.
ls::data::batch make_batch(std::size_t rows, std::size_t width = 784, std::uint32_t classes = 10) {
  ls::data::batch b;
  b.width = width;
  const ls::counter_rng rng(7, 1);
  b.features.resize(rows * width);
  for (std::size_t i = 0; i < b.features.size(); ++i) b.features[i] = rng.uniform(i);
  for (std::size_t r = 0; r < rows; ++r) {
    b.labels.push_back(static_cast<std::int32_t>(rng.u32(r) % classes));
    b.indices.push_back(r);
  }
  return b;
}

// The optimiser of the runs: SGD with momentum 0.9, or AdamW.
template <class Opt>
Opt bench_optimizer() {
  if constexpr (std::is_same_v<Opt, ls::adamw>)
    return ls::adamw{.lr = 1e-3f};
  else
    return ls::sgd{.lr = 0.01f, .momentum = 0.9f};
}

// A strategy S with its replicated model Net and the one global batch every step trains on.
template <class S, class Net = config_m, class Opt = ls::sgd>
struct run {
  S s;
  typename S::template model_type<Net> m = s.template replicate<Net>(ls::seed{1});
  ls::data::distributed_batch d;
  Opt opt = bench_optimizer<Opt>();

  std::vector<ls::data::distributed_batch> parts;  // accumulate > 1: the update's batches

  // `k` > 1: each step is one update of the same global batch's rows as k batches of 1/k.
  explicit run(const std::shared_ptr<const ls::data::batch>& g, ls::strategy_options o = {}, std::size_t k = 1)
      : s(o), d{g, ls::data::split(*g, S::replica_count)} {
    if (k > 1) {
      for (std::size_t q = 0; q < k; ++q) {
        const auto part = std::make_shared<const ls::data::batch>(make_batch(g->rows() / k));
        parts.push_back({part, ls::data::split(*part, S::replica_count)});
      }
    }
    for (int i = 0; i < 5; ++i) step();  // warm up: buffers allocated and touched
  }
  void step() {
    if (parts.empty()) {
      ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, d);
      return;
    }
    for (std::size_t q = 0; q + 1 < parts.size(); ++q) (void)s.accumulate(m, ls::softmax_cross_entropy{}, parts[q]);
    (void)s.train_step(m, opt, ls::softmax_cross_entropy{}, parts.back());
  }

  // From now on, a timeline of every step is recorded (trace=on).
  std::unique_ptr<ls::trace_recorder> rec;
  void trace_every_step() {
    rec = std::make_unique<ls::trace_recorder>(
        s.num_replicas() + 1, ls::trace_options{.steps = {0, std::numeric_limits<std::uint64_t>::max()}});
    s.set_trace(rec.get());
    rec->begin_step(0);
    step();  // its buffers touched
  }

  // Samples per second over `steps` steps.
  double measure(int steps) {
    if (rec) rec->clear();  // the spans of earlier rounds (the buffers stay)
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) step();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(steps) * static_cast<double>(d.global_size()) / sec;
  }
};

// Pins the calling thread to the `i`-th CPU this process may run on (best effort, as the
// strategy's own replica threads are pinned).
void pin_to_allowed_cpu(std::size_t i) {
  const std::vector<int> cpus = ls::backend::allowed_cpus();
  if (i < cpus.size()) ls::backend::pin_this_thread(cpus[i]);
}

// Two independent one-device runs of Net, each on half of the global batch `g`, stepped
// concurrently on two threads pinned to two CPUs: data parallelism's compute with no exchange.
template <class Net = config_m, class Opt = ls::sgd>
struct independent_pair {
  std::array<std::unique_ptr<run<ls::one_device<ls::cpu<0>>, Net, Opt>>, 2> halves;
  std::size_t global_rows;

  independent_pair(const std::shared_ptr<const ls::data::batch>& g, std::uint32_t classes) : global_rows(g->rows()) {
    for (std::size_t i = 0; i < 2; ++i) {
      const auto half = std::make_shared<const ls::data::batch>(make_batch(g->rows() / 2, g->width, classes));
      // Each model made (and its buffers first touched) on the thread that will train it.
      std::thread t([&, i] {
        pin_to_allowed_cpu(i);
        halves[i] = std::make_unique<run<ls::one_device<ls::cpu<0>>, Net, Opt>>(half);
      });
      t.join();
    }
  }

  // Global-batch samples per second over `steps` concurrent steps of both halves.
  double measure(int steps) {
    const auto t0 = std::chrono::steady_clock::now();
    std::array<std::thread, 2> threads;
    for (std::size_t i = 0; i < 2; ++i)
      threads[i] = std::thread([this, i, steps] {
        pin_to_allowed_cpu(i);
        (void)halves[i]->measure(steps);
      });
    for (auto& t : threads) t.join();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(steps) * static_cast<double>(global_rows) / sec;
  }
};

// Alternates `rounds` short rounds of `steps` steps over the runs and keeps each one's best rate,
// so that a burst of other load on the machine does not favour any of them.
template <class... Runs>
std::array<double, sizeof...(Runs)> best_rates(int rounds, int steps, Runs&... runs) {
  std::array<double, sizeof...(Runs)> best{};
  for (int round = 0; round < rounds; ++round) {
    std::size_t i = 0;
    ((best[i] = std::max(best[i], runs.measure(steps)), ++i), ...);
  }
  return best;
}

// The lines replicas=1, replicas=2 and replicas=2 shard_optimizer=1 of one configuration, each
// line starting with `tag`, rates with `digits` decimals.
void print_scaling(const char* tag, int digits, double one, double two, double sharded) {
  fmt::print("{}replicas=1 samples_per_s={:.{}f} speedup=1.00\n", tag, one, digits);
  fmt::print("{}replicas=2 samples_per_s={:.{}f} speedup={:.2f}\n", tag, two, digits, two / one);
  fmt::print("{}replicas=2 shard_optimizer=1 samples_per_s={:.{}f} speedup={:.2f}\n", tag, sharded, digits, sharded / one);
}

// The line independent=2 (the limit of 2 replicas here) against the faster 2-replica rate `two`.
void print_limit(const char* tag, int digits, double one, double two, double limit) {
  fmt::print("{}independent=2 samples_per_s={:.{}f} speedup={:.2f} of_limit={:.3f}\n", tag, limit, digits, limit / one,
             two / limit);
}

#ifdef LOCKSTEP_HAS_MPI
// Each rank trains its shards of the same global batch; a round is timed by rank 0.
int multi_worker_main() {
  const auto g = std::make_shared<const ls::data::batch>(make_batch(256));
  ls::multi_worker_mirrored<ls::cpus> s(ls::device_selection::first(1));
  auto m = s.replicate<config_m>(ls::seed{1});
  const ls::shard_plan p = s.plan();
  auto all = ls::data::split(*g, p.parts);
  ls::data::distributed_batch d{g, {all.begin() + static_cast<std::ptrdiff_t>(p.first),
                                     all.begin() + static_cast<std::ptrdiff_t>(p.first + s.num_replicas())}};
  const ls::sgd opt{.lr = 0.01f, .momentum = 0.9f};
  for (int i = 0; i < 5; ++i) ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, d);
  std::unique_ptr<run<ls::one_device<ls::cpu<0>>>> one;
  if (s.world().is_chief()) one = std::make_unique<run<ls::one_device<ls::cpu<0>>>>(g);
  double best_one = 0, best_w = 0;
  for (int round = 0; round < 8; ++round) {
    if (one) best_one = std::max(best_one, one->measure(40));
    s.barrier();  // the other ranks wait (idle) while rank 0 measures one device
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 40; ++i) ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, d);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best_w = std::max(best_w, 40.0 * 256.0 / sec);
    s.barrier();
  }
  if (s.world().is_chief()) {
    fmt::print("host_gemm={}\n", ls::host_gemm_name());
    fmt::print("replicas=1 samples_per_s={:.0f} speedup=1.00\n", best_one);
    fmt::print("workers={} replicas=1 samples_per_s={:.0f} speedup={:.2f}\n", s.world().size(), best_w, best_w / best_one);
  }
  return 0;
}
#endif

}  // namespace

int main() {
#ifdef LOCKSTEP_HAS_MPI
  if (ls::launched_by_mpi()) {
    ls::mpi_environment env;
    return multi_worker_main();
  }
#endif
  fmt::print("host_gemm={}\n", ls::host_gemm_name());
  const auto g = std::make_shared<const ls::data::batch>(make_batch(256));
  run<ls::one_device<ls::cpu<0>>> one(g);
  const ls::strategy_options unsharded{.shard_optimizer = false};
  run<ls::mirrored<ls::cpu<0>, ls::cpu<1>>> two(g, unsharded);
  run<ls::mirrored<ls::cpu<0>, ls::cpu<1>>> sharded(g, ls::strategy_options{.shard_optimizer = true});
  run<ls::mirrored<ls::cpu<0>, ls::cpu<1>>> traced(g, unsharded);
  traced.trace_every_step();
  run<ls::mirrored<ls::cpu<0>, ls::cpu<1>>> accumulated(g, unsharded, 4);
  independent_pair<> pair(g, 10);
  const auto [best_one, best_two, best_sharded, best_traced, best_accumulated, best_pair] =
      best_rates(8, 40, one, two, sharded, traced, accumulated, pair);
  print_scaling("", 0, best_one, best_two, best_sharded);
  print_limit("", 0, best_one, best_two, best_pair);
  fmt::print("replicas=2 accumulate=4 samples_per_s={:.0f} ratio_to_one_batch={:.3f}\n", best_accumulated,
             best_accumulated / best_two);
  fmt::print("replicas=2 trace=off samples_per_s={:.0f}\n", best_two);
  fmt::print("replicas=2 trace=on samples_per_s={:.0f} overhead={:.2f}% spans_per_step={:.0f}\n", best_traced,
             100.0 * (best_two / best_traced - 1.0),
             static_cast<double>(traced.rec->events(0).size() + traced.rec->events(1).size()) / 40.0);

  // Config M with AdamW: the update reads and writes two moments per parameter.
  run<ls::one_device<ls::cpu<0>>, config_m, ls::adamw> one_adam(g);
  run<ls::mirrored<ls::cpu<0>, ls::cpu<1>>, config_m, ls::adamw> two_adam(g, ls::strategy_options{.shard_optimizer = false});
  run<ls::mirrored<ls::cpu<0>, ls::cpu<1>>, config_m, ls::adamw> sharded_adam(g, ls::strategy_options{.shard_optimizer = true});
  const auto adam = best_rates(8, 40, one_adam, two_adam, sharded_adam);
  print_scaling("optimizer=adamw ", 0, adam[0], adam[1], adam[2]);

  // Config L: about 73 GFLOP per step (the first layer computes no input gradient), so 4 rounds
  // of 4 steps.
  const auto gl = std::make_shared<const ls::data::batch>(make_batch(512, 1024, 1024));
  run<ls::one_device<ls::cpu<0>>, config_l> one_l(gl);
  run<ls::mirrored<ls::cpu<0>, ls::cpu<1>>, config_l> two_l(gl, unsharded);
  run<ls::mirrored<ls::cpu<0>, ls::cpu<1>>, config_l> sharded_l(gl, ls::strategy_options{.shard_optimizer = true});
  independent_pair<config_l> pair_l(gl, 1024);
  const auto l = best_rates(4, 4, one_l, two_l, sharded_l, pair_l);
  print_scaling("config=L ", 1, l[0], l[1], l[2]);
  print_limit("config=L ", 1, l[0], std::max(l[1], l[2]), l[3]);
}
