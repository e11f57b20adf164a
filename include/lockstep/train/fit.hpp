#pragma once
/// @file fit.hpp
/// The training front end: `fit` (epochs of synchronous steps through a strategy, validation,
/// callbacks, progress, checkpoints and exact resume), `evaluate` (exact loss, accuracy and top-k
/// over every sample exactly once) and `predict`.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/data/distribute.hpp>
#include <lockstep/data/generator.hpp>
#include <lockstep/distribute.hpp>
#include <lockstep/io/checkpoint.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/optimizers/optimizer.hpp>
#include <lockstep/train/callbacks.hpp>
#include <lockstep/train/metrics.hpp>
#include <lockstep/train/progress.hpp>

namespace lockstep {

/// A source of global batches per epoch: `d.epoch(e)` is an input range of data::batch (or a
/// type derived from it), such as a data::dataset ending in `batched(n)`.
template <class D>
concept batch_source = requires(const D& d, std::uint64_t e) {
  { d.epoch(e) } -> std::ranges::input_range;
  requires data::global_batch<std::ranges::range_value_t<decltype(d.epoch(e))>>;
};

namespace detail {

/// Shares a global batch and cuts it into one shard per replica (data::split).
template <class B>
data::distributed_batch share_and_split(B&& b, std::size_t replicas) {
  using T = std::remove_cvref_t<B>;
  auto owned = std::make_shared<const T>(std::forward<B>(b));
  data::distributed_batch out;
  out.shards = data::split(*owned, replicas);
  out.global = std::move(owned);
  return out;
}

template <class Source>
data::generator<data::distributed_batch> distributed_epoch(Source src, std::uint64_t epoch, std::size_t replicas) {
  for (auto&& b : src.epoch(epoch)) co_yield share_and_split(std::move(b), replicas);
}

}  // namespace detail

/// Evaluation data of any batch_source, type-erased so it can sit in fit_options.
class eval_data {
public:
  /// No data.
  eval_data() = default;
  /// Wraps a batch source (copied; a data::dataset is a cheap handle). Epoch 0 is evaluated.
  template <batch_source Source>
    requires(!std::same_as<std::remove_cvref_t<Source>, eval_data>)
  eval_data(Source src)  // NOLINT(google-explicit-constructor): lets `.validation = test_set` read naturally
      : make_([src = std::move(src)](std::size_t replicas) { return detail::distributed_epoch(src, 0, replicas); }) {}

  /// True when data was given.
  explicit operator bool() const noexcept { return static_cast<bool>(make_); }
  /// The batches of one pass, cut into `replicas` shards each.
  [[nodiscard]] data::generator<data::distributed_batch> batches(std::size_t replicas) const {
    if (!make_) throw config_error("lockstep::eval_data: no data");
    return make_(replicas);
  }

private:
  std::function<data::generator<data::distributed_batch>(std::size_t)> make_;
};

/// Options of evaluate.
struct evaluate_options {
  std::size_t top_k = 5;  ///< k of the top-k accuracy
};

/// Exact evaluation results over a whole dataset.
struct evaluation {
  double loss = std::numeric_limits<double>::quiet_NaN();            ///< mean loss per sample
  double accuracy = std::numeric_limits<double>::quiet_NaN();        ///< top-1 accuracy
  double top_k_accuracy = std::numeric_limits<double>::quiet_NaN();  ///< top-k accuracy
  std::size_t k = 0;                                                  ///< the k of top_k_accuracy
  std::uint64_t samples = 0;                                          ///< samples evaluated (each exactly once)
  metric_sums sums;                                                   ///< the reduced sums behind the ratios
};

namespace detail {

template <class S, class R>
metric_sums reduce_metric_sums(const S& s, const R& per) {
  std::vector<double> loss, count, labelled, correct, topk;
  for (const metric_sums& m : per) {
    loss.push_back(m.loss_sum);
    count.push_back(static_cast<double>(m.count));
    labelled.push_back(static_cast<double>(m.labelled));
    correct.push_back(static_cast<double>(m.correct));
    topk.push_back(static_cast<double>(m.top_k_correct));
  }
  metric_sums out;
  out.loss_sum = static_cast<double>(s.reduce(reduce_op::sum, loss));
  out.count = static_cast<std::uint64_t>(std::llround(static_cast<double>(s.reduce(reduce_op::sum, count))));
  out.labelled = static_cast<std::uint64_t>(std::llround(static_cast<double>(s.reduce(reduce_op::sum, labelled))));
  out.correct = static_cast<std::uint64_t>(std::llround(static_cast<double>(s.reduce(reduce_op::sum, correct))));
  out.top_k_correct = static_cast<std::uint64_t>(std::llround(static_cast<double>(s.reduce(reduce_op::sum, topk))));
  return out;
}

/// Per-replica host scratch for evaluation (outputs copied to the host, loss scratch).
struct eval_scratch {
  std::vector<std::vector<float>> host_out;
  std::vector<std::vector<float>> loss_scratch;
  explicit eval_scratch(std::size_t n) : host_out(n), loss_scratch(n) {}
};

/// One replica's metric sums over its shard (evaluation mode).
template <class Rep, class Loss>
metric_sums shard_metrics(Rep& rep, const Loss& loss, const data::shard& sh, const pass_info& info, std::size_t k,
                          eval_scratch& scratch, std::size_t r) {
  metric_sums m;
  if (sh.size == 0) return m;
  using model_type = typename Rep::model_type;
  constexpr std::size_t cols = model_type::output_size;
  using T = typename model_type::value_type;
  if constexpr (is_cpu_v<typename Rep::device_type> && std::is_same_v<T, float>) {
    const float* out = rep.predict(sh, info);
    auto& ls = scratch.loss_scratch[r];
    ls.resize(std::max<std::size_t>(1, sh.size * Loss::scratch_per_row));
    const loss_sum l = loss.evaluate(rep.context(), out, sh.size, cols, targets<float>{sh.labels, sh.targets, sh.target_width},
                                     static_cast<float*>(nullptr), ls.data());
    m.loss_sum = l.sum;
    m.count = l.count;
    count_predictions(out, sh.size, cols, sh.labels, k, m);
  } else {
    const loss_sum l = rep.evaluate(loss, sh, info);
    m.loss_sum = l.sum;
    m.count = l.count;
    if (sh.labels) {
      const T* out = rep.predict(sh, info);
      auto& host = scratch.host_out[r];
      std::vector<T> tmp(sh.size * cols);
      copy_to_host(rep.context(), tmp.data(), out, tmp.size());
      rep.context().synchronize();
      host.assign(tmp.begin(), tmp.end());
      count_predictions(host.data(), sh.size, cols, sh.labels, k, m);
    }
  }
  return m;
}

}  // namespace detail

/// Evaluates `m` on every sample of one pass of `data` (epoch 0), through the strategy: each
/// replica computes sums over its shard (s.run), the sums are reduced (s.reduce), and the ratios
/// are taken last. Every sample is counted exactly once — uneven last batches are split, never padded.
template <class Strategy, class Replicated, class Loss>
evaluation evaluate(Strategy& s, Replicated& m, const Loss& loss, const eval_data& data, const evaluate_options& o = {}) {
  static_assert(lockstep::loss<Loss>, "lockstep::evaluate: the loss must satisfy lockstep::loss");
  if (o.top_k == 0) throw config_error("lockstep::evaluate: top_k must be >= 1");
  const std::size_t n = s.num_replicas();
  detail::eval_scratch scratch(n);
  metric_sums total;
  pass_info info;
  info.training = false;
  info.step = m.step();
  for (auto& db : data.batches(n)) {
    auto per = s.run(
        [&](std::size_t r, const data::shard& sh) {
          return detail::shard_metrics(m.replica(r), loss, sh, info, o.top_k, scratch, r);
        },
        db);
    total += detail::reduce_metric_sums(s, per);
  }
  evaluation e;
  e.sums = total;
  e.loss = total.loss();
  e.accuracy = total.accuracy();
  e.top_k_accuracy = total.top_k_accuracy();
  e.k = o.top_k;
  e.samples = total.count;
  return e;
}

/// Evaluates a batch source directly (see the eval_data overload).
template <class Strategy, class Replicated, class Loss, batch_source Source>
evaluation evaluate(Strategy& s, Replicated& m, const Loss& loss, const Source& data, const evaluate_options& o = {}) {
  return evaluate(s, m, loss, eval_data(data), o);
}

/// Model outputs for a whole dataset, in the order the pipeline yielded the rows.
struct predictions {
  std::vector<float> outputs;          ///< rows() x width outputs, row-major
  std::vector<std::uint64_t> indices;  ///< the dataset index of each row
  std::size_t width = 0;               ///< outputs per row
  /// Number of rows.
  [[nodiscard]] std::size_t rows() const noexcept { return indices.size(); }
};

/// Runs `m` in evaluation mode on one pass of `data` through the strategy and gathers every
/// row's outputs on the host.
template <class Strategy, class Replicated>
predictions predict(Strategy& s, Replicated& m, const eval_data& data) {
  using net = io::network_of<Replicated>;
  constexpr std::size_t cols = model<net>::output_size;
  const std::size_t n = s.num_replicas();
  predictions p;
  p.width = cols;
  pass_info info;
  info.training = false;
  info.step = m.step();
  for (auto& db : data.batches(n)) {
    const std::size_t base = p.indices.size();
    p.indices.insert(p.indices.end(), db.global->indices.begin(), db.global->indices.end());
    p.outputs.resize(p.indices.size() * cols);
    float* dst = p.outputs.data() + base * cols;
    auto per = s.run(
        [&](std::size_t r, const data::shard& sh) {
          if (sh.size == 0) return 0;
          auto& rep = m.replica(r);
          const auto* out = rep.predict(sh, info);
          using T = std::remove_cvref_t<decltype(*out)>;
          if constexpr (std::is_same_v<T, float>) {
            copy_to_host(rep.context(), dst + sh.offset * cols, out, sh.size * cols);
          } else {
            std::vector<T> tmp(sh.size * cols);
            copy_to_host(rep.context(), tmp.data(), out, tmp.size());
            std::copy(tmp.begin(), tmp.end(), dst + sh.offset * cols);
          }
          rep.context().synchronize();
          return 0;
        },
        db);
    (void)per;
  }
  return p;
}

/// Predicts a batch source directly (see the eval_data overload).
template <class Strategy, class Replicated, batch_source Source>
predictions predict(Strategy& s, Replicated& m, const Source& data) {
  return predict(s, m, eval_data(data));
}

namespace detail {

/// Hands each callback its state from checkpoint `st` (read from `source`), in order.
/// @throws checkpoint_error when the number of states differs from the number of callbacks, or a
///         state does not fit its callback.
inline void restore_callbacks(const std::vector<callback>& callbacks, const io::checkpoint_state& st,
                              const std::string& source) {
  const std::string where = "lockstep::fit: " + source + ": section 'callbacks': ";
  if (st.callback_states.size() != callbacks.size())
    throw checkpoint_error(where + "the checkpoint holds the state of " + std::to_string(st.callback_states.size()) +
                           " callbacks, but fit was given " + std::to_string(callbacks.size()) +
                           " callbacks; resume with the same callbacks in the same order");
  for (std::size_t i = 0; i < callbacks.size(); ++i) {
    const auto& saved = st.callback_states[i];
    const auto& c = callbacks[i];
    if (!c.load_state) {
      if (!saved.empty())
        throw checkpoint_error(where + "callback " + std::to_string(i) + " has no load_state, but the checkpoint holds " +
                               std::to_string(saved.size()) + " values of state for it");
      continue;
    }
    try {
      c.load_state(std::span<const double>(saved.data(), saved.size()));
    } catch (const checkpoint_error& e) {
      throw checkpoint_error(where + "callback " + std::to_string(i) + ": " + e.what());
    }
  }
}

}  // namespace detail

/// Options of fit.
struct fit_options {
  std::uint64_t epochs = 1;               ///< epochs to train (counted from epoch 0, also when resuming)
  eval_data validation{};                 ///< evaluated after every epoch when given
  std::vector<callback> callbacks{};      ///< hooks, called in order
  bool quiet = false;                     ///< no progress output
  progress_options progress{};            ///< progress display (quiet above overrides)
  std::string metrics_file{};             ///< JSON-lines file receiving one object per epoch ("" = none)
  std::string checkpoint_dir{};           ///< directory of checkpoints ("" = no checkpoints)
  std::uint64_t checkpoint_every = 0;     ///< also checkpoint every this many steps (0: epoch ends only)
  std::size_t keep_checkpoints = 3;       ///< newest checkpoints kept
  bool resume = false;                    ///< continue from the newest checkpoint in checkpoint_dir, if any
  std::uint64_t max_steps = 0;            ///< stop once this many updates are done in total (0: no limit)
  std::uint64_t seed = 0;                 ///< the model seed, recorded when the model does not know it
  std::uint64_t data_seed = 0;            ///< the pipeline seed, recorded in checkpoints
  std::uint64_t steps_per_epoch = 0;      ///< expected steps per epoch for the progress bar (0: learn it)
  std::size_t top_k = 5;                  ///< k of the validation top-k accuracy
};

/// Trains `m` with synchronous data-parallel steps through strategy `s`: for each epoch e, the
/// global batches of `train.epoch(e)` are cut into one shard per replica and each is one
/// train_step; the learning rate of each update is optimizer.lr times the control's factor, passed
/// through the schedules of the callbacks. After each epoch: validation, callbacks, progress, the
/// metrics file and (with checkpoint_dir) a checkpoint. With `resume`, the newest checkpoint is
/// loaded and training continues at its exact position (epoch and batches consumed, the sums of
/// that epoch so far, the callbacks' states), so the result is bitwise the same as an
/// uninterrupted run.
/// @throws checkpoint_error when resuming from a bad checkpoint, one whose number of callback
///         states differs from the number of callbacks, or one whose optimiser state does not fit
///         `optimizer` (io::check_optimizer_state); anything a step throws.
template <class Strategy, class Replicated, class Optimizer, class Loss, batch_source Source>
history fit(Strategy& s, Replicated& m, const Optimizer& optimizer, const Loss& loss, const Source& train,
            const fit_options& o = {}) {
  static_assert(lockstep::optimizer<Optimizer>, "lockstep::fit: the optimizer must satisfy lockstep::optimizer");
  static_assert(lockstep::loss<Loss>, "lockstep::fit: the loss must satisfy lockstep::loss");
  using net = io::network_of<Replicated>;
  const std::size_t replicas = s.num_replicas();

  history h;
  training_control ctl;
  ctl.past = &h;
  ctl.base_lr = optimizer.lr;

  std::optional<io::checkpoint_manager> ckpt;
  if (!o.checkpoint_dir.empty()) ckpt.emplace(o.checkpoint_dir, o.keep_checkpoints);
  else if (o.resume || o.checkpoint_every) throw config_error("lockstep::fit: resume and checkpoint_every need checkpoint_dir");

  std::uint64_t start_epoch = 0, skip = 0;
  io::checkpoint_state resumed_sums;  // only lr and the epoch_* sums are used: those of the resumed epoch
  resumed_sums.lr = optimizer.lr;
  if (o.resume && ckpt) {
    if (const auto p = ckpt->latest()) {
      const io::checkpoint_state st = io::load_checkpoint(*p);
      io::check_signature(st, model_signature<net>(), p->string(), io::model_name<net>());
      if constexpr (requires { m.seed().value; })
        if (st.seed != m.seed().value)
          throw checkpoint_error("lockstep::fit: " + p->string() + ": section 'rng': the checkpoint's model seed " +
                                 std::to_string(st.seed) + " differs from this model's seed " +
                                 std::to_string(m.seed().value) + "; resuming would not be exact");
      io::check_optimizer_state(st, optimizer, model<net>::param_count, p->string());
      if (st.version >= 2) detail::restore_callbacks(o.callbacks, st, p->string());
      if (st.version >= 2 && st.stop_requested) {  // a callback had stopped the run: stay stopped
        ctl.stop = true;
        h.stopped_early = st.batches == 0 ? st.epoch < o.epochs : st.epoch + 1 < o.epochs;
      }
      io::restore(m, st, optimizer, p->string());
      start_epoch = st.epoch;
      skip = st.batches;
      resumed_sums.lr = st.lr;
      resumed_sums.epoch_loss_sum = st.epoch_loss_sum;
      resumed_sums.epoch_samples = st.epoch_samples;
      resumed_sums.epoch_steps = st.epoch_steps;
      resumed_sums.epoch_labelled = st.epoch_labelled;
      resumed_sums.epoch_correct = st.epoch_correct;
      ctl.lr_factor = st.lr_factor;
      ctl.step = st.step;
      ctl.epoch = st.epoch;
      h.resumed_from_step = st.step;
    }
  }

  std::optional<metrics_log> mlog;
  if (!o.metrics_file.empty()) mlog.emplace(o.metrics_file);
  progress_options po = o.progress;
  po.quiet = po.quiet || o.quiet;
  progress bar(po, o.epochs);

  float lr = resumed_sums.lr;  // the rate of the last update (that of the checkpoint when resuming)
  auto lr_at = [&](std::uint64_t step) {
    float r = ctl.base_lr * ctl.lr_factor;
    for (const auto& c : o.callbacks)
      if (c.schedule) r = c.schedule(r, step);
    return r;
  };
  detail::accuracy_counters counters;
  double ep_loss_sum = 0;  // sums of the epoch in progress (restored from a mid-epoch checkpoint)
  std::uint64_t ep_count = 0, ep_steps = 0;
  auto save = [&](std::uint64_t epoch, std::uint64_t batches) {
    io::checkpoint_state st = io::capture(m);
    st.epoch = epoch;
    st.batches = batches;
    st.base_lr = ctl.base_lr;
    st.lr_factor = ctl.lr_factor;
    st.lr = lr;
    if constexpr (requires { m.seed().value; })
      st.seed = m.seed().value;
    else
      st.seed = o.seed;
    st.data_seed = o.data_seed;
    st.replicas = static_cast<std::uint32_t>(replicas);
    st.callback_states.reserve(o.callbacks.size());
    for (const auto& c : o.callbacks) st.callback_states.push_back(c.save_state ? c.save_state() : std::vector<double>{});
    st.stop_requested = ctl.stop;
    if (batches != 0) {  // mid-epoch: the sums of the epoch so far, so its stats come out whole
      st.epoch_loss_sum = ep_loss_sum;
      st.epoch_samples = ep_count;
      st.epoch_steps = ep_steps;
      st.epoch_labelled = counters.labelled.load();
      st.epoch_correct = counters.correct.load();
    }
    ckpt->save(st);
  };
  auto limit_reached = [&] { return o.max_steps != 0 && m.step() >= o.max_steps; };

  std::uint64_t expected_steps = o.steps_per_epoch;
  const detail::counting_loss<Loss> counted{&loss, &counters};

  for (std::uint64_t e = start_epoch; e < o.epochs && !ctl.stop && !limit_reached(); ++e) {
    ctl.epoch = e;
    const auto t0 = std::chrono::steady_clock::now();
    bar.begin_epoch(e, expected_steps);
    const bool resumed_epoch = e == start_epoch;
    counters.correct = resumed_epoch ? resumed_sums.epoch_correct : 0;
    counters.labelled = resumed_epoch ? resumed_sums.epoch_labelled : 0;
    double& loss_sum = ep_loss_sum;
    std::uint64_t &count = ep_count, &steps = ep_steps;
    loss_sum = resumed_epoch ? resumed_sums.epoch_loss_sum : 0.0;
    count = resumed_epoch ? resumed_sums.epoch_samples : 0;
    steps = resumed_epoch ? resumed_sums.epoch_steps : 0;
    const std::uint64_t count_before = count;
    std::uint64_t batches = 0;
    const std::uint64_t to_skip = resumed_epoch ? skip : 0;
    for (auto&& b : train.epoch(e)) {
      if (batches < to_skip) {  // resume: these batches were consumed before the checkpoint
        ++batches;
        continue;
      }
      const data::distributed_batch db = detail::share_and_split(std::move(b), replicas);
      lr = lr_at(m.step());
      Optimizer opt = optimizer;
      opt.lr = lr;
      const auto r = train_step(s, m, opt, counted, db);
      ++batches;
      ++steps;
      loss_sum += r.loss_sum;
      count += r.count;
      ctl.step = m.step();
      const double step_loss = r.count ? r.loss_sum / static_cast<double>(r.count) : 0.0;
      for (const auto& c : o.callbacks)
        if (c.step_end) c.step_end(step_loss, ctl);
      bar.step(batches, count, count ? loss_sum / static_cast<double>(count) : 0.0);
      if (ckpt && o.checkpoint_every && m.step() % o.checkpoint_every == 0) save(e, batches);
      if (ctl.stop || limit_reached()) break;
    }
    const bool finished = !ctl.stop && !limit_reached();
    if (finished && batches < to_skip)
      throw checkpoint_error("lockstep::fit: the checkpoint says " + std::to_string(to_skip) + " batches of epoch " +
                             std::to_string(e) + " were consumed, but the epoch has only " + std::to_string(batches));
    const auto t1 = std::chrono::steady_clock::now();
    if (finished || expected_steps == 0) expected_steps = batches;
    // an epoch cut short is checkpointed before its end hooks run: the resumed run finishes the
    // epoch and runs them once, on the whole epoch
    if (ckpt && !finished) save(e, batches);

    epoch_stats st;
    st.epoch = e;
    st.steps = steps;
    st.samples = count;
    st.train_loss = count ? loss_sum / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
    st.train_accuracy = (counters.labelled > 0 && !counters.unavailable)
                            ? static_cast<double>(counters.correct) / static_cast<double>(counters.labelled)
                            : std::numeric_limits<double>::quiet_NaN();
    const double train_seconds = std::chrono::duration<double>(t1 - t0).count();
    st.samples_per_second = train_seconds > 0 ? static_cast<double>(count - count_before) / train_seconds : 0;
    st.lr = lr;
    st.global_step = m.step();
    if (o.validation) {
      const evaluation v = evaluate(s, m, loss, o.validation, evaluate_options{o.top_k});
      st.val_loss = v.loss;
      st.val_accuracy = v.accuracy;
      st.val_samples = v.samples;
    }
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    h.epochs.push_back(st);
    for (const auto& c : o.callbacks)
      if (c.epoch_end) c.epoch_end(h.epochs.back(), ctl);
    bar.end_epoch(st);
    if (mlog) mlog->write(st);
    if (ckpt && finished) save(e + 1, 0);
    if (ctl.stop && e + 1 < o.epochs) h.stopped_early = true;
  }
  return h;
}

}  // namespace lockstep
