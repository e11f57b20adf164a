#pragma once
/// @file sharded_update.hpp
/// `sharded_update`: the optimiser update of a replicated model, whole or split over its replicas
/// (strategy_options::shard_optimizer, as ZeRO stage 1), as one unit. Unsharded, every replica
/// updates every parameter and keeps the whole optimiser state and EMA. Sharded, replica r
/// updates only its slice of the parameters, [P r / N, P (r + 1) / N) (the slices differ in
/// length by at most one), or, for a reducer that reduces onto the slices (reduces_to_slices_v:
/// host_allreduce, NCCL), whole chunks of the epilogue's grid (grid_slice), and keeps only that
/// slice's optimiser state and EMA (plus the EMA of the non-trainable state, which every replica
/// keeps); once every replica has updated its slice, `gather` copies the others' slices into it
/// (on the grid, the reducer's gather_slices does, and gather_weight_copy completes the bf16
/// weight copy on the host). The update is elementwise, so the parameters are
/// bitwise those of the unsharded update, and the state and EMA put together for a checkpoint
/// (`state_to_host`, `ema_to_host`) are those an unsharded update keeps, so a checkpoint does not
/// depend on the sharding or the replica count.
///
/// On a device kind without host memory, the update is sharded where the context can order one
/// replica's copies after another's update (shards_on_device_v: GPUs, on one GPU or several):
/// each replica marks its stream after its slice, and each copy of a slice (`copy_from`: on one
/// GPU, or a peer copy between two) waits on the device for the mark of the replica that updated
/// it. Every replica holds the whole reduced gradient (the reducer's all-reduce), so each slice's
/// update is the unsharded update's, bitwise.
///
/// The recipe's parts of an update (update_info's clip_value, device decision and EMA) are applied
/// by the optimiser in its own pass when it says `applies_recipe` (the library's do); for any
/// other optimiser, here: per-value clipping in a pass over the slice's gradient sums before the
/// optimiser, and the EMA in a pass after it.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/backend/context.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/distribute/epilogue.hpp>
#include <lockstep/memory/buffer.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

namespace detail {
/// ema = keep · ema + take · p over n elements (skipped when a device decision says so).
template <class T>
struct ema_op {
  T* ema;                                    ///< the average
  const T* p;                                ///< the weights
  T keep, take;                              ///< decay and 1 − decay
  const update_decision* decision = nullptr; ///< device decision, or null
  /// Averages element i.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    if (decision && decision->skip) return;
    ema[i] = keep * ema[i] + take * p[i];
  }
};

/// g = clip_to(g · scale, bound): per-value clipping of gradient sums for an optimiser that does
/// not clip itself (which then receives grad_scale 1).
template <class T>
struct clip_values_op {
  T* g;          ///< gradient sums, then the clipped gradient
  T scale;       ///< update_info::grad_scale
  T bound;       ///< update_info::clip_value
  /// Clips element i.
  LOCKSTEP_HD void operator()(std::size_t i) const { g[i] = clip_to(g[i] * scale, bound); }
};

/// True when contexts of type Ctx order a sharded update's copies on the device: `mark_update()`
/// after a replica's slice, `wait_for_update_of(other)` before copying it, and a kernel
/// `copy_from(ctx, dst, other, src, n)` that copies from another replica's device (GPUs).
template <class Ctx>
inline constexpr bool shards_on_device_v = requires(const Ctx& c, float* d, const float* s, std::size_t n) {
  c.mark_update();
  c.wait_for_update_of(c);
  copy_from(c, d, c, s, n);
};
}  // namespace detail

/// The optimiser update of the replicas of one model (see the file comment).
/// @tparam Replica the replica type (basic_replica<Net, Kind, T>)
template <class Replica>
class sharded_update {
public:
  using value_type = typename Replica::value_type;                       ///< parameter type
  using kind_type = typename Replica::device_type;                       ///< the device kind
  static constexpr std::size_t param_count = Replica::model_type::param_count;   ///< trainable parameters
  static constexpr std::size_t state_count = Replica::model_type::state_count;   ///< non-trainable state
  static constexpr std::size_t stored_count = Replica::model_type::stored_count; ///< parameters then state
  /// The replicas, as basic_replicated keeps them.
  using replicas_view = std::span<const std::unique_ptr<Replica>>;

  /// Parameters [first, second) that replica r of n updates under sharding: [P r / n,
  /// P (r + 1) / n).
  [[nodiscard]] static constexpr std::pair<std::size_t, std::size_t> slice_of(std::size_t r, std::size_t n) noexcept {
    return {param_count * r / n, param_count * (r + 1) / n};
  }

  /// True when the update can be sharded on this device kind: host memory, or device memory whose
  /// contexts order the copies (detail::shards_on_device_v).
  static constexpr bool shardable = device_memory<kind_type>::host_accessible ||
                                    detail::shards_on_device_v<typename Replica::context_type>;
  /// True when the update is sharded in device memory: copies ordered by the contexts' marks.
  static constexpr bool device_ordered = !device_memory<kind_type>::host_accessible && shardable;

  /// Turns sharding on or off for the replicas `reps` (one replica never shards; the effective
  /// setting may not change once `updates` > 0). `on_grid`: the slices follow the epilogue's
  /// grid (grid_slice: chunk boundaries) instead of slice_of, for a reducer that reduces each
  /// bucket onto its slices (reduces_to_slices_v), so that each chunk of the epilogue lies in
  /// one replica's slice.
  /// @throws config_error for a kind that cannot shard, or a change after the first update.
  void configure(bool on, replicas_view reps, std::uint64_t updates, bool on_grid = false) {
    const std::size_t replicas = reps.size();
    if (on && !shardable)
      throw config_error("lockstep: strategy_options::shard_optimizer is implemented for devices with host memory (cpu<I>) "
                         "and for GPUs");
    const bool sharded = on && replicas > 1;
    const bool grid = sharded && on_grid;
    if ((sharded != sharded_ || grid != on_grid_) && updates > 0)
      throw config_error("lockstep: strategy_options::shard_optimizer cannot change after the first update");
    sharded_ = sharded;
    on_grid_ = grid;
    replicas_ = replicas;
    slices_.resize(replicas);
    for (std::size_t r = 0; r < replicas; ++r) slices_[r] = slice(r);
  }
  /// True when the update is split over the replicas.
  [[nodiscard]] bool sharded() const noexcept { return sharded_; }
  /// True when the update is split on the epilogue's grid (configure's `on_grid`): the strategy's
  /// reducer then reduces each bucket onto the slices and gathers them (reduces_to_slices_v).
  [[nodiscard]] bool on_grid() const noexcept { return on_grid_; }
  /// The parameters [first, second) replica r updates: all of them, or its slice when sharded
  /// (slice_of, or grid_slice when on_grid()).
  [[nodiscard]] std::pair<std::size_t, std::size_t> slice(std::size_t r) const noexcept {
    if (!sharded_) return {0, param_count};
    return on_grid_ ? grid_slice(param_count, r, replicas_) : slice_of(r, replicas_);
  }
  /// slice(r) of every replica r, in replica order (what a reducer that reduces onto the slices is given).
  [[nodiscard]] std::span<const std::pair<std::size_t, std::size_t>> slices() const noexcept { return slices_; }

  /// Replica r (on its worker) applies `opt` to its slice with update `u` (grad_scale, clipping
  /// and a device decision already filled in); with `ema` it then updates its slice of the EMA
  /// with decay `ema_decay` (0 copies the weights).
  template <class Optimizer>
  void apply(Replica& rep, std::size_t r, const Optimizer& opt, update_info u, bool ema, double ema_decay) const {
    const auto [lo, hi] = slice(r);
    auto& ctx = rep.context();
    value_type* average = nullptr;
    if (ema) {
      auto& e = rep.ema();
      if (e.size() != (hi - lo) + state_count) {
        backend::place_memory(ctx);
        e = basic_buffer<value_type, kind_type>((hi - lo) + state_count);
        fill(ctx, e.data(), e.size(), value_type(0));
      }
      average = e.data();
    }
    const value_type keep = static_cast<value_type>(ema_decay), take = static_cast<value_type>(1.0 - ema_decay);
    if constexpr (optimizer_applies_recipe_v<Optimizer>) {
      if (average) {
        u.ema = average;
        u.ema_decay = ema_decay;
      }
      rep.apply(opt, u, lo, hi);
    } else {
      if (u.decision)
        throw config_error("lockstep: an optimiser without `applies_recipe` cannot read a device decision");
      if (u.clip_value > 0 && hi > lo) {
        for_each_index(ctx, hi - lo,
                       detail::clip_values_op<value_type>{rep.model().gradients().data() + lo,
                                                          static_cast<value_type>(u.grad_scale),
                                                          static_cast<value_type>(u.clip_value)});
        u.grad_scale = 1;
        u.clip_value = 0;
      }
      rep.apply(opt, u, lo, hi);
      if (average && hi > lo)
        for_each_index(ctx, hi - lo, detail::ema_op<value_type>{average, rep.model().parameters().data() + lo, keep, take});
    }
    if (average && state_count > 0)
      for_each_index(ctx, state_count,
                     detail::ema_op<value_type>{average + (hi - lo), rep.model().parameters().data() + param_count, keep,
                                                take, u.decision});
    // The slice's bf16 weight copy, from the updated values (on GPUs the update left the copy
    // stale, and the next pass rewrites it whole in one kernel).
    if constexpr (device_memory<kind_type>::host_accessible)
      rep.model().update_weight_copy(ctx, lo, hi, !sharded_);
    if constexpr (device_ordered)
      if (sharded_) ctx.mark_update();  // the others' copies of this slice wait for it
  }

  /// After every replica updated its slice: copies the other replicas' slices into replica r's
  /// parameters (an all-gather: through host memory, or on the GPUs with each copy queued after
  /// the mark of the replica that updated the slice; call on replica r's worker), and on the
  /// host their slices of the bf16 weight copy (basic_model::has_weight_copy). The other
  /// replicas are only read (their models taken read-only: another worker owns them).
  void gather(replicas_view reps, std::size_t r) const {
    if (!sharded_) return;
    if constexpr (shardable) {
      auto& me = reps[r]->model();
      value_type* mine = me.parameters().data();
      for (std::size_t s = 0; s < reps.size(); ++s) {
        if (s == r) continue;
        const auto [lo, hi] = slice(s);
        const auto& theirs = std::as_const(*reps[s]).model();
        if constexpr (device_ordered) {
          reps[r]->context().wait_for_update_of(reps[s]->context());
          copy_from(reps[r]->context(), mine + lo, reps[s]->context(), theirs.parameters().data() + lo, hi - lo);
        } else {
          copy(reps[r]->context(), mine + lo, theirs.parameters().data() + lo, hi - lo);
        }
      }
      gather_weight_copy(reps, r);
    }
  }

  /// After the updated slices of the parameters were gathered into replica r's (by gather, or by
  /// the reducer: reduces_to_slices_v): on the host, copies the other replicas' slices of their
  /// bf16 weight copies into replica r's (basic_model::has_weight_copy), which is then current;
  /// elsewhere nothing (on GPUs the next pass rewrites the copy whole). Call on replica r's worker
  /// once every replica has updated.
  void gather_weight_copy(replicas_view reps, std::size_t r) const {
    if constexpr (device_memory<kind_type>::host_accessible) {
      if (!sharded_) return;
      auto& me = reps[r]->model();
      for (std::size_t s = 0; s < reps.size(); ++s) {
        if (s == r) continue;
        const auto [lo, hi] = slice(s);
        me.take_weight_copy(reps[r]->context(), std::as_const(*reps[s]).model(), std::as_const(*reps[s]).context(), lo, hi);
      }
      me.weight_copy_complete(reps[r]->context());
    } else {
      (void)reps;
      (void)r;
    }
  }

  /// The optimiser state of all parameters as a host vector (empty before the first update):
  /// replica 0's, or the replicas' slices put together in the layout of an unsharded state (k
  /// arrays of param_count).
  [[nodiscard]] std::vector<value_type> state_to_host(replicas_view reps) const {
    if (!sharded_) {
      const Replica& r = *reps.front();
      std::vector<value_type> v(r.optimizer_state().size());
      if (!v.empty()) copy_to_host(r.context(), v.data(), r.optimizer_state().data(), v.size());
      return v;
    }
    const std::size_t k = state_arrays(reps);
    std::vector<value_type> v(k * param_count);
    for (std::size_t s = 0; s < reps.size(); ++s) {
      const Replica& rep = *reps[s];
      const auto [lo, hi] = slice(s);
      for (std::size_t c = 0; c < k && hi > lo; ++c)
        copy_to_host(rep.context(), v.data() + c * param_count + lo, rep.optimizer_state().data() + c * (hi - lo), hi - lo);
    }
    return v;
  }

  /// Loads an optimiser state of all parameters (as state_to_host returns it) into every
  /// replica, or each replica's slice of it when sharded; an empty one drops what the replicas
  /// hold (their next update creates the state, as before the first).
  /// @throws shape_error when a sharded state is not a whole number of arrays.
  void load_state(replicas_view reps, std::span<const value_type> in) const {
    if (in.empty()) {  // no update applied yet: none of the state the replicas may hold
      for (std::size_t s = 0; s < reps.size(); ++s) reps[s]->clear_optimizer_state();
      return;
    }
    if (sharded_ && (param_count == 0 || in.size() % param_count != 0))
      throw shape_error("lockstep::replicated::load_optimizer_state: " + std::to_string(in.size()) +
                        " elements of optimiser state are not a whole number of arrays of " + std::to_string(param_count) +
                        " (the update is sharded, which needs an elementwise optimiser)");
    const std::size_t k = param_count ? in.size() / param_count : 0;
    for (std::size_t s = 0; s < reps.size(); ++s) {
      Replica& r = *reps[s];
      auto& st = r.optimizer_state();
      const auto [lo, hi] = slice(s);
      const std::size_t size = sharded_ ? k * (hi - lo) : in.size();
      if (st.size() != size) {
        backend::place_memory(r.context());
        st = basic_buffer<value_type, kind_type>(size);
      }
      if (!sharded_) {
        copy_from_host(r.context(), st.data(), in.data(), in.size());
        continue;
      }
      for (std::size_t c = 0; c < k && hi > lo; ++c)
        copy_from_host(r.context(), st.data() + c * (hi - lo), in.data() + c * param_count + lo, hi - lo);
    }
  }

  /// The EMA of the parameters and the non-trainable state (stored_count elements) as a host
  /// vector, put together from the replicas' slices when sharded (call only when an EMA exists).
  /// @throws shape_error when a replica holds no EMA of its slice.
  [[nodiscard]] std::vector<value_type> ema_to_host(replicas_view reps) const {
    std::vector<value_type> v(stored_count);
    for (std::size_t s = 0; s < (sharded_ ? reps.size() : 1); ++s) {
      const Replica& rep = *reps[s];
      const auto [lo, hi] = slice(s);
      if (rep.ema().size() != (hi - lo) + state_count)
        throw shape_error("lockstep::replicated: replica " + std::to_string(s) + " holds " +
                          std::to_string(rep.ema().size()) + " EMA values for a slice of " + std::to_string(hi - lo) +
                          " parameters and " + std::to_string(state_count) + " state values");
      if (hi > lo) copy_to_host(rep.context(), v.data() + lo, rep.ema().data(), hi - lo);
      if (s == 0 && state_count > 0)
        copy_to_host(rep.context(), v.data() + param_count, rep.ema().data() + (hi - lo), state_count);
    }
    return v;
  }

  /// Loads an EMA of stored_count elements (as ema_to_host returns it) into every replica (its
  /// slice when sharded); an empty span removes the EMA.
  /// @throws shape_error when the length is not stored_count.
  void load_ema(replicas_view reps, std::span<const value_type> in) const {
    if (!in.empty() && in.size() != stored_count)
      throw shape_error("lockstep::replicated::load_ema: the span has " + std::to_string(in.size()) +
                        " elements but the model stores " + std::to_string(stored_count));
    for (std::size_t s = 0; s < reps.size(); ++s) {
      Replica& r = *reps[s];
      const auto [lo, hi] = slice(s);
      auto& e = r.ema();
      const std::size_t size = in.empty() ? 0 : (hi - lo) + state_count;
      if (e.size() != size) {
        backend::place_memory(r.context());
        e = basic_buffer<value_type, kind_type>(size);
      }
      if (in.empty()) continue;
      if (hi > lo) copy_from_host(r.context(), e.data(), in.data() + lo, hi - lo);
      if (state_count > 0) copy_from_host(r.context(), e.data() + (hi - lo), in.data() + param_count, state_count);
    }
  }

private:
  // Arrays of param_count in a sharded optimiser state (the slices' states are k arrays each).
  std::size_t state_arrays(replicas_view reps) const {
    std::size_t k = 0;
    bool known = false;
    for (std::size_t s = 0; s < reps.size(); ++s) {
      const auto [lo, hi] = slice(s);
      const std::size_t have = reps[s]->optimizer_state().size();
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

  bool sharded_ = false;
  bool on_grid_ = false;
  std::size_t replicas_ = 1;
  std::vector<std::pair<std::size_t, std::size_t>> slices_{{0, param_count}};
};

}  // namespace lockstep
