// The code blocks of docs/distribute.md, compiled and run.
#include <doctest/doctest.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <vector>

#include "docs/common.hpp"

namespace ls = lockstep;
using namespace std::chrono_literals;

namespace {
using mlp = ls::sequential<ls::dense<8, 16>, ls::relu, ls::dense<16, 10>>;
}  // namespace

TEST_CASE("docs/distribute.md: strategies over host devices") {
  const std::size_t n = 3;
  // example-begin distribute-strategies
  ls::mirrored<ls::cpus> a;                                      // one replica per allowed core
  ls::mirrored<ls::cpus> b(ls::device_selection::first(5));     // 5 host replicas (may share cores)
  ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus>
      e(ls::device_selection::first(n), ls::strategy_options{.micro_shard_rows = 16});
  // example-end distribute-strategies
  CHECK(a.num_replicas() >= 1);
  CHECK(b.num_replicas() == 5);
  CHECK(e.num_replicas() == n);
}

TEST_CASE("docs/distribute.md: training steps through a strategy") {
  auto global_batches = (docs_test::samples(50, 8) | ls::data::batched(16)).epoch(0);
  // example-begin distribute-train-step
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s{ls::strategy_options{.timeout = 10s, .bucket_bytes = 1 << 20}};
  auto m = s.replicate<mlp>(ls::seed{42});          // N identical replicas (broadcast from replica 0)
  for (auto&& d : s.shard(global_batches)) {    // each global batch cut into N shards
    ls::step_stats st = ls::train_step(s, m, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{}, d);
    std::printf("step %llu: mean loss %.4f over %zu samples\n", static_cast<unsigned long long>(m.step()),
                st.mean_loss(), st.count);
  }
  // example-end distribute-train-step
  CHECK(m.step() == 4);  // 50 samples in global batches of 16
}

TEST_CASE("docs/distribute.md: a custom loop") {
  auto batches = (docs_test::samples(40, 8) | ls::data::batched(8)).epoch(0);
  // example-begin distribute-custom-loop
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<mlp>(ls::seed{1});
  const ls::sgd opt{.lr = 0.1f};
  for (auto&& d : s.shard(batches)) {
    const ls::pass_info info = ls::pass_info::for_training(m.seed().value, m.step());
    auto per = s.run([&](std::size_t r, const ls::data::shard& sh) {
      auto& rep = m.replica(r);
      ls::loss_sum l = rep.forward_backward(ls::softmax_cross_entropy{}, sh, info);   // gradient SUMS
      s.all_reduce(r, rep.context(), rep.model().gradients().data(), m.param_count);
      rep.apply(opt, {opt.lr, m.step() + 1, 1.0 / static_cast<double>(d.global_size())});
      return l;
    }, d);
    m.set_step(m.step() + 1);
    ls::loss_sum total = s.reduce(ls::reduce_op::sum, per);
    std::printf("mean loss %.4f\n", total.sum / static_cast<double>(total.count));
  }
  // example-end distribute-custom-loop
  CHECK(m.step() == 5);
}

TEST_CASE("docs/distribute.md: the sharded optimiser update") {
  // example-begin distribute-shard-optimizer
  ls::mirrored<ls::cpus> s(ls::device_selection::first(2), ls::strategy_options{.shard_optimizer = true});
  // example-end distribute-shard-optimizer
  CHECK(s.options().shard_optimizer.is_on());
  CHECK(ls::strategy_options{}.shard_optimizer.is_automatic());
}

TEST_CASE("docs/distribute.md: a replica's failure, and the original exception nested in it") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<mlp>(ls::seed{5});
  const ls::sgd opt{.lr = 0.1f};
  const ls::softmax_cross_entropy loss;
  ls::data::batch b;
  b.width = 8;
  b.features.assign(4 * 8, 0.5f);
  b.labels = {0, 1, 12, 3};  // 12: not one of the model's 10 outputs
  b.indices = {0, 1, 2, 3};
  ls::data::distributed_batch d;
  d.global = std::make_shared<const ls::data::batch>(b);
  d.shards = ls::data::split(*d.global, 2);
  // example-begin distribute-failure
  try { ls::train_step(s, m, opt, loss, d); }
  catch (const ls::replica_error& e) {
    try { std::rethrow_if_nested(e); }            // the original, with its own type
    catch (const ls::data_error& bad) { /* ... */ }
  }
  // example-end distribute-failure
  CHECK(m.step() == 0);  // the step failed (a data_error, caught above), and changed nothing
}
