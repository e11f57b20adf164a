#pragma once
/// @file sequential.hpp
/// `sequential<Layers...>`: layers applied in order, itself a layer (so it nests). The layers are
/// a flat type list: widths are chained once at compile time and forward / backward are fold
/// expressions over the list, never a recursive nesting of types. A width mismatch between two
/// consecutive layers fails to compile with `layer_shape_mismatch<Position, Given, Expected>` in the
/// message (`nested_layer_shape_mismatch<layer_path<Outer, Inner>, Given, Expected>` when the two
/// layers are inside a nested sequential); `composable<Layers...>` tests the same in a
/// requires-expression.

#include <algorithm>
#include <array>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

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

/// True when L accepts input width In; a layer may refine this with `template <size_t> accepts`.
template <class L, std::size_t In>
constexpr bool layer_accepts() {
  if constexpr (requires { L::template accepts<In>; })
    return In > 0 && L::template accepts<In>;
  else
    return accepts_v<L, In>;
}

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

template <std::size_t Pos, std::size_t In, class... Ls>
struct chain {
  using bound = type_list<>;
  static constexpr bool ok = true;
  static constexpr std::size_t output = In;
  using bad_path = layer_path<>;
  static constexpr std::size_t bad_input = 0, bad_expected = 0;
};

/// Where layer L at position Pos fails for input width In: inside L when L is a chain (a nested
/// sequential) that takes width In at its entrance, else at L itself.
template <std::size_t Pos, std::size_t In, class L>
struct mismatch_at {
  using path = layer_path<Pos>;
  static constexpr std::size_t given = In, expected = L::expected_input;
};
template <std::size_t Pos, std::size_t In, class L>
  requires requires { L::template chain_at<In>::ok; } && (L::expected_input == 0 || L::expected_input == In)
struct mismatch_at<Pos, In, L> {
  using inner = typename L::template chain_at<In>;
  using path = typename prepend_position<Pos, typename inner::bad_path>::type;
  static constexpr std::size_t given = inner::bad_input, expected = inner::bad_expected;
};

template <bool Accepted, std::size_t Pos, std::size_t In, class L, class... Ls>
struct chain_step {
  using bound = type_list<>;
  static constexpr bool ok = false;
  static constexpr std::size_t output = 0;
  using bad_path = typename mismatch_at<Pos, In, L>::path;
  static constexpr std::size_t bad_input = mismatch_at<Pos, In, L>::given,
                               bad_expected = mismatch_at<Pos, In, L>::expected;
};

template <std::size_t Pos, std::size_t In, class L, class... Ls>
struct chain_step<true, Pos, In, L, Ls...> {
  using head = bind_t<L, In>;
  using tail = chain<Pos + 1, head::output_size, Ls...>;
  using bound = typename prepend<head, typename tail::bound>::type;
  static constexpr bool ok = tail::ok;
  static constexpr std::size_t output = tail::output;
  using bad_path = typename tail::bad_path;
  static constexpr std::size_t bad_input = tail::bad_input, bad_expected = tail::bad_expected;
};

template <std::size_t Pos, std::size_t In, class L, class... Ls>
struct chain<Pos, In, L, Ls...> : chain_step<layer_accepts<L, In>(), Pos, In, L, Ls...> {};

}  // namespace detail

/// Reported when layer number Position (0-based) of a sequential receives Given features but
/// expects Expected. The template arguments in the compiler's message name the position and both
/// widths.
template <std::size_t Position, std::size_t Given, std::size_t Expected>
struct layer_shape_mismatch {
  static_assert(Position != Position,
                "lockstep::sequential: the layer at Position receives Given features from the layer "
                "before it (or from the model input) but expects Expected; see the template arguments");
};

/// Reported when a layer inside a nested sequential receives Given features but expects
/// Expected. Path is `layer_path<Outer, ..., Inner>`: the position of the nested sequential in the
/// outer one, then the position inside it (0-based), as the compiler's message shows.
template <class Path, std::size_t Given, std::size_t Expected>
struct nested_layer_shape_mismatch {
  static_assert(Given != Given,
                "lockstep::sequential: inside a nested sequential, the layer at Path (outer position first) "
                "receives Given features but expects Expected; see the template arguments");
};

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
                     detail::chain<0, std::max(std::size_t{1}, detail::first_fixed_input<Ls...>()), Ls...>::ok;

namespace detail {

template <std::size_t In, class List>
struct bound_sequential;

/// A sequential bound to input width In, over its bound layers Bs...
template <std::size_t In, class... Bs>
struct bound_sequential<In, type_list<Bs...>> {
  static constexpr std::size_t layer_count = sizeof...(Bs);  ///< number of layers
  static constexpr std::array<std::size_t, layer_count> outputs{Bs::output_size...};  ///< each layer's width
  static constexpr std::array<std::size_t, layer_count> params{Bs::param_count...};  ///< each layer's parameters
  static constexpr std::size_t input_size = In;                                       ///< features in
  static constexpr std::size_t output_size = outputs[layer_count - 1];               ///< features out
  static constexpr std::size_t param_count = (Bs::param_count + ... + 0);            ///< all parameters

  /// Offset of each layer's parameters in the flat buffer (also the gradient layout).
  static constexpr std::array<std::size_t, layer_count> param_offsets = [] {
    std::array<std::size_t, layer_count> o{};
    std::size_t acc = 0;
    for (std::size_t i = 0; i < layer_count; ++i) o[i] = std::exchange(acc, acc + params[i]);
    return o;
  }();

private:
  static constexpr std::array<std::size_t, layer_count> scratch{Bs::workspace_per_sample...};
  // Per-sample workspace layout: activations of layers 0..N-2, then each layer's own scratch,
  // then two ping-pong gradient buffers as wide as the widest inner activation.
  static constexpr std::size_t max_inner = [] {
    std::size_t m = 0;
    for (std::size_t i = 0; i + 1 < layer_count; ++i) m = std::max(m, outputs[i]);
    return m;
  }();
  static constexpr std::array<std::size_t, layer_count> act_offsets = [] {
    std::array<std::size_t, layer_count> o{};
    std::size_t acc = 0;
    for (std::size_t i = 0; i < layer_count; ++i) {
      o[i] = acc;
      if (i + 1 < layer_count) acc += outputs[i];
    }
    return o;
  }();
  static constexpr std::size_t acts_total = layer_count > 1 ? act_offsets[layer_count - 1] : 0;
  static constexpr std::array<std::size_t, layer_count> scratch_offsets = [] {
    std::array<std::size_t, layer_count> o{};
    std::size_t acc = acts_total;
    for (std::size_t i = 0; i < layer_count; ++i) o[i] = std::exchange(acc, acc + scratch[i]);
    return o;
  }();
  static constexpr std::size_t grads_offset = acts_total + (Bs::workspace_per_sample + ... + 0);

public:
  /// Workspace elements per sample: inner activations, layer scratch and gradient ping-pong.
  static constexpr std::size_t workspace_per_sample = grads_offset + (layer_count > 1 ? 2 * max_inner : 0);

  /// The I-th bound layer.
  template <std::size_t I>
  using layer_type = std::tuple_element_t<I, std::tuple<Bs...>>;

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

  /// Runs the layers in order; x is batch x In, y is batch x output_size, ws holds
  /// batch * workspace_per_sample elements kept for backward.
  template <class T, class Ctx>
  static void forward(Ctx& ctx, const T* p, const T* x, T* y, T* ws, std::size_t batch, const pass_info& info) {
    static_assert(check_layers<T, Ctx>());
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (layer_type<I>::forward(ctx, p + param_offsets[I], input_of<I>(x, ws, batch), output_of<I>(y, ws, batch),
                              ws + batch * scratch_offsets[I], batch, child(info, I)),
       ...);
    }(std::make_index_sequence<layer_count>{});
  }

  /// Runs backward in reverse order, writing every parameter gradient and, when dx is not null,
  /// the input gradient. `on_layer_done(i, offset, count)` is called after layer i's gradients are
  /// final (the hook the strategy uses to start a gradient bucket's all-reduce early).
  template <class T, class Ctx, class Hook>
  static void backward(Ctx& ctx, const T* p, const T* x, const T* y, const T* dy, T* dx, T* dp, T* ws,
                       std::size_t batch, const pass_info& info, const Hook& on_layer_done) {
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (backward_one<layer_count - 1 - I>(ctx, p, x, y, dy, dx, dp, ws, batch, info, on_layer_done), ...);
    }(std::make_index_sequence<layer_count>{});
  }

  /// backward without a completion hook (the bound-layer interface).
  template <class T, class Ctx>
  static void backward(Ctx& ctx, const T* p, const T* x, const T* y, const T* dy, T* dx, T* dp, T* ws,
                       std::size_t batch, const pass_info& info) {
    backward(ctx, p, x, y, dy, dx, dp, ws, batch, info, [](std::size_t, std::size_t, std::size_t) {});
  }

private:
  static pass_info child(const pass_info& info, std::size_t i) noexcept {
    pass_info c = info;
    c.layer_stream = mix_stream(info.layer_stream, i);
    return c;
  }
  template <std::size_t I, class T>
  static const T* input_of(const T* x, T* ws, std::size_t batch) noexcept {
    if constexpr (I == 0) return x;
    else return ws + batch * act_offsets[I - 1];
  }
  template <std::size_t I, class Y, class T>
  static Y* output_of(Y* y, T* ws, std::size_t batch) noexcept {
    if constexpr (I + 1 == layer_count) return y;
    else return ws + batch * act_offsets[I];
  }
  template <class T>
  static T* pingpong(T* ws, std::size_t batch, std::size_t which) noexcept {
    return ws + batch * (grads_offset + which * max_inner);
  }
  template <std::size_t J, class T, class Ctx, class Hook>
  static void backward_one(Ctx& ctx, const T* p, const T* x, const T* y, const T* dy, T* dx, T* dp, T* ws,
                           std::size_t batch, const pass_info& info, const Hook& on_layer_done) {
    const T* g_out;
    if constexpr (J + 1 == layer_count) g_out = dy;
    else g_out = pingpong(ws, batch, J % 2);
    T* g_in;
    if constexpr (J == 0) g_in = dx;
    else g_in = pingpong(ws, batch, (J - 1) % 2);
    layer_type<J>::backward(ctx, p + param_offsets[J], input_of<J>(x, ws, batch), output_of<J>(y, ws, batch), g_out,
                            g_in, dp + param_offsets[J], ws + batch * scratch_offsets[J], batch, child(info, J));
    on_layer_done(J, param_offsets[J], params[J]);
  }
};

template <bool Ok, class Chain, std::size_t In>
struct checked_bind {
  using type = bound_sequential<In, typename Chain::bound>;
};
template <class Path, std::size_t Given, std::size_t Expected>
struct shape_mismatch_report : nested_layer_shape_mismatch<Path, Given, Expected> {};
template <std::size_t Position, std::size_t Given, std::size_t Expected>
struct shape_mismatch_report<layer_path<Position>, Given, Expected> : layer_shape_mismatch<Position, Given, Expected> {};

template <class Chain, std::size_t In>
struct checked_bind<false, Chain, In>
    : shape_mismatch_report<typename Chain::bad_path, Chain::bad_input, Chain::bad_expected> {
  using type = void;
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

  /// True when the whole chain is valid from input width In.
  template <std::size_t In>
  static constexpr bool accepts = detail::chain<0, In, Layers...>::ok;

  /// The chain of widths from input width In (where a mismatch is, for the enclosing sequential's message).
  template <std::size_t In>
  using chain_at = detail::chain<0, In, Layers...>;

  /// The sequential bound to input width In (a shape mismatch is reported here, with its position).
  template <std::size_t In>
  using bind = typename detail::checked_bind<detail::chain<0, In, Layers...>::ok,
                                             detail::chain<0, In, Layers...>, In>::type;
};

}  // namespace lockstep
