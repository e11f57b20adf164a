#pragma once
/// @file replicated.hpp
/// `replicated<Net, D, T>` (`basic_replicated<Net, Kind, T>`): the N replicas of one model that a
/// strategy trains in lockstep, with the step counter, the seed, the gradient bucket layout, and
/// host access to parameters and optimiser state (for checkpoints). Made by
/// `strategy.template replicate<Net>(seed)`, and bound to that strategy: another strategy refuses it.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/distribute/buckets.hpp>
#include <lockstep/distribute/replica.hpp>

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
  /// Replica r (run-time index).
  [[nodiscard]] replica_type& replica(std::size_t r) { return *replicas_.at(r); }
  /// Replica r (run-time index).
  [[nodiscard]] const replica_type& replica(std::size_t r) const { return *replicas_.at(r); }

  /// Splits the optimiser update over the replicas (strategy_options::shard_optimizer): replica
  /// r updates only update_slice(r) of the parameters and keeps only that slice's optimiser state;
  /// gather_updated_parameters(r) then copies the other slices into it. Host memory only.
  void set_optimizer_sharding(bool on) {
    if (on && !device_memory<Kind>::host_accessible)
      throw config_error("lockstep: strategy_options::shard_optimizer is implemented for devices with host memory (cpu<I>)");
    const bool sharded = on && replicas_.size() > 1;  // one replica has nothing to split
    if (sharded != sharded_ && step_ > 0)
      throw config_error("lockstep: strategy_options::shard_optimizer cannot change after the first update");
    sharded_ = sharded;
  }
  /// True when the optimiser update is split over the replicas.
  [[nodiscard]] bool optimizer_sharded() const noexcept { return sharded_; }
  /// The parameters [first, second) replica r updates: all of them, or its 1/N share when sharded
  /// ([P r / N, P (r + 1) / N): the slices differ in length by at most one).
  [[nodiscard]] std::pair<std::size_t, std::size_t> update_slice(std::size_t r) const noexcept {
    if (!sharded_) return {0, param_count};
    const std::size_t n = replicas_.size();
    return {param_count * r / n, param_count * (r + 1) / n};
  }
  /// After every replica updated its slice: copies the other replicas' slices into replica r's
  /// parameters (an all-gather through shared host memory; call on replica r's worker).
  void gather_updated_parameters(std::size_t r) {
    if (!sharded_) return;
    if constexpr (device_memory<Kind>::host_accessible) {
      T* mine = replicas_[r]->model().parameters().data();
      for (std::size_t s = 0; s < replicas_.size(); ++s) {
        if (s == r) continue;
        const auto [lo, hi] = update_slice(s);
        copy(replicas_[r]->context(), mine + lo, replicas_[s]->model().parameters().data() + lo, hi - lo);
      }
    }
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
    auto& r = *replicas_.front();
    copy_to_host(const_cast<context_type&>(const_cast<replica_type&>(r).context()), out.data(),
                 r.model().parameters().data(), stored_count);
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
  [[nodiscard]] std::vector<T> optimizer_state_to_host() const {
    if (!sharded_) {
      auto& r = const_cast<replica_type&>(*replicas_.front());
      std::vector<T> v(r.optimizer_state().size());
      if (!v.empty()) copy_to_host(r.context(), v.data(), r.optimizer_state().data(), v.size());
      return v;
    }
    const std::size_t k = state_arrays();
    std::vector<T> v(k * param_count);
    for (std::size_t s = 0; s < replicas_.size(); ++s) {
      auto& rep = const_cast<replica_type&>(*replicas_[s]);
      const auto [lo, hi] = update_slice(s);
      for (std::size_t c = 0; c < k && hi > lo; ++c)
        copy_to_host(rep.context(), v.data() + c * param_count + lo, rep.optimizer_state().data() + c * (hi - lo), hi - lo);
    }
    return v;
  }
  /// Loads an optimiser state of all parameters (as optimizer_state_to_host returns it) into
  /// every replica, or each replica's slice of it when the update is sharded; the next update
  /// continues from it.
  void load_optimizer_state(std::span<const T> in) {
    if (sharded_ && in.size() % param_count != 0)
      throw shape_error("lockstep::replicated::load_optimizer_state: " + std::to_string(in.size()) +
                        " elements of optimiser state are not a whole number of arrays of " +
                        std::to_string(param_count) + " (the update is sharded, which needs an elementwise optimiser)");
    const std::size_t k = param_count ? in.size() / param_count : 0;
    for (std::size_t s = 0; s < replicas_.size(); ++s) {
      auto& r = *replicas_[s];
      auto& st = r.optimizer_state();
      const auto [lo, hi] = update_slice(s);
      const std::size_t size = sharded_ ? k * (hi - lo) : in.size();
      if (st.size() != size) st = basic_buffer<T, Kind>(size);
      if (!sharded_) {
        if (!in.empty()) copy_from_host(r.context(), st.data(), in.data(), in.size());
        continue;
      }
      for (std::size_t c = 0; c < k && hi > lo; ++c)
        copy_from_host(r.context(), st.data() + c * (hi - lo), in.data() + c * param_count + lo, hi - lo);
    }
  }

private:
  static void check_length(std::size_t got, std::size_t want, const char* what) {
    if (got != want)
      throw shape_error(std::string("lockstep::replicated::") + what + ": the span has " + std::to_string(got) +
                        " elements but the model has " + std::to_string(want));
  }

  std::vector<std::unique_ptr<replica_type>> replicas_;
  lockstep::seed seed_;
  layout_type layout_;
  // Arrays of param_count in a sharded optimiser state (the slices' states are k arrays each).
  std::size_t state_arrays() const {
    std::size_t k = 0;
    bool known = false;
    for (std::size_t s = 0; s < replicas_.size(); ++s) {
      const auto [lo, hi] = update_slice(s);
      const std::size_t have = replicas_[s]->optimizer_state().size();
      if (hi == lo) continue;
      if (have % (hi - lo) != 0 || (known && have / (hi - lo) != k))
        throw shape_error("lockstep::replicated: the sharded optimiser state of replica " + std::to_string(s) + " has " +
                          std::to_string(have) + " elements for " + std::to_string(hi - lo) +
                          " parameters: not an elementwise optimiser's state");
      k = have / (hi - lo);
      known = true;
    }
    return k;
  }

  std::uint64_t step_ = 0;
  bool sharded_ = false;
  std::weak_ptr<const strategy_identity> owner_;
  std::string owner_description_;
};

/// The replicas of network Net on devices like D (a tag such as cpu<I>, or a kind): one type per
/// kind, whatever the ordinals or the number of replicas.
template <class Net, class D = cpus, class T = float>
using replicated = basic_replicated<Net, kind_of_t<D>, T>;

}  // namespace lockstep
