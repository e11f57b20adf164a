#pragma once
/// @file callbacks.hpp
/// What fit reports (epoch_stats, history) and how a caller steers it (callbacks: a user lambda
/// at epoch end or step end, early stopping, a learning-rate schedule).

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/optimizers/schedule.hpp>

namespace lockstep {

/// The results of one epoch of fit.
struct epoch_stats {
  std::uint64_t epoch = 0;              ///< 0-based epoch number
  /// Mean training loss of the epoch's applied updates (exact over replicas; an update the
  /// non-finite guard skipped counts only in skipped_updates).
  double train_loss = std::numeric_limits<double>::quiet_NaN();
  double train_accuracy = std::numeric_limits<double>::quiet_NaN();  ///< top-1 accuracy of the training-mode outputs (applied updates)
  double val_loss = std::numeric_limits<double>::quiet_NaN();        ///< validation loss (NaN without validation data)
  double val_accuracy = std::numeric_limits<double>::quiet_NaN();    ///< validation top-1 accuracy (NaN without)
  /// Validation top-k accuracy, k = val_top_k (NaN without validation or labels).
  double val_top_k_accuracy = std::numeric_limits<double>::quiet_NaN();
  std::uint64_t val_top_k = 0;          ///< the k of val_top_k_accuracy (fit_options::top_k; 0 without validation)
  double samples_per_second = 0;        ///< the applied updates' training samples per second of the epoch
  double seconds = 0;                   ///< wall time of the epoch (training and validation)
  float lr = 0;                         ///< learning rate of the epoch's last update
  std::uint64_t steps = 0;              ///< updates in this epoch
  std::uint64_t samples = 0;            ///< training samples of this epoch's applied updates
  std::uint64_t global_step = 0;        ///< updates done at the end of the epoch
  std::uint64_t val_samples = 0;        ///< validation samples evaluated (each exactly once)
  /// Mean over the epoch's applied updates of the global gradient norm before clipping (NaN when
  /// no update ran the epilogue, neither clipping nor a non-finite guard, or all were skipped).
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  /// Mean over the epoch's applied updates of the clip factor (1: nothing clipped; NaN as grad_norm).
  double clip_factor = std::numeric_limits<double>::quiet_NaN();
  std::uint64_t skipped_updates = 0;    ///< updates of the epoch the non-finite guard skipped
  /// True when fit_options::max_steps ended training with batches of this epoch left: the
  /// statistics cover the updates run. fit puts such an epoch in the history and on the progress
  /// line but gives it to no callback and no metrics file: a run resumed from its checkpoint
  /// completes the epoch and reports it once, whole.
  bool cut_short = false;
};

/// Everything fit reports: one entry per epoch run.
struct history {
  std::vector<epoch_stats> epochs;  ///< per-epoch results, in order
  bool stopped_early = false;       ///< a callback asked to stop before the last epoch
  std::uint64_t resumed_from_step = 0;  ///< step of the checkpoint fit resumed from (0: fresh start)

  /// The last epoch's results. @throws config_error when no epoch ran.
  [[nodiscard]] const epoch_stats& last() const {
    if (epochs.empty()) throw config_error("lockstep::history: no epoch has run");
    return epochs.back();
  }
  /// One metric of every epoch, e.g. `h.series(&epoch_stats::val_loss)`.
  template <class M>
  [[nodiscard]] std::vector<M> series(M epoch_stats::*field) const {
    std::vector<M> out;
    out.reserve(epochs.size());
    for (const auto& e : epochs) out.push_back(e.*field);
    return out;
  }
};

/// What a callback may read and change while fit runs.
struct training_control {
  const history* past = nullptr;  ///< the epochs finished so far
  std::uint64_t step = 0;         ///< updates done so far
  std::uint64_t epoch = 0;        ///< the epoch in progress
  float base_lr = 0;              ///< the optimiser's learning rate as given to fit
  float lr_factor = 1;            ///< multiplies the base rate before schedules (saved in checkpoints)
  bool stop = false;              ///< set to end training after the current step or epoch
  /// The last update's gradient norm before clipping (NaN when the update recipe computed none:
  /// no clipping and no non-finite guard).
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
  bool skipped = false;           ///< the non-finite guard skipped the last update
};

/// A set of hooks fit calls; empty hooks are skipped. Build them with the functions below or
/// fill the members directly. A callback with internal state that must survive a resume sets
/// `save_state` and `load_state`: fit stores what save_state returns in every checkpoint and hands
/// it to load_state when it resumes from that checkpoint.
struct callback {
  /// Called after each epoch (after validation).
  std::function<void(const epoch_stats&, training_control&)> epoch_end;
  /// Called after each update with the update's mean loss.
  std::function<void(double, training_control&)> step_end;
  /// Maps (rate, step) to the rate of update `step` (0-based); schedules of more than one callback
  /// compose in order.
  std::function<float(float, std::uint64_t)> schedule;
  /// Returns the callback's internal state (stored in checkpoints); empty hook: no state.
  std::function<std::vector<double>()> save_state;
  /// Restores a state save_state returned (throw checkpoint_error if it does not fit); needed
  /// whenever save_state is set.
  std::function<void(std::span<const double>)> load_state;
  /// Called when fit starts, before its first epoch and before a resume's load_state: a callback
  /// that keeps state forgets an earlier fit's here (one callback object may serve several runs).
  std::function<void()> train_begin;
};

/// A function object run after every epoch: copyable (it is stored in a std::function) and
/// callable as `f(const epoch_stats&)` or `f(const epoch_stats&, training_control&)`.
template <class F>
concept epoch_callback = std::copy_constructible<F> && (std::invocable<F&, const epoch_stats&> ||
                                                        std::invocable<F&, const epoch_stats&, training_control&>);

/// A function object run after every update: copyable and callable as `f(double mean_loss)` or
/// `f(double mean_loss, training_control&)`.
template <class F>
concept step_callback = std::copy_constructible<F> && (std::invocable<F&, double> ||
                                                       std::invocable<F&, double, training_control&>);

namespace detail {
/// Checks epoch callback F member by member, so that a type that lacks one is told which.
template <class F>
constexpr bool check_epoch_callback() {
  static_assert(std::invocable<F&, const epoch_stats&> || std::invocable<F&, const epoch_stats&, training_control&>,
                "lockstep: an epoch callback needs `void operator()(const lockstep::epoch_stats& stats)` or `void "
                "operator()(const lockstep::epoch_stats& stats, lockstep::training_control& control)`");
  static_assert(std::copy_constructible<F>, "lockstep: an epoch callback must be copyable (fit keeps it in a std::function)");
  return true;  // each missing member was named above
}
/// Checks step callback F member by member, so that a type that lacks one is told which.
template <class F>
constexpr bool check_step_callback() {
  static_assert(std::invocable<F&, double> || std::invocable<F&, double, training_control&>,
                "lockstep: a step callback needs `void operator()(double mean_loss)` or `void operator()(double "
                "mean_loss, lockstep::training_control& control)`");
  static_assert(std::copy_constructible<F>, "lockstep: a step callback must be copyable (fit keeps it in a std::function)");
  return true;  // each missing member was named above
}
}  // namespace detail

/// A callback running `f(stats)` or `f(stats, control)` after every epoch (F: an epoch_callback;
/// a type that is not one is told which member it lacks).
template <class F>
callback on_epoch_end(F f) {
  static_assert(detail::check_epoch_callback<F>());
  callback c;
  if constexpr (std::invocable<F&, const epoch_stats&, training_control&>)
    c.epoch_end = std::move(f);
  else
    c.epoch_end = [f = std::move(f)](const epoch_stats& s, training_control&) mutable { f(s); };
  return c;
}

/// A callback running `f(loss)` or `f(loss, control)` after every update (F: a step_callback; a
/// type that is not one is told which member it lacks).
template <class F>
callback on_step_end(F f) {
  static_assert(detail::check_step_callback<F>());
  callback c;
  if constexpr (std::invocable<F&, double, training_control&>)
    c.step_end = std::move(f);
  else
    c.step_end = [f = std::move(f)](double l, training_control&) mutable { f(l); };
  return c;
}

/// A callback applying a learning-rate schedule (constant_schedule, cosine_schedule, ... or any
/// `float(float base, uint64 step)`). A schedule is a pure function of the step, so a resumed run
/// continues it exactly. (Schedule: a learning_rate_schedule; a type that is not one is told which
/// member it lacks.) @throws config_error when the schedule's optional `check()` refuses a field.
template <class Schedule>
callback lr_schedule(Schedule s) {
  static_assert(detail::check_schedule<Schedule>());
  detail::check_schedule_fields(s);  // a field out of range is refused here, before fit
  callback c;
  c.schedule = [s = std::move(s)](float base, std::uint64_t step) { return static_cast<float>(s(base, step)); };
  return c;
}

/// The metric early stopping watches.
enum class monitored { val_loss, val_accuracy, train_loss, train_accuracy };

/// Options of early_stopping.
struct early_stopping_options {
  monitored monitor = monitored::val_loss;  ///< the metric (losses are minimised, accuracies maximised)
  std::uint64_t patience = 3;              ///< epochs without improvement before stopping
  double min_delta = 0;                    ///< smallest change that counts as an improvement
};

namespace detail {
/// Throws config_error when metric `m` is NaN in `s` because the epoch could not measure it (no
/// validation data; no labelled rows, for an accuracy), rather than because training diverged
/// or the non-finite guard skipped every update of the epoch (no improvement).
inline void check_monitored(monitored m, const epoch_stats& s) {
  const bool validation = m == monitored::val_loss || m == monitored::val_accuracy;
  const char* name = m == monitored::val_loss         ? "val_loss"
                     : m == monitored::val_accuracy   ? "val_accuracy"
                     : m == monitored::train_loss     ? "train_loss"
                                                      : "train_accuracy";
  const std::string where = "lockstep::early_stopping: it monitors " + std::string(name) + ", but epoch " +
                            std::to_string(s.epoch) + " ";
  if (validation && s.val_samples == 0)
    throw config_error(where + "had no validation (give fit_options::validation, or monitor train_loss)");
  if (m == monitored::val_accuracy)
    throw config_error(where + "measured no accuracy (the validation data has no labels); monitor val_loss instead");
  if (m == monitored::train_accuracy && s.samples > 0)  // none: every update skipped, no improvement
    throw config_error(where + "measured no accuracy (the loss counts no hits: a loss without labels, or replicas "
                               "whose outputs are not on the host); monitor a loss instead");
}
}  // namespace detail

/// A callback that stops training when the monitored metric has not improved by more than
/// min_delta for `patience` epochs in a row. A NaN metric never counts as an improvement (a
/// diverged loss, or an epoch whose updates the non-finite guard all skipped); a metric the epoch
/// could not measure (a validation metric without validation data, an accuracy without labels)
/// raises config_error at the first epoch's end (for train_accuracy, the first epoch with an
/// applied update). Its
/// state (best value, epochs without improvement) is saved in checkpoints, so a resumed run
/// stops at the same epoch as an uninterrupted one, and forgotten when a fit starts (train_begin),
/// so the same callback given to another fit starts afresh, as Keras's does.
/// @throws config_error when min_delta is negative or not finite.
inline callback early_stopping(early_stopping_options o = {}) {
  if (!detail::finite_nonnegative(o.min_delta))
    throw config_error("lockstep::early_stopping: min_delta is " + detail::option_value(o.min_delta) +
                       "; it must be finite and >= 0 (a negative one counts a worse metric as an improvement)");
  struct state {
    double best = std::numeric_limits<double>::quiet_NaN();
    std::uint64_t wait = 0;
  };
  auto st = std::make_shared<state>();
  callback c;
  c.train_begin = [st] { *st = state{}; };
  c.epoch_end = [o, st](const epoch_stats& s, training_control& ctl) {
    double v = 0;
    bool maximise = false;
    switch (o.monitor) {
      case monitored::val_loss: v = s.val_loss; break;
      case monitored::val_accuracy: v = s.val_accuracy; maximise = true; break;
      case monitored::train_loss: v = s.train_loss; break;
      case monitored::train_accuracy: v = s.train_accuracy; maximise = true; break;
    }
    if (std::isnan(v)) detail::check_monitored(o.monitor, s);
    const bool improved =
        !std::isnan(v) && (std::isnan(st->best) || (maximise ? v > st->best + o.min_delta : v < st->best - o.min_delta));
    if (improved) {
      st->best = v;
      st->wait = 0;
    } else if (++st->wait >= o.patience) {
      ctl.stop = true;
    }
  };
  c.save_state = [st] { return std::vector<double>{st->best, static_cast<double>(st->wait)}; };
  c.load_state = [st](std::span<const double> v) {
    if (v.size() != 2)
      throw checkpoint_error("lockstep::early_stopping: the saved state holds " + std::to_string(v.size()) +
                             " values, expected 2 (best value, epochs without improvement)");
    if (!(v[1] >= 0) || v[1] != std::floor(v[1]) || v[1] > 9007199254740992.0)
      throw checkpoint_error("lockstep::early_stopping: the saved epochs without improvement, " + std::to_string(v[1]) +
                             ", is not a whole number >= 0");
    st->best = v[0];
    st->wait = static_cast<std::uint64_t>(v[1]);
  };
  return c;
}

}  // namespace lockstep
