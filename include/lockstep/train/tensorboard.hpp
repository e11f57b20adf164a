#pragma once
/// @file tensorboard.hpp
/// `tensorboard(dir, options)`: a fit callback writing the training curves as TensorBoard scalars
/// (io/tensorboard.hpp), as Keras's TensorBoard callback and PyTorch's SummaryWriter do.
///
/// Per epoch (step = the epoch number): epoch/loss, epoch/accuracy, epoch/lr,
/// epoch/samples_per_second, with validation data epoch/val_loss, epoch/val_accuracy and
/// epoch/val_top_k_accuracy (k = fit_options::top_k), and when
/// the update recipe has an epilogue (clipping or the non-finite guard) epoch/grad_norm and
/// epoch/clip_factor (means over the epoch's applied updates) and epoch/skipped_updates.
/// Per update (step = the number of updates done): step/loss and step/lr, with an epilogue
/// step/grad_norm (before clipping) and step/skipped (1 for a skipped update), plus whatever
/// tensorboard_options::step_scalars adds. A metric that is not available (NaN) is left out.
/// A fit resumed from a checkpoint marks a restart (a SessionLog START event) at its first
/// update, so TensorBoard drops the step/ scalars that the interrupted run wrote past the
/// checkpoint and shows each update once (not the epoch/ scalars: their step is the epoch).

#include <cmath>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/io/tensorboard.hpp>
#include <lockstep/train/callbacks.hpp>

namespace lockstep {

/// Scalars a step_scalars hook adds to a step's event. Not copyable: its `values` view tags it
/// keeps itself.
class tensorboard_step_scalars {
public:
  tensorboard_step_scalars() = default;
  tensorboard_step_scalars(const tensorboard_step_scalars&) = delete;
  tensorboard_step_scalars& operator=(const tensorboard_step_scalars&) = delete;
  /// Adds scalar `tag` = `value`; the tag is copied (it may be a string the hook then destroys).
  /// The copies' storage is kept from step to step, so a steady run allocates nothing here.
  void add(std::string_view tag, double value) {
    if (values.size() >= tags_.size()) tags_.emplace_back();  // a deque: earlier tags do not move
    std::string& kept = tags_[values.size()];
    kept.assign(tag);
    values.push_back({kept, value});
  }
  /// The scalars added so far, in order (their tags view this object's copies). Read them; change
  /// them only by add, or by clear (which starts the next step's).
  std::vector<io::tensorboard_scalar> values;

private:
  std::deque<std::string> tags_;  // the tags' copies, reused in order after values is cleared
};

/// Options of the tensorboard callback.
struct tensorboard_options {
  /// Only the chief writes: pass the strategy's is_chief(); elsewhere the callback does nothing.
  bool chief = true;
  /// Write the per-update scalars every this many updates (0: none, only the per-epoch ones).
  std::uint64_t every_steps = 1;
  /// Called at each written update to add scalars of one's own to its event, from the training
  /// control: `f(control, out)` with `out.add("step/epoch", control.epoch)`.
  std::function<void(const training_control&, tensorboard_step_scalars&)> step_scalars{};
};

/// A callback writing TensorBoard scalars into a new event file in directory `dir` (created when
/// missing) on the chief; see the file comment for the tags. The per-update learning rate is the
/// rate after the schedules of the callbacks placed BEFORE this one (fit composes schedules in the
/// order of its callbacks, and this callback's schedule hook records the rate it is handed and
/// returns it unchanged), so put it after every lr_schedule. The file is opened when the callback
/// is made.
/// @throws config_error when the directory or the file cannot be created.
inline callback tensorboard(const std::filesystem::path& dir, tensorboard_options o = {}) {
  callback c;
  if (!o.chief) return c;
  struct state {
    io::tensorboard_writer writer;
    tensorboard_options options;
    float rate = 0;                 // the rate of the update in progress, as the schedules gave it
    bool rate_known = false;
    bool restarted = false;         // resumed from a checkpoint: the next step's event marks a restart
    tensorboard_step_scalars extra;  // reused every step
    std::vector<io::tensorboard_scalar> row;
    state(const std::filesystem::path& d, tensorboard_options opt) : writer(d), options(std::move(opt)) {}
  };
  auto st = std::make_shared<state>(dir, std::move(o));
  c.schedule = [st](float rate, std::uint64_t) {
    st->rate = rate;
    st->rate_known = true;
    return rate;
  };
  // No state of its own in checkpoints; loading one (a resume) marks the restart, so that the
  // steps the crashed run wrote past the checkpoint are not shown twice.
  c.train_begin = [st] { st->restarted = false; };
  c.save_state = [] { return std::vector<double>{}; };
  c.load_state = [st](std::span<const double> v) {
    if (!v.empty())
      throw checkpoint_error("lockstep::tensorboard: the saved state holds " + std::to_string(v.size()) +
                             " values, expected none");
    st->restarted = true;
  };
  c.step_end = [st](double loss, training_control& ctl) {
    if (st->restarted) {  // this run's first update after a resume: events from it on replace the old ones
      st->restarted = false;
      st->writer.session_start(static_cast<std::int64_t>(ctl.step));
    }
    const std::uint64_t every = st->options.every_steps;
    if (every == 0 || ctl.step % every != 0) return;
    auto& row = st->row;
    row.clear();
    if (!std::isnan(loss)) row.push_back({"step/loss", loss});
    if (st->rate_known) row.push_back({"step/lr", st->rate});
    if (!std::isnan(ctl.grad_norm) || ctl.skipped) {  // the update recipe has an epilogue
      if (!std::isnan(ctl.grad_norm)) row.push_back({"step/grad_norm", ctl.grad_norm});
      row.push_back({"step/skipped", ctl.skipped ? 1.0 : 0.0});
    }
    if (st->options.step_scalars) {
      auto& extra = st->extra.values;
      extra.clear();
      st->options.step_scalars(ctl, st->extra);
      row.insert(row.end(), extra.begin(), extra.end());
    }
    st->writer.scalars(static_cast<std::int64_t>(ctl.step), row);
  };
  c.epoch_end = [st](const epoch_stats& s, training_control&) {
    auto& row = st->row;
    row.clear();
    const auto add = [&](std::string_view tag, double v) {
      if (!std::isnan(v)) row.push_back({tag, v});
    };
    add("epoch/loss", s.train_loss);
    add("epoch/accuracy", s.train_accuracy);
    add("epoch/lr", s.lr);
    add("epoch/samples_per_second", s.samples_per_second);
    if (!std::isnan(s.grad_norm) || s.skipped_updates > 0) {  // the update recipe has an epilogue
      add("epoch/grad_norm", s.grad_norm);
      add("epoch/clip_factor", s.clip_factor);
      add("epoch/skipped_updates", static_cast<double>(s.skipped_updates));
    }
    if (s.val_samples > 0) {
      add("epoch/val_loss", s.val_loss);
      add("epoch/val_accuracy", s.val_accuracy);
      add("epoch/val_top_k_accuracy", s.val_top_k_accuracy);
    }
    st->writer.scalars(static_cast<std::int64_t>(s.epoch), row);
  };
  return c;
}

}  // namespace lockstep
