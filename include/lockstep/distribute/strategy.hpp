#pragma once
/// @file strategy.hpp
/// `mirrored_strategy<Kind, Reducer, Determinism>`: the synchronous data-parallel strategy over
/// replicas on devices of one kind, whose device list is a run-time value. It is the one class
/// every mirrored strategy is made of (`mirrored<cpu<0>, cpu<1>>`, `mirrored<gpus>`,
/// `one_device<cpu<0>>`: see mirrored.hpp), so the training path is instantiated once per
/// device kind, reducer and determinism level, never once per device or per replica count.
///
/// Its anatomy: an `executor` (persistent workers, run, reduce), a `Reducer` (gradient
/// aggregation, chosen at compile time), and a step policy (`overlapped_step` for run_to_run,
/// `micro_shard_step` for replica_count_invariant). It makes replicated models bound to itself,
/// runs per-replica functions, reduces per-replica values and performs whole training steps.
///
/// Failure: an exception in any replica reaches the caller as a replica_error naming the replica
/// (and the step) with the original nested (a collective that waited longer than
/// strategy_options::timeout raises timeout_error naming the replicas and the bucket); every
/// other replica is released; afterwards the strategy is usable again, and a failed train_step
/// has changed neither the parameters nor the step counter.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/backend/context.hpp>
#include <lockstep/core/build_check.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/data/shard_batches.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/device_set.hpp>
#include <lockstep/distribute/executor.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/replica.hpp>
#include <lockstep/distribute/replicated.hpp>
#include <lockstep/distribute/steps/micro_shard_step.hpp>
#include <lockstep/distribute/steps/overlapped_step.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/memory/buffer.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

namespace detail {
/// The position of the reducer's aggregation device among `ordinals` (the first match; 0 when
/// the reducer has none, or aggregates on a device of another kind).
template <class Reducer, class Kind>
std::size_t aggregation_root(const std::vector<std::size_t>& ordinals) {
  if constexpr (requires { typename Reducer::aggregation_device; }) {
    using A = typename Reducer::aggregation_device;
    if constexpr (std::is_same_v<kind_of_t<A>, Kind>) {
      for (std::size_t i = 0; i < ordinals.size(); ++i)
        if (ordinals[i] == static_cast<std::size_t>(A::ordinal)) return i;
      throw config_error(std::string("lockstep::mirrored: the reducer aggregates on ") + backend_traits<Kind>::name +
                         " device " + std::to_string(A::ordinal) + ", which is not among the devices " +
                         detail::list_text(ordinals));
    }
  }
  return 0;
}
}  // namespace detail

/// A synchronous data-parallel strategy over replicas on devices of kind Kind, listed at run time.
/// @tparam Kind        the device kind (cpus, gpus)
/// @tparam Reducer     how gradient sums are aggregated (satisfies lockstep::reducer)
/// @tparam Determinism run_to_run or replica_count_invariant (host memory only)
template <class Kind, class Reducer, determinism Determinism>
class mirrored_strategy {
  static_assert(device_backend<Kind>,
                "lockstep::mirrored: Kind must be a device kind with a complete backend (lockstep::device_backend)");
  static_assert(detail::check_reducer<Reducer, context_t<Kind>>());  // names a missing member
  static_assert(Determinism == determinism::run_to_run || device_memory<Kind>::host_accessible,
                "lockstep::mirrored: replica_count_invariant is implemented for devices with host memory (cpu<I>)");

  using step_policy =
      std::conditional_t<Determinism == determinism::run_to_run, overlapped_step, micro_shard_step>;

public:
  using strategy_concept = strategy_tag;                        ///< opts in to the strategy concept
  using kind_type = Kind;                                       ///< the device kind of every replica
  using reducer_type = Reducer;                                 ///< the gradient reducer
  using context_type = context_t<Kind>;                         ///< a replica's context
  using core_type = mirrored_strategy;                          ///< the class the training path is written for
  static constexpr determinism determinism_level = Determinism; ///< the determinism level
  /// The replicated model type for network Net with parameters of type T.
  template <class Net, class T = float>
  using model_type = basic_replicated<Net, Kind, T>;

  /// A strategy over the devices with the given ordinals (in replica order; validated by the
  /// caller, see resolve_devices), with the given options; starts the worker threads.
  /// @throws config_error for a bad option.
  mirrored_strategy(std::vector<std::size_t> ordinals, strategy_options options)
      : ordinals_(check_ordinals(std::move(ordinals))),
        options_(check(options, ordinals_.size())),
        identity_(std::make_shared<const strategy_identity>(strategy_identity{describe(ordinals_)})),
        reducer_(reducer_config{ordinals_.size(), options_.timeout, max_buckets,
                                detail::aggregation_root<Reducer, Kind>(ordinals_)}),
        step_(ordinals_.size(), options_),
        exec_(ordinals_.size(), options_.pin_replicas && backend_traits<Kind>::replica_owns_core, &abort_all, &reset_all,
              this) {
    warn_if_unoptimised();  // once per process, for a program compiled without optimisation
  }
  mirrored_strategy(const mirrored_strategy&) = delete;
  mirrored_strategy& operator=(const mirrored_strategy&) = delete;

  /// Number of replicas.
  [[nodiscard]] std::size_t num_replicas() const noexcept { return ordinals_.size(); }
  /// The device ordinal of each replica.
  [[nodiscard]] const std::vector<std::size_t>& device_ordinals() const noexcept { return ordinals_; }
  /// The options.
  [[nodiscard]] const strategy_options& options() const noexcept { return options_; }
  /// The reducer (for collectives issued from inside run()).
  [[nodiscard]] Reducer& reducer() noexcept { return reducer_; }
  /// BLAS threads per host replica (strategy_options::blas_threads; 1 by default, so a cpu<I>
  /// device is one core and replicas × BLAS threads never exceed the cores).
  [[nodiscard]] int blas_threads() const noexcept { return options_.blas_threads; }
  /// The strategy in words, for messages: "mirrored over cpu devices {0, 1}".
  [[nodiscard]] const std::string& description() const noexcept { return identity_->description; }

  /// Makes one replica of Net per device, initialised from `s` and made identical by a broadcast
  /// from replica 0. The model is bound to this strategy.
  template <class Net, class T = float>
  [[nodiscard]] model_type<Net, T> replicate(lockstep::seed s) {
    std::vector<context_type> contexts;
    contexts.reserve(num_replicas());
    for (const std::size_t o : ordinals_)
      contexts.push_back(
          backend_traits<Kind>::make_context(o, replica_settings{options_.blas_threads, options_.flush_denormals}));
    model_type<Net, T> m(std::move(contexts), s, options_.bucket_bytes, identity_);
    m.set_optimizer_sharding(options_.shard_optimizer);
    if (m.buckets().size > max_buckets - 1) throw config_error("lockstep::mirrored: the model has too many buckets");
    bind_workspaces(m, m.param_count * sizeof(T));
    broadcast(m, 0);
    return m;
  }

  /// Throws config_error naming both strategies unless this strategy made `m`.
  template <class Net, class T>
  void check_model(const model_type<Net, T>& m) const {
    if (!m.made_by(identity_.get()))
      throw config_error("lockstep::mirrored: the model was made by another strategy (" + m.owner_description() +
                         ") and cannot be used with this one (" + description() +
                         "); make it with this strategy's replicate(), or load its checkpoint into one that is");
  }

  /// Copies replica `root`'s parameters and optimiser state to every other replica (only the
  /// parameters when the update is sharded: each replica owns its slice of the state).
  template <class Net, class T>
  void broadcast(model_type<Net, T>& m, std::size_t root = 0) {
    check_model(m);
    if (root >= num_replicas())
      throw config_error("lockstep::mirrored::broadcast: root " + std::to_string(root) + " is not a replica");
    const std::size_t state = m.optimizer_sharded() ? 0 : m.replica(root).optimizer_state().size();
    auto job = [&](std::size_t r) {
      auto& rep = m.replica(r);
      rep.context().activate();
      reducer_.broadcast(r, rep.context(), rep.model().parameters().data(), m.stored_count, root);
      if (state) {
        if (rep.optimizer_state().size() != state)
          throw shape_error("lockstep::mirrored::broadcast: optimiser states differ in size");
        reducer_.broadcast(r, rep.context(), rep.optimizer_state().data(), state, root);
      }
    };
    exec_.execute(job);
  }

  /// Runs fn(replica_index, shard) on every replica's worker with its shard of `b`; returns the
  /// per-replica results (nothing for a void fn). The first failure reaches the caller as a replica_error.
  template <class F>
  auto run(F&& fn, const data::distributed_batch& b) {
    return exec_.run(std::forward<F>(fn), b);
  }

  /// Runs fn(replica_index) on every replica's worker and waits for all.
  template <class F>
  void run_each(F&& fn) {
    exec_.run_each(std::forward<F>(fn));
  }

  /// Combines per-replica values in replica order (sum, mean, min or max; see executor::reduce).
  template <class V>
  [[nodiscard]] auto reduce(reduce_op op, const std::vector<V>& values) const {
    return exec_.reduce(op, values);
  }

  /// In-place sum of `count` elements across replicas, called by every replica from inside run()
  /// (synchronous; uses the bucket id after the model's buckets).
  template <class Ctx, class T>
  void all_reduce(std::size_t replica, Ctx& ctx, T* data, std::size_t count) {
    reducer_.start(replica, ctx, data, count, max_buckets - 1);
    reducer_.wait(replica, ctx, max_buckets - 1);
  }

  /// Cuts every global batch of `batches` into one shard per replica (see data::shard_batches).
  template <class Range>
  [[nodiscard]] auto shard(Range&& batches) const {
    return data::shard_batches(std::forward<Range>(batches), num_replicas());
  }

  /// One synchronous training step on `b` (see lockstep::train_step).
  template <class Net, class T, class Optimizer, class Loss>
  step_stats train_step(model_type<Net, T>& m, const Optimizer& opt, const Loss& loss, const data::distributed_batch& b) {
    static_assert(optimizer<Optimizer>, "lockstep::train_step: the optimiser must satisfy lockstep::optimizer");
    static_assert(lockstep::loss<Loss>, "lockstep::train_step: the loss must satisfy lockstep::loss");
    check_model(m);
    exec_.check_batch(b);
    std::size_t total = 0;
    for (const auto& s : b.shards) total += s.size;
    if (total != b.global_size())
      throw shape_error("lockstep::train_step: the shards hold " + std::to_string(total) +
                        " rows but the global batch has " + std::to_string(b.global_size()));
    if (total == 0) return {};
    const pass_info info{true, m.seed().value, m.step(), 0, 0};
    const update_info update{opt.lr, m.step() + 1, 1.0 / static_cast<double>(total)};
    step_stats out;
    out.loss_sum = step_.run(exec_, reducer_, m, opt, loss, b, info, update);
    out.count = total;
    m.set_step(m.step() + 1);
    return out;
  }

private:
  static constexpr std::size_t max_buckets = 256;

  static std::vector<std::size_t> check_ordinals(std::vector<std::size_t> o) {
    if (o.empty()) throw config_error("lockstep::mirrored: needs at least one device");
    return o;
  }

  static std::string describe(const std::vector<std::size_t>& ordinals) {
    return std::string("mirrored over ") + backend_traits<Kind>::name + " devices " + detail::list_text(ordinals);
  }

  static strategy_options check(strategy_options o, std::size_t replicas) {
    if (o.timeout.count() <= 0) throw config_error("lockstep: strategy_options::timeout must be positive");
    if (o.blas_threads < 1)
      throw config_error("lockstep: strategy_options::blas_threads must be >= 1, got " + std::to_string(o.blas_threads));
    if constexpr (backend_traits<Kind>::replica_owns_core) {
      const auto cores = static_cast<std::size_t>(allowed_cpu_count());
      if (o.blas_threads > 1 && replicas * static_cast<std::size_t>(o.blas_threads) > cores)
        throw config_error("lockstep: strategy_options::blas_threads = " + std::to_string(o.blas_threads) + " with " +
                           std::to_string(replicas) + " replicas would run " +
                           std::to_string(replicas * static_cast<std::size_t>(o.blas_threads)) + " BLAS threads on " +
                           std::to_string(cores) + " cores");
    }
    if (o.shard_optimizer && !device_memory<Kind>::host_accessible)
      throw config_error(std::string("lockstep: strategy_options::shard_optimizer is implemented for devices with host "
                                     "memory (cpu<I>), not for ") + backend_traits<Kind>::name + " devices");
    if (Determinism == determinism::replica_count_invariant && o.blas_threads != 1)
      throw config_error("lockstep: strategy_options::blas_threads must be 1 under replica_count_invariant "
                         "(a GEMM's result must not depend on the thread count)");
    return o;
  }

  static void abort_all(void* self) noexcept {
    auto* s = static_cast<mirrored_strategy*>(self);
    s->reducer_.abort();
    s->step_.abort();
  }
  static void reset_all(void* self) noexcept {
    auto* s = static_cast<mirrored_strategy*>(self);
    s->reducer_.reset();
    s->step_.reset();
  }

  template <class Model>
  void bind_workspaces(Model& m, std::size_t max_bucket_bytes) {
    const std::size_t bytes = reducer_.workspace_bytes(max_bucket_bytes);
    if (bytes > workspace_bytes_) {
      workspaces_.clear();
      for (std::size_t r = 0; r < num_replicas(); ++r) {
        m.replica(r).context().activate();  // device memory lands on the current device: replica r's
        workspaces_.emplace_back(bytes);
      }
      workspace_bytes_ = bytes;
      auto job = [&](std::size_t r) { reducer_.bind(r, workspaces_[r].data(), bytes); };
      exec_.execute(job);
    }
  }

  std::vector<std::size_t> ordinals_;
  strategy_options options_;
  std::shared_ptr<const strategy_identity> identity_;
  Reducer reducer_;
  step_policy step_;
  std::vector<basic_buffer<std::byte, Kind>> workspaces_;
  std::size_t workspace_bytes_ = 0;
  executor exec_;
};

/// One synchronous training step of model `m` on distributed batch `b`: every replica runs
/// forward and backward on its shard, gradient sums are all-reduced bucket by bucket while the
/// backward pass continues, and every replica applies the same update with lr = opt.lr and
/// grad_scale = 1 / (global sample count). Returns the loss summed over the global batch and the
/// count; increments m.step(). An empty global batch changes nothing and returns {0, 0}.
template <class Strategy, class Model, class Optimizer, class Loss>
  requires strategy_for<Strategy, Model, Optimizer, Loss>
step_stats train_step(Strategy& s, Model& m, const Optimizer& opt, const Loss& loss, const data::distributed_batch& b) {
  return s.train_step(m, opt, loss, b);
}

}  // namespace lockstep
