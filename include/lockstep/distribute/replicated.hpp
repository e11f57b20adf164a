#pragma once
/// @file replicated.hpp
/// `replicated<Net, D, T>` (`basic_replicated<Net, Kind, T>`): the N replicas of one model that a
/// strategy trains in lockstep, with the step counter, the seed, the gradient bucket layout, the
/// optimiser update (whole or sharded: sharded_update), the EMA of the weights and the non-finite
/// guard's counters, and host access to parameters, optimiser state and EMA (for checkpoints). Made by
/// `strategy.template replicate<Net>(seed)`, and bound to that strategy: another strategy refuses it.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/backend/context.hpp>
#include <lockstep/backend/host/ops.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/precision.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/distribute/buckets.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/replica.hpp>
#include <lockstep/distribute/sharded_update.hpp>

namespace lockstep {

/// Who made a replicated model: the identity a strategy shares with the models it makes.
struct strategy_identity {
  std::string description;  ///< the strategy in words, for messages ("mirrored over cpu devices {0, 1}")
};

/// The replicas of one model, identical after every step.
/// @tparam Net  the network type
/// @tparam Kind the device kind every replica shares (each replica's context holds its ordinal)
/// @tparam T    parameter type
template <class Net, class Kind, class T>
class basic_replicated {
public:
  using replica_type = basic_replica<Net, Kind, T>;           ///< one replica
  using model_type = typename replica_type::model_type;       ///< one replica's model
  using context_type = typename replica_type::context_type;   ///< a replica's context
  using value_type = T;                                       ///< parameter type
  using layout_type = bucket_layout<detail::layer_table<typename model_type::bound>::count>;  ///< bucket table
  static constexpr std::size_t param_count = model_type::param_count;  ///< trainable parameters per replica
  static constexpr std::size_t stored_count = model_type::stored_count;  ///< parameters then non-trainable state

  /// Replicas with the given contexts, all initialised from `s` (a strategy then broadcasts replica 0).
  basic_replicated(std::vector<context_type> contexts, lockstep::seed s, std::size_t bucket_bytes,
                   std::shared_ptr<const strategy_identity> owner = {})
      : seed_(s), layout_(plan_buckets<typename model_type::bound, T>(bucket_bytes)), owner_(owner),
        owner_description_(owner ? owner->description : std::string("no strategy")) {
    if (contexts.empty()) throw config_error("lockstep::replicated: needs at least one replica");
    replicas_.reserve(contexts.size());
    for (auto& c : contexts) replicas_.push_back(std::make_unique<replica_type>(std::move(c), s));
  }

  /// Number of replicas.
  [[nodiscard]] std::size_t size() const noexcept { return replicas_.size(); }
  /// The precision policy the replicas compute in (replicate<Net, P>): fp32 unless their contexts
  /// say otherwise.
  [[nodiscard]] compute_precision precision() const noexcept {
    if constexpr (requires(const context_type& c) {
                    { c.policy() } -> std::same_as<compute_precision>;
                  })
      return replicas_.front()->context().policy();
    else
      return compute_precision::fp32;
  }
  /// Replica r (run-time index).
  [[nodiscard]] replica_type& replica(std::size_t r) { return *replicas_.at(r); }
  /// Replica r (run-time index).
  [[nodiscard]] const replica_type& replica(std::size_t r) const { return *replicas_.at(r); }

  /// Splits the optimiser update over the replicas (strategy_options::shard_optimizer; see
  /// sharded_update): host or GPU replicas; `on_grid`: on the epilogue's grid (what a strategy
  /// whose reducer reduces onto the slices asks: reduces_to_slices_v). An optimiser state or an
  /// EMA loaded before the first update (load_optimizer_state, load_ema) moves to the new slices
  /// with its bits.
  void set_optimizer_sharding(bool on, bool on_grid = false) {
    const std::vector<T> state = optimizer_state_to_host(), average = ema_to_host();  // as they were loaded
    update_.configure(on, replicas(), step_, on_grid);
    [[maybe_unused]] const backend::caller_scope_t<context_type> keep;  // it places the replicas' buffers
    if (!state.empty()) update_.load_state(replicas(), state);
    if (!average.empty()) update_.load_ema(replicas(), average);
  }
  /// True when the optimiser update is split over the replicas.
  [[nodiscard]] bool optimizer_sharded() const noexcept { return update_.sharded(); }
  /// The optimiser update of these replicas, whole or sharded: which slice each replica
  /// updates, applying it, and the copy of the updated slices (sharded_update).
  [[nodiscard]] const sharded_update<replica_type>& update_plan() const noexcept { return update_; }
  /// The replicas, as the update plan takes them.
  [[nodiscard]] typename sharded_update<replica_type>::replicas_view replicas() const noexcept {
    return {replicas_.data(), replicas_.size()};
  }
  /// The parameters [first, second) replica r updates (update_plan().slice(r)).
  [[deprecated("use update_plan().slice(r)")]] [[nodiscard]] std::pair<std::size_t, std::size_t> update_slice(
      std::size_t r) const noexcept {
    return update_.slice(r);
  }
  /// Copies the other replicas' updated slices into replica r (update_plan().gather(replicas(), r)).
  [[deprecated("use update_plan().gather(replicas(), r)")]] void gather_updated_parameters(std::size_t r) {
    update_.gather(replicas(), r);
  }

  /// Number of updates done so far.
  [[nodiscard]] std::uint64_t step() const noexcept { return step_; }
  /// Sets the update counter (when resuming from a checkpoint).
  void set_step(std::uint64_t s) noexcept { step_ = s; }
  /// The seed the replicas were initialised from; it also keys dropout.
  [[nodiscard]] lockstep::seed seed() const noexcept { return seed_; }
  /// The gradient buckets (reverse layer order).
  [[nodiscard]] const layout_type& buckets() const noexcept { return layout_; }

  /// True when the strategy of identity `id` made these replicas (and still exists).
  [[nodiscard]] bool made_by(const strategy_identity* id) const noexcept {
    const auto p = owner_.lock();
    return p && p.get() == id;
  }
  /// The strategy that made these replicas, in words.
  [[nodiscard]] const std::string& owner_description() const noexcept { return owner_description_; }

  /// Copies replica 0's parameters (then its non-trainable state) to host memory (`out` holds
  /// stored_count elements).
  void parameters_to_host(std::span<T> out) const {
    check_length(out.size(), stored_count, "parameters_to_host");
    const replica_type& r = *replicas_.front();
    copy_to_host(r.context(), out.data(), r.model().parameters().data(), stored_count);
  }
  /// Replica 0's parameters as a host vector.
  [[nodiscard]] std::vector<T> parameters_to_host() const {
    std::vector<T> v(stored_count);
    parameters_to_host(std::span<T>(v));
    return v;
  }
  /// Loads the same parameters (then non-trainable state, stored_count in all) into every replica.
  void load_parameters(std::span<const T> in) {
    check_length(in.size(), stored_count, "load_parameters");
    for (auto& r : replicas_) copy_from_host(r->context(), r->model().parameters().data(), in.data(), stored_count);
  }

  /// The optimiser state of all parameters as a host vector (empty before the first update):
  /// replica 0's, or, when the update is sharded, the replicas' slices put together in the layout
  /// of an unsharded state (k arrays of param_count), so a checkpoint does not depend on sharding.
  [[nodiscard]] std::vector<T> optimizer_state_to_host() const { return update_.state_to_host(replicas()); }
  /// Loads an optimiser state of all parameters (as optimizer_state_to_host returns it) into
  /// every replica, or each replica's slice of it when the update is sharded; the next update
  /// continues from it (from none, as the first update does, when `in` is empty).
  void load_optimizer_state(std::span<const T> in) {
    [[maybe_unused]] const backend::caller_scope_t<context_type> keep;  // it places the replicas' state
    update_.load_state(replicas(), in);
  }

  /// True when the replicas hold an exponential moving average of the weights (update_recipe::ema).
  [[nodiscard]] bool has_ema() const noexcept { return ema_updates_ > 0; }
  /// Number of updates the EMA has taken in (0: none yet).
  [[nodiscard]] std::uint64_t ema_updates() const noexcept { return ema_updates_; }
  /// The EMA of the parameters, then of the non-trainable state (stored_count elements; put
  /// together from the slices when sharded); empty without an EMA.
  [[nodiscard]] std::vector<T> ema_to_host() const {
    return has_ema() ? update_.ema_to_host(replicas()) : std::vector<T>{};
  }
  /// The EMA into `out` (stored_count elements: the parameters, then the non-trainable state), as
  /// parameters_to_host writes the weights (io::save_safetensors with safetensors_options::ema).
  /// @throws config_error when there is no EMA yet; shape_error when out's length is not stored_count.
  void ema_parameters_to_host(std::span<T> out) const {
    check_length(out.size(), stored_count, "ema_parameters_to_host");
    if (!has_ema())
      throw config_error("lockstep::replicated::ema_parameters_to_host: the model holds no EMA of its weights (set "
                         "update_recipe::ema, or fit_options::ema, and train at least one update)");
    const std::vector<T> v = ema_to_host();
    std::copy(v.begin(), v.end(), out.begin());
  }
  /// Loads an EMA (as ema_to_host returns it) that has taken in `updates` updates into every
  /// replica (its slice when sharded); an empty span with 0 updates removes the EMA.
  /// @throws shape_error when the length is not stored_count (or not 0 with 0 updates).
  void load_ema(std::span<const T> in, std::uint64_t updates) {
    if ((updates == 0) != in.empty())
      throw shape_error("lockstep::replicated::load_ema: an EMA of " + std::to_string(updates) + " updates with " +
                        std::to_string(in.size()) + " values");
    [[maybe_unused]] const backend::caller_scope_t<context_type> keep;  // it places the replicas' EMA
    update_.load_ema(replicas(), in);
    ema_updates_ = updates;
  }
  /// Counts one more update taken into the EMA (called by the strategy after it updated every
  /// replica's EMA).
  void count_ema_update() noexcept { ++ema_updates_; }

  /// Updates skipped by the non-finite guard, in all (they advance step() but change nothing else).
  [[nodiscard]] std::uint64_t skipped_updates() const noexcept { return skipped_; }
  /// Updates skipped by the non-finite guard since the last applied one.
  [[nodiscard]] std::uint64_t consecutive_skips() const noexcept { return consecutive_skips_; }
  /// Sets the guard's counters (when resuming from a checkpoint).
  void set_skip_counters(std::uint64_t skipped, std::uint64_t consecutive) noexcept {
    skipped_ = skipped;
    consecutive_skips_ = consecutive;
  }
  /// The dynamic loss scale (used under mixed<fp16>: loss_scaled()).
  [[nodiscard]] loss_scaler& scaler() noexcept { return scaler_; }
  /// The dynamic loss scale (read-only).
  [[nodiscard]] const loss_scaler& scaler() const noexcept { return scaler_; }
  /// True when the model's policy scales the loss (mixed<fp16>).
  [[nodiscard]] bool loss_scaled() const noexcept { return precision() == compute_precision::fp16; }

  /// Records the outcome of an update for the guard's counters.
  void count_update(bool skipped) noexcept {
    if (skipped) {
      ++skipped_;
      ++consecutive_skips_;
    } else {
      consecutive_skips_ = 0;
    }
  }

  /// Under strategy_options::defer_readback: the last update whose loss is still being read back
  /// (set and taken by the strategy; empty when none).
  [[nodiscard]] std::optional<detail::late_update>& late_update() noexcept { return late_; }

private:
  static void check_length(std::size_t got, std::size_t want, const char* what) {
    if (got != want)
      throw shape_error(std::string("lockstep::replicated::") + what + ": the span has " + std::to_string(got) +
                        " elements but the model has " + std::to_string(want));
  }

  std::vector<std::unique_ptr<replica_type>> replicas_;
  lockstep::seed seed_;
  layout_type layout_;
  std::uint64_t step_ = 0;
  sharded_update<replica_type> update_;
  std::uint64_t ema_updates_ = 0;
  std::uint64_t skipped_ = 0, consecutive_skips_ = 0;
  loss_scaler scaler_;
  std::weak_ptr<const strategy_identity> owner_;
  std::string owner_description_;
  std::optional<detail::late_update> late_;
};

/// Which weights of a replicated model a pass uses.
enum class weights {
  live,  ///< the trained parameters
  ema    ///< their exponential moving average (update_recipe::ema), swapped in for the pass
};

/// Runs `f()` with the EMA of `m`'s weights (and of its non-trainable state) loaded into every
/// replica in place of the live ones — gathered when the update is sharded — and restores the
/// live weights bitwise afterwards, also when `f` throws. Returns what `f` returns.
/// @throws config_error when `m` holds no EMA.
template <class Replicated, class F>
decltype(auto) with_ema_weights(Replicated& m, F&& f) {
  if (!m.has_ema())
    throw config_error("lockstep: the model holds no EMA of its weights (update_recipe::ema / fit_options::ema, and "
                       "at least one update)");
  using T = typename Replicated::value_type;
  const std::vector<T> live = m.parameters_to_host();
  const std::vector<T> average = m.ema_to_host();
  m.load_parameters(std::span<const T>(average));
  struct restore {
    Replicated* m;
    const std::vector<T>* live;
    ~restore() { m->load_parameters(std::span<const T>(*live)); }
  } guard{&m, &live};
  return std::forward<F>(f)();
}

/// The replicas of network Net on devices like D (a tag such as cpu<I>, or a kind): one type per
/// kind, whatever the ordinals or the number of replicas.
template <class Net, class D = cpus, class T = float>
using replicated = basic_replicated<Net, kind_of_t<D>, T>;

}  // namespace lockstep
