#pragma once
/// @file concepts.hpp
/// The vocabulary every strategy shares: determinism levels, reduction operators, options, step
/// statistics, the static device-set rules and the `strategy` concept.

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <limits>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/data/batch.hpp>

namespace lockstep {

/// How reproducible training is (a compile-time option of a strategy; see docs/distribute.md).
enum class determinism {
  run_to_run,              ///< repeated runs of one configuration are bitwise equal (fixed summation order)
  replica_count_invariant  ///< bitwise equal whatever the number of replicas (fixed micro-shards)
};

/// How per-replica values are combined.
enum class reduce_op { sum, mean, min, max };

/// Whether a strategy splits the optimiser update over its replicas (strategy_options::
/// shard_optimizer): `true` (always, where the device kind can), `false` (never), or
/// `optimizer_sharding::automatic` (the default: where it was measured faster, below).
class optimizer_sharding {
public:
  /// The three settings.
  enum class mode : unsigned char { off = 0, on = 1, automatic = 2 };
  /// Automatic.
  constexpr optimizer_sharding() noexcept = default;
  /// On (true) or off (false): `.shard_optimizer = true`.
  constexpr optimizer_sharding(bool on) noexcept : mode_(on ? mode::on : mode::off) {}  // implicit on purpose
  /// The setting `m`.
  constexpr optimizer_sharding(mode m) noexcept : mode_(m) {}  // implicit on purpose
  /// Automatic: host replicas shard the update when the process holds two or more of them and the
  /// optimiser is elementwise and keeps two or more state values per parameter (adam, adamw),
  /// decided when the model's first update is applied (or when fit starts). With sgd's one momentum
  /// value the copies cost more than the halved update saves, and GPU replicas are not measured.
  static constexpr optimizer_sharding automatic() noexcept { return optimizer_sharding(mode::automatic); }
  /// The setting.
  [[nodiscard]] constexpr mode value() const noexcept { return mode_; }
  /// True when set to on.
  [[nodiscard]] constexpr bool is_on() const noexcept { return mode_ == mode::on; }
  /// True when left automatic.
  [[nodiscard]] constexpr bool is_automatic() const noexcept { return mode_ == mode::automatic; }
  /// Same setting.
  constexpr bool operator==(const optimizer_sharding&) const noexcept = default;

private:
  mode mode_ = mode::automatic;
};

/// Run-time options of a strategy.
struct strategy_options {
  std::chrono::milliseconds timeout{60'000};  ///< longest wait in a collective before timeout_error
  std::size_t bucket_bytes = 4u << 20;        ///< gradient bytes per all-reduce bucket (0: one bucket per layer)
  std::size_t micro_shard_rows = 32;          ///< rows per micro-shard (replica_count_invariant only)
  /// Under gradient accumulation (run_to_run only): bytes per host replica that may hold the
  /// update's layer inputs and output gradients, so that each dense layer forms its weight
  /// gradient once per update over all its rows instead of adding one GEMM per batch into it
  /// (faster where the gradient is large and the batches short; 0: never). Grown in the first
  /// accumulated update, reused after it.
  std::size_t deferred_gradient_bytes = 64u << 20;
  int blas_threads = 1;                       ///< BLAS threads per host replica (replicas × threads <= cores)
  bool pin_replicas = true;                   ///< pin host replica r's thread to the r-th allowed CPU (when there are enough; replica 0's, the caller's, only while a job runs)
  bool flush_denormals = true;                ///< host replicas flush subnormal floats to zero (see host_context)
  /// Splits the optimiser update and its state over the replicas (as ZeRO stage 1): replica r
  /// updates its 1/N of the parameters, then the slices are gathered on every replica; optimiser state
  /// memory per replica ÷ N, the same bits as unsharded. Host replicas, or GPU replicas (on one
  /// GPU or several: the copies are peer copies); elementwise optimisers (sgd, adam, adamw; see
  /// optimizer_elementwise_v). `true` shards (or refuses what cannot be sharded), `false` never
  /// does; the default, optimizer_sharding::automatic(), shards where it was measured faster.
  optimizer_sharding shard_optimizer{};
  /// GPU replicas: cuBLAS may use TF32 tensor cores for FP32 GEMMs (about 10 mantissa bits;
  /// faster, off by default). Host replicas refuse it (config_error).
  bool tf32 = false;
  /// GPU replicas: a step never waits for its own work (but for what reads back inside the step:
  /// a loss that sums through `sum`, batch_norm over several replicas; docs/gpu.md). Each loss
  /// copies its totals (and the epilogue its decision) to page-locked memory on the device's
  /// stream, and train_step returns
  /// the statistics of the PREVIOUS update, read once this step is queued (flush_stats(model)
  /// returns the last one). The parameters are the same bits as without it. One process; the
  /// recipe's non-finite guard must be nonfinite_policy::apply and the loss unscaled (those
  /// decide on the host). Host replicas refuse it (config_error): they have no wait to save.
  bool defer_readback = false;
};

namespace detail {
/// The longest wait a collective keeps: 100 years, which `now() + timeout` in steady_clock's
/// nanoseconds can add without overflow (milliseconds::max() would wrap to a deadline already past).
inline constexpr std::chrono::milliseconds max_timeout = std::chrono::hours(24 * 365 * 100);

/// `strategy_options::timeout`, refused (config_error giving it in ms) when not positive, and
/// capped at max_timeout (a longer one, such as milliseconds::max(), means "no limit"): every
/// strategy checks it before its first collective, on every worker alike.
inline std::chrono::milliseconds checked_timeout(std::chrono::milliseconds t) {
  if (t.count() <= 0)
    throw config_error("lockstep: strategy_options::timeout must be positive, got " + std::to_string(t.count()) + " ms");
  return std::min(t, max_timeout);
}
}  // namespace detail

/// What one synchronous training step returns, over the whole global batch (every replica of
/// every worker; the same on every worker) — over all the batches of the update under gradient
/// accumulation: the loss sum, the count, the top-1 hits of the training-mode outputs among the
/// labelled rows, and what the update's epilogue found (norm, clip factor, skipped).
struct step_stats {
  double loss_sum = 0;        ///< sum of per-sample losses over the whole global batch
  std::size_t count = 0;      ///< samples in the global batch
  std::size_t correct = 0;    ///< labelled rows whose arg-max output equals the label
  std::size_t labelled = 0;   ///< labelled rows whose hits were counted (0 where a device could not count them)
  /// The global norm of the gradient the update applied, before clipping (NaN when the update
  /// ran no epilogue: neither clipping nor a non-finite guard).
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  double clip_factor = 1;     ///< the factor clipping by global norm scaled the gradient by (1: not clipped)
  bool skipped = false;       ///< the non-finite guard skipped the update (nothing changed but the step counter)
  double loss_scale = 1;      ///< the loss scale the update's gradient carried (mixed<fp16>'s dynamic scale; 1 otherwise)

  /// Mean loss per sample (0 for an empty batch).
  [[nodiscard]] double mean_loss() const noexcept { return count ? loss_sum / static_cast<double>(count) : 0.0; }
  /// Training top-1 accuracy of the step (NaN when no hit was counted).
  [[nodiscard]] double accuracy() const noexcept {
    return labelled ? static_cast<double>(correct) / static_cast<double>(labelled)
                    : std::numeric_limits<double>::quiet_NaN();
  }
};

namespace detail {

/// The host's part of an update whose loss and decision are still being copied back
/// (strategy_options::defer_readback): its statistics but the loss sum, the hits and the norm.
struct late_update {
  step_stats stats;         ///< count, labelled, loss scale (loss_sum and correct are zero)
  std::uint64_t step = 0;   ///< the model's step counter before the update
  bool has_norm = false;    ///< the update ran an epilogue: its decision carries the norm and clip factor
};

}  // namespace detail

/// How a strategy cuts global batches: into `parts` shards of which this process takes shards
/// `first`, `first + 1`, ... (one per local replica). A single-process strategy takes them all.
struct shard_plan {
  std::size_t parts = 1;  ///< shards per global batch over all processes
  std::size_t first = 0;  ///< the first shard of this process
};

/// Opt-in tag: a type is a strategy only when it says `using strategy_concept = lockstep::strategy_tag;`.
struct strategy_tag {};

/// The device tags of a strategy, as a type.
template <class... Devices>
struct device_list {
  static constexpr std::size_t size = sizeof...(Devices);  ///< number of devices
};

namespace detail {

template <class... Ds>
constexpr bool distinct_cpu_ordinals() {
  if constexpr (sizeof...(Ds) < 2) {
    return true;
  } else {
    constexpr std::array<bool, sizeof...(Ds)> host{is_cpu_v<Ds>...};
    constexpr std::array<std::size_t, sizeof...(Ds)> ord{static_cast<std::size_t>(Ds::ordinal)...};
    for (std::size_t i = 0; i < host.size(); ++i)
      for (std::size_t j = i + 1; j < host.size(); ++j)
        if (host[i] && host[j] && ord[i] == ord[j]) return false;
    return true;
  }
}

template <class... Ds>
constexpr bool valid_device_set() {
  if constexpr (sizeof...(Ds) == 0 || !(device<Ds> && ...))
    return false;
  else
    return ((is_cpu_v<Ds> && ...) || (is_gpu_v<Ds> && ...)) && distinct_cpu_ordinals<Ds...>();
}

/// A function shaped like what strategy::run accepts (used by the concept).
struct run_archetype {
  int operator()(std::size_t, const data::shard&) const { return 0; }
};

template <class...>
inline constexpr bool always_false = false;

}  // namespace detail

/// True when no two devices are the same cpu<I> (each host replica needs its own ordinal).
template <class... Devices>
inline constexpr bool distinct_cpu_ordinals_v = detail::distinct_cpu_ordinals<Devices...>();

/// True when Devices... can form one strategy: at least one device, all cpu<I> or all gpu<I>,
/// no repeated cpu<I> (a repeated gpu<I> is allowed when the reducer handles it).
template <class... Devices>
inline constexpr bool valid_device_set_v = detail::valid_device_set<Devices...>();

/// A strategy: a set of replicas on devices of one kind (`kind_type`), fixed at construction, that
/// run a function on their shards of a distributed batch (returning the per-replica results as a
/// range) and combine per-replica values (see mirrored_strategy for the full interface). What
/// `fit` calls besides is `train_step`, checked for a given model by `strategy_for`; a strategy
/// spanning several processes also offers `world()` (world.hpp), checked by
/// `detail::check_strategy` when declared.
template <class S>
concept strategy = requires(S& s, const S& cs, const data::distributed_batch& b, const std::vector<double>& v) {
  typename S::strategy_concept;
  requires std::same_as<typename S::strategy_concept, strategy_tag>;
  typename S::kind_type;
  requires device_kind_tag<typename S::kind_type>;
  { cs.num_replicas() } -> std::convertible_to<std::size_t>;
  { s.run(detail::run_archetype{}, b) } -> std::ranges::input_range;
  requires std::convertible_to<std::ranges::range_reference_t<decltype(s.run(detail::run_archetype{}, b))>, int>;
  { cs.reduce(reduce_op::sum, v) } -> std::convertible_to<double>;
};

/// A strategy that can train model M (a replicated model it made) with optimiser O and loss L:
/// `s.train_step(m, opt, loss, batch)` returns the step's step_stats.
template <class S, class M, class O, class L>
concept strategy_for = strategy<S> && requires(S& s, M& m, const O& o, const L& l, const data::distributed_batch& b) {
  { s.train_step(m, o, l, b) } -> std::convertible_to<step_stats>;
};

namespace detail {

/// Checks world W member by member (what fit, evaluate and predict call on a strategy's world),
/// so that a world that lacks one, or declares one with another signature, is told which.
template <class W>
constexpr bool check_world() {
  static_assert(requires(const W& w) { { w.rank() } -> std::convertible_to<std::size_t>; },
                "lockstep: a world needs `std::size_t rank() const`");
  static_assert(requires(const W& w) { { w.size() } -> std::convertible_to<std::size_t>; },
                "lockstep: a world needs `std::size_t size() const` (the number of workers)");
  static_assert(requires(const W& w) { { w.is_chief() } -> std::convertible_to<bool>; },
                "lockstep: a world needs `bool is_chief() const` (only the chief writes progress, metrics and "
                "checkpoints)");
  static_assert(requires(const W& w) { { w.plan() } -> std::convertible_to<shard_plan>; },
                "lockstep: a world needs `lockstep::shard_plan plan() const` (how global batches are cut)");
  static_assert(requires(const W& w) { { w.global_replicas() } -> std::convertible_to<std::size_t>; },
                "lockstep: a world needs `std::size_t global_replicas() const` (replicas over every worker)");
  static_assert(requires(W& w, std::span<double> v) { w.sum(v); },
                "lockstep: a world needs `void sum(std::span<double> values)` (each value summed over the workers, "
                "the same bits on every worker)");
  static_assert(requires { { W::recovers_after_failure } -> std::convertible_to<bool>; },
                "lockstep: a world needs `static constexpr bool recovers_after_failure`");
  return true;  // each missing member was named above
}

/// Checks strategy S member by member for what fit, evaluate and predict call, so that a strategy
/// that lacks one (or declares an optional hook with another signature, which would otherwise be
/// ignored silently) is told which.
template <class S>
constexpr bool check_strategy() {
  static_assert(requires { requires std::same_as<typename S::strategy_concept, strategy_tag>; },
                "lockstep: a strategy opts in with `using strategy_concept = lockstep::strategy_tag;`");
  static_assert(requires { requires device_kind_tag<typename S::kind_type>; },
                "lockstep: a strategy needs `using kind_type = K;` naming the device kind of its replicas "
                "(lockstep::cpus or lockstep::gpus)");
  static_assert(requires(const S& s) { { s.num_replicas() } -> std::convertible_to<std::size_t>; },
                "lockstep: a strategy needs `std::size_t num_replicas() const`");
  static_assert(requires(S& s, const data::distributed_batch& b) {
                  { s.run(run_archetype{}, b) } -> std::ranges::input_range;
                  requires std::convertible_to<std::ranges::range_reference_t<decltype(s.run(run_archetype{}, b))>, int>;
                },
                "lockstep: a strategy needs `template <class F> auto run(F&& fn, const lockstep::data::distributed_batch& "
                "b)` that calls fn(std::size_t replica, const lockstep::data::shard&) for every replica and returns "
                "the results in replica order (a std::vector<R>)");
  static_assert(requires(const S& s, const std::vector<double>& v) {
                  { s.reduce(reduce_op::sum, v) } -> std::convertible_to<double>;
                },
                "lockstep: a strategy needs `double reduce(lockstep::reduce_op op, const std::vector<double>& values) "
                "const`");
  if constexpr (requires(S& s) { s.world(); })
    static_assert(check_world<std::remove_cvref_t<decltype(std::declval<S&>().world())>>(),
                  "lockstep: a strategy's optional `world()` must return a lockstep::world (see distribute/world.hpp)");
  return true;  // each missing member was named above
}

/// check_strategy, and that S trains model M with optimiser O and loss L (what fit calls).
template <class S, class M, class O, class L>
constexpr bool check_training_strategy() {
  static_assert(check_strategy<S>());
  static_assert(requires(S& s, M& m, const O& o, const L& l, const data::distributed_batch& b) {
                  { s.train_step(m, o, l, b) } -> std::convertible_to<step_stats>;
                },
                "lockstep: a strategy needs `template <class Optimizer, class Loss> lockstep::step_stats "
                "train_step(Model& m, const Optimizer& opt, const Loss& loss, const lockstep::data::distributed_batch& "
                "b)` for the model fit is given (one synchronous step of every replica)");
  return true;
}

}  // namespace detail

}  // namespace lockstep
