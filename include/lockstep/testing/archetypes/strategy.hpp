#pragma once
/// @file strategy.hpp (testing/archetypes)
/// The archetypes of the strategy and world concepts: a strategy with exactly the members fit,
/// evaluate and predict call, and one whose `world()` spans workers simulated by threads (see
/// model.hpp for why they live outside lockstep). tests/train/source_strategy_archetypes_test.cpp
/// checks that they train bitwise like mirrored, and the strategy suite
/// (lockstep/testing/strategy.hpp) runs on them.

#include <algorithm>
#include <barrier>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/backend/host/context.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/replicated.hpp>
#include <lockstep/distribute/world.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep_archetypes {

namespace ls = lockstep;

/// Strategy: n host replicas run one after the other on the calling thread, their gradient sums
/// added in replica order by hand. The members of the strategy concept, and train_step for the
/// replicated models made by make_replicas below.
class strategy {
public:
  using strategy_concept = ls::strategy_tag;
  using kind_type = ls::cpus;

  explicit strategy(std::size_t replicas) : n_(replicas) {}

  std::size_t num_replicas() const { return n_; }

  template <class F>
  auto run(F&& fn, const ls::data::distributed_batch& b) {
    std::vector<std::invoke_result_t<F&, std::size_t, const ls::data::shard&>> out;
    for (std::size_t r = 0; r < n_; ++r) out.push_back(fn(r, b.shards[r]));
    return out;
  }

  double reduce(ls::reduce_op op, const std::vector<double>& v) const {
    double s = v.at(0);
    for (std::size_t r = 1; r < v.size(); ++r)
      s = op == ls::reduce_op::min ? std::min(s, v[r]) : op == ls::reduce_op::max ? std::max(s, v[r]) : s + v[r];
    return op == ls::reduce_op::mean ? s / static_cast<double>(v.size()) : s;
  }

  template <class Net, class Optimizer, class Loss>
  ls::step_stats train_step(ls::replicated<Net>& m, const Optimizer& opt, const Loss& loss,
                            const ls::data::distributed_batch& b) {
    std::size_t total = 0;
    for (const auto& sh : b.shards) total += sh.size;
    if (total == 0) return {};
    const ls::pass_info info = ls::pass_info::for_training(m.seed().value, m.step());
    ls::step_stats st;
    for (std::size_t r = 0; r < n_; ++r) {
      const ls::loss_sum l = m.replica(r).forward_backward(loss, b.shards[r], info);
      st.loss_sum += l.sum;
      st.correct += l.correct;  // the training accuracy fit reports
      st.labelled += l.labelled;
    }
    float* sum = m.replica(0).model().gradients().data();
    for (std::size_t r = 1; r < n_; ++r) {
      const float* g = m.replica(r).model().gradients().data();
      for (std::size_t i = 0; i < m.param_count; ++i) sum[i] += g[i];
    }
    for (std::size_t r = 1; r < n_; ++r) std::copy(sum, sum + m.param_count, m.replica(r).model().gradients().data());
    const ls::update_info u{opt.lr, m.step() + 1, 1.0 / static_cast<double>(total)};
    for (std::size_t r = 0; r < n_; ++r) m.replica(r).apply(opt, u);
    m.set_step(m.step() + 1);
    st.count = total;
    return st;
  }

private:
  std::size_t n_;
};

/// n host replicas of Net from `seed` (what a strategy's replicate does; not a member fit calls).
/// The contexts leave the calling thread's floating-point mode alone.
template <class Net>
ls::replicated<Net> make_replicas(std::size_t n, ls::seed seed) {
  std::vector<ls::host_context> contexts;
  for (std::size_t r = 0; r < n; ++r) contexts.emplace_back(1, false);
  return ls::replicated<Net>(std::move(contexts), seed, 0);
}

/// The processes of a multi-process job, simulated by threads of this one: each worker's sums
/// are added in rank order through shared memory (what MPI does between processes).
class process_group {
public:
  explicit process_group(std::size_t workers) : sync_(static_cast<std::ptrdiff_t>(workers)), doubles_(workers), floats_(workers) {}
  /// Every worker's v becomes the sum over workers, in rank order.
  template <class T>
  void sum(std::size_t rank, std::span<T> v) {
    auto& slots = slots_of<T>();
    slots[rank] = v;
    sync_.arrive_and_wait();
    std::vector<T> s(slots[0].begin(), slots[0].end());
    for (std::size_t w = 1; w < slots.size(); ++w)
      for (std::size_t i = 0; i < s.size(); ++i) s[i] += slots[w][i];
    sync_.arrive_and_wait();  // every worker has read every worker's values
    std::copy(s.begin(), s.end(), v.begin());
  }

private:
  template <class T>
  std::vector<std::span<T>>& slots_of() {
    if constexpr (std::is_same_v<T, double>)
      return doubles_;
    else
      return floats_;
  }
  std::barrier<> sync_;
  std::vector<std::span<double>> doubles_;
  std::vector<std::span<float>> floats_;
};

/// A world of `workers` processes simulated by threads: exactly the members of lockstep::world.
class thread_world {
public:
  thread_world(process_group& w, std::size_t rank, std::size_t workers) : world_(&w), rank_(rank), workers_(workers) {}
  std::size_t rank() const { return rank_; }
  std::size_t size() const { return workers_; }
  bool is_chief() const { return rank_ == 0; }
  ls::shard_plan plan() const { return {workers_, rank_}; }  // one replica per worker
  std::size_t global_replicas() const { return workers_; }
  void sum(std::span<double> v) { world_->sum(rank_, v); }
  static constexpr bool recovers_after_failure = false;

private:
  process_group* world_;
  std::size_t rank_, workers_;
};
static_assert(ls::world<thread_world>);

/// Strategy spanning several processes: worker `rank` of `workers`, one replica each, with a
/// `world()`; fit cuts every global batch into one shard per worker (world().plan()), adds the
/// workers' counts (world().sum) and lets only rank 0 report (world().is_chief()).
class worker_strategy {
public:
  using strategy_concept = ls::strategy_tag;
  using kind_type = ls::cpus;

  worker_strategy(process_group& w, std::size_t rank, std::size_t workers) : world_(w, rank, workers), shared_(&w), rank_(rank) {}

  std::size_t num_replicas() const { return 1; }
  thread_world& world() { return world_; }

  template <class F>
  auto run(F&& fn, const ls::data::distributed_batch& b) {
    return std::vector{fn(std::size_t{0}, b.shards.at(0))};
  }
  double reduce(ls::reduce_op, const std::vector<double>& v) const { return v.at(0); }

  template <class Net, class Optimizer, class Loss>
  ls::step_stats train_step(ls::replicated<Net>& m, const Optimizer& opt, const Loss& loss,
                            const ls::data::distributed_batch& b) {
    const std::size_t total = b.global_size();  // over every worker
    if (total == 0) return {};
    const ls::pass_info info = ls::pass_info::for_training(m.seed().value, m.step());
    const ls::loss_sum l = m.replica(0).forward_backward(loss, b.shards.at(0), info);
    double sums[3] = {l.sum, static_cast<double>(l.correct), static_cast<double>(l.labelled)};
    shared_->sum(rank_, std::span<float>(m.replica(0).model().gradients().data(), m.param_count));
    world_.sum(sums);
    m.replica(0).apply(opt, ls::update_info{opt.lr, m.step() + 1, 1.0 / static_cast<double>(total)});
    m.set_step(m.step() + 1);
    return {sums[0], total, static_cast<std::size_t>(sums[1]), static_cast<std::size_t>(sums[2])};
  }

private:
  thread_world world_;
  process_group* shared_;
  std::size_t rank_;
};

}  // namespace lockstep_archetypes
