#pragma once
/// @file mirrored.hpp
/// Synchronous data-parallel strategies: `basic_mirrored<Reducer, Determinism, Devices...>` and
/// its everyday names `mirrored<Devices...>` (reducer chosen from the device set) and
/// `one_device<Device>`. A strategy owns one persistent worker thread per replica (the single
/// replica of a one-device strategy runs on the caller's thread) and one reducer; it makes
/// replicated models, runs per-replica functions, reduces per-replica values, and performs
/// whole training steps (train_step) with bucketed, overlapped gradient all-reduce.
///
/// Failure: an exception in any replica reaches the caller as its original type (a collective
/// that waited longer than strategy_options::timeout raises timeout_error naming the replicas and
/// the bucket); every other replica is released; afterwards the strategy is usable again, and a
/// failed train_step has changed neither the parameters nor the step counter.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/backend/context.hpp>
#include <lockstep/backend/host/context.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/data/distribute.hpp>
#include <lockstep/distribute/buckets.hpp>
#include <lockstep/distribute/detail/host_comm.hpp>
#include <lockstep/distribute/detail/workers.hpp>
#include <lockstep/distribute/host_reducers.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/replica.hpp>
#include <lockstep/distribute/replicated.hpp>
#include <lockstep/distribute/strategy.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/memory/buffer.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

namespace detail {

/// The position of the first of Ds that is the reducer's aggregation device (0 when it has none).
template <class Reducer, class... Ds>
constexpr std::size_t aggregation_root() {
  if constexpr (requires { typename Reducer::aggregation_device; }) {
    std::size_t i = 0, found = sizeof...(Ds);
    ((std::is_same_v<typename Reducer::aggregation_device, Ds> && found == sizeof...(Ds) ? (found = i, ++i) : ++i), ...);
    return found == sizeof...(Ds) ? 0 : found;
  } else {
    return 0;
  }
}

/// A replica's execution context: host replicas get a BLAS thread budget, others their ordinal.
template <class Ctx, class D>
Ctx make_context(int blas_threads) {
  if constexpr (is_cpu_v<D>)
    return Ctx(blas_threads);
  else
    return Ctx(static_cast<int>(D::ordinal));
}

}  // namespace detail

/// A synchronous data-parallel strategy over Devices... with an explicit reducer and determinism.
/// @tparam Reducer     how gradient sums are aggregated (satisfies lockstep::reducer)
/// @tparam Determinism run_to_run or replica_count_invariant (host devices only)
/// @tparam Devices     one device tag per replica: all cpu<I> (distinct) or all gpu<I>
template <class Reducer, determinism Determinism, class... Devices>
class basic_mirrored {
  static_assert(sizeof...(Devices) > 0, "lockstep::mirrored needs at least one device");
  static_assert((device<Devices> && ...), "lockstep::mirrored: every template argument must be a device tag (cpu<I> or gpu<I>)");
  static_assert(distinct_cpu_ordinals_v<Devices...>,
                "lockstep::mirrored: a cpu<I> device appears twice; each host replica needs its own ordinal "
                "(mirrored<cpu<0>, cpu<1>, ...>)");
  static_assert((is_cpu_v<Devices> && ...) || (is_gpu_v<Devices> && ...),
                "lockstep::mirrored: cpu and gpu devices cannot be mixed in one strategy");
  static_assert(reducer<Reducer>, "lockstep::mirrored: Reducer must satisfy lockstep::reducer (see reducer.hpp)");
  static_assert(Reducer::template supports<Devices...>,
                "lockstep::mirrored: this reducer has no path for this device set (for example a repeated gpu<I> "
                "needs a reducer for replicas sharing one GPU)");
  static_assert(Determinism == determinism::run_to_run || (is_cpu_v<Devices> && ...),
                "lockstep::mirrored: replica_count_invariant is implemented for cpu<I> devices");

  using first_device = std::tuple_element_t<0, std::tuple<Devices...>>;

public:
  using strategy_concept = strategy_tag;                 ///< opts in to the strategy concept
  using devices = device_list<Devices...>;               ///< the device tags, in replica order
  using reducer_type = Reducer;                          ///< the gradient reducer
  using device_type = first_device;                      ///< the device type every replica shares
  static constexpr std::size_t replica_count = sizeof...(Devices);  ///< number of replicas
  static constexpr determinism determinism_level = Determinism;     ///< the determinism level
  /// The replicated model type for network Net with parameters of type T.
  template <class Net, class T = float>
  using model_type = replicated<Net, first_device, T>;

  /// A strategy with the given options (starts the worker threads).
  explicit basic_mirrored(strategy_options options = {})
      : options_(check(options)),
        reducer_(reducer_config{replica_count, options_.timeout, max_buckets,
                                detail::aggregation_root<Reducer, Devices...>()}),
        sync_(replica_count, options_.timeout, 0),
        pool_(replica_count, &abort_all, this, options_.pin_replicas && (is_cpu_v<Devices> && ...)),
        loss_(replica_count) {}
  basic_mirrored(const basic_mirrored&) = delete;
  basic_mirrored& operator=(const basic_mirrored&) = delete;

  /// Number of replicas.
  [[nodiscard]] std::size_t num_replicas() const noexcept { return replica_count; }
  /// The options.
  [[nodiscard]] const strategy_options& options() const noexcept { return options_; }
  /// The reducer (for collectives issued from inside run()).
  [[nodiscard]] Reducer& reducer() noexcept { return reducer_; }
  /// BLAS threads per host replica (strategy_options::blas_threads; 1 by default, so a cpu<I>
  /// device is one core and replicas × BLAS threads never exceed the cores).
  [[nodiscard]] int blas_threads() const noexcept { return options_.blas_threads; }

  /// Makes N replicas of Net, initialised from `s` and made identical by a broadcast from replica 0.
  template <class Net, class T = float>
  [[nodiscard]] model_type<Net, T> replicate(lockstep::seed s) {
    using ctx_t = typename model_type<Net, T>::context_type;
    std::vector<ctx_t> contexts;
    contexts.reserve(replica_count);
    (contexts.push_back(detail::make_context<ctx_t, Devices>(blas_threads())), ...);
    model_type<Net, T> m(std::move(contexts), s, options_.bucket_bytes);
    if (m.buckets().size > max_buckets) throw config_error("lockstep::mirrored: the model has too many buckets");
    bind_workspaces(m, m.param_count * sizeof(T));
    broadcast(m, 0);
    return m;
  }

  /// Copies replica `root`'s parameters and optimiser state to every other replica.
  template <class Net, class T>
  void broadcast(model_type<Net, T>& m, std::size_t root = 0) {
    if (root >= replica_count) throw config_error("lockstep::mirrored::broadcast: root " + std::to_string(root) + " is not a replica");
    const std::size_t state = m.replica(root).optimizer_state().size();
    auto job = [&](std::size_t r) {
      auto& rep = m.replica(r);
      rep.context().activate();
      reducer_.broadcast(r, rep.context(), rep.model().parameters().data(), m.param_count, root);
      if (state) {
        if (rep.optimizer_state().size() != state) throw shape_error("lockstep::mirrored::broadcast: optimiser states differ in size");
        reducer_.broadcast(r, rep.context(), rep.optimizer_state().data(), state, root);
      }
    };
    execute(job);
  }

  /// Runs fn(replica_index, shard) on every replica's worker with its shard of `b`; returns the
  /// per-replica results (nothing for a void fn). The first exception reaches the caller.
  template <class F>
  auto run(F&& fn, const data::distributed_batch& b) {
    check_batch(b);
    using R = std::invoke_result_t<F&, std::size_t, const data::shard&>;
    if constexpr (std::is_void_v<R>) {
      auto job = [&](std::size_t r) { fn(r, b.shards[r]); };
      execute(job);
    } else {
      std::vector<std::optional<R>> out(replica_count);
      auto job = [&](std::size_t r) { out[r].emplace(fn(r, b.shards[r])); };
      execute(job);
      std::vector<R> values;
      values.reserve(replica_count);
      for (auto& o : out) values.push_back(std::move(*o));
      return values;
    }
  }

  /// Runs fn(replica_index) on every replica's worker and waits for all.
  template <class F>
  void run_each(F&& fn) {
    auto job = [&](std::size_t r) { fn(r); };
    execute(job);
  }

  /// Combines per-replica values in replica order (sum, mean, min or max).
  template <class V>
    requires std::is_arithmetic_v<V>
  [[nodiscard]] V reduce(reduce_op op, const std::vector<V>& values) const {
    if (values.empty()) throw config_error("lockstep::mirrored::reduce: no values to reduce");
    V acc = values.front();
    for (std::size_t i = 1; i < values.size(); ++i) {
      switch (op) {
        case reduce_op::sum:
        case reduce_op::mean: acc = static_cast<V>(acc + values[i]); break;
        case reduce_op::min: acc = std::min(acc, values[i]); break;
        case reduce_op::max: acc = std::max(acc, values[i]); break;
      }
    }
    if (op == reduce_op::mean) acc = static_cast<V>(acc / static_cast<V>(values.size()));
    return acc;
  }

  /// Combines per-replica loss sums: sums, counts and hits add up (sum), or the mean loss per sample
  /// (mean: sum / count, counts kept); min and max pick the replica with the smallest or largest sum.
  [[nodiscard]] loss_sum reduce(reduce_op op, const std::vector<loss_sum>& values) const {
    loss_sum t;
    std::vector<double> sums;
    for (const auto& v : values) {
      t.sum += v.sum;
      t.count += v.count;
      t.correct += v.correct;
      sums.push_back(v.sum);
    }
    if (op == reduce_op::mean) t.sum = t.count ? t.sum / static_cast<double>(t.count) : 0.0;
    if (op == reduce_op::min || op == reduce_op::max) return values.at(static_cast<std::size_t>(
        std::distance(sums.begin(), op == reduce_op::min ? std::min_element(sums.begin(), sums.end())
                                                         : std::max_element(sums.begin(), sums.end()))));
    return t;
  }

  /// In-place sum of `count` elements across replicas, called by every replica from inside run()
  /// (synchronous; uses the bucket id after the model's buckets).
  template <class Ctx, class T>
  void all_reduce(std::size_t replica, Ctx& ctx, T* data, std::size_t count) {
    reducer_.start(replica, ctx, data, count, max_buckets - 1);
    reducer_.wait(replica, ctx, max_buckets - 1);
  }

  /// Cuts every global batch of `batches` into one shard per replica (see data::distribute).
  template <class Range>
  [[nodiscard]] auto distribute(Range&& batches) const {
    return data::distribute(std::forward<Range>(batches), replica_count);
  }

  /// One synchronous training step on `b` (see lockstep::train_step).
  template <class Net, class T, class Optimizer, class Loss>
  step_stats train_step(model_type<Net, T>& m, const Optimizer& opt, const Loss& loss, const data::distributed_batch& b) {
    static_assert(optimizer<Optimizer>, "lockstep::train_step: the optimiser must satisfy lockstep::optimizer");
    static_assert(lockstep::loss<Loss>, "lockstep::train_step: the loss must satisfy lockstep::loss");
    check_batch(b);
    std::size_t total = 0;
    for (const auto& s : b.shards) total += s.size;
    if (total != b.global_size())
      throw shape_error("lockstep::train_step: the shards hold " + std::to_string(total) + " rows but the global batch has " +
                        std::to_string(b.global_size()));
    if (total == 0) return {};
    const pass_info info{true, m.seed().value, m.step(), 0, 0};
    const update_info update{opt.lr, m.step() + 1, 1.0 / static_cast<double>(total)};
    step_stats out;
    if constexpr (Determinism == determinism::run_to_run) {
      auto job = [&](std::size_t r) { loss_[r] = step_bucketed(m, r, opt, loss, b.shards[r], info, update); };
      execute(job);
      for (const auto& l : loss_) out.loss_sum += l.sum;
    } else {
      step_micro_shards(m, opt, loss, *b.global, info, update);
      for (const auto& l : micro_loss_) out.loss_sum += l.sum;
    }
    out.count = total;
    m.set_step(m.step() + 1);
    return out;
  }

private:
  static constexpr std::size_t max_buckets = 256;

  static strategy_options check(strategy_options o) {
    if (o.timeout.count() <= 0) throw config_error("lockstep: strategy_options::timeout must be positive");
    if (Determinism == determinism::replica_count_invariant && o.micro_shard_rows == 0)
      throw config_error("lockstep: strategy_options::micro_shard_rows must be >= 1");
    if (o.blas_threads < 1)
      throw config_error("lockstep: strategy_options::blas_threads must be >= 1, got " + std::to_string(o.blas_threads));
    if constexpr ((is_cpu_v<Devices> && ...)) {
      if (o.blas_threads > 1 &&
          replica_count * static_cast<std::size_t>(o.blas_threads) > static_cast<std::size_t>(hardware_threads()))
        throw config_error("lockstep: strategy_options::blas_threads = " + std::to_string(o.blas_threads) + " with " +
                           std::to_string(replica_count) + " replicas would run " +
                           std::to_string(replica_count * static_cast<std::size_t>(o.blas_threads)) +
                           " BLAS threads on " + std::to_string(hardware_threads()) + " cores");
      if (Determinism == determinism::replica_count_invariant && o.blas_threads != 1)
        throw config_error("lockstep: strategy_options::blas_threads must be 1 under replica_count_invariant "
                           "(a GEMM's result must not depend on the thread count)");
    }
    return o;
  }

  static void abort_all(void* self) noexcept {
    auto* s = static_cast<basic_mirrored*>(self);
    s->reducer_.abort();
    s->sync_.abort();
  }

  template <class Job>
  void execute(Job& job) {
    if constexpr ((is_cpu_v<Devices> && ...)) host_context(blas_threads()).activate();
    try {
      pool_.run(job);
    } catch (...) {
      reducer_.reset();
      sync_.reset();
      throw;
    }
  }

  void check_batch(const data::distributed_batch& b) const {
    if (b.shards.size() != replica_count)
      throw config_error("lockstep::mirrored: the distributed batch has " + std::to_string(b.shards.size()) +
                         " shards but the strategy has " + std::to_string(replica_count) + " replicas");
    if (!b.global && !b.shards.empty() && b.shards.front().global_size != 0)
      throw config_error("lockstep::mirrored: the distributed batch has shards but no global batch");
  }

  template <class Model>
  void bind_workspaces(Model& m, std::size_t max_bucket_bytes) {
    const std::size_t bytes = reducer_.workspace_bytes(max_bucket_bytes);
    if (bytes > workspace_bytes_) {
      workspaces_.clear();
      for (std::size_t r = 0; r < replica_count; ++r) {
        // Device memory lands on the current device: make it replica r's.
        if constexpr (!is_cpu_v<first_device>) m.replica(r).context().activate();
        workspaces_.emplace_back(bytes);
      }
      workspace_bytes_ = bytes;
      auto job = [&](std::size_t r) { reducer_.bind(r, workspaces_[r].data(), bytes); };
      execute(job);
    }
  }

  // run_to_run: forward/backward of the replica's shard; each bucket's all-reduce starts from the
  // backward hook as soon as its lowest layer is done; then wait for all buckets and update.
  template <class Net, class T, class Optimizer, class Loss>
  loss_sum step_bucketed(model_type<Net, T>& m, std::size_t r, const Optimizer& opt, const Loss& loss,
                         const data::shard& s, const pass_info& info, const update_info& update) {
    auto& rep = m.replica(r);
    auto& ctx = rep.context();
    const auto& layout = m.buckets();
    T* grads = rep.model().gradients().data();
    loss_sum l;
    if constexpr (replica_count == 1) {
      l = rep.forward_backward(loss, s, info);
    } else {
      auto hook = [&](std::size_t layer, std::size_t, std::size_t) {
        if (const std::size_t b = layout.completes[layer]) {
          const gradient_bucket& g = layout.buckets[b - 1];
          // No host wait here: a reducer orders its collective after the compute already queued
          // on ctx (host work is synchronous; GPU reducers wait on an event of the compute stream).
          reducer_.start(r, ctx, grads + g.offset, g.count, b - 1);
        }
      };
      l = rep.forward_backward(loss, s, info, hook);
      for (std::size_t b = 0; b < layout.size; ++b) reducer_.wait(r, ctx, b);
    }
    rep.apply(opt, update);
    return l;
  }

  // replica_count_invariant: the global batch is cut into micro-shards of micro_shard_rows rows;
  // replica r computes the gradient sums of micro-shards [K r / N, K (r + 1) / N) into their slots;
  // then every replica sums its slice of the parameters over the slots in micro-shard order and
  // writes it to every replica. The GEMM shapes and the summation order depend only on the batch.
  template <class Net, class T, class Optimizer, class Loss>
  void step_micro_shards(model_type<Net, T>& m, const Optimizer& opt, const Loss& loss, const data::batch& g,
                         const pass_info& info, const update_info& update) {
    constexpr std::size_t P = model_type<Net, T>::param_count;
    const std::size_t rows = g.rows(), mrows = options_.micro_shard_rows;
    const std::size_t k_total = (rows + mrows - 1) / mrows;
    if (slots_.size() < k_total * P * sizeof(T)) slots_ = buffer<std::byte, cpu<0>>(k_total * P * sizeof(T));
    micro_loss_.assign(k_total, loss_sum{});
    T* slots = reinterpret_cast<T*>(slots_.data());
    const auto whole = data::whole(g);
    auto job = [&](std::size_t r) {
      auto& rep = m.replica(r);
      for (std::size_t k = k_total * r / replica_count; k < k_total * (r + 1) / replica_count; ++k) {
        data::shard s = whole;
        const std::size_t lo = k * mrows, n = std::min(mrows, rows - lo);
        s.features = g.features.data() + lo * g.width;
        s.labels = g.labels.empty() ? nullptr : g.labels.data() + lo;
        s.targets = g.targets.empty() ? nullptr : g.targets.data() + lo * g.target_width;
        s.indices = g.indices.data() + lo;
        s.size = n;
        s.offset = lo;
        micro_loss_[k] = rep.forward_backward(loss, s, info);
        std::memcpy(slots + k * P, rep.model().gradients().data(), P * sizeof(T));
      }
      sync_.barrier(r);
      const auto [lo, hi] = detail::slice_of<T>(P, r, replica_count);
      constexpr std::size_t chunk = detail::reduce_chunk_bytes / sizeof(T);
      T acc[chunk];
      for (std::size_t c = lo; c < hi; c += chunk) {
        const std::size_t n = std::min(chunk, hi - c);
        std::memcpy(acc, slots + c, n * sizeof(T));
        for (std::size_t k = 1; k < k_total; ++k)
          for (std::size_t i = 0; i < n; ++i) acc[i] += slots[k * P + c + i];
        for (std::size_t j = 0; j < replica_count; ++j)
          std::memcpy(m.replica(j).model().gradients().data() + c, acc, n * sizeof(T));
      }
      sync_.barrier(r);
      rep.apply(opt, update);
    };
    execute(job);
  }

  strategy_options options_;
  Reducer reducer_;
  detail::host_comm sync_;
  std::vector<buffer<std::byte, first_device>> workspaces_;
  std::size_t workspace_bytes_ = 0;
  detail::worker_pool pool_;
  std::vector<loss_sum> loss_;
  std::vector<loss_sum> micro_loss_;
  buffer<std::byte, cpu<0>> slots_;
};

/// Mirrored strategy over Devices...: the reducer comes from select_reducer_t<Devices...>,
/// determinism is run_to_run. `mirrored<cpu<0>, cpu<1>>` trains two host replicas.
template <class... Devices>
class mirrored : public basic_mirrored<select_reducer_t<Devices...>, determinism::run_to_run, Devices...> {
  using base = basic_mirrored<select_reducer_t<Devices...>, determinism::run_to_run, Devices...>;

public:
  using base::base;
  /// A strategy with default options.
  mirrored() : base(strategy_options{}) {}
};

/// One replica on Device (its BLAS may use every core).
template <class Device>
class one_device : public basic_mirrored<single_device_reducer, determinism::run_to_run, Device> {
  using base = basic_mirrored<single_device_reducer, determinism::run_to_run, Device>;

public:
  using base::base;
  /// A strategy with default options.
  one_device() : base(strategy_options{}) {}
};

/// One synchronous training step of model `m` on distributed batch `b`: every replica runs
/// forward and backward on its shard, gradient sums are all-reduced bucket by bucket while the
/// backward pass continues, and every replica applies the same update with lr = opt.lr and
/// grad_scale = 1 / (global sample count). Returns the loss summed over the global batch and the
/// count; increments m.step(). An empty global batch changes nothing and returns {0, 0}.
template <class Strategy, class Model, class Optimizer, class Loss>
  requires strategy<Strategy>
step_stats train_step(Strategy& s, Model& m, const Optimizer& opt, const Loss& loss, const data::distributed_batch& b) {
  return s.train_step(m, opt, loss, b);
}

}  // namespace lockstep
