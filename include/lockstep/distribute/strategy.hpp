#pragma once
/// @file strategy.hpp
/// `mirrored_strategy<Kind, Reducer, Determinism, World>`: THE synchronous data-parallel strategy:
/// replicas on devices of one kind, listed at run time, in a world of one or more processes. Every
/// strategy of the library is this class: `mirrored<cpu<0>, cpu<1>>`, `mirrored<gpus>`,
/// `one_device<cpu<0>>` (mirrored.hpp) over `local_world`, and `multi_worker_mirrored<cpus>`
/// (multi_worker.hpp) over `mpi_world`. So the training path — replicate, broadcast, train_step,
/// the option checks, failure handling — is written once, and is instantiated once per device
/// kind, reducer, determinism level and world, never once per device or per replica count.
///
/// Its anatomy: a World (who the processes are, how global batches are cut, sums over workers,
/// what a failure leaves; world.hpp), an `executor` (persistent workers, run, reduce), a
/// `Reducer` (gradient aggregation, chosen at compile time) and a step policy
/// (`overlapped_step` for run_to_run, `micro_shard_step` for replica_count_invariant;
/// steps/step_policy.hpp).
///
/// Failure: an exception in any replica reaches the caller as a replica_error naming the replica
/// (and the step) with the original nested (a collective that waited longer than
/// strategy_options::timeout raises timeout_error naming the replicas and the bucket); every
/// other replica is released; a train_step that failed before its update (in forward, backward
/// or the gradient's collectives) has changed neither the parameters nor the step counter, while
/// one that failed inside the optimiser's update may leave replicas different (broadcast
/// re-synchronises them from replica 0). In a local world the strategy is usable again afterwards; in an MPI world the error
/// also names the worker's rank, and the strategy refuses further use (end the job).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <lockstep/backend/context.hpp>
#include <lockstep/core/build_check.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/core/trace.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/data/shard_batches.hpp>
#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/device_set.hpp>
#include <lockstep/distribute/epilogue.hpp>
#include <lockstep/distribute/executor.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/replica.hpp>
#include <lockstep/distribute/replicated.hpp>
#include <lockstep/distribute/steps/micro_shard_step.hpp>
#include <lockstep/distribute/steps/overlapped_step.hpp>
#include <lockstep/distribute/steps/step_policy.hpp>
#include <lockstep/backend/readback.hpp>
#include <lockstep/distribute/update_phase.hpp>
#include <lockstep/distribute/world.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/memory/buffer.hpp>
#include <lockstep/optimizers/optimizer.hpp>
#include <lockstep/version.hpp>

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

/// A reducer made for world W: from (config, world, ordinals) when it takes the world (it spans
/// workers itself), else from (config).
template <class Reducer, class World>
Reducer make_reducer(const reducer_config& c, World& w, const std::vector<std::size_t>& ordinals) {
  if constexpr (std::is_constructible_v<Reducer, const reducer_config&, World&, const std::vector<std::size_t>&>)
    return Reducer(c, w, ordinals);
  else
    return Reducer(c);
}

/// Device 0 of kind Kind, for checking which kinds a reducer serves (void for a kind without one).
template <class Kind>
struct first_device_of {
  using type = void;  ///< unknown kind
};
template <>
struct first_device_of<cpus> {
  using type = cpu<0>;  ///< host replicas
};
template <>
struct first_device_of<gpus> {
  using type = gpu<0>;  ///< GPU replicas
};

/// True when Reducer serves replicas of kind Kind: its `supports_kind<Kind>` when it says, else
/// its `supports` for a device of the kind (its aggregation device when that is of the kind, else
/// device 0; a kind without device tags is vouched for by its backend).
template <class Reducer, class Kind>
constexpr bool reducer_serves_kind() {
  using D = typename first_device_of<Kind>::type;
  if constexpr (requires { { Reducer::template supports_kind<Kind> } -> std::convertible_to<bool>; }) {
    return Reducer::template supports_kind<Kind>;
  } else if constexpr (std::is_void_v<D>) {
    return true;  // a kind the library does not know: its backend vouches for its reducers
  } else {
    if constexpr (requires { typename Reducer::aggregation_device; }) {
      using A = typename Reducer::aggregation_device;
      if constexpr (std::is_same_v<kind_of_t<A>, Kind>) return Reducer::template supports<A>;
    }
    return Reducer::template supports<D>;
  }
}
}  // namespace detail

/// A synchronous data-parallel strategy over replicas on devices of kind Kind, listed at run time.
/// @tparam Kind        the device kind (cpus, gpus)
/// @tparam Reducer     how gradient sums are aggregated (satisfies lockstep::reducer)
/// @tparam Determinism run_to_run or replica_count_invariant (host memory only)
/// @tparam World       the processes: local_world (one process) or mpi_world (multi_worker_mirrored)
template <class Kind, class Reducer, determinism Determinism, class World = local_world>
class mirrored_strategy {
  static_assert(device_backend<Kind>,
                "lockstep::mirrored: Kind must be a device kind with a complete backend (lockstep::device_backend)");
  static_assert(detail::check_reducer<Reducer, context_t<Kind>, World>());  // names a missing member
  static_assert(detail::reducer_serves_kind<Reducer, Kind>(),
                "lockstep::mirrored: this reducer does not serve this device kind (its `supports` refuses the kind's "
                "devices: for example host_allreduce sums host memory, which GPU replicas do not have); name a "
                "reducer for the kind");
  static_assert(Determinism == determinism::run_to_run || device_memory<Kind>::host_accessible,
                "lockstep::mirrored: replica_count_invariant is implemented for devices with host memory (cpu<I>)");
  static_assert(world<World>, "lockstep::mirrored: World must satisfy lockstep::world (local_world, mpi_world)");

  using step_policy = std::conditional_t<Determinism == determinism::run_to_run, overlapped_step<World>,
                                         micro_shard_step<World>>;
  static_assert(detail::check_step_policy_shape<step_policy, World>());

public:
  using strategy_concept = strategy_tag;                        ///< opts in to the strategy concept
  using kind_type = Kind;                                       ///< the device kind of every replica
  using reducer_type = Reducer;                                 ///< the gradient reducer
  using context_type = context_t<Kind>;                         ///< a replica's context
  using world_type = World;                                     ///< the processes of the job
  static constexpr determinism determinism_level = Determinism; ///< the determinism level
  /// The replicated model type for network Net with parameters of type T.
  template <class Net, class T = float>
  using model_type = basic_replicated<Net, Kind, T>;
  /// True when the kind's context can defer readback (strategy_options::defer_readback).
  static constexpr bool can_defer_readback = backend::deferring_context<typename backend_traits<Kind>::context_type>;
  /// True when a sharded update is cut on the epilogue's grid and aggregated by the reducer's
  /// reduce-scatter and all-gather (reduces_to_slices_v): a reducer that can, on a kind whose
  /// replicas' epilogue reads their own gradient (host memory, or a device epilogue).
  static constexpr bool shards_on_grid =
      reduces_to_slices_v<Reducer> &&
      (device_memory<Kind>::host_accessible || detail::device_epilogue<typename backend_traits<Kind>::context_type>);
  /// shards_on_grid for a model of value type T: the device epilogue reads float gradients only
  /// (a double model's reads the whole reduced gradient back), so a double model on a device
  /// kind shards on the plain slices of a whole all-reduce.
  template <class T>
  static constexpr bool shards_on_grid_for =
      shards_on_grid && (device_memory<Kind>::host_accessible || std::is_same_v<T, float>);

  /// A strategy over the local devices with the given ordinals (in replica order; validated by
  /// the caller, see resolve_devices), with the given options, in `world` (collective when the
  /// world spans several processes); starts the worker threads.
  /// @throws config_error for a bad option.
  mirrored_strategy(std::vector<std::size_t> ordinals, strategy_options options, World world)
      : ordinals_(check_ordinals(std::move(ordinals))),
        options_(check(options, ordinals_.size(), world)),
        world_(std::move(world)),
        identity_(std::make_shared<const strategy_identity>(strategy_identity{describe(ordinals_, world_)})),
        reducer_(detail::make_reducer<Reducer>(
            reducer_config{ordinals_.size(), options_.timeout, collective_ids::count,
                           detail::aggregation_root<Reducer, Kind>(ordinals_)},
            world_, ordinals_)),
        step_(ordinals_.size(), options_, world_),
        exec_(ordinals_.size(), options_.pin_replicas && backend_traits<Kind>::replica_owns_core, &abort_all, &reset_all,
              this) {
    warn_if_unoptimised();  // once per process, for a program compiled without optimisation
  }
  /// A strategy in a local world (one process).
  mirrored_strategy(std::vector<std::size_t> ordinals, strategy_options options)
    requires std::is_same_v<World, local_world>
      : mirrored_strategy(ordinals, options, local_world(ordinals.size())) {}
  mirrored_strategy(const mirrored_strategy&) = delete;
  mirrored_strategy& operator=(const mirrored_strategy&) = delete;

  /// Number of local replicas (those of this process).
  [[nodiscard]] std::size_t num_replicas() const noexcept { return ordinals_.size(); }
  /// The device ordinal of each local replica.
  [[nodiscard]] const std::vector<std::size_t>& device_ordinals() const noexcept { return ordinals_; }
  /// The options.
  [[nodiscard]] const strategy_options& options() const noexcept { return options_; }
  /// Records the steps' spans on `rec` from now on (null: stops): each replica's forward and
  /// backward per top-level layer, each bucket's reduction from its start to its wait, the
  /// epilogue, the update and its gather, as thread r of `rec` for replica r (core/trace.hpp).
  /// `rec` records only in its window of steps (trace_recorder::begin_step) and must outlive
  /// its use here; needs at least num_replicas() threads.
  /// @throws config_error when `rec` has fewer threads than this process has replicas.
  void set_trace(trace_recorder* rec) {
    if (rec != nullptr && rec->threads() < num_replicas())
      throw config_error("lockstep::mirrored::set_trace: the recorder has " + std::to_string(rec->threads()) +
                         " threads; this strategy has " + std::to_string(num_replicas()) +
                         " replicas, one recorder thread each");
    trace_ = rec;
  }
  /// The recorder set by set_trace (null: none).
  [[nodiscard]] trace_recorder* trace() const noexcept { return trace_; }

  /// The reducer (for collectives issued from inside run()).
  [[nodiscard]] Reducer& reducer() noexcept { return reducer_; }
  /// The world: `world().rank()`, `size()`, `is_chief()`, `plan()`, `global_replicas()`, `sum(values)`.
  [[nodiscard]] World& world() noexcept { return world_; }
  /// The world (read-only).
  [[nodiscard]] const World& world() const noexcept { return world_; }
  /// How global batches are cut: world().plan() (one shard per local replica in a local world).
  [[nodiscard]] shard_plan plan() const noexcept { return world_.plan(); }
  /// BLAS threads per host replica (strategy_options::blas_threads; 1 by default, so a cpu<I>
  /// device is one core and replicas × BLAS threads never exceed the cores).
  [[nodiscard]] int blas_threads() const noexcept { return options_.blas_threads; }
  /// The strategy in words, for messages: "mirrored over cpu devices {0, 1}" (and the world).
  [[nodiscard]] const std::string& description() const noexcept { return identity_->description; }

  /// Makes one replica of Net per local device, initialised from `s` and made identical by a
  /// broadcast from replica 0 (of rank 0). The model is bound to this strategy. Collective: the
  /// workers first check that they agree on the collective plan (a config_error naming the
  /// field otherwise).
  /// @tparam P the parameter type (float; double for gradient checks) or a precision policy
  ///           (core/precision.hpp): fp32, mixed<bf16> and mixed<fp16>, and tf32 (gpu replicas).
  ///           A policy's model stores fp32, so its type is the fp32 model's.
  template <class Net, class P = float>
  [[nodiscard]] model_type<Net, precision_value_t<P>> replicate(lockstep::seed s) {
    [[maybe_unused]] const backend::caller_scope_t<context_type> keep;  // the caller's device stays current
    static_assert(precision_traits<P>::known,
                  "lockstep: replicate<Net, P>: P is a parameter type (float, double) or a precision policy "
                  "(lockstep::fp32, lockstep::tf32, lockstep::mixed<lockstep::bf16>, lockstep::mixed<lockstep::fp16>); "
                  "bf16 and fp16 alone are formats, not policies: write lockstep::mixed<lockstep::bf16>");
    using T = precision_value_t<P>;
    constexpr compute_precision precision = precision_traits<P>::precision;
    static_assert(precision != compute_precision::tf32 || is_gpu_v<Kind>,
                  "lockstep: the tf32 policy is for gpu replicas (TF32 tensor cores); cpu replicas compute in fp32, or "
                  "in bf16 under lockstep::mixed<lockstep::bf16>");
    world_.check_usable();
    std::vector<context_type> contexts;
    contexts.reserve(num_replicas());
    for (const std::size_t o : ordinals_)
      contexts.push_back(backend_traits<Kind>::make_context(
          o, replica_settings{options_.blas_threads, options_.flush_denormals, options_.tf32, precision}));
    check_replica_memory<Kind>(contexts, (model_type<Net, T>::stored_count + model_type<Net, T>::param_count) * sizeof(T) +
                                             reducer_.workspace_bytes(model_type<Net, T>::param_count * sizeof(T)));
    model_type<Net, T> m(std::move(contexts), s, options_.bucket_bytes, identity_);
    m.set_optimizer_sharding(options_.shard_optimizer.is_on(), shards_on_grid_for<T>);  // automatic: see prepare_update
    collective_ids::check_buckets(m.buckets().size, "lockstep::mirrored");
    if constexpr (device_memory<Kind>::host_accessible && requires { world_.reserve_floats(m.stored_count); })
      world_.reserve_floats(m.stored_count);  // the communication thread's scratch: no allocation in a step
    world_.agree(plan_of(m));  // a mismatch is a config_error; the check's own collective completed
    if constexpr (std::is_same_v<T, float> && requires { reducer_.gradient_storage(std::size_t{}, std::size_t{}); })
      for (std::size_t r = 0; r < num_replicas(); ++r)  // gradients where the reducer sums them in place
        if (std::shared_ptr<float> storage = reducer_.gradient_storage(r, m.param_count))
          m.replica(r).model().adopt_gradients(m.replica(r).context(), std::move(storage));
    bind_workspaces(m, m.param_count * sizeof(T));
    broadcast(m, 0);
    return m;
  }

  /// What every worker must agree on for model `m` before the first collective (world.hpp).
  template <class Net, class T>
  [[nodiscard]] collective_plan plan_of(const model_type<Net, T>& m) const {
    collective_plan p;
    p.add("lockstep version", static_cast<std::uint64_t>(version_major) * 1'000'000 + version_minor * 1'000 + version_patch);
    p.add_hashed("device kind", backend_traits<Kind>::name);
    p.add("determinism", static_cast<std::uint64_t>(Determinism));
    p.add_hashed("reducer", typeid(Reducer).name());
    p.add("parameter type size", sizeof(T));
    p.add("precision", static_cast<std::uint64_t>(m.precision()));
    p.add("bucket_bytes", options_.bucket_bytes);
    p.add("micro_shard_rows", options_.micro_shard_rows);
    p.add("shard_optimizer", static_cast<std::uint64_t>(options_.shard_optimizer.value()));
    p.add("parameter count", m.param_count);
    p.add("stored parameter count", m.stored_count);
    p.add("bucket count", m.buckets().size);
    std::string layout;
    for (std::size_t k = 0; k < m.buckets().size; ++k)
      layout += std::to_string(m.buckets().buckets[k].offset) + ":" + std::to_string(m.buckets().buckets[k].count) + ",";
    p.add_hashed("bucket plan", layout);
    return p;
  }

  /// Throws config_error naming both strategies unless this strategy made `m`.
  template <class Net, class T>
  void check_model(const model_type<Net, T>& m) const {
    if (!m.made_by(identity_.get()))
      throw config_error("lockstep::mirrored: the model was made by another strategy (" + m.owner_description() +
                         ") and cannot be used with this one (" + description() +
                         "); make it with this strategy's replicate(), or load its checkpoint into one that is");
  }

  /// Copies replica `root`'s parameters and optimiser state (of rank 0, across workers) to every
  /// other replica (only the parameters when the update is sharded: each replica owns its slice
  /// of the state). A replica whose state differs in size from root's (a failure before every
  /// replica had made its state, a worker that has made none yet) is given the size of rank 0's
  /// root first; when that root has none, every replica's state is dropped, so the next update
  /// makes it as on a fresh model. Across workers `root` is a replica of rank 0 (the others'
  /// replicas take rank 0's values), and the workers' updates must be all sharded or none
  /// (automatic sharding decides per worker from its replica count).
  /// Collective. @throws config_error on every worker when root is not one of rank 0's
  /// replicas, or when the workers differ in whether their update is sharded (give
  /// strategy_options::shard_optimizer explicitly).
  template <class Net, class T>
  void broadcast(model_type<Net, T>& m, std::size_t root = 0) {
    [[maybe_unused]] const backend::caller_scope_t<context_type> keep;  // replica 0 runs on this thread
    check_model(m);
    world_.check_usable();
    const bool sharded = m.optimizer_sharded();
    const std::size_t asked = root;
    bool root_ok = root < num_replicas();
    std::size_t state = sharded || !root_ok ? 0 : m.replica(root).optimizer_state().size();
    if (world_.size() > 1) {
      // Rank 0's root check and state size on every worker (they all take part in the same
      // broadcasts, and all refuse alike), and how many workers shard their update.
      const bool chief = world_.rank() == 0;
      double v[3] = {chief && root_ok ? 1.0 : 0.0, chief ? static_cast<double>(state) : 0.0, sharded ? 1.0 : 0.0};
      world_.sum(std::span<double>(v));
      root_ok = v[0] == 1.0;
      state = static_cast<std::size_t>(v[1]);
      if (root_ok && v[2] != 0.0 && v[2] != static_cast<double>(world_.size()))
        throw config_error("lockstep::mirrored::broadcast: " + std::to_string(static_cast<std::size_t>(v[2])) + " of the " +
                           std::to_string(world_.size()) + " workers shard their optimiser update and the others do not "
                           "(optimizer_sharding::automatic() decides per worker, from its replica count): set "
                           "strategy_options::shard_optimizer to true or false on every worker");
      if (!chief) root = 0;  // this worker's replicas take rank 0's values through its replica 0
    }
    if (!root_ok)
      throw config_error("lockstep::mirrored::broadcast: root " + std::to_string(asked) + " is not a replica" +
                         (world_.size() > 1 ? " of worker rank 0" : ""));
    auto job = [&](std::size_t r) {
      auto& rep = m.replica(r);
      rep.context().activate();
      reducer_.broadcast(r, rep.context(), rep.model().parameters().data(), m.stored_count, root);
      if (!m.optimizer_sharded() && state == 0)
        rep.clear_optimizer_state();  // root made none: the next update makes every replica's (of its optimiser)
      else if (!m.optimizer_sharded() && rep.optimizer_state().size() != state)
        rep.optimizer_state() = std::remove_reference_t<decltype(rep.optimizer_state())>(state);
      if (state) reducer_.broadcast(r, rep.context(), rep.optimizer_state().data(), state, root);
    };
    world_.guarded([&] { exec_.execute(job); }, [this] { abort_all(this); });
  }

  /// Runs fn(replica_index, shard) on every local replica's worker with its shard of `b`; returns
  /// the per-replica results (nothing for a void fn). The first failure reaches the caller as a replica_error.
  template <class F>
  auto run(F&& fn, const data::distributed_batch& b) {
    [[maybe_unused]] const backend::caller_scope_t<context_type> keep;  // replica 0 runs on this thread
    return exec_.run(std::forward<F>(fn), b);
  }

  /// Runs fn(replica_index) on every local replica's worker and waits for all.
  template <class F>
  void run_each(F&& fn) {
    [[maybe_unused]] const backend::caller_scope_t<context_type> keep;  // replica 0 runs on this thread
    exec_.run_each(std::forward<F>(fn));
  }

  /// Combines per-replica values of this process in replica order (sum, mean, min or max; see
  /// executor::reduce); world().sum adds values over the workers.
  template <class V>
  [[nodiscard]] auto reduce(reduce_op op, const std::vector<V>& values) const {
    return exec_.reduce(op, values);
  }

  /// In-place sum of `count` elements across every replica of every worker, called by every
  /// local replica from inside run() or run_each() (synchronous; collective_ids::all_reduce).
  template <class Ctx, class T>
  void all_reduce(std::size_t replica, Ctx& ctx, T* data, std::size_t count) {
    reducer_.start(replica, ctx, data, count, collective_ids::all_reduce);
    reducer_.wait(replica, ctx, collective_ids::all_reduce);
  }

  /// Every worker arrives (nothing to wait for in a local world). Collective.
  /// @throws config_error when a failure has left the strategy unusable (as train_step does).
  void barrier() {
    world_.check_usable();
    world_.guarded([&] { world_.barrier(); }, [this] { abort_all(this); });
  }

  /// Cuts every global batch of `batches` into this process's shards: plan().parts shards, of
  /// which this process keeps one per local replica from plan().first (data::shard_batches; in a
  /// local world, the whole batch over the replicas). It takes global batches: a worker's part
  /// (data::shard_by_worker) is cut with data::shard_batches(part, num_replicas()) instead.
  template <class Range>
  [[nodiscard]] auto shard(Range&& batches) const {
    const shard_plan p = plan();
    return data::shard_batches(std::forward<Range>(batches), p.parts, p.first, num_replicas());
  }

  /// One synchronous training step on `b` (see lockstep::train_step): b.global is the whole
  /// global batch, b.shards this process's shards of it (plan()). It completes an update: the
  /// last batch of one started by accumulate(), or an update of its own. The update follows
  /// `recipe` (clipping, the non-finite guard, the EMA; epilogue.hpp). Collective.
  /// @throws numerics_error when the recipe's guard raises (the update changed nothing); what a
  ///         replica throws, as a replica_error (the update in progress is abandoned).
  template <class Net, class T, class Optimizer, class Loss>
  step_stats train_step(model_type<Net, T>& m, const Optimizer& opt, const Loss& loss, const data::distributed_batch& b,
                        const update_recipe& recipe = {}) {
    static_assert(optimizer<Optimizer>, "lockstep::train_step: the optimiser must satisfy lockstep::optimizer");
    static_assert(lockstep::loss<Loss>, "lockstep::train_step: the loss must satisfy lockstep::loss");
    static_assert(detail::check_step_policy_run<step_policy, Reducer, model_type<Net, T>, Loss>());
    [[maybe_unused]] const backend::caller_scope_t<context_type> keep;  // replica 0 runs on this thread
    check_model(m);
    world_.check_usable();
    exec_.check_batch(b);
    recipe.check();
    check_hyperparameters(opt);
    check_loss_options(loss);
    const std::size_t total = b.global_size();
    check_shards(b, total);
    check_pending(m);
    if (options_.defer_readback) check_deferrable(recipe, m.loss_scaled());
    prepare_update(m, opt);
    const update_part part{pending_.rows, pending_.batches == 0, true};
    const std::size_t rows = pending_.rows + total;
    if (rows == 0) return {};
    pass_info info = pass_info::for_training(m.seed().value, m.step());
    info.trace = trace_;
    // Under a dynamic loss scale an overflow skips the update (unless the recipe raises) and the
    // scaler, not max_consecutive_skips, decides when to stop.
    const bool scaled = m.loss_scaled();
    update_recipe effective = recipe;
    if (scaled) {
      if (effective.nonfinite == nonfinite_policy::apply) effective.nonfinite = nonfinite_policy::skip;
      effective.max_consecutive_skips = std::numeric_limits<std::uint64_t>::max();
    }
    const double loss_scale = scaled ? m.scaler().scale() : 1.0;
    set_loss_scale(m, loss_scale);
    // The optimiser counts the updates it applied (a skipped update is not one).
    const update_info base{opt.lr, m.step() - m.skipped_updates() + 1, 1.0 / static_cast<double>(rows)};
    detail::update_phase<model_type<Net, T>, Optimizer, Reducer> finish(m, opt, effective, base, rows, loss_scale, epilogue_,
                                                                        reducer_);
    finish.set_trace(trace_);
    if (part.first) std::fill(epilogue_.nonfinite_loss.begin(), epilogue_.nonfinite_loss.end(), 0);
    if (part.first) keep_states(m);
    step_stats out;
    const std::uint64_t step_before = m.step();
    try {
      const defer_scope<model_type<Net, T>> deferring(m, options_.defer_readback);
      out = world_.guarded([&] { return step_.run(exec_, reducer_, m, loss, b, info, part, finish); },
                           [this] { abort_all(this); });
    } catch (...) {
      pending_ = {};
      drop_late(m);
      restore_states(m);
      throw;
    }
    pending_ = {};
    out.count = rows;
    out.loss_scale = loss_scale;
    const epilogue_result& r = finish.result();
    if (effective.needs_epilogue()) {
      out.grad_norm = r.norm;
      out.clip_factor = r.factor;
    }
    out.skipped = r.skip;
    // A skipped update leaves the running statistics as the update found them (when this function
    // returns or throws: the diagnostics below run forward passes too).
    const state_restorer<Net, T> unmoved{r.skip ? &m : nullptr};
    if (r.skip && effective.nonfinite == nonfinite_policy::raise)
      throw numerics_error(
          numerics_message(m, loss, b, part.offset, "the reduced gradient is not finite; the update was not applied"),
          m.step());
    m.count_update(r.skip);
    if (finish.updates_ema() && !r.skip) m.count_ema_update();
    // From here the update is counted, so the step advances however this function leaves (the
    // limits' diagnostics below run forward passes, which may throw): a checkpoint never holds
    // more skipped updates than updates.
    const std::uint64_t step = m.step();
    const step_advance<model_type<Net, T>> advance{m, step + 1};
    if (scaled && !m.scaler().update(r.skip))
      throw numerics_error(
          numerics_message(m, loss, b, part.offset,
                           "the reduced gradient overflowed in " + std::to_string(loss_scaler::max_overflows_at_minimum) +
                               " updates in a row at the smallest loss scale, 1; each was skipped: the model diverged, or "
                               "its values do not fit fp16 (try mixed<bf16>)"),
          step);
    if (r.skip && effective.nonfinite == nonfinite_policy::skip && m.consecutive_skips() >= effective.max_consecutive_skips)
      throw numerics_error(  // this skipped update is consumed like the others
          numerics_message(m, loss, b, part.offset,
                           "the reduced gradient was not finite in " + std::to_string(m.consecutive_skips()) +
                               " updates in a row (update_recipe::max_consecutive_skips); each was skipped"),
          step);
    // `advance` sets the step to step + 1 as this function returns (nothing below reads it).
    if constexpr (can_defer_readback) {
      if (options_.defer_readback) {  // this update's loss comes back with the next step
        const detail::late_update now{out, step_before, effective.needs_epilogue()};
        const step_stats previous = take_late(m);
        for (std::size_t r = 0; r < m.size(); ++r) m.replica(r).context().readback_seal();
        m.late_update() = now;
        return previous;
      }
    }
    return out;
  }

  /// Under strategy_options::shard_optimizer = optimizer_sharding::automatic() (the default):
  /// decides whether the update of `m`, trained with `opt`, is sharded — yes on host replicas,
  /// two or more in this process, with an elementwise optimiser that keeps one or more state
  /// values per parameter (adam, adamw, sgd with momentum) where the reducer reduces onto the
  /// slices (shards_on_grid: host_allreduce), two or more (adam, adamw) with other reducers (what
  /// bench_scaling measured faster) — while `m` has applied no update and holds no optimiser state or EMA;
  /// otherwise, and under `true` or `false`, it changes nothing. train_step calls it before
  /// the model's first update, and fit before it restores a checkpoint (so a resumed run shards as
  /// the first run did); a custom loop that restores a checkpoint calls it first.
  template <class Net, class T, class Optimizer>
  void prepare_update(model_type<Net, T>& m, const Optimizer& opt) {
    check_model(m);
    // An EMA loaded before the first update keeps the layout it was loaded in.
    if (!options_.shard_optimizer.is_automatic() || m.step() != 0 || m.has_ema()) return;
    for (std::size_t r = 0; r < m.size(); ++r)
      if (m.replica(r).optimizer_state().size() != 0) return;
    constexpr std::size_t n = model_type<Net, T>::param_count;
    bool shard = false;
    if constexpr (device_memory<Kind>::host_accessible && optimizer_elementwise_v<Optimizer>)
      shard = m.size() > 1 && opt.state_size(n) >= (shards_on_grid_for<T> ? 1 : 2) * n;
    m.set_optimizer_sharding(shard, shards_on_grid_for<T>);
  }

  /// Under strategy_options::defer_readback: the statistics of the last update of `m` that
  /// train_step has not returned yet, once its work is done (a host wait); count 0 when none is
  /// pending. Without deferral nothing is ever pending: count 0. Call it where a run of steps
  /// ends (fit calls it before every checkpoint and at the end of every epoch).
  /// @throws numerics_error when that update's loss was NaN.
  template <class Net, class T>
  step_stats flush_stats(model_type<Net, T>& m) {
    check_model(m);
    return take_late(m);
  }

  /// One batch of an update that more batches will complete (gradient accumulation): every
  /// replica runs forward and backward on its shard of `b` and adds its gradients to those of
  /// the update's earlier batches; no parameter changes, and no collective runs that the step
  /// policy can avoid (run_to_run: none). The update's rows are the rows of all its batches, so
  /// the update train_step() completes is that of one batch holding them all (bitwise under
  /// replica_count_invariant when every batch's rows are a multiple of micro_shard_rows).
  /// Returns the update's loss sum and hits so far (this process's replicas' before the last
  /// batch, in a world of several processes) and its rows so far. Collective.
  /// @throws config_error when another model has an update in progress on this strategy.
  template <class Net, class T, class Loss>
  step_stats accumulate(model_type<Net, T>& m, const Loss& loss, const data::distributed_batch& b) {
    static_assert(lockstep::loss<Loss>, "lockstep::accumulate: the loss must satisfy lockstep::loss");
    [[maybe_unused]] const backend::caller_scope_t<context_type> keep;  // replica 0 runs on this thread
    check_model(m);
    world_.check_usable();
    exec_.check_batch(b);
    const std::size_t total = b.global_size();
    check_shards(b, total);
    check_pending(m);
    step_stats out;
    if (total > 0) {
      set_loss_scale(m, m.loss_scaled() ? m.scaler().scale() : 1.0);
      const update_part part{pending_.rows, pending_.batches == 0, false};
      pass_info info = pass_info::for_training(m.seed().value, m.step());
      info.trace = trace_;
      epilogue_.prepare(num_replicas(), model_type<Net, T>::param_count);
      if (part.first) std::fill(epilogue_.nonfinite_loss.begin(), epilogue_.nonfinite_loss.end(), 0);
      if (part.first) keep_states(m);
      detail::accumulate_phase<Kind> phase(epilogue_);
      try {
        const defer_scope<model_type<Net, T>> deferring(m, options_.defer_readback);
        out = world_.guarded([&] { return step_.run(exec_, reducer_, m, loss, b, info, part, phase); },
                             [this] { abort_all(this); });
      } catch (...) {
        pending_ = {};
        drop_late(m);
        restore_states(m);
        throw;
      }
      pending_.model = &m;
      if (options_.defer_readback) pending_.discard = &discard_current<Net, T>;
      pending_.rows += total;
      ++pending_.batches;
    }
    out.count = pending_.rows;
    return out;
  }

  /// Abandons the update in progress (the batches accumulate() gave since the last update): the
  /// next batch starts a new update. Nothing else changes.
  void abandon_update() noexcept {
    if (pending_.discard) pending_.discard(pending_.model);
    pending_ = {};
  }
  /// Batches of the update in progress (0: none).
  [[nodiscard]] std::size_t pending_batches() const noexcept { return pending_.batches; }

private:
  // Every replica of `m` keeps its non-trainable state (batch norm's running statistics) as the
  // update starts, for restore_states (a skipped or failed update changes none of it).
  template <class Net, class T>
  static void keep_states(model_type<Net, T>& m) {
    if constexpr (model_type<Net, T>::stored_count > model_type<Net, T>::param_count)
      for (std::size_t r = 0; r < m.size(); ++r) m.replica(r).keep_state();
  }
  // Puts back what keep_states kept (best effort while an error is on its way: a device that
  // failed reports its own error).
  template <class Net, class T>
  static void restore_states(model_type<Net, T>& m) noexcept {
    if constexpr (model_type<Net, T>::stored_count > model_type<Net, T>::param_count)
      for (std::size_t r = 0; r < m.size(); ++r) try {
          m.replica(r).restore_state();
        } catch (...) {
        }
  }
  // Sets the step of the model it names to `to` when it goes (the update is counted, however the
  // step function leaves).
  template <class M>
  struct step_advance {
    M& m;             // the model
    std::uint64_t to;  // its step from then on
    ~step_advance() { m.set_step(to); }
  };
  // Calls restore_states on the model it names when it goes.
  template <class Net, class T>
  struct state_restorer {
    model_type<Net, T>* m;  // null: nothing to restore
    explicit state_restorer(model_type<Net, T>* model) noexcept : m(model) {}
    state_restorer(const state_restorer&) = delete;
    state_restorer& operator=(const state_restorer&) = delete;
    ~state_restorer() {
      if (m) restore_states(*m);
    }
  };

  // Every replica of `m` multiplies its loss's gradient by `s` (the dynamic loss scale).
  template <class Net, class T>
  static void set_loss_scale(model_type<Net, T>& m, double s) noexcept {
    for (std::size_t r = 0; r < m.size(); ++r) m.replica(r).set_loss_scale(s);
  }

  static std::vector<std::size_t> check_ordinals(std::vector<std::size_t> o) {
    if (o.empty()) throw config_error("lockstep::mirrored: needs at least one device");
    return o;
  }

  static std::string describe(const std::vector<std::size_t>& ordinals, const World& w) {
    std::string text = std::string("mirrored over ") + backend_traits<Kind>::name + " devices " + detail::list_text(ordinals);
    const std::string where = w.describe();
    return where.empty() ? text : text + " (" + where + ")";
  }

  static strategy_options check(strategy_options o, std::size_t replicas, const World& w) {
    o.timeout = detail::checked_timeout(o.timeout);
    if (o.blas_threads < 1)
      throw config_error("lockstep: strategy_options::blas_threads must be >= 1, got " + std::to_string(o.blas_threads));
    if constexpr (backend_traits<Kind>::replica_owns_core) {
      if (w.size() > 1) {
        o.pin_replicas = false;  // several processes share the machine's cores
      } else {
        const auto cores = static_cast<std::size_t>(allowed_cpu_count());
        if (o.blas_threads > 1 && replicas * static_cast<std::size_t>(o.blas_threads) > cores)
          throw config_error("lockstep: strategy_options::blas_threads = " + std::to_string(o.blas_threads) + " with " +
                             std::to_string(replicas) + " replicas would run " +
                             std::to_string(replicas * static_cast<std::size_t>(o.blas_threads)) + " BLAS threads on " +
                             std::to_string(cores) + " cores");
      }
    }
    if (o.shard_optimizer.is_on() && !device_memory<Kind>::host_accessible &&
        !detail::shards_on_device_v<typename backend_traits<Kind>::context_type>)
      throw config_error(std::string("lockstep: strategy_options::shard_optimizer is implemented for devices with host "
                                     "memory (cpu<I>) and GPUs, not for ") + backend_traits<Kind>::name + " devices");
    if (o.defer_readback) {
      if constexpr (!can_defer_readback)
        throw config_error(std::string("lockstep: strategy_options::defer_readback is for device replicas whose context "
                                       "reads back a step late (gpu); ") +
                           backend_traits<Kind>::name + " replicas read their statistics in the step, with no wait to save");
      if (w.size() > 1)
        throw config_error("lockstep: strategy_options::defer_readback is implemented in one process, not across " +
                           std::to_string(w.size()) + " workers");
    }
    if (Determinism == determinism::replica_count_invariant && o.blas_threads != 1)
      throw config_error("lockstep: strategy_options::blas_threads must be 1 under replica_count_invariant "
                         "(a GEMM's result must not depend on the thread count)");
    return o;
  }

  // The shards must hold exactly this process's part of the global batch (plan()).
  void check_shards(const data::distributed_batch& b, std::size_t total) const {
    std::size_t held = 0, expected = 0;
    for (const auto& s : b.shards) held += s.size;
    const shard_plan p = world_.plan();
    for (std::size_t r = 0; r < num_replicas(); ++r) expected += data::detail::part_of(total, p.first + r, p.parts).second;
    if (held != expected)
      throw shape_error("lockstep::train_step: the shards hold " + std::to_string(held) + " rows but this process's part of "
                        "the global batch of " + std::to_string(total) + " has " + std::to_string(expected));
  }

  // Refuses a batch for model `m` while another model's update is in progress.
  template <class M>
  void check_pending(const M& m) const {
    if (pending_.model && pending_.model != static_cast<const void*>(&m))
      throw config_error("lockstep::mirrored: another model has an update in progress on this strategy (" +
                         std::to_string(pending_.batches) +
                         " batches accumulated); complete it with train_step or call abandon_update() first");
  }

  // The message of a numerics_error at the current update of `m`, whose last batch was `b` at
  // row offset `offset` of the update: the step, the first non-finite layer, and the replica and
  // worker whose shard produced the non-finite value — the first whose loss was not finite, else
  // (the loss was finite and the overflow arose in the backward pass) the first whose shard of
  // `b` gives a non-finite gradient when its forward and backward run again (this path only: the
  // update was skipped, so the parameters are those the batch saw).
  template <class Net, class T, class Loss>
  std::string numerics_message(model_type<Net, T>& m, const Loss& loss, const data::distributed_batch& b,
                               std::size_t offset, const std::string& what) {
    using table = detail::layer_table<typename model_type<Net, T>::model_type::bound>;
    constexpr std::size_t P = model_type<Net, T>::param_count;
    std::string text = "lockstep: update " + std::to_string(m.step() + 1) + " (step " + std::to_string(m.step()) +
                       "): " + what;
    // The first non-finite parameter gradient, from the reduced sums: replica 0's, or, where the
    // reducer reduced onto the update's slices, each replica's own slice.
    std::vector<T> g(P);
    const bool slices = m.update_plan().on_grid();
    for (std::size_t r = 0; r < (slices ? m.size() : 1); ++r) {
      const auto [lo, hi] = slices ? m.update_plan().slice(r) : std::pair<std::size_t, std::size_t>{0, P};
      copy_to_host(m.replica(r).context(), g.data() + lo, m.replica(r).model().gradients().data() + lo, hi - lo);
      m.replica(r).context().synchronize();
    }
    std::size_t at = P;
    for (std::size_t i = 0; i < P; ++i)
      if (!(g[i] - g[i] == 0)) {
        at = i;
        break;
      }
    if (at < P) {
      std::size_t layer = 0;
      for (std::size_t k = 0; k < table::count; ++k)
        if (table::params[k] > 0 && table::offsets[k] <= at && at < table::offsets[k] + table::params[k]) layer = k;
      std::size_t bucket = 0;
      for (std::size_t k = 0; k < m.buckets().size; ++k) {
        const auto& bk = m.buckets().buckets[k];
        if (bk.offset <= at && at < bk.offset + bk.count) bucket = k;
      }
      text += "; the first non-finite gradient is parameter " + std::to_string(at) + " of layer " + std::to_string(layer) +
              " (gradient bucket " + std::to_string(bucket) + ")";
    }
    // Per worker: 1 + the first local replica to blame, and how (1: its loss, 2: its gradient).
    std::size_t local = 0, how = 0;
    for (std::size_t r = 0; r < num_replicas() && how == 0; ++r)
      if (epilogue_.nonfinite_loss.size() > r && epilogue_.nonfinite_loss[r]) {
        local = r;
        how = 1;
      }
    if (how == 0) {  // each local replica runs its shard again, on its own (no row exchange)
      std::vector<char> bad(num_replicas(), 0);
      pass_info info = pass_info::for_training(m.seed().value, m.step());
      info.update_offset = offset;
      auto job = [&](std::size_t r) {
        auto& rep = m.replica(r);
        data::shard own = b.shards[r];
        own.global_size = own.size;  // a batch of its own: batch norm normalises over the shard
        (void)rep.forward_backward(loss, own, info);
        std::vector<T> h(P);
        copy_to_host(rep.context(), h.data(), rep.model().gradients().data(), P);
        rep.context().synchronize();
        for (const T v : h)
          if (!(v - v == 0)) {
            bad[r] = 1;
            break;
          }
      };
      try {
        exec_.execute(job, m.step());
      } catch (const std::exception&) {
        std::fill(bad.begin(), bad.end(), 0);  // the message then names no replica
      }
      for (std::size_t r = 0; r < bad.size() && how == 0; ++r)
        if (bad[r]) {
          local = r;
          how = 2;
        }
    }
    // Every worker's findings, a collective that every worker reaches (every worker decided the same).
    std::vector<double> found(2 * world_.size(), 0.0);
    if (how) {
      found[2 * world_.rank()] = static_cast<double>(local + 1);
      found[2 * world_.rank() + 1] = static_cast<double>(how);
    }
    world_.sum(std::span<double>(found));
    for (std::size_t w = 0; w < world_.size(); ++w)
      if (found[2 * w] > 0) {
        const std::string who =
            "replica " + std::to_string(static_cast<std::size_t>(found[2 * w]) - 1) + " of worker " + std::to_string(w);
        return text + (found[2 * w + 1] == 1 ? "; the shard of " + who + " gave a non-finite loss"
                                             : "; the shard of " + who + " gave a finite loss but a non-finite gradient");
      }
    return text + "; no replica's shard of the update's last batch gives a non-finite value on its own";
  }

  // strategy_options::defer_readback: every replica context of `m` defers its readback for one
  // step, and stops when the step ends or throws.
  template <class M>
  class defer_scope {
  public:
    defer_scope(M& m, bool on) noexcept : m_(on ? &m : nullptr) { set(true); }
    ~defer_scope() { set(false); }
    defer_scope(const defer_scope&) = delete;
    defer_scope& operator=(const defer_scope&) = delete;

  private:
    void set(bool v) noexcept {
      if constexpr (can_defer_readback)
        if (m_)
          for (std::size_t r = 0; r < m_->size(); ++r) m_->replica(r).context().set_defer_readback(v);
    }
    M* m_;
  };

  // Refuses an update that decides on the host while readback is deferred.
  static void check_deferrable(const update_recipe& recipe, bool loss_scaled) {
    if (recipe.nonfinite != nonfinite_policy::apply)
      throw config_error("lockstep::train_step: strategy_options::defer_readback reads each update's epilogue decision "
                         "one step late, but update_recipe::nonfinite = skip or raise decides on the host whether the "
                         "update counts; use nonfinite_policy::apply, or turn defer_readback off");
    if (loss_scaled)
      throw config_error("lockstep::train_step: strategy_options::defer_readback reads each update's epilogue decision "
                         "one step late, but mixed<fp16>'s dynamic loss scale changes on the host after each update; "
                         "use mixed<bf16>, or turn defer_readback off");
  }

  // Drops the readback pages of every replica of `m` and its late update (after a failure).
  template <class M>
  static void drop_late(M& m) noexcept {
    if constexpr (can_defer_readback) {
      for (std::size_t r = 0; r < m.size(); ++r) m.replica(r).context().readback_reset();
      m.late_update().reset();
    }
  }

  // Drops what the current readback page of every replica of the model at `p` holds (an abandoned update).
  template <class Net, class T>
  static void discard_current(const void* p) noexcept {
    if constexpr (can_defer_readback) {
      auto& m = *static_cast<model_type<Net, T>*>(const_cast<void*>(p));
      for (std::size_t r = 0; r < m.size(); ++r) m.replica(r).context().readback_discard();
    }
  }

  // The late update of `m` completed with what its replicas read back (their sealed pages, each
  // replica's losses in evaluation order, the replicas in order: the sums an undeferred step
  // makes); count 0 when none. Frees the pages.
  template <class Net, class T>
  step_stats take_late(model_type<Net, T>& m) {
    if constexpr (!can_defer_readback) {
      return {};
    } else {
      auto& late = m.late_update();
      double loss_sum = 0;
      std::size_t correct = 0, evaluations = 0;
      bool nan = false;
      double norm = 0, factor = 1;
      bool decided = false;
      for (std::size_t r = 0; r < m.size(); ++r) {
        const backend::readback_totals t = m.replica(r).context().readback_collect();
        loss_sum += t.loss;
        correct += t.hits;
        evaluations += t.evaluations;
        nan = nan || t.nan;
        if (r == 0 && t.has_decision) {
          decided = true;
          norm = t.decision.norm;
          factor = t.decision.factor;
        }
      }
      if (!late) return {};
      step_stats s = late->stats;
      const std::uint64_t step = late->step;
      const bool has_norm = late->has_norm;
      late.reset();
      if (evaluations > 0) {  // else the loss read its totals in the step (one that does not defer)
        s.loss_sum = loss_sum;
        s.correct = correct;
      }
      if (has_norm && decided) {  // else the host read the decision in the step (an optimiser of the user's)
        s.grad_norm = norm;
        s.clip_factor = factor;
      }
      if (nan) {
        drop_late(m);
        throw numerics_error("lockstep: update " + std::to_string(step + 1) + " (step " + std::to_string(step) +
                                 "): its loss is NaN, read one step late under strategy_options::defer_readback (the "
                                 "update was applied): a logit is not finite (a learning rate too large, or input "
                                 "values that are not finite)",
                             step);
      }
      return s;
    }
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

  // Called by replicate on the caller's thread: it places the workspaces, computes nothing.
  template <class Model>
  void bind_workspaces(Model& m, std::size_t max_bucket_bytes) {
    const std::size_t bytes = reducer_.workspace_bytes(max_bucket_bytes);
    if (bytes > workspace_bytes_) {
      workspaces_.clear();
      for (std::size_t r = 0; r < num_replicas(); ++r) {
        backend::place_memory(m.replica(r).context());  // device memory lands on replica r's device
        workspaces_.emplace_back(bytes);
      }
      workspace_bytes_ = bytes;
      auto job = [&](std::size_t r) { reducer_.bind(r, workspaces_[r].data(), bytes); };
      exec_.execute(job);
    }
  }

  std::vector<std::size_t> ordinals_;
  strategy_options options_;
  World world_;
  std::shared_ptr<const strategy_identity> identity_;
  Reducer reducer_;
  step_policy step_;
  std::vector<basic_buffer<std::byte, Kind>> workspaces_;
  std::size_t workspace_bytes_ = 0;
  executor exec_;
  detail::epilogue_workspace<Kind> epilogue_;
  trace_recorder* trace_ = nullptr;
  // The update accumulate() has in progress.
  struct pending_update {
    const void* model = nullptr;  // the model whose update is in progress
    std::size_t rows = 0;         // its rows so far
    std::size_t batches = 0;      // its batches so far
    void (*discard)(const void*) noexcept = nullptr;  // drops its deferred readback (defer_readback)
  } pending_;
};

/// One synchronous training step of model `m` on distributed batch `b`: every replica runs
/// forward and backward on its shard, gradient sums are all-reduced bucket by bucket while the
/// backward pass continues, and every replica applies the same update with lr = opt.lr and
/// grad_scale = 1 / (global sample count of the update: all its batches under accumulation). Returns the loss summed over the global batch, the
/// count and the training hits; increments m.step(). An empty global batch changes nothing and
/// returns {0, 0}, unless batches given to accumulate() are pending: then it completes their update.
template <class Strategy, class Model, class Optimizer, class Loss>
  requires strategy_for<Strategy, Model, Optimizer, Loss>
step_stats train_step(Strategy& s, Model& m, const Optimizer& opt, const Loss& loss, const data::distributed_batch& b) {
  return s.train_step(m, opt, loss, b);
}

/// train_step following an update recipe (clipping, the non-finite guard, the EMA; epilogue.hpp).
template <class Strategy, class Model, class Optimizer, class Loss>
  requires strategy_for<Strategy, Model, Optimizer, Loss>
step_stats train_step(Strategy& s, Model& m, const Optimizer& opt, const Loss& loss, const data::distributed_batch& b,
                      const update_recipe& recipe) {
  return s.train_step(m, opt, loss, b, recipe);
}

/// One batch of an update that a later train_step completes (gradient accumulation; see
/// mirrored_strategy::accumulate).
template <class Strategy, class Model, class Loss>
step_stats accumulate(Strategy& s, Model& m, const Loss& loss, const data::distributed_batch& b) {
  return s.accumulate(m, loss, b);
}

}  // namespace lockstep
