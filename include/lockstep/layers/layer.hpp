#pragma once
/// @file layer.hpp
/// The layer concept. A layer type (say `dense<784, 128>`) is unbound: it says which input widths
/// it accepts. Binding it to an input width (`L::template bind<In>`) gives the bound layer, whose
/// static members do the work on flat parameter views. Layers hold no batch state: activations
/// and scratch live in a workspace the caller owns, so replicas and threads stay simple.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <lockstep/core/precision.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/core/shape.hpp>
#include <lockstep/core/views.hpp>

namespace lockstep {

class trace_recorder;     // core/trace.hpp
class gradient_deferral;  // layers/deferral.hpp

/// The exchange that layers whose training forward couples the rows of the GLOBAL batch
/// (batch_norm) use to see the rows of every replica. A strategy passes one in `pass_info`; every
/// replica of the step calls it the same number of times, in the same order, with the same width.
class row_exchange {
public:
  virtual ~row_exchange() = default;
  /// Replica `rank` contributes its `rows` rows (`width` values each, host memory), rows
  /// [first_row, first_row + rows) of a table of `total_rows` rows; returns the whole table (host
  /// memory, valid until this replica's next call) once every replica has contributed.
  virtual const float* all_gather(std::size_t rank, const float* mine, std::size_t first_row, std::size_t rows,
                                  std::size_t width, std::size_t total_rows) = 0;
  /// The same for double rows.
  virtual const double* all_gather(std::size_t rank, const double* mine, std::size_t first_row, std::size_t rows,
                                   std::size_t width, std::size_t total_rows) = 0;
  /// True for the one replica, over every process, that contributes the global sums a coupled
  /// layer computes as its parameter gradient (the others contribute zeros, so the strategy's
  /// sum over replicas returns them exactly).
  [[nodiscard]] virtual bool leads(std::size_t rank) const noexcept { return rank == 0; }
  /// True when one replica in one process takes part: all_gather would hand back the caller's own
  /// rows, so a layer may skip the call (a GPU replica then keeps its rows on the device).
  [[nodiscard]] virtual bool single() const noexcept { return false; }
};

/// Opt-in tag: a type is a layer only when it says `using layer_concept = lockstep::layer_tag;`.
struct layer_tag {};

/// What a forward or backward pass needs to know besides tensors: the mode and the keys of
/// its randomness. Keys use the sample's position in the GLOBAL batch, so dropout masks do not
/// depend on how the batch is split across replicas.
struct pass_info {
  bool training = false;             ///< train mode (dropout active) or eval mode
  std::uint64_t seed = 0;            ///< the run's seed
  std::uint64_t step = 0;            ///< global step number (keys dropout masks)
  std::uint64_t sample_offset = 0;   ///< position of this shard's first row in the global batch
  std::uint64_t layer_stream = 0;    ///< identifies the layer (sequential derives it per position)
  std::ptrdiff_t state_offset = 0;   ///< from the layer's `params` to its non-trainable state (see layer_state)
  std::uint64_t global_rows = 0;     ///< rows of the global batch (0: this call's batch is all of it)
  row_exchange* exchange = nullptr;  ///< gathers rows across replicas (null: this call holds the whole batch)
  std::size_t rank = 0;              ///< this replica's index in `exchange`
  /// Rows of the same update in its earlier batches (gradient accumulation): randomness is keyed
  /// by the row's position in the update, update_offset + sample_offset (0 for one batch per update).
  std::uint64_t update_offset = 0;
  /// Backward ADDS the parameter gradients to what dparams holds instead of overwriting them
  /// (gradient accumulation; only layers that say `accumulates_gradients` are given it, see
  /// accumulates_gradients_v).
  bool accumulate = false;
  /// Where the top-level model records a span per layer's forward and backward, as recorder
  /// thread `trace_thread` (null: no trace). Set by a strategy with a recorder (set_trace) and
  /// its step policy; a sequential clears it for the layers it runs.
  trace_recorder* trace = nullptr;
  std::size_t trace_thread = 0;  ///< the recorder thread of this pass (the local replica's index)
  /// This batch is the last of its update (false for the batches before it under gradient
  /// accumulation): the parameter gradients must be final when backward returns.
  bool last_of_update = true;
  /// Bytes per replica that a host model may keep of its layers' inputs and output gradients to
  /// form their weight gradients once per accumulated update (0: never; set by the run_to_run
  /// step policy from strategy_options::deferred_gradient_bytes; see deferral.hpp).
  std::size_t deferral_budget = 0;
  /// Where the layers keep those rows (set by the model from deferral_budget; null: they add their
  /// weight gradients batch by batch).
  gradient_deferral* deferral = nullptr;
  /// The pass keeps an activation that the next layer reads in bf16 (bf16_activations_v) as bf16
  /// encodings, half the bytes, where that gives the same bits (see sequential's stored_at): set
  /// by a float host model under `mixed<bf16>` (host_context::bf16_activations); a sequential then
  /// lays out its workspace as `workspace_per_sample_bf16` says.
  bool bf16_activations = false;

  /// A training pass of update `step` of a model seeded with `seed` (the other fields are set
  /// where they become known: the replica sets the shard's offset and the global batch's rows,
  /// the step policy the row exchange, sequential the layer streams and state offsets).
  [[nodiscard]] static constexpr pass_info for_training(std::uint64_t seed, std::uint64_t step) noexcept {
    pass_info p;
    p.training = true;
    p.seed = seed;
    p.step = step;
    return p;
  }
  /// An evaluation pass (dropout off, running statistics used) after `step` updates.
  [[nodiscard]] static constexpr pass_info for_evaluation(std::uint64_t step) noexcept {
    pass_info p;
    p.step = step;
    return p;
  }
};

/// The non-trainable state of a layer (`state_count` elements, e.g. batch norm's running
/// statistics): it lives in the model's parameter buffer after every trainable parameter, where
/// the optimiser never reaches, at `info.state_offset` from the layer's parameters. Forward in
/// training mode may update it; it is saved in checkpoints with the parameters.
template <class T>
[[nodiscard]] T* layer_state(const T* params, const pass_info& info) noexcept {
  return const_cast<T*>(params) + info.state_offset;  // the model's buffer is not const
}

/// Rows of the global batch a pass belongs to: `info.global_rows`, or `batch` when it is 0.
[[nodiscard]] inline std::size_t global_rows_of(const pass_info& info, std::size_t batch) noexcept {
  return info.global_rows ? static_cast<std::size_t>(info.global_rows) : batch;
}

/// Random-stream purposes, mixed into layer streams so that init and dropout never share draws.
enum class rng_purpose : std::uint64_t { init = 1, dropout = 2 };

/// The stream of layer `layer_stream` for `purpose` (and, for per-step draws, `step`).
constexpr std::uint64_t layer_rng_stream(std::uint64_t layer_stream, rng_purpose purpose,
                                         std::uint64_t step = 0) noexcept {
  return mix_stream(mix_stream(layer_stream, static_cast<std::uint64_t>(purpose)), step);
}

/// The shape of an input row of bound layer B: its `input_shape`, or `shape<input_size>`.
template <class B>
struct bound_input_shape {
  using type = shape<B::input_size>;  ///< a flat row
};
template <class B>
  requires requires { typename B::input_shape; }
struct bound_input_shape<B> {
  using type = typename B::input_shape;  ///< the layer says
};
/// Shorthand for bound_input_shape<B>::type.
template <class B>
using bound_input_shape_t = typename bound_input_shape<B>::type;

/// What a bound activation layer `Layer` declares as its `fused_activation` so that the layer
/// before it may apply it: its scalar functions Fn (with `grad_from_output(y, dy)`, the input
/// gradient from the output alone) and the declaring layer itself.
template <class Fn, class Layer>
struct activation_fusion {
  using function = Fn;  ///< f, and grad_from_output
  using layer = Layer;  ///< the bound layer that declares it
};

/// True when bound layer B applies the elementwise activation of the bound layer N that follows
/// it in its own forward, in the pass that writes its output: B declares `using fuses_activation
/// = B;` (its `forward_activated<Fn>` writes Fn of its output, and its backward never reads its
/// output), and N declares `using fused_activation = activation_fusion<Fn, N>;` with an Fn that has
/// `grad_from_output`. Both name themselves, so a layer derived from either (which may change its
/// forward or backward) inherits no fusion. A sequential then runs B's forward_activated into N's
/// output and N's `backward_from_output`: B's own output is neither written nor kept.
template <class B, class N>
inline constexpr bool fuses_activation_v = [] {
  if constexpr (requires {
                  typename B::fuses_activation;
                  typename N::fused_activation::function;
                  typename N::fused_activation::layer;
                })
    return std::is_same_v<typename B::fuses_activation, B> && std::is_same_v<typename N::fused_activation::layer, N> &&
           requires(float y) { N::fused_activation::function::grad_from_output(y, y); };
  else
    return false;
}();

/// The shape of an output row of bound layer B: its `output_shape`, or `shape<output_size>`.
template <class B>
struct bound_output_shape {
  using type = shape<B::output_size>;  ///< a flat row
};
template <class B>
  requires requires { typename B::output_shape; }
struct bound_output_shape<B> {
  using type = typename B::output_shape;  ///< the layer says
};
/// Shorthand for bound_output_shape<B>::type.
template <class B>
using bound_output_shape_t = typename bound_output_shape<B>::type;

/// What a bound layer's forward receives, for element type T on context type Ctx, input rows of
/// shape In and output rows of shape Out: typed views of its input and output rows (same row
/// count, the batch) and its flat parameter and scratch slices.
template <class T, class Ctx, class In, class Out>
struct forward_args {
  using kind_type = kind_of_context_t<Ctx>;               ///< the device kind every pointer lives on
  using input_view = rows_view<const T, In, kind_type>;        ///< type of x
  using output_view = rows_view<T, Out, kind_type>;            ///< type of y
  const T* params = nullptr;  ///< the layer's `param_count` parameters (then, at info.state_offset, its state)
  input_view x;               ///< the input rows
  output_view y;              ///< the output rows to write (as many as x)
  T* workspace = nullptr;     ///< x.rows() * workspace_per_sample + workspace_fixed elements kept for backward
  pass_info info;             ///< mode, randomness keys and the row exchange
  /// Rows in this pass (x.rows()).
  [[nodiscard]] constexpr std::size_t batch() const noexcept { return x.rows(); }
};

/// What a bound layer's backward receives: the forward's views and workspace, the gradient of the
/// loss sum with respect to y, where to write the input gradient (an EMPTY view when nobody needs
/// it: the model's first layer) and the parameter gradient to OVERWRITE.
template <class T, class Ctx, class In, class Out>
struct backward_args {
  using kind_type = kind_of_context_t<Ctx>;              ///< the device kind
  using input_view = rows_view<const T, In, kind_type>;       ///< type of x
  using output_view = rows_view<const T, Out, kind_type>;     ///< type of y and dy
  using input_grad_view = rows_view<T, In, kind_type>;        ///< type of dx
  const T* params = nullptr;  ///< the layer's parameters, as in forward
  input_view x;               ///< forward's input rows
  output_view y;              ///< forward's output rows
  output_view dy;             ///< gradient of the loss sum with respect to y
  input_grad_view dx;         ///< input gradient to write; empty when not wanted
  T* dparams = nullptr;       ///< the layer's `param_count` parameter gradients, to OVERWRITE
  T* workspace = nullptr;     ///< the workspace forward filled
  pass_info info;             ///< as in forward
  /// Rows in this pass (x.rows()).
  [[nodiscard]] constexpr std::size_t batch() const noexcept { return x.rows(); }
};

/// The forward_args of bound layer B (its input_shape and output_shape, or flat rows).
template <class T, class Ctx, class B>
using forward_args_for = forward_args<T, Ctx, bound_input_shape_t<B>, bound_output_shape_t<B>>;
/// The backward_args of bound layer B.
template <class T, class Ctx, class B>
using backward_args_for = backward_args<T, Ctx, bound_input_shape_t<B>, bound_output_shape_t<B>>;

/// A bound layer's shape, each a `static constexpr std::size_t`:
///   - `input_size`, `output_size`: features in and out per row;
///   - `param_count`: elements of the layer's slice of the flat parameter (and gradient) buffer;
///   - `workspace_per_sample`: elements of scratch per row that forward keeps for backward.
/// Optional members (0 or false when absent):
///   - `workspace_fixed`: scratch elements independent of the batch, after the per-row scratch;
///   - `state_count`: elements of non-trainable state (see layer_state), set by
///     `static void init_state(T* state)`;
///   - `couples_rows`: true when the training forward of a row depends on the other rows of the
///     global batch (it then uses `pass_info::exchange`);
///   - `mixed_precision`: true when its GEMMs may compute in the model's precision policy
///     (mixed_precision_v; fp32 under every policy when absent);
///   - `input_shape`, `output_shape`: the `shape<...>` of an input and output row (else
///     `shape<input_size>`, `shape<output_size>`); they type the views of forward_args and
///     backward_args.
template <class B>
concept bound_layer = requires {
  { B::input_size } -> std::convertible_to<std::size_t>;
  { B::output_size } -> std::convertible_to<std::size_t>;
  { B::param_count } -> std::convertible_to<std::size_t>;
  { B::workspace_per_sample } -> std::convertible_to<std::size_t>;
};

namespace detail {
/// B has `static void init(T* params, const counter_rng&)`.
template <class B, class T>
concept bound_layer_init = requires(T* p, const counter_rng& rng) {
  { B::init(p, rng) } -> std::same_as<void>;
};
/// B has `static void forward(Ctx&, const forward_args<T, Ctx, In, Out>&)`.
template <class B, class T, class Ctx>
concept bound_layer_forward = requires(Ctx& ctx, const forward_args_for<T, Ctx, B>& a) {
  { B::forward(ctx, a) } -> std::same_as<void>;
};
/// B has `static void backward(Ctx&, const backward_args<T, Ctx, In, Out>&)`.
template <class B, class T, class Ctx>
concept bound_layer_backward = requires(Ctx& ctx, const backward_args_for<T, Ctx, B>& a) {
  { B::backward(ctx, a) } -> std::same_as<void>;
};
}  // namespace detail

/// A bound layer the library can run with element type T on contexts of type Ctx: its shape
/// (`bound_layer`) and the three static functions the library calls, exactly:
///   - `static void init(T* params, const counter_rng& rng)`: fills the layer's parameters (host
///     memory) from its own random stream;
///   - `static void forward(Ctx& ctx, const forward_args<T, Ctx, In, Out>& a)`: writes a.y from
///     a.x; may keep up to a.batch() * workspace_per_sample (+ workspace_fixed) elements in
///     a.workspace;
///   - `static void backward(Ctx& ctx, const backward_args<T, Ctx, In, Out>& a)`: OVERWRITES
///     a.dparams with the gradient of the loss sum and, when a.dx is not empty, writes the input
///     gradient.
/// In and Out are B's input and output row shapes (`input_shape`/`output_shape`, else
/// `shape<input_size>`/`shape<output_size>`): `forward_args<T, Ctx, shape<784>, shape<128>>`.
/// Nothing else of a bound layer is used (an optional `layer_count` marks a nested sequential).
template <class B, class T, class Ctx>
concept bound_layer_for = bound_layer<B> && detail::bound_layer_init<B, T> && detail::bound_layer_forward<B, T, Ctx> &&
                          detail::bound_layer_backward<B, T, Ctx>;

/// An unbound layer. Required members:
///   - `using layer_concept = lockstep::layer_tag;` (the opt-in, so nothing is a layer by accident);
///   - `static constexpr std::size_t expected_input`: the one input width it accepts, or 0 for any;
///   - `template <std::size_t In> struct bind` (or an alias template): the bound layer for input
///     width In, a `bound_layer_for` each element type and context the layer supports;
///   - optionally `template <std::size_t In> static constexpr bool accepts`, which refines the
///     accepted widths (sequential uses it to check a whole nested chain).
template <class L>
concept layer = requires {
  typename L::layer_concept;
  requires std::same_as<typename L::layer_concept, layer_tag>;
  { L::expected_input } -> std::convertible_to<std::size_t>;
};

namespace detail {
/// Checks bound layer B for element type T and context Ctx member by member, so that a layer that
/// lacks one is told which; the library calls it where it first runs a bound layer.
template <class B, class T, class Ctx>
constexpr bool check_bound_layer() {
  if constexpr (std::is_void_v<B>) {
    return true;  // a sequential whose shapes do not chain: reported by layer_shape_mismatch
  } else {
    static_assert(requires { { B::input_size } -> std::convertible_to<std::size_t>; },
                  "lockstep: a bound layer needs `static constexpr std::size_t input_size`");
    static_assert(requires { { B::output_size } -> std::convertible_to<std::size_t>; },
                  "lockstep: a bound layer needs `static constexpr std::size_t output_size`");
    static_assert(requires { { B::param_count } -> std::convertible_to<std::size_t>; },
                  "lockstep: a bound layer needs `static constexpr std::size_t param_count`");
    static_assert(requires { { B::workspace_per_sample } -> std::convertible_to<std::size_t>; },
                  "lockstep: a bound layer needs `static constexpr std::size_t workspace_per_sample`");
    static_assert(bound_layer_init<B, T>,
                  "lockstep: a bound layer needs `static void init(T* params, const lockstep::counter_rng& rng)`");
    static_assert(bound_layer_forward<B, T, Ctx>,
                  "lockstep: a bound layer needs `static void forward(Ctx& ctx, const lockstep::forward_args<T, "
                  "Ctx, In, Out>& a)` with In, Out its input and output row shapes");
    static_assert(bound_layer_backward<B, T, Ctx>,
                  "lockstep: a bound layer needs `static void backward(Ctx& ctx, const lockstep::backward_args<T, "
                  "Ctx, In, Out>& a)` with In, Out its input and output row shapes");
    if constexpr (requires { B::template check_layers<T, Ctx>(); })
      return B::template check_layers<T, Ctx>();  // a sequential: its layers too
    else
      return true;  // each missing member was named above
  }
}
}  // namespace detail

/// Scratch elements of bound layer B that do not depend on the batch (its `workspace_fixed`, or 0).
template <class B>
inline constexpr std::size_t workspace_fixed_v = [] {
  if constexpr (requires { B::workspace_fixed; }) return std::size_t{B::workspace_fixed};
  else return std::size_t{0};
}();

/// Workspace elements per row of bound layer B in a pass that keeps activations in bf16
/// (pass_info::bf16_activations): its `workspace_per_sample_bf16` (a sequential's layout with bf16
/// activations, never larger than its fp32 one), or its workspace_per_sample.
template <class B>
inline constexpr std::size_t workspace_bf16_v = [] {
  if constexpr (requires { B::workspace_per_sample_bf16; }) return std::size_t{B::workspace_per_sample_bf16};
  else return std::size_t{B::workspace_per_sample};
}();

/// True when bound layer B declares `static constexpr bool bf16_activations = true`: besides its
/// forward and backward it has `forward_stored<Fn>(ctx, a, x16, y16)`, which reads its input rows
/// from their bf16 encodings x16 (when not null) and, applying the following activation Fn, writes
/// its output as bf16 encodings y16 (when not null; a.y then receives the same results in fp32,
/// which the next layer may read), and `backward_stored(ctx, a, x16)`, its backward with the
/// input read from x16. A sequential keeps the activation before such a layer in bf16 where the
/// layer that writes it can, and a relu it applies where the next layer reads bf16 or only reads
/// it in forward (input_unread_v; pass_info::bf16_activations).
template <class B>
inline constexpr bool bf16_activations_v = [] {
  if constexpr (requires { B::bf16_activations; }) return bool{B::bf16_activations};
  else return false;
}();

/// True when bound layer B declares `static constexpr bool backward_reads_output = false`: its
/// backward never reads `a.y` (dense reads its input, dropout its mask), so a sequential may keep
/// its output in bf16 for a next layer that reads bf16 (bf16_activations_v), from the encodings of
/// what its forward wrote (the layer suite checks the claim with a poisoned `a.y`).
template <class B>
inline constexpr bool output_unread_v = [] {
  if constexpr (requires { B::backward_reads_output; }) return !bool{B::backward_reads_output};
  else return false;
}();

/// True when bound layer B declares `static constexpr bool backward_reads_input = false`: its
/// backward never reads `a.x` (dropout reads its mask), so a sequential may keep a relu output
/// that B reads in forward as bf16 encodings for the relu's backward, B's forward reading the
/// fp32 values the layer before the relu computed (the layer suite checks the claim with a
/// poisoned `a.x`).
template <class B>
inline constexpr bool input_unread_v = [] {
  if constexpr (requires { B::backward_reads_input; }) return !bool{B::backward_reads_input};
  else return false;
}();

/// True when activation functions Fn declare `grad_from_sign = true`: their grad_from_output(y, dy)
/// reads only whether y > 0, which a bf16 encoding of y keeps for every value that is not
/// subnormal, so the activation's output may be kept in bf16 (bf16_activations_v).
template <class Fn>
inline constexpr bool grad_from_sign_v = [] {
  if constexpr (requires { Fn::grad_from_sign; }) return bool{Fn::grad_from_sign};
  else return false;
}();

/// Non-trainable state elements of bound layer B (its `state_count`, or 0).
template <class B>
inline constexpr std::size_t state_count_v = [] {
  if constexpr (requires { B::state_count; }) return std::size_t{B::state_count};
  else return std::size_t{0};
}();

/// True when bound layer B honours pass_info::accumulate in backward (it says `static constexpr
/// bool accumulates_gradients = true;`), or has no parameters. A model whose layers all do
/// accumulates gradients through them (the GEMMs' beta = 1); otherwise the model adds each
/// batch's gradients into the running sum itself.
template <class B>
inline constexpr bool accumulates_gradients_v = [] {
  if constexpr (requires { B::accumulates_gradients; }) return bool{B::accumulates_gradients} || B::param_count == 0;
  else return B::param_count == 0;
}();

/// True when bound layer B opts in to the model's precision policy (`static constexpr bool
/// mixed_precision = true;`): its GEMMs then compute in the policy's type (bf16 inputs, fp32
/// accumulation and outputs under mixed<bf16>). A layer that declares nothing computes in fp32
/// under every policy, so a layer written for fp32 trains unchanged.
template <class B>
inline constexpr bool mixed_precision_v = [] {
  if constexpr (requires { B::mixed_precision; }) return bool{B::mixed_precision};
  else return false;
}();

namespace detail {
/// Sets the GEMM precision of `ctx` for one call of bound layer B (the context's policy when B
/// opts in, fp32 otherwise) and restores the caller's on destruction; does nothing for a context
/// without a precision (a backend that computes in fp32 only).
template <class B, class Ctx>
class layer_precision_scope {
public:
  /// Enters B's precision.
  explicit layer_precision_scope(Ctx& ctx) noexcept : ctx_(ctx) {
    if constexpr (has_precision) {
      saved_ = ctx.gemm_precision();
      ctx.set_gemm_precision(mixed_precision_v<B> ? ctx.policy() : compute_precision::fp32);
    }
  }
  layer_precision_scope(const layer_precision_scope&) = delete;
  layer_precision_scope& operator=(const layer_precision_scope&) = delete;
  /// Restores the caller's precision.
  ~layer_precision_scope() {
    if constexpr (has_precision) ctx_.set_gemm_precision(saved_);
  }

private:
  static constexpr bool has_precision = requires(Ctx& c) {
    { c.policy() } -> std::same_as<compute_precision>;
    c.set_gemm_precision(compute_precision::fp32);
  };
  Ctx& ctx_;
  compute_precision saved_ = compute_precision::fp32;
};
}  // namespace detail

/// True when bound layer B's training forward couples the rows of the global batch.
template <class B>
inline constexpr bool couples_rows_v = [] {
  if constexpr (requires { B::couples_rows; }) return bool{B::couples_rows};
  else return false;
}();

/// The shape of an output row of bound layer B (its `output_shape`, or `shape<output_size>`);
/// `InShape` is the input row's shape, kept by layers that say `preserves_shape`.
template <class B, class InShape, bool Preserves = false>
struct output_shape_of {
  using type = shape<B::output_size>;  ///< a flat row
};
template <class B, class InShape, bool Preserves>
  requires requires { typename B::output_shape; }
struct output_shape_of<B, InShape, Preserves> {
  using type = typename B::output_shape;  ///< the layer says
};
template <class B, class InShape>
  requires(!requires { typename B::output_shape; })
struct output_shape_of<B, InShape, true> {
  using type = InShape;  ///< an elementwise layer keeps the shape
};

/// True when layer L accepts input width In.
template <class L, std::size_t In>
inline constexpr bool accepts_v = In > 0 && (L::expected_input == 0 || L::expected_input == In);

/// The bound form of layer L at input width In.
template <class L, std::size_t In>
using bind_t = typename L::template bind<In>;

/// True when layer L reads the shape of its input row, not only its width: it provides
/// `template <class S> static constexpr bool accepts_shape` and `template <class S> bind_shape`.
template <class L>
concept shape_aware_layer = layer<L> && requires { typename L::template bind_shape<shape<1>>; };

/// True when layer L accepts input rows of shape S.
template <class L, class S>
constexpr bool accepts_shape_v() {
  if constexpr (requires { L::template accepts_shape<S>; })
    return S::size > 0 && L::template accepts_shape<S>;
  else if constexpr (requires { L::template accepts<S::size>; })
    return S::size > 0 && L::template accepts<S::size>;
  else
    return accepts_v<L, S::size>;
}

namespace detail {
template <class L, class S>
struct bind_shape_impl {
  using type = typename L::template bind<S::size>;
};
template <class L, class S>
  requires requires { typename L::template bind_shape<S>; }
struct bind_shape_impl<L, S> {
  using type = typename L::template bind_shape<S>;
};
template <class L>
constexpr bool preserves_shape() {
  if constexpr (requires { L::preserves_shape; }) return bool{L::preserves_shape};
  else return false;
}
}  // namespace detail

/// The bound form of layer L for input rows of shape S (`bind<S::size>` for a layer that only
/// needs the width).
template <class L, class S>
using bind_shape_t = typename detail::bind_shape_impl<L, S>::type;

/// The shape of an output row of layer L bound to input shape S.
template <class L, class S>
using output_shape_t = typename output_shape_of<bind_shape_t<L, S>, S, detail::preserves_shape<L>()>::type;

}  // namespace lockstep
