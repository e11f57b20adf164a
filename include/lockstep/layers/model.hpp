#pragma once
/// @file model.hpp
/// `model<Net, T, Device>` (`basic_model<Net, T, Kind>`): one replica's instance of a network type. It owns the flat parameter
/// buffer, the flat gradient buffer of the same layout, and the activation workspace (grown to
/// the largest batch seen, then reused: a steady-state step allocates nothing).

#include <algorithm>
#include <cstddef>
#include <memory>
#include <cstdint>
#include <string>
#include <concepts>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/backend/context.hpp>
#include <lockstep/backend/host/ops.hpp>
#include <lockstep/backend/pack16.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/layers/deferral.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/layers/sequential.hpp>
#include <lockstep/memory/buffer.hpp>

namespace lockstep {

namespace detail {
/// g[i] += acc[i]: a layer's gradient of one batch added to the running sum of the earlier ones.
template <class T>
struct gradient_sum_op {
  T* g;          ///< this batch's gradients, then the sum
  const T* acc;  ///< the sum of the earlier batches
  /// Adds element i.
  LOCKSTEP_HD void operator()(std::size_t i) const { g[i] += acc[i]; }
};
}  // namespace detail

namespace detail {
/// Appends to `out` the path of every layer inside bound layer B that computes in fp32 under
/// every policy ("2", "1.0": positions in the sequentials around it, "" for B itself).
template <class B>
void collect_fp32_layers(std::vector<std::string>& out, const std::string& path) {
  if constexpr (requires { B::layer_count; typename B::template layer_type<0>; }) {  // a sequential
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (collect_fp32_layers<typename B::template layer_type<I>>(out, path.empty() ? std::to_string(I)
                                                                                  : path + "." + std::to_string(I)),
       ...);
    }(std::make_index_sequence<B::layer_count>{});
  } else if constexpr (requires { typename B::inner; }) {  // a residual block: its body
    collect_fp32_layers<typename B::inner>(out, path);
  } else if constexpr (!mixed_precision_v<B>) {
    out.push_back(path);
  }
}
}  // namespace detail

/// The layers of network Net that compute in fp32 under every precision policy, because they
/// declare no `mixed_precision` (user layers written for fp32): their positions, "2" for the third
/// layer of Net, "1.0" for the first layer of a sequential at position 1. Empty when every layer
/// follows the model's policy.
template <class Net>
std::vector<std::string> layers_in_fp32() {
  std::vector<std::string> out;
  detail::collect_fp32_layers<bind_t<Net, Net::expected_input>>(out, "");
  return out;
}

/// Bytes one replica holds, by purpose (basic_replica::memory(), basic_model::memory()): what
/// a precision policy, sharding or accumulation changes. Counted in the device's memory, as
/// allocated (buffers grow to the largest batch seen and are reused).
struct memory_use {
  std::size_t parameters = 0;       ///< the master parameters and the non-trainable state
  std::size_t gradients = 0;        ///< the gradient buffer, and the running sum of layers that do not accumulate
  std::size_t optimizer_state = 0;  ///< the optimiser's state (the replica's slice when sharded)
  std::size_t activations = 0;      ///< the layers' workspace (activations kept for backward) and the output
  std::size_t weight_copy = 0;      ///< the bf16 weight copy (mixed<bf16> on host replicas)
  std::size_t gemm_operands = 0;    ///< buffers the context converts GEMM operands into (mixed policies)
  std::size_t other = 0;            ///< the EMA, the loss's buffers, staged inputs, rows kept for accumulated weight gradients
  /// The sum of every part.
  [[nodiscard]] std::size_t total() const noexcept {
    return parameters + gradients + optimizer_state + activations + weight_copy + gemm_operands + other;
  }
};

/// The no-op backward hook: called after each top-level layer's gradients are final.
struct no_layer_hook {
  /// Does nothing.
  void operator()(std::size_t, std::size_t, std::size_t) const noexcept {}
};

/// One instance of network Net with parameters of type T on device kind Kind (see `model`).
/// @tparam Net  a layer whose first layer fixes the input width (usually a sequential)
/// @tparam T    parameter and activation type (float for training, double for gradient checks)
/// @tparam Kind the device kind the buffers live on (cpus, gpus)
template <class Net, class T, class Kind>
class basic_model {
  static_assert(layer<Net>, "lockstep::model: Net must be a layer (for example a lockstep::sequential)");
  static_assert(Net::expected_input > 0,
                "lockstep::model: the network's first layer must fix the input width (start with a dense layer, or with reshape<C, H, W> for images)");

public:
  using network = Net;                                      ///< the unbound network type
  using bound = bind_t<Net, Net::expected_input>;           ///< the network bound to its input width
  using value_type = T;                                     ///< parameter type
  using device_type = Kind;                                 ///< the device kind the buffers live on
  using context_type = context_t<Kind>;                     ///< the context kernels run with
  static_assert(detail::check_bound_layer<bound, T, context_type>());  // names a missing member
  static constexpr std::size_t input_size = bound::input_size;    ///< features per input row
  static constexpr std::size_t output_size = bound::output_size;  ///< outputs per row
  using input_shape = bound_input_shape_t<bound>;                 ///< shape of an input row
  using output_shape = bound_output_shape_t<bound>;               ///< shape of an output row (what the loss sees)
  static constexpr std::size_t param_count = bound::param_count;  ///< trainable parameters (length of the gradients)
  static constexpr std::size_t state_count = state_count_v<bound>;  ///< non-trainable state after the parameters
  static constexpr std::size_t stored_count = param_count + state_count;  ///< length of the parameter buffer
  static constexpr bool couples_rows = couples_rows_v<bound>;  ///< a layer's training forward couples rows

  /// A host model initialised from `s`.
  explicit basic_model(lockstep::seed s = {}) requires std::default_initializable<context_t<Kind>>
      : params_(stored_count), grads_(param_count) {
    context_type ctx;
    init(ctx, s);
  }

  /// A model on the context's device initialised from `s` (initialised on the host, then copied with `ctx`).
  basic_model(context_type& ctx, lockstep::seed s) : params_(stored_count), grads_(param_count) { init(ctx, s); }

  /// Re-initialises every parameter from seed `s` (the values depend only on (s, layer, element))
  /// and the non-trainable state to its initial value.
  void init(context_type& ctx, lockstep::seed s) {
    std::vector<T> host(stored_count);
    bound::init(host.data(), counter_rng(s.value, layer_rng_stream(0, rng_purpose::init)));
    if constexpr (state_count > 0) bound::init_state(host.data() + param_count);
    copy_from_host(ctx, params_.data(), host.data(), stored_count);
    fill(ctx, grads_.data(), param_count, T(0));
    copy_fresh_ = false;
  }

  /// Grows the workspace for batches of up to `rows` rows on `ctx` (forward does this on demand),
  /// laid out as the passes on `ctx` lay it out (with activations in bf16 where
  /// stores_bf16_activations).
  void reserve(const context_type& ctx, std::size_t rows) {
    const bool bf16 = stores_bf16_activations(ctx);
    if (reserved_ && rows <= capacity_ && bf16 == bf16_layout_) return;
    const std::size_t per_sample = bf16 ? workspace_bf16_v<bound> : bound::workspace_per_sample;
    workspace_.reserve_discard(rows * per_sample + workspace_fixed_v<bound>);
    output_.reserve_discard(rows * output_size);
    capacity_ = rows;
    bf16_layout_ = bf16;
    reserved_ = true;
  }

  /// True when this model's passes on `ctx` keep the activations that a layer reads in bf16 as
  /// bf16 encodings (pass_info::bf16_activations): a float model on a host context whose
  /// bf16_activations() is true.
  [[nodiscard]] static bool stores_bf16_activations([[maybe_unused]] const context_type& ctx) noexcept {
    if constexpr (std::is_same_v<T, float> && detail::host_context_v<context_type>)
      return ctx.bf16_activations();
    else
      return false;
  }

  /// Runs the network on `rows` rows of x (rows x input_size, on D) and returns the output
  /// (rows x output_size, on D, valid until the next forward). `x` must stay valid until backward.
  const T* forward(context_type& ctx, const T* x, std::size_t rows, const pass_info& info) {
    reserve(ctx, rows);
    last_info_ = info;
    last_info_.bf16_activations = bf16_layout_;
    last_info_.state_offset = static_cast<std::ptrdiff_t>(param_count);  // the state follows the parameters
    last_info_.deferral = nullptr;
    if constexpr (accumulates_gradients && std::is_same_v<Kind, cpus>) {
      if (info.training && info.deferral_budget > 0) {  // weight gradients once per accumulated update
        deferral_.set_budget(info.deferral_budget);
        last_info_.deferral = &deferral_;
      }
    }
    const detail::layer_precision_scope<bound, context_type> precision(ctx);
    const weight_copy_scope copy(*this, ctx);
    bound::forward(ctx, forward_args_for<T, context_type, bound>{params_.data(),
                                                             {x, rows},
                                                             {output_.data(), rows},
                                                             workspace_.data(),
                                                             last_info_});
    last_x_ = x;
    last_rows_ = rows;
    return output_.data();
  }

  /// Back-propagates dy (rows x output_size, the gradient of the loss SUM) through the last
  /// forward and OVERWRITES the gradient buffer — or, when the forward's pass_info::accumulate
  /// was set, ADDS to it (gradient accumulation: through the layers themselves when they all
  /// accumulate, see accumulates_gradients_v; else each layer's gradients are added to a copy of
  /// the running sum as the layer finishes). The first layer computes no input gradient.
  /// `on_layer_done(layer, offset, count)` runs as each top-level layer's gradients become final.
  template <class Hook = no_layer_hook>
  void backward(context_type& ctx, const T* dy, const Hook& on_layer_done = {}) {
    if constexpr (!accumulates_gradients) {
      if (last_info_.accumulate) {
        accum_.reserve_discard(param_count);
        copy(ctx, accum_.data(), grads_.data(), param_count);
        last_info_.accumulate = false;  // the layers overwrite; the sum is formed below
        T* g = grads_.data();
        const T* acc = accum_.data();
        run_backward(ctx, dy, [&](std::size_t layer, std::size_t offset, std::size_t count) {
          for_each_index(ctx, count, detail::gradient_sum_op<T>{g + offset, acc + offset});
          on_layer_done(layer, offset, count);
        });
        last_info_.accumulate = true;
        return;
      }
    }
    run_backward(ctx, dy, on_layer_done);
  }

  /// True when every layer adds its gradients itself under pass_info::accumulate.
  static constexpr bool accumulates_gradients = accumulates_gradients_v<bound>;

private:
  template <class Hook>
  void run_backward(context_type& ctx, const T* dy, const Hook& on_layer_done) {
    const backward_args_for<T, context_type, bound> a{params_.data(),
                                                  {last_x_, last_rows_},
                                                  {output_.data(), last_rows_},
                                                  {dy, last_rows_},
                                                  {},  // the first layer computes no input gradient
                                                  grads_.data(),
                                                  workspace_.data(),
                                                  last_info_};
    const detail::layer_precision_scope<bound, context_type> precision(ctx);
    const weight_copy_scope copy(*this, ctx);
    if constexpr (requires { bound::layer_count; })
      bound::backward(ctx, a, on_layer_done);
    else {
      bound::backward(ctx, a);
      on_layer_done(std::size_t{0}, std::size_t{0}, param_count);
    }
  }

  // Float models may keep a bf16 weight copy (has_weight_copy).
  static constexpr bool keeps_weight_copy =
      std::is_same_v<T, float> && (std::is_same_v<Kind, cpus> || std::is_same_v<Kind, gpus>);

  // Gives the context this model's weight copy for one pass (rewritten first when stale), and
  // takes it back after.
  class weight_copy_scope {
  public:
    weight_copy_scope(basic_model& m, context_type& ctx) : ctx_(ctx) {
      if constexpr (keeps_weight_copy) {
        saved_ = ctx.weight_copy();
        bf16_weight_copy_view v{};
        if (has_weight_copy(ctx)) {
          if (!m.copy_fresh_) m.update_weight_copy(ctx, 0, param_count, true);
          v = bf16_weight_copy_view{m.params_.data(), param_count, m.copy_.data()};
        }
        ctx.set_weight_copy(v);
      }
    }
    weight_copy_scope(const weight_copy_scope&) = delete;
    weight_copy_scope& operator=(const weight_copy_scope&) = delete;
    ~weight_copy_scope() {
      if constexpr (keeps_weight_copy) ctx_.set_weight_copy(saved_);
    }

  private:
    context_type& ctx_;
    std::conditional_t<keeps_weight_copy, bf16_weight_copy_view, bool> saved_{};
  };

public:

  /// The flat parameter buffer: param_count trainable parameters, then state_count elements of
  /// non-trainable state (batch-norm running statistics), stored_count in all. Writable access
  /// marks the bf16 weight copy stale (rewritten at the next pass; see has_weight_copy), so write
  /// the parameters through a pointer taken from this call, not one kept from an earlier one.
  [[nodiscard]] basic_buffer<T, Kind>& parameters() noexcept {
    copy_fresh_ = false;
    return params_;
  }
  /// The flat parameter buffer (parameters, then state).
  [[nodiscard]] const basic_buffer<T, Kind>& parameters() const noexcept { return params_; }
  /// The flat gradient buffer (same layout as the parameters).
  [[nodiscard]] basic_buffer<T, Kind>& gradients() noexcept { return grads_; }
  /// The flat gradient buffer (same layout as the parameters).
  [[nodiscard]] const basic_buffer<T, Kind>& gradients() const noexcept { return grads_; }
  /// The rows this model keeps for weight gradients formed once per accumulated update (see
  /// deferral.hpp; empty unless a run_to_run strategy accumulated on a host replica).
  [[nodiscard]] const gradient_deferral& deferral() const noexcept { return deferral_; }
  /// Largest batch the workspace holds without growing.
  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }

  /// True when a model of this type keeps a bf16 copy of its trainable parameters on context
  /// `ctx`: a float model whose context computes under `mixed<bf16>` with bf16_weight_copy() on
  /// (host_context's or cuda_context's). The copy's GEMMs then read a weight operand from it
  /// instead of converting the weights at every GEMM. On the host the update rewrites it from the
  /// updated parameters (sharded_update: each replica its slice, right after the optimiser, then
  /// the others' slices with theirs); a pass rewrites it whole when it is stale (after writable
  /// access to parameters(), init or load, and on GPUs after every update: one kernel on the
  /// compute stream). It is never checkpointed: the fp32 parameters are the master copy, and the
  /// GEMMs multiply the same values from either.
  [[nodiscard]] static bool has_weight_copy([[maybe_unused]] const context_type& ctx) noexcept {
    if constexpr (keeps_weight_copy)
      return ctx.policy() == compute_precision::bf16 && ctx.bf16_weight_copy();
    else
      return false;
  }
  /// Bytes the bf16 weight copy holds (0 without one).
  [[nodiscard]] std::size_t weight_copy_bytes() const noexcept { return copy_.size() * sizeof(std::uint16_t); }
  /// The bytes this model holds (its part of basic_replica::memory(): parameters, gradients,
  /// activations, weight copy, kept rows).
  [[nodiscard]] memory_use memory() const noexcept {
    memory_use m;
    m.parameters = params_.size() * sizeof(T);
    m.gradients = (grads_.size() + accum_.size()) * sizeof(T);
    m.activations = (workspace_.size() + output_.size()) * sizeof(T);
    m.weight_copy = weight_copy_bytes();
    m.other = deferral_.reserved_bytes();
    return m;
  }

  /// After an update of parameters [lo, hi) on `ctx`: rewrites that slice of the weight copy
  /// (when the model keeps one); `complete` when no other slice changed (an unsharded update).
  void update_weight_copy([[maybe_unused]] const context_type& ctx, [[maybe_unused]] std::size_t lo,
                          [[maybe_unused]] std::size_t hi, [[maybe_unused]] bool complete) {
    if constexpr (keeps_weight_copy) {
      if (!has_weight_copy(ctx) || hi <= lo) return;
      reserve_weight_copy(ctx);
      if constexpr (device_memory<Kind>::host_accessible)
        backend::to_bf16_weights(params_.data() + lo, hi - lo, copy_.data() + lo);
      else  // the encodings the GPU's packed GEMMs would write (pack16_op), on the compute stream
        for_each_index(ctx, hi - lo, backend::bf16_encode_op{params_.data() + lo, copy_.data() + lo});
      if (complete) copy_fresh_ = true;
    }
  }

private:
  // Allocates the weight copy's param_count encodings on ctx's device (once).
  void reserve_weight_copy(const context_type& ctx) {
    if (copy_.size() == param_count) return;
    backend::place_memory(ctx);
    copy_ = basic_buffer<std::uint16_t, Kind>(param_count);
  }

public:
  /// A sharded update's gather on `ctx`: slice [lo, hi) of the weight copy taken from `other`
  /// (on `other_ctx`), which updated that slice and rewrote its copy of it; converted from this
  /// model's parameters (just gathered) where `other` keeps no copy.
  void take_weight_copy([[maybe_unused]] const context_type& ctx, [[maybe_unused]] const basic_model& other,
                        [[maybe_unused]] const context_type& other_ctx, [[maybe_unused]] std::size_t lo,
                        [[maybe_unused]] std::size_t hi) {
    if constexpr (keeps_weight_copy && device_memory<Kind>::host_accessible) {
      if (!has_weight_copy(ctx) || hi <= lo) return;
      reserve_weight_copy(ctx);
      if (has_weight_copy(other_ctx) && other.copy_.size() == param_count)
        std::copy(other.copy_.data() + lo, other.copy_.data() + hi, copy_.data() + lo);
      else
        backend::to_bf16_weights(params_.data() + lo, hi - lo, copy_.data() + lo);
    }
  }
  /// After a sharded update's gather on `ctx` (every slice rewritten or taken): the weight copy is
  /// current.
  void weight_copy_complete([[maybe_unused]] const context_type& ctx) noexcept {
    if constexpr (keeps_weight_copy && device_memory<Kind>::host_accessible)
      copy_fresh_ = has_weight_copy(ctx) && copy_.size() == param_count;
  }

  /// Moves the gradients into `storage`: param_count elements of memory kind Kind that `storage`
  /// keeps alive (a worker's shared-memory window, which the other workers' all-reduce reads and
  /// writes in place); the gradients are copied there and the old buffer is freed.
  void adopt_gradients(context_type& ctx, std::shared_ptr<T> storage) {
    copy(ctx, storage.get(), grads_.data(), param_count);
    grads_ = basic_buffer<T, Kind>::borrowed(storage.get(), param_count);
    grads_owner_ = std::move(storage);
  }

private:
  basic_buffer<T, Kind> params_;
  basic_buffer<T, Kind> grads_;
  std::shared_ptr<T> grads_owner_;  // keeps adopt_gradients' storage alive (null: grads_ owns its memory)
  basic_buffer<T, Kind> workspace_;
  basic_buffer<T, Kind> output_;
  basic_buffer<T, Kind> accum_;  // the running gradient sum, for layers that do not accumulate themselves
  gradient_deferral deferral_;   // kept rows for weight gradients formed once per accumulated update
  basic_buffer<std::uint16_t, Kind> copy_;  // the bf16 weight copy (has_weight_copy), param_count encodings
  bool copy_fresh_ = false;          // copy_ holds the current parameters' encodings
  std::size_t capacity_ = 0;
  bool bf16_layout_ = false;  // the workspace is laid out with activations in bf16 (stores_bf16_activations)
  bool reserved_ = false;  // the batch-independent workspace exists (even for an empty first batch)
  const T* last_x_ = nullptr;
  std::size_t last_rows_ = 0;
  pass_info last_info_{};
};

/// One instance of network Net with parameters of type T on device D (a tag such as cpu<I>, or a
/// kind): one type per kind, so replicas on different devices of one kind share their code.
template <class Net, class T = float, class D = cpus>
using model = basic_model<Net, T, kind_of_t<D>>;

}  // namespace lockstep
