#pragma once
/// @file loss.hpp
/// The loss concept. A loss returns the SUM of per-sample losses and the sample count, and
/// writes the gradient of that sum: replicas all-reduce sums and divide by the global count, so
/// N replicas compute exactly what one device computes on the same global batch.

#include <concepts>
#include <cstddef>
#include <cstdint>

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

/// A loss evaluation over one shard: the sum over its samples and how many there were.
struct loss_sum {
  double sum = 0;          ///< sum of per-sample losses
  std::size_t count = 0;   ///< samples summed
  std::size_t correct = 0; ///< rows whose arg-max output equals the label (losses with counts_correct)
};

/// True when loss L counts top-1 hits in loss_sum::correct as it evaluates (on any device).
template <class L>
inline constexpr bool counts_correct_v = requires { requires L::counts_correct; };

/// A loss: opts in with loss_tag; `evaluate(ctx, out, rows, cols, targets, grad, scratch)` writes the
/// gradient of the summed loss into grad (when not null) and returns the sum and count.
/// `scratch_per_row` says how many T of scratch per row it needs.
template <class L>
concept loss = requires {
  typename L::loss_concept;
  requires std::same_as<typename L::loss_concept, loss_tag>;
  { L::scratch_per_row } -> std::convertible_to<std::size_t>;
};

}  // namespace lockstep
