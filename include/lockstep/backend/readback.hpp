#pragma once
/// @file readback.hpp (backend)
/// Deferred readback: what a device context hands back one step late when a strategy runs with
/// strategy_options::defer_readback (the loss totals of a step and its epilogue's decision), and
/// the optional members by which a device kind's context offers it. A context that defers
/// copies each loss's device totals into page-locked memory on its compute stream instead of
/// waiting for them; the strategy seals the step's page after the step is queued and collects
/// it after the NEXT step is queued, so the host never waits for work of the step it is queuing.

#include <cmath>
#include <concepts>
#include <cstddef>

#include <lockstep/backend/epilogue.hpp>

namespace lockstep::backend {

/// The values a context read back for one step, summed in the order the losses were evaluated
/// (the order an undeferred step adds them in, so the totals are the same bits).
struct readback_totals {
  double loss = 0;                 ///< sum of the step's deferred loss sums
  std::size_t hits = 0;            ///< sum of their top-1 hits (each rounded as loss_sum::correct is)
  std::size_t evaluations = 0;     ///< losses deferred in the step (0: nothing was pending)
  bool nan = false;                ///< some deferred loss sum was NaN
  bool has_decision = false;       ///< `decision` holds the step's epilogue decision
  update_decision decision;        ///< the epilogue's decision (clipping's norm and factor)

  /// Adds one loss evaluation's totals: its loss sum and its hit count.
  void add(double loss_sum, double hit_count) noexcept {
    loss += loss_sum;
    hits += static_cast<std::size_t>(hit_count + 0.5);
    nan = nan || std::isnan(loss_sum);
    ++evaluations;
  }
};

/// A context that can defer readback (the CUDA context; a device kind's own context may offer
/// it too): `set_defer_readback(on)` turns deferral on for the losses evaluated next,
/// `defers_readback()` says whether it is on, `readback_seal()` closes the current step's page
/// after its work is queued (and starts the other page), `readback_collect()` waits for the
/// sealed page of the step before and returns its totals (evaluations 0 when none is sealed),
/// `readback_discard()` drops what the current page holds (an abandoned update), and
/// `readback_reset()` drops both pages (after a failed step).
template <class Ctx>
concept deferring_context = requires(Ctx& c, bool on) {
  c.set_defer_readback(on);
  { c.defers_readback() } -> std::same_as<bool>;
  c.readback_seal();
  { c.readback_collect() } -> std::same_as<readback_totals>;
  c.readback_discard();
  c.readback_reset();
};

}  // namespace lockstep::backend
