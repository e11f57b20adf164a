#pragma once
/// @file sequential.hpp
/// `sequential<Layers...>`: layers applied in order, itself a layer (so it nests). The layers are
/// a flat type list: widths are chained once at compile time and forward / backward are fold
/// expressions over the list, never a recursive nesting of types. A shape mismatch between two
/// consecutive layers fails to compile with exactly one error, whose diagnostic names
/// `shape_mismatch::layer<layer_path<2>, dense<128, 10>>::expects_inputs<128>::but_layer<
/// layer_path<1>, relu>::gives<256>` (see namespace shape_mismatch); `composable<Layers...>` tests
/// the same in a requires-expression.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/core/trace.hpp>
#include <lockstep/layers/layer.hpp>

namespace lockstep {

namespace detail {

template <class... Ts>
struct type_list {};

template <class T, class List>
struct prepend;
template <class T, class... Ts>
struct prepend<T, type_list<Ts...>> {
  using type = type_list<T, Ts...>;
};

}  // namespace detail

/// The positions of a layer inside nested sequentials, outermost first (0-based); it names the
/// place of a shape mismatch in compile errors.
template <std::size_t... Positions>
struct layer_path {};

namespace detail {

template <std::size_t P, class Path>
struct prepend_position;
template <std::size_t P, std::size_t... Ps>
struct prepend_position<P, layer_path<Ps...>> {
  using type = layer_path<P, Ps...>;
};

/// The layer before a position: its path (in the frame of the chain that holds it) and its type.
template <class Path, class Layer>
struct previous {
  using path = Path;          ///< where it is
  using layer_type = Layer;   ///< what it is
};
/// The layer before position 0 of a chain: outside the chain (the enclosing sequential's layer
/// before it, or the model's input).
struct previous_outside {};

/// The chain of a sequential's layers from input rows of shape S (flat list, bound once); Prev is
/// the layer before position Pos.
template <std::size_t Pos, class S, class Prev, class... Ls>
struct chain {
  using bound = type_list<>;
  static constexpr bool ok = true;
  using output = S;
  using bad_path = layer_path<>;
  using bad_shape = S;
  using bad_layer = void;
  using bad_previous = previous_outside;
  static constexpr std::size_t bad_input = 0, bad_expected = 0;
};

/// The layer before a mismatch found inside layer L at position Pos: Prev itself when the inner
/// chain failed at its own first position, else the inner one, its path under Pos.
template <std::size_t Pos, class Prev, class InnerPrevious>
struct resolve_previous {
  using type = previous<typename prepend_position<Pos, typename InnerPrevious::path>::type,
                        typename InnerPrevious::layer_type>;
};
template <std::size_t Pos, class Prev>
struct resolve_previous<Pos, Prev, previous_outside> {
  using type = Prev;
};

/// Where layer L at position Pos fails for input shape S: inside L when L is a chain (a nested
/// sequential, a residual block's body) that takes S at its entrance and fails within, else at L
/// itself (a residual block whose body chains but changes the shape).
template <std::size_t Pos, class S, class Prev, class L>
struct mismatch_at {
  using path = layer_path<Pos>;
  using given_shape = S;
  using layer_type = L;
  using previous_layer = Prev;
  static constexpr std::size_t given = S::size, expected = L::expected_input;
};
template <std::size_t Pos, class S, class Prev, class L>
  requires requires { L::template chain_at<S>::ok; } && (L::expected_input == 0 || L::expected_input == S::size) &&
           (!L::template chain_at<S>::ok)
struct mismatch_at<Pos, S, Prev, L> {
  using inner = typename L::template chain_at<S>;
  using path = typename prepend_position<Pos, typename inner::bad_path>::type;
  using given_shape = typename inner::bad_shape;
  using layer_type = typename inner::bad_layer;
  using previous_layer = typename resolve_previous<Pos, Prev, typename inner::bad_previous>::type;
  static constexpr std::size_t given = inner::bad_input, expected = inner::bad_expected;
};

template <bool Accepted, std::size_t Pos, class S, class Prev, class L, class... Ls>
struct chain_step {
  using bound = type_list<>;
  static constexpr bool ok = false;
  using output = S;
  using bad_path = typename mismatch_at<Pos, S, Prev, L>::path;
  using bad_shape = typename mismatch_at<Pos, S, Prev, L>::given_shape;
  using bad_layer = typename mismatch_at<Pos, S, Prev, L>::layer_type;
  using bad_previous = typename mismatch_at<Pos, S, Prev, L>::previous_layer;
  static constexpr std::size_t bad_input = mismatch_at<Pos, S, Prev, L>::given,
                               bad_expected = mismatch_at<Pos, S, Prev, L>::expected;
};

template <std::size_t Pos, class S, class Prev, class L, class... Ls>
struct chain_step<true, Pos, S, Prev, L, Ls...> {
  using head = bind_shape_t<L, S>;
  using tail = chain<Pos + 1, output_shape_t<L, S>, previous<layer_path<Pos>, L>, Ls...>;
  using bound = typename prepend<head, typename tail::bound>::type;
  static constexpr bool ok = tail::ok;
  using output = typename tail::output;
  using bad_path = typename tail::bad_path;
  using bad_shape = typename tail::bad_shape;
  using bad_layer = typename tail::bad_layer;
  using bad_previous = typename tail::bad_previous;
  static constexpr std::size_t bad_input = tail::bad_input, bad_expected = tail::bad_expected;
};

template <std::size_t Pos, class S, class Prev, class L, class... Ls>
struct chain<Pos, S, Prev, L, Ls...> : chain_step<accepts_shape_v<L, S>(), Pos, S, Prev, L, Ls...> {};

template <class T>
inline constexpr bool reported = false;  // a shape mismatch, named by the type T

}  // namespace detail

/// The names of a shape mismatch between two layers, read as a sentence in the compiler's one
/// error: `layer<Path, Layer>::expects_inputs<E>::but_layer<PreviousPath, Previous>::gives<G>`
/// (Layer, at Path, expects rows of E features, but Previous, the layer before it at
/// PreviousPath, gives G), or `layer<Path, Layer>::cannot_take<Shape>::from_layer<PreviousPath,
/// Previous>` for a layer that reads the shape of its rows (a convolution needs `shape<C, H, W>` at
/// least as large as its window). A path is `layer_path<Outer, ..., Inner>`: the positions inside
/// nested sequentials, outermost first, counted from 0 with activations included.
/// `the_model_input` stands for the layer before the first one.
namespace shape_mismatch {

/// The "layer" before the first layer of a model: its input rows.
struct the_model_input {};

/// Layer at Path (see the namespace's comment).
template <class Path, class Layer>
struct layer {
  /// ... expects rows of Expected features ...
  template <std::size_t Expected>
  struct expects_inputs {
    /// ... but the layer before it, Previous at PreviousPath, ...
    template <class PreviousPath, class Previous>
    struct but_layer {
      /// ... gives rows of Given features.
      template <std::size_t Given>
      struct gives {
        static_assert(detail::reported<gives>,
                      "lockstep::sequential: a layer expects rows of another width than the layer before it gives. "
                      "The type named in this diagnostic reads as a sentence: "
                      "layer<path, layer type>::expects_inputs<width>::but_layer<path, type of the layer before>::"
                      "gives<width> (layers count from 0, activations included; a path is outer position first)");
      };
    };
  };
  /// ... cannot take rows of shape Shape ...
  template <class Shape>
  struct cannot_take {
    /// ... from the layer before it, Previous at PreviousPath.
    template <class PreviousPath, class Previous>
    struct from_layer {
      static_assert(detail::reported<from_layer>,
                    "lockstep::sequential: a layer cannot take the shape of the rows the layer before it gives. "
                    "The type named in this diagnostic reads as a sentence: "
                    "layer<path, layer type>::cannot_take<shape>::from_layer<path, type of the layer before> "
                    "(layers count from 0, activations included; a path is outer position first; the layer's own "
                    "template arguments say what it needs)");
    };
  };
};

}  // namespace shape_mismatch

namespace detail {
/// The input width of the first layer that fixes one (0 when none does).
template <class... Ls>
constexpr std::size_t first_fixed_input() {
  std::size_t r = 0;
  ((r == 0 ? r = Ls::expected_input : r), ...);
  return r;
}
}  // namespace detail

/// True when Layers... chain: every layer accepts the width its predecessor produces, starting
/// from the first fixed input width (or width 1 when every layer takes any width).
template <class... Ls>
concept composable = sizeof...(Ls) > 0 && (layer<Ls> && ...) &&
                     detail::chain<0, shape<std::max(std::size_t{1}, detail::first_fixed_input<Ls...>())>,
                                   detail::previous_outside, Ls...>::ok;

namespace detail {

/// For each of the bound layers Bs..., whether it applies the next layer's activation in its own
/// forward (fuses_activation_v of it and its successor; false for the last).
template <class... Bs>
constexpr std::array<bool, sizeof...(Bs)> fused_pairs() {
  using list = std::tuple<Bs...>;
  std::array<bool, sizeof...(Bs)> f{};
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((f[I] = [] {
       if constexpr (I + 1 < sizeof...(Bs))
         return fuses_activation_v<std::tuple_element_t<I, list>, std::tuple_element_t<I + 1, list>>;
       else
         return false;
     }()),
     ...);
  }(std::make_index_sequence<sizeof...(Bs)>{});
  return f;
}

template <class S, class Out, class List>
struct bound_sequential;

/// A sequential bound to input rows of shape S (output rows of shape Out), over its bound layers Bs...
template <class S, class Out, class... Bs>
struct bound_sequential<S, Out, type_list<Bs...>> {
  static constexpr std::size_t layer_count = sizeof...(Bs);  ///< number of layers
  static constexpr std::array<std::size_t, layer_count> outputs{Bs::output_size...};  ///< each layer's width
  static constexpr std::array<std::size_t, layer_count> params{Bs::param_count...};  ///< each layer's parameters
  static constexpr std::array<std::size_t, layer_count> states{state_count_v<Bs>...};  ///< each layer's state
  using input_shape = S;                                                              ///< shape of an input row
  using output_shape = Out;                                                           ///< shape of an output row
  static constexpr std::size_t input_size = S::size;                                  ///< features in
  static constexpr std::size_t output_size = outputs[layer_count - 1];               ///< features out
  static constexpr std::size_t param_count = (Bs::param_count + ... + 0);            ///< all parameters
  static constexpr std::size_t state_count = (state_count_v<Bs> + ... + 0);          ///< all non-trainable state
  static constexpr bool couples_rows = (couples_rows_v<Bs> || ...);                  ///< some layer couples rows
  static constexpr bool mixed_precision = true;  ///< transparent: each layer runs in its own precision
  static constexpr bool accumulates_gradients = (accumulates_gradients_v<Bs> && ...);  ///< every layer adds under pass_info::accumulate
  /// Whether layer i applies layer i + 1's activation in its own forward (fuses_activation_v): it
  /// writes layer i + 1's output, layer i + 1's forward is skipped and its backward reads its
  /// output only, and layer i's own output is neither written nor kept (no workspace).
  static constexpr std::array<bool, layer_count> fused = fused_pairs<Bs...>();

  /// Offset of each layer's parameters in the flat buffer (also the gradient layout).
  static constexpr std::array<std::size_t, layer_count> param_offsets = [] {
    std::array<std::size_t, layer_count> o{};
    std::size_t acc = 0;
    for (std::size_t i = 0; i < layer_count; ++i) o[i] = std::exchange(acc, acc + params[i]);
    return o;
  }();
  /// Offset of each layer's state in the sequential's state (which follows all its parameters).
  static constexpr std::array<std::size_t, layer_count> state_offsets = [] {
    std::array<std::size_t, layer_count> o{};
    std::size_t acc = 0;
    for (std::size_t i = 0; i < layer_count; ++i) o[i] = std::exchange(acc, acc + states[i]);
    return o;
  }();

private:
  // The array of at(std::integral_constant<std::size_t, I>{}) for each layer I.
  template <class At>
  static constexpr std::array<bool, layer_count> each_layer(At at) {
    std::array<bool, layer_count> k{};
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((k[I] = at(std::integral_constant<std::size_t, I>{})), ...);
    }(std::make_index_sequence<layer_count>{});
    return k;
  }
  // Whether layer I's output is kept as bf16 encodings in a pass that keeps activations in bf16
  // (pass_info::bf16_activations). Either layer I is an activation that layer I - 1, which writes
  // bf16 too (bf16_activations_v), applies in its own forward, whose gradient reads only the
  // sign of its output (grad_from_sign_v), and the next layer reads bf16 (bf16_activations_v) or
  // reads it in forward only (fp32_reader: the fp32 values layer I - 1 left in a gradient
  // buffer); or the next layer reads bf16 and layer I writes its own output, which its backward
  // never reads (output_unread_v), and the sequential encodes it.
  template <std::size_t I>
  static constexpr bool stored_at() {
    using list = std::tuple<Bs...>;
    if constexpr (I + 1 >= layer_count) {
      return false;
    } else if constexpr (I > 0 && fused[I == 0 ? 0 : I - 1]) {
      using act = std::tuple_element_t<I, list>;
      return bf16_activations_v<std::tuple_element_t<I - 1, list>> &&
             grad_from_sign_v<typename act::fused_activation::function> &&
             (bf16_activations_v<std::tuple_element_t<I + 1, list>> || fp32_reader<I + 1>());
    } else if constexpr (!bf16_activations_v<std::tuple_element_t<I + 1, list>>) {
      return false;
    } else {
      return !fused[I] && output_unread_v<std::tuple_element_t<I, list>>;
    }
  }
  // Whether layer I, which follows an activation applied by the layer before it, can read that
  // activation in fp32 from a gradient buffer in a pass that keeps it in bf16: its backward never
  // reads its input (input_unread_v), it reads no bf16 itself, and it applies no activation of its
  // own (its output goes to its slot, or to the other gradient buffer: fp32_buffer).
  template <std::size_t I>
  static constexpr bool fp32_reader() {
    using list = std::tuple<Bs...>;
    if constexpr (I >= layer_count) {
      return false;
    } else {
      using B = std::tuple_element_t<I, list>;
      return input_unread_v<B> && !bf16_activations_v<B> && !fused[I];
    }
  }
  static constexpr std::array<bool, layer_count> stored16 =
      each_layer([](auto i) { return stored_at<decltype(i)::value>(); });
  // Whether layer I's output is kept nowhere, in either layout: neither layer I's backward
  // (output_unread_v) nor layer I + 1's (input_unread_v) reads it, layer I + 1 reads it in fp32
  // (not bf16_activations_v), and no activation is fused on either side. Layer I then writes it
  // into a gradient buffer, which forward does not otherwise use, and layer I + 1 reads it from
  // there (a pooling before flatten, a dense layer or a flatten before dropout).
  template <std::size_t I>
  static constexpr bool transient_at() {
    using list = std::tuple<Bs...>;
    if constexpr (I + 1 >= layer_count) {
      return false;
    } else {
      using B = std::tuple_element_t<I, list>;
      using next = std::tuple_element_t<I + 1, list>;
      return !fused[I] && !(I > 0 && fused[I == 0 ? 0 : I - 1]) && output_unread_v<B> && input_unread_v<next> &&
             !bf16_activations_v<next>;
    }
  }
  static constexpr std::array<bool, layer_count> transient =
      each_layer([](auto i) { return transient_at<decltype(i)::value>(); });
  static constexpr std::array<bool, layer_count> reads_bf16{bf16_activations_v<Bs>...};
  // Which gradient buffer (0 or 1) holds activation i's fp32 values during forward in layout B16,
  // or -1 where they are in its own slot: a transient activation, or one kept in bf16 whose writer
  // computes fp32 results first (writes16, encodes16). A writer takes the buffer its input is not in.
  template <bool B16>
  static constexpr std::array<int, layer_count> fp32_buffer = [] {
    std::array<int, layer_count> b{};
    b.fill(-1);
    for (std::size_t i = 0; i < layer_count; ++i) {
      if (i > 0 && fused[i - 1]) continue;  // layer i - 1 writes it
      const bool from16 = B16 && i > 0 && stored16[i - 1] && reads_bf16[i];
      const int in = i == 0 || from16 ? -1 : b[i - 1];
      const std::size_t t = fused[i] ? i + 1 : i;
      if (transient[t] || (B16 && stored16[t])) b[t] = in == 0 ? 1 : 0;
    }
    return b;
  }();
  static constexpr bool has_stored16 = [] {
    for (bool k : stored16)
      if (k) return true;
    return false;
  }();
  static constexpr std::array<std::size_t, layer_count> scratch{Bs::workspace_per_sample...};
  static constexpr std::array<std::size_t, layer_count> scratch16{workspace_bf16_v<Bs>...};
  static constexpr std::array<std::size_t, layer_count> fixed{workspace_fixed_v<Bs>...};
  // Workspace layout for a batch of b rows: b * (activations of layers 0..N-2, none for a layer
  // fused with the next: its output slot is the next one's, and none for a transient activation,
  // which only lives in a gradient buffer during forward), then each layer's own region
  // (b * its per-row scratch + its fixed scratch), then two ping-pong gradient buffers of b * the
  // widest inner activation. With B16 (a pass that keeps activations in bf16), an activation kept
  // in bf16 (stored16) takes half its width, rounded up, as b rows of bf16 encodings, and the
  // layers' scratch is their workspace_bf16_v; a layer that writes such an activation computes
  // its fp32 results in a ping-pong buffer, which forward does not otherwise use (fp32_buffer).
  static constexpr std::size_t max_inner = [] {
    std::size_t m = 0;
    for (std::size_t i = 0; i + 1 < layer_count; ++i) m = std::max(m, outputs[i]);
    return m;
  }();
  template <bool B16>
  static constexpr std::array<std::size_t, layer_count> act_offsets = [] {
    std::array<std::size_t, layer_count> o{};
    std::size_t acc = 0;
    for (std::size_t i = 0; i < layer_count; ++i) {
      o[i] = acc;
      if (i + 1 < layer_count && !fused[i] && !transient[i])
        acc += B16 && stored16[i] ? (outputs[i] + 1) / 2 : outputs[i];
    }
    return o;
  }();
  template <bool B16>
  static constexpr std::size_t acts_total = layer_count > 1 ? act_offsets<B16>[layer_count - 1] : 0;
  template <bool B16>
  static constexpr std::array<std::size_t, layer_count> scratch_offsets = [] {  // per-row part, after the activations
    std::array<std::size_t, layer_count> o{};
    std::size_t acc = acts_total<B16>;
    for (std::size_t i = 0; i < layer_count; ++i) o[i] = std::exchange(acc, acc + (B16 ? scratch16[i] : scratch[i]));
    return o;
  }();
  static constexpr std::array<std::size_t, layer_count> fixed_offsets = [] {  // fixed part before layer i
    std::array<std::size_t, layer_count> o{};
    std::size_t acc = 0;
    for (std::size_t i = 0; i < layer_count; ++i) o[i] = std::exchange(acc, acc + fixed[i]);
    return o;
  }();
  template <bool B16>
  static constexpr std::size_t grads_offset =
      acts_total<B16> + (B16 ? (workspace_bf16_v<Bs> + ... + 0) : (Bs::workspace_per_sample + ... + 0));

public:
  /// Workspace elements per sample: inner activations, layer scratch and gradient ping-pong.
  static constexpr std::size_t workspace_per_sample = grads_offset<false> + (layer_count > 1 ? 2 * max_inner : 0);
  /// Workspace elements per sample in a pass that keeps activations in bf16
  /// (pass_info::bf16_activations; workspace_bf16_v): each activation that the next layer reads in
  /// bf16 (see stored_at) in half the elements, rounded up; never more than workspace_per_sample.
  static constexpr std::size_t workspace_per_sample_bf16 =
      grads_offset<true> + (layer_count > 1 ? 2 * max_inner : 0);
  /// Workspace elements independent of the batch: the layers' fixed scratch.
  static constexpr std::size_t workspace_fixed = (workspace_fixed_v<Bs> + ... + 0);

  /// The I-th bound layer.
  template <std::size_t I>
  using layer_type = std::tuple_element_t<I, std::tuple<Bs...>>;

  /// True when layer I applies layer I + 1's activation in its own forward (`fused`).
  template <std::size_t I>
  static constexpr bool fused_with_next = fused[I];
  /// True when layer I's forward is applied by layer I - 1 (fused_with_next<I - 1>).
  template <std::size_t I>
  static constexpr bool fused_into_previous = I > 0 && fused[I == 0 ? 0 : I - 1];

  /// Checks every layer member by member for element type T and context Ctx (the model calls
  /// this, so that a layer missing a member is named however deep it is nested).
  template <class T, class Ctx>
  static constexpr bool check_layers() {
    return (check_bound_layer<Bs, T, Ctx>() && ...);
  }

  /// Initialises every layer from its own stream, derived from `rng`'s stream and the position.
  template <class T>
  static void init(T* p, const counter_rng& rng) {
    static_assert((detail::bound_layer_init<Bs, T> && ...),
                  "lockstep: a bound layer of this sequential needs `static void init(T* params, const "
                  "lockstep::counter_rng& rng)`");
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (layer_type<I>::init(p + param_offsets[I], counter_rng(rng.seed(), mix_stream(rng.stream(), I))), ...);
    }(std::make_index_sequence<layer_count>{});
  }

  /// Sets every layer's non-trainable state to its initial value (`state_count` elements).
  template <class T>
  static void init_state(T* state) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (init_state_of<layer_type<I>>(state + state_offsets[I]), ...);
    }(std::make_index_sequence<layer_count>{});
  }

  /// Runs the layers in order; a.workspace holds batch * workspace_per_sample + workspace_fixed
  /// elements kept for backward.
  template <class T, class Ctx>
  static void forward(Ctx& ctx, const forward_args<T, Ctx, S, Out>& a) {
    static_assert(check_layers<T, Ctx>());
    if constexpr (bf16_layout<T, Ctx>) {
      if (a.info.bf16_activations) return forward_in<true>(ctx, a);
    }
    forward_in<false>(ctx, a);
  }

  /// Runs backward in reverse order, writing every parameter gradient and, when a.dx is not
  /// empty, the input gradient. `on_layer_done(i, offset, count)` is called after layer i's
  /// gradients are final (the hook the strategy uses to start a gradient bucket's all-reduce early).
  template <class T, class Ctx, class Hook>
  static void backward(Ctx& ctx, const backward_args<T, Ctx, S, Out>& a, const Hook& on_layer_done) {
    if constexpr (bf16_layout<T, Ctx>) {
      if (a.info.bf16_activations) return backward_in<true>(ctx, a, on_layer_done);
    }
    backward_in<false>(ctx, a, on_layer_done);
  }

  /// backward without a completion hook (the bound-layer interface).
  template <class T, class Ctx>
  static void backward(Ctx& ctx, const backward_args<T, Ctx, S, Out>& a) {
    backward(ctx, a, [](std::size_t, std::size_t, std::size_t) {});
  }

private:
  template <class B, class T>
  static void init_state_of(T* state) {
    if constexpr (state_count_v<B> > 0) B::init_state(state);
  }
  static pass_info child(const pass_info& info, std::size_t i) noexcept {
    pass_info c = info;
    c.layer_stream = mix_stream(info.layer_stream, i);
    // The state of layer i, seen from its parameters: ours start at our params + state_offset.
    c.state_offset = info.state_offset - static_cast<std::ptrdiff_t>(param_offsets[i]) +
                     static_cast<std::ptrdiff_t>(state_offsets[i]);
    c.trace = nullptr;  // spans are per top-level layer: a nested sequential records none
    return c;
  }
  // Whether a pass with T on Ctx may keep activations in bf16 and this chain then lays out its
  // workspace differently (float on a host context).
  template <class T, class Ctx>
  static constexpr bool bf16_layout = std::is_same_v<T, float> && detail::host_context_v<Ctx> &&
                                      (has_stored16 || workspace_per_sample_bf16 != workspace_per_sample);
  // The activation layer I + 1's scalar functions where layer I applies it, else void.
  template <std::size_t I>
  static constexpr auto fused_function() {
    if constexpr (fused[I]) return std::type_identity<typename layer_type<I + 1>::fused_activation::function>{};
    else return std::type_identity<void>{};
  }
  template <std::size_t I>
  using fused_function_t = typename decltype(fused_function<I>())::type;
  // Whether layer I reads its input as bf16 encodings in layout B16.
  template <std::size_t I, bool B16>
  static constexpr bool reads16 = B16 && I > 0 && stored16[I == 0 ? 0 : I - 1] && reads_bf16[I];
  // Whether layer I reads its input in fp32 from a gradient buffer (fp32_buffer) in layout B16: a
  // relu kept in bf16 for its own backward (fp32_reader), or a transient activation; its backward
  // is then given no input.
  template <std::size_t I, bool B16>
  static constexpr bool reads_buffer = I > 0 && !reads16<I, B16> && fp32_buffer<B16>[I == 0 ? 0 : I - 1] >= 0;
  // Whether layer I's own output is kept in bf16 (stored16, not an activation applied by layer
  // I - 1): layer I writes it in fp32 (where no backward reads it), and its encodings are written
  // by layer I itself where it reads and writes bf16 (writes16), by the sequential otherwise.
  template <std::size_t I, bool B16>
  static constexpr bool encodes16 = B16 && stored16[I] && !fused_into_previous<I>;
  // Whether layer I is given where to write the bf16 encodings of what its forward writes (its
  // forward_stored's y16): the activation it applies, or its own output, kept in bf16.
  template <std::size_t I, bool B16>
  static constexpr bool writes16 = B16 && ((fused[I] && stored16[I + 1 < layer_count ? I + 1 : I]) ||
                                           (encodes16<I, B16> && bf16_activations_v<layer_type<I>>));
  template <bool B16, class T, class Ctx>
  static void forward_in(Ctx& ctx, const forward_args<T, Ctx, S, Out>& a) {
    const std::size_t batch = a.batch();
    T* ws = a.workspace;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (forward_one<I, B16>(ctx, a, ws, batch), ...);
    }(std::make_index_sequence<layer_count>{});
  }
  template <bool B16, class T, class Ctx, class Hook>
  static void backward_in(Ctx& ctx, const backward_args<T, Ctx, S, Out>& a, const Hook& on_layer_done) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (backward_one<layer_count - 1 - I, B16>(ctx, a, on_layer_done), ...);
    }(std::make_index_sequence<layer_count>{});
  }
  template <std::size_t I, bool B16, class T>
  static const T* input_of(const T* x, T* ws, std::size_t batch) noexcept {
    if constexpr (I == 0) return x;
    else return ws + batch * act_offsets<B16>[I - 1];
  }
  template <std::size_t I, bool B16, class Y, class T>
  static Y* output_of(Y* y, T* ws, std::size_t batch) noexcept {
    if constexpr (I + 1 == layer_count) return y;
    else return ws + batch * act_offsets<B16>[I];
  }
  // The bf16 encodings of layer I's output (stored16) in layout B16.
  template <std::size_t I, bool B16, class T>
  static std::uint16_t* stored_output_of(T* ws, std::size_t batch) noexcept {
    return reinterpret_cast<std::uint16_t*>(ws + batch * act_offsets<B16>[I]);
  }
  template <std::size_t I, bool B16, class T>
  static T* scratch_of(T* ws, std::size_t batch) noexcept {
    return ws + batch * scratch_offsets<B16>[I] + fixed_offsets[I];
  }
  template <bool B16, class T>
  static T* pingpong(T* ws, std::size_t batch, std::size_t which) noexcept {
    return ws + batch * (grads_offset<B16> + which * max_inner) + workspace_fixed;
  }
  template <std::size_t I, bool B16, class T, class Ctx>
  static void forward_one(Ctx& ctx, const forward_args<T, Ctx, S, Out>& a, T* ws, std::size_t batch) {
    const work_span<Ctx> span(ctx, a.info.trace, a.info.trace_thread, "forward", "compute", "layer",
                              static_cast<std::int64_t>(I));
    if constexpr (fused_into_previous<I>) {
      return;  // layer I - 1 wrote this layer's output
    } else {
      const layer_precision_scope<layer_type<I>, Ctx> precision(ctx);
      // Where the layer writes fp32: its output, or the fused activation's, or (when that is kept
      // in bf16, or nowhere) a gradient buffer, which forward does not otherwise use (fp32_buffer).
      constexpr std::size_t target = fused[I] ? I + 1 : I;  // the activation this forward writes
      T* y;
      if constexpr (fp32_buffer<B16>[target] >= 0) y = pingpong<B16>(ws, batch, fp32_buffer<B16>[target]);
      else y = output_of<target, B16>(a.y.data(), ws, batch);
      const T* x;
      if constexpr (reads16<I, B16>) x = nullptr;
      else if constexpr (reads_buffer<I, B16>) x = pingpong<B16>(ws, batch, fp32_buffer<B16>[I - 1]);
      else x = input_of<I, B16>(a.x.data(), ws, batch);
      const forward_args_for<T, Ctx, layer_type<I>> args{
          a.params + param_offsets[I],
          {x, batch},
          {y, batch},
          scratch_of<I, B16>(ws, batch),
          child(a.info, I)};
      if constexpr (reads16<I, B16> || writes16<I, B16>) {
        const std::uint16_t* x16 = nullptr;
        std::uint16_t* y16 = nullptr;
        if constexpr (reads16<I, B16>) x16 = stored_output_of<I - 1, B16>(ws, batch);
        if constexpr (writes16<I, B16>) y16 = stored_output_of<target, B16>(ws, batch);
        layer_type<I>::template forward_stored<fused_function_t<I>>(ctx, args, x16, y16);
      } else if constexpr (fused_with_next<I>) {
        layer_type<I>::template forward_activated<typename layer_type<I + 1>::fused_activation::function>(ctx, args);
      } else {
        layer_type<I>::forward(ctx, args);
      }
      if constexpr (encodes16<I, B16> && !writes16<I, B16>)  // kept as the encodings the next GEMMs would make
        backend::to_bf16_weights(y, batch * outputs[I], stored_output_of<I, B16>(ws, batch));
    }
  }
  template <std::size_t J, bool B16, class T, class Ctx, class Hook>
  static void backward_one(Ctx& ctx, const backward_args<T, Ctx, S, Out>& a, const Hook& on_layer_done) {
    const std::size_t batch = a.batch();
    T* ws = a.workspace;
    // When the caller wants no input gradient and no layer below J owns parameters, nothing needs
    // layer J's input gradient: J gets an empty dx, and a parameter-free J is skipped (a network
    // that starts with reshape, or an activation, computes no gradient nobody reads).
    const bool nothing_below = param_offsets[J] == 0 && a.dx.empty();
    const work_span<Ctx> span(ctx, a.info.trace, a.info.trace_thread, "backward", "compute", "layer",
                              static_cast<std::int64_t>(J));
    if (nothing_below && params[J] == 0) {
      on_layer_done(J, param_offsets[J], params[J]);
      return;
    }
    const T* g_out;
    if constexpr (J + 1 == layer_count) g_out = a.dy.data();
    else g_out = pingpong<B16>(ws, batch, J % 2);
    T* g_in;
    if constexpr (J == 0) g_in = a.dx.data();
    else g_in = nothing_below ? nullptr : pingpong<B16>(ws, batch, (J - 1) % 2);
    const layer_precision_scope<layer_type<J>, Ctx> precision(ctx);
    const backward_args_for<T, Ctx, layer_type<J>> args{a.params + param_offsets[J],
                                                       {reads_buffer<J, B16> ? nullptr : input_of<J, B16>(a.x.data(), ws, batch), batch},
                                                       {encodes16<J, B16> || transient[J] ? nullptr : output_of<J, B16>(a.y.data(), ws, batch), batch},
                                                       {g_out, batch},
                                                       {g_in, batch},
                                                       a.dparams + param_offsets[J],
                                                       scratch_of<J, B16>(ws, batch),
                                                       child(a.info, J)};
    if constexpr (B16 && stored16[J] && fused_into_previous<J>)
      layer_type<J>::backward_from_stored(ctx, args, stored_output_of<J, B16>(ws, batch));  // its output in bf16
    else if constexpr (fused_into_previous<J>)
      layer_type<J>::backward_from_output(ctx, args);  // its input was never written
    else if constexpr (reads16<J, B16>)
      layer_type<J>::backward_stored(ctx, args, stored_output_of<J - 1, B16>(ws, batch));  // its input in bf16
    else
      layer_type<J>::backward(ctx, args);
    on_layer_done(J, param_offsets[J], params[J]);
  }
};

template <bool Ok, class Chain, class S>
struct checked_bind {
  using type = bound_sequential<S, typename Chain::output, typename Chain::bound>;
};

/// What a sequential whose shapes do not chain binds to, after its one error: a complete bound
/// layer that maps rows of shape S to rows of shape S and does nothing, so that no second error
/// follows from the first (an incomplete type, a missing member).
template <class S>
struct unbound_sequential {
  using input_shape = S;                                 ///< as given
  using output_shape = S;                                ///< as given
  static constexpr std::size_t input_size = S::size;     ///< features in
  static constexpr std::size_t output_size = S::size;    ///< features out
  static constexpr std::size_t param_count = 0;          ///< none
  static constexpr std::size_t state_count = 0;          ///< none
  static constexpr std::size_t workspace_per_sample = 0; ///< none
  static constexpr std::size_t workspace_fixed = 0;      ///< none
  static constexpr bool couples_rows = false;            ///< no
  /// Nothing to check.
  template <class T, class Ctx>
  static constexpr bool check_layers() {
    return true;
  }
  /// Nothing to initialise.
  template <class T>
  static void init(T*, const counter_rng&) {}
  /// Nothing to initialise.
  template <class T>
  static void init_state(T*) {}
  /// Never runs (the program does not compile).
  template <class T, class Ctx>
  static void forward(Ctx&, const forward_args<T, Ctx, S, S>&) {}
  /// Never runs (the program does not compile).
  template <class T, class Ctx>
  static void backward(Ctx&, const backward_args<T, Ctx, S, S>&) {}
};

/// The path of the layer before a mismatch, and its type (the model's input before position 0).
template <class Previous>
struct previous_names {
  using path = typename Previous::path;
  using layer_type = typename Previous::layer_type;
};
template <>
struct previous_names<previous_outside> {
  using path = layer_path<>;
  using layer_type = shape_mismatch::the_model_input;
};

template <class Chain, bool ShapeReport = !std::is_void_v<typename Chain::bad_layer> &&
                                          (shape_aware_layer<typename Chain::bad_layer> || Chain::bad_shape::rank > 1)>
struct shape_mismatch_report
    : shape_mismatch::layer<typename Chain::bad_path, typename Chain::bad_layer>::template expects_inputs<
          Chain::bad_expected>::template but_layer<typename previous_names<typename Chain::bad_previous>::path,
                                                   typename previous_names<typename Chain::bad_previous>::layer_type>::
          template gives<Chain::bad_input> {};
template <class Chain>
struct shape_mismatch_report<Chain, true>
    : shape_mismatch::layer<typename Chain::bad_path, typename Chain::bad_layer>::template cannot_take<
          typename Chain::bad_shape>::template from_layer<typename previous_names<typename Chain::bad_previous>::path,
                                                           typename previous_names<typename Chain::bad_previous>::layer_type> {};

template <class Chain, class S>
struct checked_bind<false, Chain, S> {
  using type = unbound_sequential<S>;
  // Instantiates the report (its static_assert is the one error) without making this class, and
  // so `type`, invalid: clang would otherwise add an error for every later use of `type`.
  static_assert(sizeof(shape_mismatch_report<Chain>) > 0);
};

}  // namespace detail

/// Layers applied in order; a layer itself, so sequentials nest.
template <class... Layers>
struct sequential {
  static_assert(sizeof...(Layers) > 0, "lockstep::sequential needs at least one layer");
  static_assert((layer<Layers> && ...),
                "lockstep::sequential: every argument must be a layer (opt in with "
                "`using layer_concept = lockstep::layer_tag;` and provide expected_input and bind)");
  using layer_concept = layer_tag;  ///< opts in to the layer concept
  /// The input width of the first layer that fixes one (0 when every layer takes any width).
  static constexpr std::size_t expected_input = detail::first_fixed_input<Layers...>();

  /// True when the whole chain is valid from input rows of shape S.
  template <class S>
  static constexpr bool accepts_shape = detail::chain<0, S, detail::previous_outside, Layers...>::ok;

  /// True when the whole chain is valid from flat input rows of width In.
  template <std::size_t In>
  static constexpr bool accepts = accepts_shape<shape<In>>;

  /// The chain of shapes from input shape S (where a mismatch is, for the enclosing sequential's message).
  template <class S>
  using chain_at = detail::chain<0, S, detail::previous_outside, Layers...>;

  /// The sequential bound to input rows of shape S (a mismatch is reported here, with its position
  /// and the layer before it, in one compile error).
  template <class S>
  using bind_shape = typename detail::checked_bind<chain_at<S>::ok, chain_at<S>, S>::type;

  /// The sequential bound to flat input rows of width In.
  template <std::size_t In>
  using bind = bind_shape<shape<In>>;
};

}  // namespace lockstep
