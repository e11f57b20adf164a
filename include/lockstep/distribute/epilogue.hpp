#pragma once
/// @file epilogue.hpp
/// The reduced-gradient epilogue: what happens between the last gradient bucket of an update and
/// the first parameter that changes. One pass over the reduced gradient SUMS computes, per chunk
/// of a fixed grid over the flat parameter vector, a sum of squares in double (which is also the
/// finite flag: it is finite exactly when every element of the chunk is); the chunks are combined
/// in chunk order. From that come the global norm of the gradient the optimiser applies (the sums
/// times 1 / (rows of the update × loss scale)), the clip factor, the non-finite decision and the
/// one scalar the optimiser receives, `update_info::grad_scale` = clip factor / (rows × loss scale),
/// so unscaling and clipping add no pass of their own.
///
/// The grid and the arithmetic inside a chunk depend only on the parameter count — never on the
/// replica or worker count, nor on who computes a chunk — so every replica and worker gets the
/// same norm and flag bits, and under determinism::replica_count_invariant (where the sums
/// themselves are the same bits for every split) every replica or worker COUNT does too. A chunk:
/// 16 lanes, lane l adding the squares (as doubles) of the chunk's elements l, l + 16, l + 32, ...
/// in index order, the lanes then added pairwise (l + 8 into l, then + 4, + 2, + 1). The square of a
/// float is exact in a double, so a fused multiply-add gives the same bits as a multiply and an add.
///
/// The order of operations of an update (the training recipe, `update_recipe`): reduce → unscale →
/// guard → clip by global norm → per-value clip → optimiser → EMA. Clipping happens once per
/// update, on the reduced gradient of all its batches, never per batch.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include <lockstep/backend/epilogue.hpp>
#include <lockstep/core/error.hpp>

namespace lockstep {

/// The exponential moving average of the weights (Keras `use_ema`, PyTorch `AveragedModel`).
struct ema_options {
  double decay = 0;               ///< ema = decay · ema + (1 − decay) · weights; 0: no EMA
  std::uint64_t start_step = 0;   ///< the EMA starts after this many updates (its first update copies the weights)
  std::uint64_t every = 1;        ///< then it is updated at every `every`-th update
};

/// How an update is made from the reduced gradient (see the file comment for the order).
struct update_recipe {
  double clip_global_norm = 0;  ///< > 0: the gradient is scaled so that its global norm is at most this
  float clip_value = 0;         ///< > 0: each gradient element is clamped to [−clip_value, clip_value] (after the norm clip)
  nonfinite_policy nonfinite = nonfinite_policy::apply;  ///< what a non-finite reduced gradient does
  std::uint64_t max_consecutive_skips = 20;  ///< nonfinite_policy::skip: numerics_error after this many skips in a row
  ema_options ema{};            ///< the EMA of the weights (decay 0: none)

  /// True when the update needs the epilogue's pass (a norm or a finite flag).
  [[nodiscard]] constexpr bool needs_epilogue() const noexcept {
    return clip_global_norm > 0 || nonfinite != nonfinite_policy::apply;
  }
  /// True when the EMA is updated after update number `update` (1-based).
  [[nodiscard]] constexpr bool ema_at(std::uint64_t update) const noexcept {
    return ema.decay > 0 && update > ema.start_step && (update - ema.start_step - 1) % (ema.every ? ema.every : 1) == 0;
  }
  /// @throws config_error naming the field of a value that has no meaning.
  void check() const {
    constexpr const char* who = "lockstep";
    detail::require_option(who, "update_recipe::clip_global_norm", clip_global_norm,
                           clip_global_norm >= 0 && std::isfinite(clip_global_norm), "finite and >= 0");
    detail::require_option(who, "update_recipe::clip_value", clip_value, clip_value >= 0 && std::isfinite(clip_value),
                           "finite and >= 0");
    detail::require_option(who, "update_recipe::ema.decay", ema.decay, ema.decay >= 0 && ema.decay < 1, "in [0, 1)");
    if (ema.every == 0) throw config_error("lockstep: update_recipe::ema.every must be >= 1");
    if (nonfinite == nonfinite_policy::skip && max_consecutive_skips == 0)
      throw config_error("lockstep: update_recipe::max_consecutive_skips must be >= 1");
  }
};

}  // namespace lockstep
