#pragma once
/// @file replica.hpp
/// `replica<Net, D, T>` (`basic_replica<Net, Kind, T>`): everything one device needs for training — its context, its model
/// instance, its optimiser state and the scratch of its loss — allocated on first use and reused,
/// so a steady-state step allocates nothing. A strategy owns one per device; single-device
/// training can use one directly.

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <lockstep/backend/context.hpp>
#include <lockstep/backend/host/ops.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/layers/model.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/memory/buffer.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep {

/// One device's training state, for devices of kind Kind (the ordinal is in the context).
template <class Net, class Kind, class T>
class basic_replica {
public:
  using model_type = basic_model<Net, T, Kind>;  ///< the model instance type
  using context_type = context_t<Kind>;          ///< the device's execution context
  using value_type = T;                          ///< parameter type
  using device_type = Kind;                      ///< the device kind

  /// A replica with parameters initialised from `s`.
  basic_replica(context_type ctx, lockstep::seed s) : ctx_(std::move(ctx)), model_(on_device(ctx_), s) {}

  /// Grows every buffer for shards of up to `rows` rows, so later steps allocate nothing. The
  /// calling thread computes for this replica from here (forward_backward and predict start with
  /// it): its context is activated (the device made current; on the host the thread's mode set).
  void reserve(std::size_t rows) {
    ctx_.activate();
    model_.reserve(ctx_, rows);
    if (rows <= capacity_) return;
    dout_.reserve_discard(rows * model_type::output_size);
    scratch_.reserve_discard(rows * max_loss_scratch_per_row);
    if constexpr (host_memory && !direct_input) {  // other devices stage through their context
      input_.reserve_discard(rows * model_type::input_size);
      targets_.reserve_discard(rows * model_type::output_size);
      labels_.reserve_discard(rows);
    }
    capacity_ = rows;
  }

  /// Forward and backward on one shard: leaves the gradient of the shard's loss SUM in
  /// gradients() (zero for an empty shard) — or adds it to what gradients() holds when
  /// info.accumulate is set (gradient accumulation; info.update_offset keys the rows' randomness
  /// by their position in the update) — and returns the loss sum and count, and the top-1 hits
  /// of the training-mode outputs among the labelled rows (`correct`, `labelled`: from the loss
  /// when it counts them, else read from host outputs; labelled = 0 when neither can).
  /// `on_layer_done(layer, offset, count)` runs as each top-level layer's gradients become final.
  template <class Loss, class Hook = no_layer_hook>
  loss_sum forward_backward(const Loss& loss, const data::shard& s, const pass_info& info, const Hook& on_layer_done = {}) {
    check_width(s);
    check_loss_labels<Loss>(s.labels, s.size, model_type::output_size, {s.indices, info.rank, info.step});
    reserve(s.size);
    pass_info i = info;
    i.sample_offset = s.offset;
    i.global_rows = s.global_size;
    i.training = true;
    const T* x = stage(s);
    const T* out = model_.forward(ctx_, x, s.size, i);
    check_loss<Loss>();
    loss_sum l = loss.evaluate(ctx_, loss_args_t{{out, s.size}, targets_of(s), {dout_.data(), s.size}, scratch_.data()});
    count_hits<Loss>(l, s, out);
    if (loss_scale_ != 1) scale(ctx_, dout_.data(), s.size * model_type::output_size, static_cast<T>(loss_scale_));
    model_.backward(ctx_, dout_.data(), on_layer_done);
    return l;
  }

  /// The factor forward_backward multiplies the loss's gradient by before backward (the dynamic
  /// loss scale of mixed<fp16>; 1 otherwise): the gradient sums then carry it.
  void set_loss_scale(double s) noexcept { loss_scale_ = s; }

  /// Evaluation forward on one shard; returns the output (rows x output_size, on the device).
  const T* predict(const data::shard& s, const pass_info& info) {
    check_width(s);
    reserve(s.size);
    pass_info i = info;
    i.sample_offset = s.offset;
    i.training = false;
    return model_.forward(ctx_, stage(s), s.size, i);
  }

  /// Loss sum (no gradient) of one shard in evaluation mode.
  template <class Loss>
  loss_sum evaluate(const Loss& loss, const data::shard& s, const pass_info& info) {
    return loss_of(loss, s, predict(s, info));
  }

  /// Loss sum (no gradient) of shard `s` for the outputs `out` that predict() just returned for it.
  template <class Loss>
  loss_sum loss_of(const Loss& loss, const data::shard& s, const T* out) {
    check_loss<Loss>();
    check_loss_labels<Loss>(s.labels, s.size, model_type::output_size, {s.indices});
    return loss.evaluate(ctx_, loss_args_t{{out, s.size}, targets_of(s), {}, scratch_.data()});
  }

  /// Applies the optimiser to the (already aggregated) gradient sums of parameters [lo, hi) (all
  /// of them by default; a slice under strategy_options::shard_optimizer, for an elementwise
  /// optimiser). The state, state_size(hi - lo) elements, is created (zeroed) on the first call
  /// and must keep its size: one optimiser kind and one slice per replica.
  template <class Optimizer>
  void apply(const Optimizer& opt, const update_info& u, std::size_t lo = 0, std::size_t hi = model_type::param_count) {
    static_assert(detail::check_optimizer<Optimizer, T, context_type>());  // names a missing member
    if (lo > hi || hi > model_type::param_count)
      throw config_error("lockstep::replica::apply: the slice [" + std::to_string(lo) + ", " + std::to_string(hi) +
                         ") is not within the " + std::to_string(model_type::param_count) + " parameters");
    if constexpr (!optimizer_elementwise_v<Optimizer>) {
      if (hi - lo != model_type::param_count)
        throw config_error("lockstep: strategy_options::shard_optimizer needs an elementwise optimiser (one that says "
                           "`static constexpr bool elementwise = true;`: each parameter's update reads only its own "
                           "gradient and state); this optimiser updates all parameters together");
    }
    const std::size_t n = hi - lo;
    const std::size_t need = opt.state_size(n);
    if (state_.size() != need) {
      on_device(ctx_);
      if (state_initialised_)
        throw config_error("lockstep: the optimiser state has " + std::to_string(state_.size()) +
                           " elements but this optimiser needs " + std::to_string(need) +
                           "; use one optimiser configuration per model");
      state_ = basic_buffer<T, Kind>(need);
      fill(ctx_, state_.data(), need, T(0));
    }
    state_initialised_ = true;
    opt.update(ctx_, model_.parameters().data() + lo, model_.gradients().data() + lo, state_.data(), n, u);
  }

  /// The bytes this replica holds on its device, by purpose (the model's buffers, the optimiser
  /// state, the EMA, the loss's and the input's buffers, the context's GEMM operand buffers).
  [[nodiscard]] memory_use memory() const noexcept {
    memory_use m = model_.memory();
    m.optimizer_state = state_.size() * sizeof(T);
    if constexpr (requires { ctx_.gemm_operand_bytes(); }) m.gemm_operands = ctx_.gemm_operand_bytes();
    m.other += (ema_.size() + dout_.size() + scratch_.size() + input_.size() + targets_.size()) * sizeof(T) +
               labels_.size() * sizeof(std::int32_t);
    return m;
  }

  /// The model instance.
  [[nodiscard]] model_type& model() noexcept { return model_; }
  /// The model instance.
  [[nodiscard]] const model_type& model() const noexcept { return model_; }
  /// The flat optimiser state (of the parameters this replica updates).
  [[nodiscard]] basic_buffer<T, Kind>& optimizer_state() noexcept { return state_; }
  /// The flat optimiser state (read-only).
  [[nodiscard]] const basic_buffer<T, Kind>& optimizer_state() const noexcept { return state_; }
  /// The exponential moving average of the weights this replica keeps (its slice of the
  /// parameters, then the non-trainable state; empty without an EMA; see sharded_update).
  [[nodiscard]] basic_buffer<T, Kind>& ema() noexcept { return ema_; }
  /// The EMA (read-only).
  [[nodiscard]] const basic_buffer<T, Kind>& ema() const noexcept { return ema_; }
  /// The device's execution context.
  [[nodiscard]] context_type& context() noexcept { return ctx_; }
  /// The device's execution context (copies to the host take it read-only).
  [[nodiscard]] const context_type& context() const noexcept { return ctx_; }

  /// Copies the model's non-trainable state (batch norm's running statistics, which a training
  /// forward pass moves) aside, for restore_state(); nothing for a model without state. The copy
  /// is made on first use, then reused.
  void keep_state() {
    if constexpr (model_type::state_count > 0) {
      if (kept_.size() != model_type::state_count) {
        on_device(ctx_);
        kept_ = basic_buffer<T, Kind>(model_type::state_count);
      }
      copy(ctx_, kept_.data(), model_.parameters().data() + model_type::param_count, model_type::state_count);
    }
  }
  /// Puts back the state keep_state() copied (an update that was skipped or failed).
  void restore_state() {
    if constexpr (model_type::state_count > 0)
      if (kept_.size() == model_type::state_count)
        copy(ctx_, model_.parameters().data() + model_type::param_count, kept_.data(), model_type::state_count);
  }

  /// Drops the optimiser state: the next apply creates it, zeroed, for whichever optimiser it is
  /// given (a checkpoint taken before the first applied update holds none).
  void clear_optimizer_state() {
    state_ = basic_buffer<T, Kind>();
    state_initialised_ = false;
  }

  /// Sizes the optimiser state for `opt` and zeroes it (what apply does on first use).
  template <class Optimizer>
  void reset_optimizer_state(const Optimizer& opt) {
    on_device(ctx_);
    state_ = basic_buffer<T, Kind>(opt.state_size(model_type::param_count));
    fill(ctx_, state_.data(), state_.size(), T(0));
    state_initialised_ = true;
  }

private:
  /// Loss scratch reserved per row; a loss that needs more is a compile error.
  static constexpr std::size_t max_loss_scratch_per_row = 4;
  /// What the loss receives: views of the model's output rows.
  using loss_args_t = loss_args<T, context_type, typename model_type::output_shape>;
  template <class Loss>
  static constexpr void check_loss() {
    static_assert(detail::check_loss<Loss, T, context_type, typename model_type::output_shape>());  // names a missing member
    static_assert(Loss::scratch_per_row <= max_loss_scratch_per_row,
                  "lockstep::replica: this loss asks for more scratch per row than a replica reserves");
  }

  // Host memory reads the shard in place (float) or converts it; device memory is staged by the
  // context (stage_shard: one asynchronous copy of features, labels and targets).
  static constexpr bool host_memory = device_memory<Kind>::host_accessible;
  static constexpr bool direct_input = host_memory && std::is_same_v<T, float>;

  // Device buffers are allocated on the calling thread's current device: make it this replica's
  // (only that: the thread may be the caller's, computing for no replica).
  static context_type& on_device(context_type& c) {
    backend::place_memory(c);
    return c;
  }

  // The top-1 hits of a labelled shard: the loss counted them, or (host memory) they are read
  // from the outputs; on other devices a loss that does not count them leaves labelled = 0.
  template <class Loss>
  static void count_hits(loss_sum& l, const data::shard& s, const T* out) {
    l.labelled = 0;
    if (!s.labels || s.size == 0) {
      l.correct = 0;
      return;
    }
    if constexpr (counts_correct_v<Loss>) {
      l.labelled = s.size;
    } else if constexpr (host_memory) {
      constexpr std::size_t cols = model_type::output_size;
      std::size_t hits = 0;
      for (std::size_t r = 0; r < s.size; ++r)
        if (s.labels[r] >= 0 && static_cast<std::size_t>(s.labels[r]) < cols)
          hits += rank_of(out + r * cols, cols, static_cast<std::size_t>(s.labels[r])) == 0 ? 1 : 0;
      l.correct = hits;
      l.labelled = s.size;
    } else {
      l.correct = 0;
    }
  }

  static void check_width(const data::shard& s) {
    if (s.size > 0 && s.width != model_type::input_size)
      throw shape_error("lockstep: the batch has " + std::to_string(s.width) + " features per row but the model's input is " +
                        std::to_string(model_type::input_size));
  }

  // The shard's features as T on the device: used in place on the host, converted or copied otherwise.
  const T* stage(const data::shard& s) {
    if constexpr (direct_input) {
      return s.features;
    } else {
      const std::size_t n = s.size * s.width;
      if constexpr (host_memory) {
        for (std::size_t k = 0; k < n; ++k) input_[k] = static_cast<T>(s.features[k]);
        return input_.data();
      } else {
        // Features, labels and targets go through the context's pinned double buffer in one
        // asynchronous copy that overlaps the device work still queued from the previous shard.
        static_assert(std::is_same_v<T, float>, "lockstep: replicas on device memory train in float");
        const auto st = ctx_.stage_shard(s.features, n, s.labels, s.size, s.targets, s.size * s.target_width);
        staged_labels_ = st.labels;
        staged_targets_ = st.targets;
        return st.features;
      }
    }
  }

  targets<T> targets_of(const data::shard& s) {
    if (s.targets && s.size > 0 && s.target_width != model_type::output_size)
      throw shape_error("lockstep: targets have width " + std::to_string(s.target_width) + " but the model outputs " +
                        std::to_string(model_type::output_size));
    if constexpr (direct_input) {
      return {s.labels, s.targets, s.target_width};
    } else if constexpr (!host_memory) {
      return {staged_labels_, staged_targets_, s.target_width};  // staged with the features
    } else {
      targets<T> t{nullptr, nullptr, s.target_width};
      if (s.labels) {
        copy_from_host(ctx_, labels_.data(), s.labels, s.size);
        t.labels = labels_.data();
      }
      if (s.targets) {
        const std::size_t n = s.size * s.target_width;
        for (std::size_t k = 0; k < n; ++k) targets_[k] = static_cast<T>(s.targets[k]);
        t.values = targets_.data();
      }
      return t;
    }
  }

  context_type ctx_;
  model_type model_;
  basic_buffer<T, Kind> state_;
  basic_buffer<T, Kind> ema_;
  basic_buffer<T, Kind> kept_;  // keep_state's copy of the non-trainable state
  basic_buffer<T, Kind> dout_;
  double loss_scale_ = 1;  // see set_loss_scale
  basic_buffer<T, Kind> scratch_;
  basic_buffer<T, Kind> input_;
  basic_buffer<T, Kind> targets_;
  basic_buffer<std::int32_t, Kind> labels_;
  const std::int32_t* staged_labels_ = nullptr;  // device memory: the current shard's labels
  const T* staged_targets_ = nullptr;             // device memory: the current shard's targets
  std::size_t capacity_ = 0;
  bool state_initialised_ = false;
};

/// One device's training state for network Net on device D (a tag such as cpu<I>, or a kind):
/// one type per kind, whatever the ordinal.
template <class Net, class D = cpus, class T = float>
using replica = basic_replica<Net, kind_of_t<D>, T>;

}  // namespace lockstep
