#pragma once
/// @file loss.hpp
/// The loss concept. A loss returns the SUM of per-sample losses and the sample count, and
/// writes the gradient of that sum: replicas all-reduce sums and divide by the global count, so
/// N replicas compute exactly what one device computes on the same global batch.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <lockstep/backend/softmax_xent.hpp>
#include <lockstep/core/labels.hpp>
#include <lockstep/core/shape.hpp>
#include <lockstep/core/views.hpp>

namespace lockstep {

/// Opt-in tag: a type is a loss only when it says `using loss_concept = lockstep::loss_tag;`.
struct loss_tag {};

/// What a loss compares the network output with: class labels or regression targets (device
/// pointers on the replica's device).
template <class T>
struct targets {
  const std::int32_t* labels = nullptr;  ///< one class label per row (classification)
  const T* values = nullptr;             ///< rows x width targets (regression)
  std::size_t width = 0;                 ///< targets per row
};

/// What a loss's evaluate receives, for element type T on context type Ctx and output rows of
/// shape Shape (the model's output row): typed views of the outputs and of where the gradient goes.
template <class T, class Ctx, class Shape>
struct loss_args {
  using kind_type = kind_of_context_t<Ctx>;             ///< the device kind every pointer lives on
  using output_view = rows_view<const T, Shape, kind_type>;  ///< type of out
  using grad_view = rows_view<T, Shape, kind_type>;          ///< type of grad
  output_view out;                 ///< the network's output rows (may be 0 rows)
  lockstep::targets<T> target;     ///< what each row is compared with
  grad_view grad;                  ///< where the gradient of the sum goes; empty in evaluation
  T* scratch = nullptr;            ///< out.rows() * scratch_per_row elements of scratch
  /// Rows in this evaluation (out.rows()).
  [[nodiscard]] constexpr std::size_t rows() const noexcept { return out.rows(); }
};

/// A loss evaluation over one shard: the sum over its samples and how many there were.
struct loss_sum {
  double sum = 0;          ///< sum of per-sample losses
  std::size_t count = 0;   ///< samples summed
  std::size_t correct = 0; ///< rows whose arg-max output equals the label (losses with counts_correct)
  std::size_t labelled = 0;///< labelled rows whose hits `correct` counts (filled by the replica, not the loss)
};

/// How many outputs of `row` rank ahead of output `label`: those strictly larger, and those equal
/// with a smaller index (so ties resolve to the lowest index, as an argmax does). A NaN ranks
/// above every number, as in softmax_cross_entropy's arg-max (NaNs tie with each other). The
/// prediction is top-k correct when the result is < k.
template <class T>
[[nodiscard]] std::size_t rank_of(const T* row, std::size_t cols, std::size_t label) noexcept {
  const T v = row[label];
  std::size_t ahead = 0;
  for (std::size_t j = 0; j < cols; ++j) {
    const bool tie = row[j] == v || (row[j] != row[j] && v != v);
    ahead += (backend::detail::xent_above(row[j], v) || (tie && j < label)) ? 1 : 0;
  }
  return ahead;
}

/// True when loss L counts top-1 hits in loss_sum::correct as it evaluates (on any device).
template <class L>
inline constexpr bool counts_correct_v = requires { requires L::counts_correct; };

/// A loss, its device-independent part. Required members:
///   - `using loss_concept = lockstep::loss_tag;` (the opt-in);
///   - `static constexpr std::size_t scratch_per_row`: elements of scratch per row that evaluate
///     may use (at most 4: a replica reserves that much);
///   - optionally `static constexpr bool counts_correct = true;` when evaluate fills
///     loss_sum::correct (the top-1 hits), so that training accuracy needs no read-back;
///   - optionally, for a loss over class labels, `static constexpr std::size_t
///     label_classes(std::size_t outputs)`: labels must lie in [0, label_classes(outputs)) for a
///     model with `outputs` outputs. A replica then checks every shard's labels on the host
///     before the loss sees them (check_labels), and names the loss by its
///     `static constexpr std::string_view name` when it has one;
///   - optionally `void check() const`, throwing config_error for an option out of range:
///     fit, evaluate and train_step call it before any replica runs (check_loss_options);
///   - optionally `std::string hyperparameters() const`: its options that change the loss, as
///     text (loss_hyperparameters); a multi-worker fit refuses workers whose texts differ.
/// Which element types and contexts it runs on is `loss_for<L, T, Ctx>`.
template <class L>
concept loss = requires {
  typename L::loss_concept;
  requires std::same_as<typename L::loss_concept, loss_tag>;
  { L::scratch_per_row } -> std::convertible_to<std::size_t>;
};

/// True when loss L takes class labels that index the model's output row (it declares
/// `label_classes`, see `loss`).
template <class L>
concept takes_class_labels = requires(std::size_t outputs) {
  { L::label_classes(outputs) } -> std::convertible_to<std::size_t>;
};

/// The name of loss L in messages: its `name`, or "lockstep: the loss".
template <class L>
constexpr std::string_view loss_name() noexcept {
  if constexpr (requires { { L::name } -> std::convertible_to<std::string_view>; })
    return std::string_view(L::name);
  else
    return "lockstep: the loss";
}

/// Calls loss `l`'s optional check() (a loss without one has no option to check).
template <class L>
void check_loss_options(const L& l) {
  if constexpr (requires { l.check(); }) l.check();
}

/// Loss `l`'s optional hyperparameters() (empty for a loss without it): what a multi-worker fit
/// compares across workers.
template <class L>
std::string loss_hyperparameters(const L& l) {
  if constexpr (requires { l.hyperparameters(); }) {
    static_assert(std::convertible_to<decltype(l.hyperparameters()), std::string>,
                  "lockstep: a loss's hyperparameters() must return text (a std::string)");
    return l.hyperparameters();
  } else {
    return {};
  }
}

/// Checks the `rows` labels of a shard for loss L and a model with `outputs` outputs (see
/// check_labels); does nothing for a loss that does not take class labels, or without labels.
template <class L>
void check_loss_labels(const std::int32_t* labels, std::size_t rows, std::size_t outputs, const label_site& site = {}) {
  if constexpr (takes_class_labels<L>)
    check_labels(loss_name<L>(), labels, rows, static_cast<std::size_t>(L::label_classes(outputs)), outputs, site);
}

namespace detail {
/// L has `loss_sum evaluate(Ctx&, const loss_args<T, Ctx, Shape>&) const`.
template <class L, class T, class Ctx, class Shape>
concept loss_evaluate = requires(const L& l, Ctx& ctx, const loss_args<T, Ctx, Shape>& a) {
  { l.evaluate(ctx, a) } -> std::same_as<loss_sum>;
};
}  // namespace detail

/// A loss the library can evaluate with element type T on contexts of type Ctx, for output rows
/// of shape Shape: `loss<L>` and the one member function the library calls, on a const loss (a
/// loss holds no batch state):
///   - `template <class T, class Ctx, class Shape> loss_sum evaluate(Ctx& ctx,
///     const loss_args<T, Ctx, Shape>& a) const`: returns the SUM of the per-sample losses of the
///     rows of a.out against a.target and the count of samples summed; writes the gradient of
///     that sum into a.grad unless it is empty; may use a.rows() * scratch_per_row elements of
///     a.scratch. a.rows() may be 0.
template <class L, class T, class Ctx, class Shape = shape<1>>
concept loss_for = loss<L> && detail::loss_evaluate<L, T, Ctx, Shape>;

namespace detail {
/// Checks loss L for element type T and context Ctx member by member, so that a loss that lacks
/// one is told which.
template <class L, class T, class Ctx, class Shape>
constexpr bool check_loss() {
  static_assert(requires { requires std::same_as<typename L::loss_concept, loss_tag>; },
                "lockstep: a loss opts in with `using loss_concept = lockstep::loss_tag;`");
  static_assert(requires { { L::scratch_per_row } -> std::convertible_to<std::size_t>; },
                "lockstep: a loss needs `static constexpr std::size_t scratch_per_row`");
  static_assert(loss_evaluate<L, T, Ctx, Shape>,
                "lockstep: a loss needs `lockstep::loss_sum evaluate(Ctx& ctx, const lockstep::loss_args<T, Ctx, "
                "Shape>& a) const` (note the const)");
  return true;  // each missing member was named above
}
}  // namespace detail

}  // namespace lockstep
