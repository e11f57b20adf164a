#pragma once
/// @file fit.hpp
/// The training front end: `fit` (epochs of synchronous steps through a strategy, validation,
/// callbacks, progress, checkpoints and exact resume), `evaluate` (exact loss, accuracy and top-k
/// over every sample exactly once) and `predict`.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/data/shard_batches.hpp>
#include <lockstep/data/generator.hpp>
#include <lockstep/distribute.hpp>
#include <lockstep/io/checkpoint.hpp>
#include <lockstep/train/checkpoint.hpp>
#include <lockstep/train/fit_trace.hpp>
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

/// True when S is (or derives from) a mirrored_strategy.
template <class K, class R, determinism D, class W>
std::true_type is_mirrored_strategy(const mirrored_strategy<K, R, D, W>*);
std::false_type is_mirrored_strategy(...);
template <class S>
inline constexpr bool is_mirrored_strategy_v = decltype(is_mirrored_strategy(static_cast<const S*>(nullptr)))::value;

/// The mirrored_strategy base of a strategy derived from one.
template <class K, class R, determinism D, class W>
mirrored_strategy<K, R, D, W>& as_mirrored(mirrored_strategy<K, R, D, W>& s) noexcept {
  return s;
}

/// The strategy class a strategy's training path is written for: the mirrored_strategy base of
/// every mirrored form (so fit and evaluate are instantiated once per kind, reducer, determinism
/// and world, not once per device list), or the strategy itself.
template <class S>
auto& core_of(S& s) noexcept {
  if constexpr (is_mirrored_strategy_v<S>)
    return as_mirrored(s);
  else
    return s;
}

/// Refuses a model the strategy did not make (config_error naming both), or — for a strategy of
/// the user's, which cannot tell who made a model — one with another number of replicas.
template <class S, class M>
void check_bound(const S& s, const M& m) {
  if constexpr (is_mirrored_strategy_v<S>) {
    s.check_model(m);
  } else if (m.size() != s.num_replicas()) {
    throw config_error("lockstep: the model has " + std::to_string(m.size()) + " replicas but the strategy has " +
                       std::to_string(s.num_replicas()));
  }
}

template <class Source>
data::generator<data::distributed_batch> distributed_epoch(Source src, std::uint64_t epoch, std::size_t parts,
                                                           std::size_t first, std::size_t count) {
  for (auto&& b : src.epoch(epoch)) co_yield data::detail::make_sharded(std::move(b), parts, first, count);
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
      : make_([src = check_copyable(std::move(src))](std::size_t parts, std::size_t first, std::size_t count) {
          return detail::distributed_epoch(src, 0, parts, first, count);
        }) {}

  /// True when data was given.
  explicit operator bool() const noexcept { return static_cast<bool>(make_); }
  /// The batches of one pass, cut into `replicas` shards each.
  [[nodiscard]] data::generator<data::distributed_batch> batches(std::size_t replicas) const {
    return batches(replicas, 0, replicas);
  }
  /// The batches of one pass, each cut into `parts` shards of which `count` from `first` are kept
  /// (one process's part of a multi-process job).
  [[nodiscard]] data::generator<data::distributed_batch> batches(std::size_t parts, std::size_t first,
                                                                 std::size_t count) const {
    if (!make_) throw config_error("lockstep::eval_data: no data");
    return make_(parts, first, count);
  }

private:
  /// Passes `src` on, refusing (at compile time, by name) a source that cannot be copied.
  template <class Source>
  static Source&& check_copyable(Source&& src) noexcept {
    static_assert(std::copy_constructible<std::remove_cvref_t<Source>>,
                  "lockstep: evaluation data (a batch source given to evaluate, predict or fit_options::validation) "
                  "must be copyable: it is kept as a copy");
    return std::move(src);
  }
  std::function<data::generator<data::distributed_batch>(std::size_t, std::size_t, std::size_t)> make_;
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

/// Per-replica host scratch for evaluating a model of value type T (outputs copied to the host,
/// in T: outputs rounded to float could tie where T's do not; loss scratch).
template <class T>
struct eval_scratch {
  std::vector<std::vector<T>> host_out;
  std::vector<std::vector<float>> loss_scratch;
  explicit eval_scratch(std::size_t n) : host_out(n), loss_scratch(n) {}
};

/// One replica's metric sums over its shard (evaluation mode).
template <class Rep, class Loss>
metric_sums shard_metrics(Rep& rep, const Loss& loss, const data::shard& sh, const pass_info& info, std::size_t k,
                          eval_scratch<typename Rep::model_type::value_type>& scratch, std::size_t r) {
  metric_sums m;
  if (sh.size == 0) return m;
  using model_type = typename Rep::model_type;
  constexpr std::size_t cols = model_type::output_size;
  using T = typename model_type::value_type;
  if constexpr (device_memory<typename Rep::device_type>::host_accessible && std::is_same_v<T, float>) {
    static_assert(detail::check_loss<Loss, float, typename Rep::context_type, typename model_type::output_shape>());
    const float* out = rep.predict(sh, info);
    check_loss_labels<Loss>(sh.labels, sh.size, cols, {sh.indices});  // as the replica's loss_of does
    auto& ls = scratch.loss_scratch[r];
    ls.resize(std::max<std::size_t>(1, sh.size * Loss::scratch_per_row));
    using args = loss_args<float, typename Rep::context_type, typename model_type::output_shape>;
    const loss_sum l =
        loss.evaluate(rep.context(), args{{out, sh.size}, targets<float>{sh.labels, sh.targets, sh.target_width}, {}, ls.data()});
    m.loss_sum = l.sum;
    m.count = l.count;
    count_predictions(out, sh.size, cols, sh.labels, k, m);
  } else {  // one evaluation forward; the outputs are read back to the host only to count hits
    const T* out = rep.predict(sh, info);
    const loss_sum l = rep.loss_of(loss, sh, out);
    m.loss_sum = l.sum;
    m.count = l.count;
    if (sh.labels) {
      auto& host = scratch.host_out[r];
      host.resize(sh.size * cols);
      copy_to_host(rep.context(), host.data(), out, host.size());
      rep.context().synchronize();
      count_predictions(host.data(), sh.size, cols, sh.labels, k, m);
    }
  }
  return m;
}

/// Calls `f` on the pieces of `sh` that the global batch's grid of `rows` rows cuts it into (rows
/// [k rows, (k + 1) rows) of the global batch), in order; on `sh` whole when `rows` is 0. A row's
/// outputs then come from a forward pass over the same rows whatever the shards are (a GEMM's bits
/// can depend on its row count), as the replica_count_invariant training step's micro-shards do.
template <class F>
void for_each_grid_piece(const data::shard& sh, std::size_t rows, F&& f) {
  if (rows == 0) {
    f(sh);
    return;
  }
  const std::size_t end = sh.offset + sh.size;
  for (std::size_t lo = sh.offset; lo < end;) {
    const std::size_t hi = std::min(end, (lo / rows + 1) * rows);
    f(data::rows_of(sh, lo - sh.offset, hi - lo));
    lo = hi;
  }
}

/// The rows global replica `gr` of `gn` evaluates under a grid of `rows` rows: the micro-shards
/// [K gr / gn, K (gr + 1) / gn) of the K = ceil(rows of the batch / `rows`) of `db`'s global batch,
/// the same rows as the replica_count_invariant training step gives it, so each micro-shard is one
/// forward pass whatever the replica count; `sh` (the even cut) when `rows` is 0 or the global batch
/// does not hold every row (an index-first pipeline's).
inline data::shard grid_shard(const data::distributed_batch& db, const data::shard& sh, std::size_t gr, std::size_t gn,
                              std::size_t rows) noexcept {
  if (rows == 0 || !db.global || !db.global->holds_every_row()) return sh;
  const data::batch& g = *db.global;
  const std::size_t k_total = (g.rows() + rows - 1) / rows;
  const std::size_t lo = std::min(g.rows(), k_total * gr / gn * rows);
  const std::size_t hi = std::min(g.rows(), k_total * (gr + 1) / gn * rows);
  return data::rows_of(g, lo, hi - lo);
}

/// The rows of the evaluation grid of strategy `s` (for_each_grid_piece): its micro-shard rows
/// under replica_count_invariant, 0 (shards whole) otherwise.
template <class Strategy>
std::size_t evaluation_grid(const Strategy& s) {
  if constexpr (requires { Strategy::determinism_level; s.options().micro_shard_rows; }) {
    if constexpr (Strategy::determinism_level == determinism::replica_count_invariant)
      return std::max<std::size_t>(1, s.options().micro_shard_rows);
  }
  (void)s;
  return 0;
}

/// The batches a worker went through in a pass, to compare across workers: their number and a
/// hash of every batch's row count and rows' dataset indices.
struct batch_tally {
  std::uint64_t batches = 0;                       ///< batches added
  std::uint64_t rows = collective_plan::hash({});  ///< hash over their row counts and dataset indices

  /// Counts `db` and hashes its global batch's rows.
  void add(const data::distributed_batch& db) { add(db.global->indices); }
  /// Counts a global batch of rows of dataset indices `idx` and hashes them.
  void add(std::span<const std::uint64_t> idx) {
    ++batches;
    const std::uint64_t n = idx.size();
    rows = collective_plan::hash({reinterpret_cast<const char*>(&n), sizeof n}, rows);
    rows = collective_plan::hash({reinterpret_cast<const char*>(idx.data()), idx.size() * sizeof idx[0]}, rows);
  }
  /// Agrees with the other workers of `w` (its agree; nothing for a world without one) on the
  /// count (field `count_field`) and the hash (`rows_field`); a mismatch's message ends with
  /// `remedy`. Collective.
  template <class World>
  void agree(World& w, std::string count_field, std::string rows_field, std::string remedy) const {
    if constexpr (requires(const collective_plan& p) { w.agree(p); }) {
      collective_plan p;
      p.add(std::move(count_field), batches)
          .add_hashed(std::move(rows_field), {reinterpret_cast<const char*>(&rows), sizeof rows})
          .remedy(std::move(remedy));
      w.agree(p);
    }
  }
};

/// evaluate on the strategy's core class (see lockstep::evaluate). Under replica_count_invariant
/// each replica evaluates the training step's micro-shards of the batch, one forward pass each
/// (grid_shard, for_each_grid_piece).
template <class Strategy, class Replicated, class Loss>
evaluation evaluate_core(Strategy& s, Replicated& m, const Loss& loss, const eval_data& data, const evaluate_options& o) {
  if (o.top_k == 0) throw config_error("lockstep::evaluate: top_k must be >= 1");
  check_loss_options(loss);
  check_bound(s, m);
  const std::size_t n = s.num_replicas();
  detail::eval_scratch<typename std::remove_cvref_t<decltype(m.replica(0))>::model_type::value_type> scratch(n);
  metric_sums total;
  const pass_info info = pass_info::for_evaluation(m.step());
  auto&& w = world_of(s);
  const shard_plan plan = w.plan();
  const std::size_t grid = evaluation_grid(s);
  batch_tally seen;  // what this worker evaluated (compared across workers below)
  for (auto& db : data.batches(plan.parts, plan.first, n)) {
    if (w.size() > 1) seen.add(db);
    auto per = s.run(
        [&](std::size_t r, const data::shard& sh) {
          metric_sums sums;
          for_each_grid_piece(grid_shard(db, sh, plan.first + r, plan.parts, grid), grid, [&](const data::shard& piece) {
            sums += shard_metrics(m.replica(r), loss, piece, info, o.top_k, scratch, r);
          });
          return sums;
        },
        db);
    total += reduce_metric_sums(s, per);
  }
  if (w.size() > 1) {  // more than one process: every process's sums, added in rank order
    // Workers given different data would add up sums of different datasets without a word.
    seen.agree(w, "number of evaluation batches", "evaluation rows (the dataset index of every row, batch by batch)",
               "every worker must evaluate the same data: the same dataset, batch size and order (each worker "
               "evaluates its own rows of every global batch)");
    double v[5] = {total.loss_sum, static_cast<double>(total.count), static_cast<double>(total.labelled),
                   static_cast<double>(total.correct), static_cast<double>(total.top_k_correct)};
    w.sum(v);
    total.loss_sum = v[0];
    total.count = static_cast<std::uint64_t>(std::llround(v[1]));
    total.labelled = static_cast<std::uint64_t>(std::llround(v[2]));
    total.correct = static_cast<std::uint64_t>(std::llround(v[3]));
    total.top_k_correct = static_cast<std::uint64_t>(std::llround(v[4]));
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
}  // namespace detail

/// Evaluates `m` on every sample of one pass of `data` (epoch 0), through the strategy: each
/// replica computes sums over its shard (s.run), the sums are reduced (s.reduce), and the ratios
/// are taken last. Every sample is counted exactly once — uneven last batches are split, never padded.
/// The workers of a multi-worker job must evaluate the same batches (the same data, batch size and
/// order): a config_error on every worker otherwise, before their sums are added.
template <class Strategy, class Replicated, class Loss>
evaluation evaluate(Strategy& s, Replicated& m, const Loss& loss, const eval_data& data, const evaluate_options& o = {}) {
  static_assert(detail::check_strategy<Strategy>());  // names a missing member
  static_assert(detail::check_loss<Loss, typename Replicated::value_type, typename Replicated::context_type,
                                   typename Replicated::model_type::output_shape>());
  return detail::evaluate_core(detail::core_of(s), m, loss, data, o);
}

/// Evaluates a batch source directly (see the eval_data overload).
template <class Strategy, class Replicated, class Loss, batch_source Source>
evaluation evaluate(Strategy& s, Replicated& m, const Loss& loss, const Source& data, const evaluate_options& o = {}) {
  return evaluate(s, m, loss, eval_data(data), o);
}

/// Evaluates the weights `w` of `m`: weights::ema swaps the EMA in for the pass and restores the
/// live weights bitwise afterwards (with_ema_weights); weights::live is evaluate(s, m, loss, data, o).
/// @throws config_error for weights::ema when `m` holds no EMA.
template <class Strategy, class Replicated, class Loss>
evaluation evaluate(Strategy& s, Replicated& m, const Loss& loss, const eval_data& data, weights w,
                    const evaluate_options& o = {}) {
  if (w == weights::live) return evaluate(s, m, loss, data, o);
  return with_ema_weights(m, [&] { return evaluate(s, m, loss, data, o); });
}

/// evaluate with weights `w` of a batch source (see the eval_data overload).
template <class Strategy, class Replicated, class Loss, batch_source Source>
evaluation evaluate(Strategy& s, Replicated& m, const Loss& loss, const Source& data, weights w,
                    const evaluate_options& o = {}) {
  return evaluate(s, m, loss, eval_data(data), w, o);
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
/// row's outputs on the host. Under replica_count_invariant each replica runs the training step's
/// micro-shards of the batch, one forward pass each, so the outputs are the same bits for any
/// replica count.
template <class Strategy, class Replicated>
predictions predict(Strategy& strategy, Replicated& m, const eval_data& data) {
  static_assert(detail::check_strategy<Strategy>());  // names a missing member
  auto& s = detail::core_of(strategy);
  detail::check_bound(s, m);
  using net = network_of<Replicated>;
  constexpr std::size_t cols = model<net>::output_size;
  const std::size_t n = s.num_replicas();
  const std::size_t grid = detail::evaluation_grid(s);
  predictions p;
  p.width = cols;
  const pass_info info = pass_info::for_evaluation(m.step());
  for (auto& db : data.batches(n)) {
    const std::size_t base = p.indices.size();
    p.indices.insert(p.indices.end(), db.global->indices.begin(), db.global->indices.end());
    p.outputs.resize(p.indices.size() * cols);
    float* dst = p.outputs.data() + base * cols;
    auto per = s.run(
        [&](std::size_t r, const data::shard& sh) {
          auto& rep = m.replica(r);
          detail::for_each_grid_piece(detail::grid_shard(db, sh, r, n, grid), grid, [&](const data::shard& piece) {
            if (piece.size == 0) return;
            const auto* out = rep.predict(piece, info);
            using T = std::remove_cvref_t<decltype(*out)>;
            if constexpr (std::is_same_v<T, float>) {
              copy_to_host(rep.context(), dst + piece.offset * cols, out, piece.size * cols);
            } else {
              std::vector<T> tmp(piece.size * cols);
              copy_to_host(rep.context(), tmp.data(), out, tmp.size());
              std::copy(tmp.begin(), tmp.end(), dst + piece.offset * cols);
            }
            rep.context().synchronize();
          });
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

/// The states of `callbacks` (save_state's values; empty for a callback without one), to put
/// back with reload_callbacks.
inline std::vector<std::vector<double>> callback_states(const std::vector<callback>& callbacks) {
  std::vector<std::vector<double>> out;
  out.reserve(callbacks.size());
  for (const auto& c : callbacks) out.push_back(c.save_state ? c.save_state() : std::vector<double>{});
  return out;
}

/// Puts back the states `saved` (callback_states) of the callbacks that can save and load theirs
/// (after a resume that failed part-way; a callback refusing its own state is left).
inline void reload_callbacks(const std::vector<callback>& callbacks, const std::vector<std::vector<double>>& saved) noexcept {
  for (std::size_t i = 0; i < callbacks.size() && i < saved.size(); ++i)
    if (callbacks[i].save_state && callbacks[i].load_state) try {
        callbacks[i].load_state(std::span<const double>(saved[i].data(), saved[i].size()));
      } catch (...) {
      }
}

/// Hands each callback its state from checkpoint `st` (read from `source`), in order; when one
/// refuses its state, the caller puts back the states it kept (callback_states, reload_callbacks).
/// @throws checkpoint_error when the number of states differs from the number of callbacks, or a
///         state does not fit its callback.
inline void restore_callbacks(const std::vector<callback>& callbacks, const checkpoint_state& st,
                              const std::string& source) {
  const std::string where = "lockstep::fit: " + source + ": section 'callbacks': ";
  if (st.callback_states.size() != callbacks.size())
    throw checkpoint_error(where + "the checkpoint holds the state of " + std::to_string(st.callback_states.size()) +
                           " callbacks, but fit was given " + std::to_string(callbacks.size()) +
                           " callbacks; resume with the same callbacks in the same order");
  for (std::size_t i = 0; i < callbacks.size(); ++i)
    if (!callbacks[i].load_state && !st.callback_states[i].empty())
      throw checkpoint_error(where + "callback " + std::to_string(i) + " has no load_state, but the checkpoint holds " +
                             std::to_string(st.callback_states[i].size()) + " values of state for it");
  for (std::size_t i = 0; i < callbacks.size(); ++i) {
    const auto& saved = st.callback_states[i];
    if (!callbacks[i].load_state) continue;
    try {
      callbacks[i].load_state(std::span<const double>(saved.data(), saved.size()));
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
  /// Global batches per update (gradient accumulation, Keras's meaning: the update batch is
  /// `accumulate` × the pipeline's batch). Schedules, max_steps, progress, step counters and
  /// checkpoints count updates.
  std::size_t accumulate = 1;
  bool drop_partial_update = false;       ///< drop an epoch's last batches that do not fill an update (default: a shorter update)
  double clip_global_norm = 0;            ///< > 0: clip the update's gradient to this global norm (update_recipe)
  float clip_value = 0;                   ///< > 0: clamp each gradient element to [-clip_value, clip_value]
  nonfinite_policy nonfinite = nonfinite_policy::apply;  ///< what a non-finite reduced gradient does (skip, raise)
  std::uint64_t max_consecutive_skips = 20;  ///< nonfinite_policy::skip: numerics_error after this many in a row
  ema_options ema{};                      ///< an exponential moving average of the weights (decay 0: none)
  bool validate_with_ema = false;         ///< validation evaluates the EMA weights (swapped in, then the live ones restored)
  bool show_kernels = false;              ///< host strategies: name the host GEMM's kernels, the elementwise loops' instruction set and the model's precision before the first epoch
  /// A timeline of the steps in `trace_steps`, written by the chief at the end of the run to this
  /// file in the Chrome trace-event format (Perfetto, chrome://tracing; "" = no trace): every
  /// replica's forward and backward per layer, each bucket's reduction, the epilogue, the update,
  /// and the driver's pipeline waits, steps and checkpoint writes, one process per worker.
  std::string trace_file{};
  trace_window trace_steps{};             ///< the updates a trace records (default: steps 10 to 19)

  /// The update recipe these options describe.
  [[nodiscard]] update_recipe recipe() const {
    update_recipe r;
    r.clip_global_norm = clip_global_norm;
    r.clip_value = clip_value;
    r.nonfinite = nonfinite;
    r.max_consecutive_skips = max_consecutive_skips;
    r.ema = ema;
    return r;
  }
};

namespace detail {

/// Everything fit does around the training steps that does not depend on the model's type: the
/// resume position and epoch sums, the learning rate of each update, callbacks, progress, the
/// metrics file and checkpoints. Compiled once, whatever the models a program trains.
class fit_session {
public:
  /// A session for options `o`, an optimiser with base rate `base_lr`, on `replicas` replicas,
  /// for a model that has done `model_step` updates. Only the chief (`chief`) writes progress,
  /// the metrics file and checkpoints.
  fit_session(const fit_options& o, float base_lr, std::size_t replicas, bool chief = true, std::uint64_t model_step = 0)
      : o_(o), replicas_(replicas), chief_(chief) {
    ctl.past = &h;
    ctl.step = model_step;  // a fit continuing a trained model (a resume sets it again)
    ctl.base_lr = base_lr;
    lr = base_lr;
    if (!finite_nonnegative(base_lr))  // a user optimiser's check may allow it
      throw config_error("lockstep::fit: the optimiser's lr is " + option_value(base_lr) +
                         "; it must be finite and >= 0");
    if (!o.checkpoint_dir.empty()) {
      ckpt_.emplace(o.checkpoint_dir, o.keep_checkpoints);
      // Without resume, checkpoints of later steps than the model's are another run's: this run's
      // own would be the older ones, deleted first, and a resume would continue the other run.
      if (const auto other = o.resume ? std::optional<std::filesystem::path>() : ckpt_->latest())
        if (const std::uint64_t step = io::checkpoint_manager::step_of(*other); step > model_step)
          throw config_error("lockstep::fit: checkpoint_dir " + o.checkpoint_dir + " holds checkpoints of another run (" +
                             other->filename().string() + ", step " + std::to_string(step) + ", while the model has done " +
                             std::to_string(model_step) + " updates): this run's would be the ones deleted to keep the "
                             "newest, and a resume would continue the other run; resume from them "
                             "(fit_options::resume), or give an empty or new checkpoint_dir");
    } else if (o.resume || o.checkpoint_every) {
      throw config_error("lockstep::fit: resume and checkpoint_every need checkpoint_dir");
    }
  }

  /// The newest checkpoint to resume from, with its path (none unless resuming and one exists).
  [[nodiscard]] std::optional<std::pair<checkpoint_state, std::string>> checkpoint_to_resume() const {
    if (!o_.resume || !ckpt_) return std::nullopt;
    const auto p = ckpt_->latest();
    if (!p) return std::nullopt;
    return std::make_pair(load_checkpoint(*p), p->string());
  }

  /// Takes over a checkpoint's position, sums, rates and callback states (the model is restored by the caller).
  void resume_from(const checkpoint_state& st, const std::string& source) {
    if (st.has_callback_state) detail::restore_callbacks(o_.callbacks, st, source);
    if (st.has_callback_state && st.stop_requested) {  // a callback had stopped the run: stay stopped
      ctl.stop = true;
      h.stopped_early = st.batches == 0 ? st.epoch < o_.epochs : st.epoch + 1 < o_.epochs;
    }
    start_epoch = st.epoch;
    skip_ = st.batches;
    expected_rows_ = st.consumed_rows_hash;
    resume_source_ = source;
    lr = st.lr;
    resumed_ = {st.epoch_loss_sum, st.epoch_samples, st.epoch_steps, st.epoch_labelled, st.epoch_correct,
                st.epoch_norm_sum, st.epoch_norm_updates, st.epoch_clip_sum, st.epoch_skipped};
    ctl.lr_factor = st.lr_factor;
    ctl.step = st.step;
    ctl.epoch = st.epoch;
    h.resumed_from_step = st.step;
    resume_note_ = resume_line(source, st.epoch, st.step);
  }

  /// Adds to the resume line that the checkpoint was written under precision policy `was` when
  /// the model continues under another, `now` (allowed: the weights are fp32 under every policy).
  void note_precision(const std::string& was, const std::string& now) {
    if (!was.empty() && was != now && !resume_note_.empty())
      resume_note_ += "; written under " + was + ", continuing under " + now;
  }
  /// Adds to the resume line that the checkpoint's EMA of `updates` updates was dropped (this
  /// run has no fit_options::ema: it would stay as it was, stale, in later checkpoints and exports).
  void note_ema_dropped(std::uint64_t updates) {
    if (!resume_note_.empty())
      resume_note_ += "; its EMA of the weights (" + std::to_string(updates) +
                      " updates) is dropped: fit_options::ema is off in this run";
  }

  /// Prints `line` on the progress display (the chief's, unless quiet).
  void note(const std::string& line) {
    if (bar_) bar_->note(line);
  }

  /// Opens (appends to) the metrics file on the chief: before a resume changes anything.
  /// @throws config_error when it cannot be opened.
  void open_metrics_file() {
    if (!o_.metrics_file.empty() && chief_ && !mlog_) mlog_.emplace(o_.metrics_file);
  }

  /// Opens the outputs of the run: the metrics file (open_metrics_file) and the progress bar.
  void open_outputs() {
    open_metrics_file();
    progress_options po = o_.progress;
    po.quiet = po.quiet || o_.quiet || !chief_;
    bar_.emplace(po, o_.epochs, o_.max_steps);
    if (o_.resume && ckpt_) bar_->note(resume_note_.empty() ? fresh_start_line(o_.checkpoint_dir) : resume_note_);
    expected_steps_ = o_.steps_per_epoch;
  }

  /// True while epoch `e` should run.
  [[nodiscard]] bool runs(std::uint64_t e, std::uint64_t model_step) const {
    return e < o_.epochs && !ctl.stop && !limit_reached(model_step);
  }
  /// True once max_steps updates are done.
  [[nodiscard]] bool limit_reached(std::uint64_t model_step) const {
    return o_.max_steps != 0 && model_step >= o_.max_steps;
  }

  /// Starts epoch e: its sums (those of the checkpoint when it is the resumed epoch) and the bar.
  void begin_epoch(std::uint64_t e) {
    ctl.epoch = e;
    t0_ = std::chrono::steady_clock::now();
    // the bar counts updates: under accumulation, those of the resumed epoch so far
    bar_->begin_epoch(e, expected_steps_, ctl.step, e == start_epoch ? (o_.accumulate > 1 ? resumed_.steps : skip_) : 0,
                      e == start_epoch ? resumed_.samples : 0);
    const bool resumed = e == start_epoch;
    correct_ = resumed ? resumed_.correct : 0;
    labelled_ = resumed ? resumed_.labelled : 0;
    loss_sum_ = resumed ? resumed_.loss_sum : 0.0;
    count_ = resumed ? resumed_.samples : 0;
    steps_ = resumed ? resumed_.steps : 0;
    count_before_ = count_;
    norm_sum_ = resumed ? resumed_.norm_sum : 0.0;
    norm_updates_ = resumed ? resumed_.norm_updates : 0;
    clip_sum_ = resumed ? resumed_.clip_sum : 0.0;
    skipped_ = resumed ? resumed_.skipped : 0;
    batches = 0;
    consumed_ = {};
    to_skip = resumed ? skip_ : 0;
  }

  /// The learning rate of the update after `step` updates: base rate × factor, through the schedules.
  [[nodiscard]] float rate_at(std::uint64_t step) const {
    float r = ctl.base_lr * ctl.lr_factor;
    for (const auto& c : o_.callbacks)
      if (c.schedule) r = c.schedule(r, step);
    return r;
  }

  /// Records a finished update of `batches_used` global batches (the model has done
  /// `model_step` updates); true when training must stop now.
  /// Under strategy_options::defer_readback `r` is the previous update's statistics, and `late`
  /// returns the last update's (a host wait) before a checkpoint records the epoch's sums.
  template <class Save, class Late>
  bool end_step(const step_stats& r, std::uint64_t model_step, const Save& save, std::uint64_t batches_used,
                const Late& late) {
    batches += batches_used;
    ++steps_;
    add_stats(r);
    ctl.step = model_step;
    ctl.grad_norm = r.grad_norm;
    ctl.skipped = r.skipped;
    // No rows: under defer_readback the first update of the run, of each epoch and after each
    // checkpoint (the previous update's statistics were read at the epoch's end or for the
    // checkpoint): no loss to report, not a loss of 0.
    const double step_loss =
        r.count ? r.loss_sum / static_cast<double>(r.count) : std::numeric_limits<double>::quiet_NaN();
    for (const auto& c : o_.callbacks)
      if (c.step_end) c.step_end(step_loss, ctl);
    bar_->step(steps_, count_, count_ ? loss_sum_ / static_cast<double>(count_) : std::numeric_limits<double>::quiet_NaN(),
               r.grad_norm, r.clip_factor, skipped_);
    if (ckpt_ && o_.checkpoint_every && model_step % o_.checkpoint_every == 0) {
      add_stats(late());
      save(ctl.epoch, batches);
    }
    return ctl.stop || limit_reached(model_step);
  }

  /// Adds an update's statistics to the epoch's sums (an update read back late: no step of its
  /// own). An update the non-finite guard skipped is only counted as skipped: its loss, rows, hits
  /// and gradient norm (not finite) stay out of the epoch's sums, as its batches stay out of the
  /// model.
  void add_stats(const step_stats& r) {
    if (r.skipped) {
      ++skipped_;
      return;
    }
    if (!std::isnan(r.grad_norm)) {
      norm_sum_ += r.grad_norm;
      clip_sum_ += r.clip_factor;
      ++norm_updates_;
    }
    loss_sum_ += r.loss_sum;
    count_ += r.count;
    correct_ += r.correct;
    labelled_ += r.labelled;
  }

  /// Ends the steps of epoch e (`left`: training stopped with batches of it left): checks the
  /// resume position, and checkpoints an epoch cut short (before its end hooks run: the resumed
  /// run finishes the epoch and runs them once). Returns the epoch's statistics so far, and
  /// whether it finished.
  template <class Save>
  std::pair<epoch_stats, bool> end_steps(std::uint64_t e, std::uint64_t model_step, const Save& save, bool left) {
    const bool finished = !ctl.stop && (!left || !limit_reached(model_step));
    if (finished && batches < to_skip)
      throw checkpoint_error("lockstep::fit: the checkpoint says " + std::to_string(to_skip) + " batches of epoch " +
                             std::to_string(e) + " were consumed, but the epoch has only " + std::to_string(batches));
    const auto t1 = std::chrono::steady_clock::now();
    if (finished || expected_steps_ == 0) expected_steps_ = steps_;
    if (ckpt_ && !finished) save(e, batches);
    epoch_stats st;
    st.epoch = e;
    st.steps = steps_;
    st.samples = count_;
    st.train_loss = count_ ? loss_sum_ / static_cast<double>(count_) : std::numeric_limits<double>::quiet_NaN();
    st.train_accuracy = labelled_ > 0
                            ? static_cast<double>(correct_) / static_cast<double>(labelled_)
                            : std::numeric_limits<double>::quiet_NaN();
    const double train_seconds = std::chrono::duration<double>(t1 - t0_).count();
    st.samples_per_second = train_seconds > 0 ? static_cast<double>(count_ - count_before_) / train_seconds : 0;
    st.lr = lr;
    st.global_step = model_step;
    if (norm_updates_ > 0) {
      st.grad_norm = norm_sum_ / static_cast<double>(norm_updates_);
      st.clip_factor = clip_sum_ / static_cast<double>(norm_updates_);
    }
    st.skipped_updates = skipped_;
    st.cut_short = !finished && !ctl.stop;
    return {st, finished};
  }

  /// Ends epoch e (validation already in `st`): callbacks, progress, metrics, the epoch-end
  /// checkpoint. An epoch max_steps cut short goes to the history and the progress display only:
  /// callbacks and the metrics file see each epoch once, whole (a resumed run completes it).
  template <class Save>
  void end_epoch(epoch_stats st, bool finished, const Save& save) {
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    h.epochs.push_back(st);
    if (!st.cut_short)
      for (const auto& c : o_.callbacks)
        if (c.epoch_end) c.epoch_end(h.epochs.back(), ctl);
    bar_->end_epoch(st);
    if (mlog_ && !st.cut_short) mlog_->write(st);
    if (ckpt_ && finished) save(st.epoch + 1, 0);
    if (ctl.stop && st.epoch + 1 < o_.epochs) h.stopped_early = true;
  }

  /// Fills the run's part of checkpoint `st` at (epoch, batches consumed) and writes it (the
  /// caller checks the factor first on every worker: check_factor).
  void save(checkpoint_state st, std::uint64_t epoch, std::uint64_t batches_done, std::uint64_t seed) {
    if (!chief_) return;
    st.epoch = epoch;
    st.batches = batches_done;
    st.base_lr = ctl.base_lr;
    st.lr_factor = ctl.lr_factor;
    st.lr = lr;
    st.seed = seed;
    st.data_seed = o_.data_seed;
    st.replicas = static_cast<std::uint32_t>(replicas_);
    st.consumed_rows_hash = batches_done != 0 ? consumed_.rows : batch_tally{}.rows;
    st.callback_states.reserve(o_.callbacks.size());
    for (const auto& c : o_.callbacks) st.callback_states.push_back(c.save_state ? c.save_state() : std::vector<double>{});
    st.stop_requested = ctl.stop;
    if (batches_done != 0) {  // mid-epoch: the sums of the epoch so far, so its stats come out whole
      st.epoch_loss_sum = loss_sum_;
      st.epoch_samples = count_;
      st.epoch_steps = steps_;
      st.epoch_labelled = labelled_;
      st.epoch_correct = correct_;
      st.epoch_norm_sum = norm_sum_;
      st.epoch_norm_updates = norm_updates_;
      st.epoch_clip_sum = clip_sum_;
      st.epoch_skipped = skipped_;
    }
    ckpt_->save(st);
  }

  /// The first epoch to run (the checkpoint's when resuming).
  [[nodiscard]] std::uint64_t first_epoch() const noexcept { return start_epoch; }
  /// True (and counts global batch `b` as consumed) while the epoch's batches are those consumed
  /// before the checkpoint being resumed.
  /// @throws checkpoint_error when, the last of them counted, their rows differ from those the
  /// checkpoint recorded (another batch size, shuffle or data: samples would be trained twice or never).
  bool skip_consumed(const data::batch& b) {
    if (batches >= to_skip) return false;
    ++batches;
    consumed_.add(b.indices);
    if (batches == to_skip && expected_rows_ && consumed_.rows != *expected_rows_)
      throw checkpoint_error("lockstep::fit: " + resume_source_ + ": section 'fit pipeline position' (FPIP): the " +
                             std::to_string(to_skip) + " batches of epoch " + std::to_string(ctl.epoch) +
                             " consumed before the checkpoint are not those the pipeline gives now (their rows' "
                             "dataset indices or counts differ: another batch size, shuffle or dataset size); "
                             "resuming would train samples twice or never (resume with the pipeline that wrote it)");
    return true;
  }
  /// Counts global batch `db` as consumed (trained, accumulated or dropped) for the checkpoint's
  /// record of the epoch's rows.
  void consume(const data::distributed_batch& db) { consumed_.add(db); }
  /// Counts `n` batches of the epoch as consumed without an update (fit_options::drop_partial_update).
  void drop_batches(std::uint64_t n) noexcept { batches += n; }
  /// The learning rate of the update after `step` updates (rate_at), remembered as the last rate.
  /// @throws config_error when it is negative or not finite (a schedule's or a callback's factor
  /// gone wrong: refused before it trains, or lands in a checkpoint that cannot be resumed).
  float next_rate(std::uint64_t step) {
    check_factor();
    const float r = rate_at(step);
    if (!finite_nonnegative(r))
      throw config_error("lockstep::fit: the learning rate of update " + std::to_string(step + 1) + " is " +
                         option_value(r) + " (the optimiser's lr " + option_value(ctl.base_lr) + " x factor " +
                         option_value(ctl.lr_factor) + ", through the schedules); it must be finite and >= 0");
    lr = r;
    return lr;
  }
  /// The run's history (the session is done with it).
  [[nodiscard]] history take_history() noexcept { return std::move(h); }

  /// @throws config_error when a callback left training_control::lr_factor negative or not finite
  /// (what a checkpoint must not hold: its reader refuses it).
  void check_factor() const {
    if (!finite_nonnegative(ctl.lr_factor))
      throw config_error("lockstep::fit: a callback set training_control::lr_factor to " +
                         option_value(ctl.lr_factor) + " (after " + std::to_string(ctl.step) +
                         " updates); it must be finite and >= 0");
  }

private:
  history h;                          // the result
  training_control ctl;               // what callbacks see and change
  float lr = 0;                       // the rate of the last update (the checkpoint's when resuming)
  std::uint64_t start_epoch = 0;      // the first epoch to run
  std::uint64_t batches = 0;          // global batches of the epoch in progress consumed so far
  std::uint64_t to_skip = 0;          // batches of this epoch consumed before the checkpoint

  const fit_options& o_;
  std::size_t replicas_;
  bool chief_ = true;
  std::optional<io::checkpoint_manager> ckpt_;
  std::optional<metrics_log> mlog_;
  std::optional<progress> bar_;
  std::string resume_note_;  // resume_line of the checkpoint resumed from (empty: a fresh start)
  struct epoch_sums {
    double loss_sum = 0;
    std::uint64_t samples = 0, steps = 0, labelled = 0, correct = 0;
    double norm_sum = 0;
    std::uint64_t norm_updates = 0;
    double clip_sum = 0;
    std::uint64_t skipped = 0;
  };
  epoch_sums resumed_;  // the sums of the resumed epoch so far (from its checkpoint)
  std::uint64_t skip_ = 0;
  batch_tally consumed_;                         // the batches of the epoch consumed so far
  std::optional<std::uint64_t> expected_rows_;   // the resumed checkpoint's hash of them (FPIP)
  std::string resume_source_;                    // the resumed checkpoint's path
  std::uint64_t expected_steps_ = 0;
  std::chrono::steady_clock::time_point t0_{};
  double loss_sum_ = 0;
  std::uint64_t count_ = 0, steps_ = 0, count_before_ = 0;
  std::uint64_t correct_ = 0, labelled_ = 0;  // training top-1 hits of the epoch in progress, and labelled rows
  double norm_sum_ = 0, clip_sum_ = 0;        // the epoch's updates' gradient norms and clip factors
  std::uint64_t norm_updates_ = 0, skipped_ = 0;  // updates whose norm was computed; updates skipped
};

/// Throws config_error naming `option` unless the directory file `path` goes into exists and may
/// be written: before training, for an output written only at its end.
inline void check_output_directory(const std::string& path, const char* option) {
  const std::filesystem::path dir = io::directory_of(path);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    throw config_error("lockstep::fit: " + std::string(option) + " " + path + ": the directory " + dir.string() +
                       " does not exist (the file is written when the run ends)");
  if (::access(dir.c_str(), W_OK) != 0)
    throw config_error("lockstep::fit: " + std::string(option) + " " + path + ": the directory " + dir.string() +
                       " is not writable: " + std::strerror(errno));
}

/// The model seed recorded in checkpoints: the model's own, or fit_options::seed.
template <class M>
std::uint64_t model_seed(const M& m, const fit_options& o) {
  if constexpr (requires { m.seed().value; })
    return m.seed().value;
  else
    return o.seed;
}

/// Where a fit starts and what it runs, as every worker of a multi-worker fit must agree on it
/// before the first step (start_agreement): whether this worker's setup failed (then the other
/// fields mean nothing), the start position (checkpoint `ck`'s when resuming, with a hash of its
/// parameters; else step `model_step` of epoch 0), and the options and values (the optimizer's
/// learning rate `lr` and its other `hyperparameters`, optimizer_hyperparameters; the loss's
/// `loss_options`, loss_hyperparameters) that count, validate or change the updates (a worker would wait in a collective that another
/// never starts, or the replicas would drift apart); an option that cannot act in this run (top_k
/// without validation, max_consecutive_skips without the skip policy, the EMA's schedule without
/// an EMA) is compared as 0 or "none".
inline collective_plan start_plan(bool failed, const fit_options& o, double lr, std::string_view hyperparameters,
                                  std::string_view loss_options, std::uint64_t seed, const checkpoint_state* ck,
                                  std::uint64_t model_step) {
  // hashed; -0 as +0 (they act alike, so workers holding one and the other agree)
  const auto exact = [](double x) { return std::to_string(std::bit_cast<std::uint64_t>(x == 0 ? 0.0 : x)); };
  const auto given = [](bool b) -> std::uint64_t { return b ? 1 : 0; };
  // The parameters of the checkpoint to resume, as bytes (hashed; none without one).
  const std::string_view resumed =
      ck ? std::string_view(reinterpret_cast<const char*>(ck->parameters.data()), ck->parameters.size() * sizeof(float))
         : std::string_view();
  collective_plan p;
  p.add("fit's setup failed (1: yes; that worker raises its own error)", given(failed));
  p.add("step to start from (the checkpoint's, when resuming)", ck ? ck->step : model_step)
      .add("epoch to start from", ck ? ck->epoch : 0)
      .add("batches of that epoch already trained", ck ? ck->batches : 0)
      .add_hashed("the parameters of the checkpoint resumed", resumed)
      .add("fit_options::epochs", o.epochs)
      .add("fit_options::max_steps", o.max_steps)
      .add("fit_options::accumulate", o.accumulate)
      .add("fit_options::drop_partial_update", given(o.drop_partial_update))
      .add("fit_options::validation (1: given)", given(static_cast<bool>(o.validation)))
      .add("fit_options::validate_with_ema", given(o.validate_with_ema))
      .add("fit_options::top_k (with validation; else 0)", o.validation ? o.top_k : 0)
      .add("fit_options::trace_file (1: given)", given(!o.trace_file.empty()))
      .add("fit_options::callbacks (their number)", o.callbacks.size())
      .add("the model seed", seed)
      .add("fit_options::data_seed", o.data_seed)
      .add_hashed("the optimizer's learning rate", exact(lr))
      .add_hashed("the optimizer's other hyperparameters", hyperparameters)
      .add_hashed("the loss's hyperparameters", loss_options)
      .add_hashed("fit_options::clip_global_norm", exact(o.clip_global_norm))
      .add_hashed("fit_options::clip_value", exact(o.clip_value))
      .add("fit_options::nonfinite", static_cast<std::uint64_t>(o.nonfinite))
      .add("fit_options::max_consecutive_skips (under nonfinite_policy::skip; else 0)",
           o.nonfinite == nonfinite_policy::skip ? o.max_consecutive_skips : 0)
      .add_hashed("fit_options::ema", o.ema.decay > 0 ? exact(o.ema.decay) + "," + std::to_string(o.ema.start_step) +
                                                            "," + std::to_string(o.ema.every)
                                                      : std::string("none"))
      .remedy("every worker must call fit with the same model, optimizer and options, and a resume must find the "
              "same newest checkpoint on every worker: keep checkpoint_dir on a file system that every worker shares");
  return p;
}

/// The agreement of a multi-worker fit's workers on start_plan: one collective (the world's
/// agree; nothing in one process), with a config_error on every worker when their plans differ.
/// Made before fit's setup (option checks, the checkpoint search, the metrics file), which can
/// fail on some workers only: a failing worker's guard still takes part in the agreement as it
/// unwinds, so the others get a config_error naming it instead of waiting for it in their first
/// collective, and it raises its own error.
template <class World>
class start_agreement {
public:
  /// A guard for the setup that follows, on world `w`.
  explicit start_agreement(World& w) noexcept : w_(w), uncaught_(std::uncaught_exceptions()) {}
  start_agreement(const start_agreement&) = delete;
  start_agreement& operator=(const start_agreement&) = delete;
  /// While the setup unwinds: agrees on a failed setup (errors swallowed: this worker's own propagates).
  ~start_agreement() {
    if (done_ || std::uncaught_exceptions() <= uncaught_) return;
    try {
      agree([] { return start_plan(true, fit_options{}, 0, {}, {}, 0, nullptr, 0); });
    } catch (...) {  // the setup's own error is on its way
    }
  }

  /// Agrees on the plan that `make_plan()` returns (a start_plan of a setup that succeeded),
  /// made only where there is another worker to agree with (in one process it would hash the
  /// resumed checkpoint's parameters for nothing). Collective.
  /// @throws config_error when the workers' plans differ.
  template <class MakePlan>
  void agree(MakePlan&& make_plan) {
    if constexpr (requires(const collective_plan& p) { w_.agree(p); }) {
      if (w_.size() > 1) {
        // A plan that fails to be made (a user's hyperparameters(), memory) leaves done_ false:
        // the guard then agrees on a failed setup as the error unwinds.
        const collective_plan plan = std::forward<MakePlan>(make_plan)();
        done_ = true;
        w_.agree(plan);
        return;
      }
    }
    done_ = true;
  }

private:
  World& w_;
  int uncaught_;
  bool done_ = false;
};

/// Checks that checkpoint `st` read from `source` was written by this model, seed (model_seed(m,
/// o)), pipeline seed (fit_options::data_seed) and kind of optimiser.
template <class Replicated, class Optimizer>
void check_resumable(const Replicated& m, const Optimizer& optimizer, const checkpoint_state& st,
                     const std::string& source, const fit_options& o) {
  using net = network_of<Replicated>;
  check_signature(st, model_signature<net>(), source, model_name<net>());
  constexpr bool own_seed = requires { m.seed().value; };
  // Where the seeds are: fit's section from format 3 on, the rng section before.
  const std::string section = st.version >= 3 ? "section 'fit' (FITS)" : "section 'rng'";
  if (const std::uint64_t seed = model_seed(m, o); st.seed != seed)
    throw checkpoint_error("lockstep::fit: " + source + ": " + section + ": the checkpoint's model seed " +
                           std::to_string(st.seed) + " differs from " +
                           (own_seed ? "this model's seed " : "fit_options::seed (this model does not know its seed) ") +
                           std::to_string(seed) + "; resuming would not be exact");
  if (st.data_seed != o.data_seed)  // the pipeline's order would differ: batches trained twice or never
    throw checkpoint_error("lockstep::fit: " + source + ": " + section + ": the checkpoint's pipeline seed " +
                           std::to_string(st.data_seed) + " differs from fit_options::data_seed " +
                           std::to_string(o.data_seed) + "; resuming would not be exact (give the pipeline and "
                           "data_seed the seed of the run that wrote it)");
  check_optimizer_state(st, optimizer, model<net>::param_count, source);
}

/// Multi-worker fit: the workers agree, at the end of epoch `epoch`, on the batches they trained
/// in it (`trained`: their number and a hash of their rows' dataset indices):
/// pipelines that differ (a shuffle seeded per worker, another dataset) would otherwise train on
/// mixed global batches without a word. Collective; a config_error on every worker when they differ.
template <class World>
void agree_on_epoch(World& w, std::uint64_t epoch, const batch_tally& trained) {
  const std::string of = "epoch " + std::to_string(epoch) + "'s batches";
  trained.agree(w, "number of " + of, "the dataset indices of " + of,
                "every worker must build the same input pipeline: the same dataset, batch size and shuffle seed; the "
                "strategy cuts each global batch among the workers");
}

/// fit on the strategy's core class (see lockstep::fit).
template <class Strategy, class Replicated, class Optimizer, class Loss, class Source>
history fit_core(Strategy& s, Replicated& m, const Optimizer& optimizer, const Loss& loss, const Source& train,
                 const fit_options& o) {
  check_bound(s, m);
  auto&& w = world_of(s);
  // The workers agree on where they start before the first step, also when the setup below fails
  // on some of them (start_agreement).
  start_agreement<std::remove_reference_t<decltype(w)>> agreement(w);
  // Every option is checked before anything changes (a resume restores the model and callbacks).
  const update_recipe recipe = o.recipe();
  recipe.check();
  check_hyperparameters(optimizer);
  check_loss_options(loss);
  if (o.accumulate == 0) throw config_error("lockstep::fit: fit_options::accumulate must be >= 1");
  if constexpr (!requires { s.accumulate(m, loss, std::declval<const data::distributed_batch&>()); })
    if (o.accumulate > 1)
      throw config_error("lockstep::fit: fit_options::accumulate > 1 needs a strategy with accumulate(model, loss, batch)");
  constexpr bool takes_recipe = requires(const Optimizer& op) {
    s.train_step(m, op, loss, std::declval<const data::distributed_batch&>(), recipe);
  };
  if constexpr (!takes_recipe) {
    if (recipe.needs_epilogue() || recipe.clip_value > 0 || recipe.ema.decay > 0)
      throw config_error("lockstep::fit: clipping, the non-finite guard and the EMA need a strategy whose train_step "
                         "takes a lockstep::update_recipe");
  }
  if (o.validate_with_ema && recipe.ema.decay <= 0)
    throw config_error("lockstep::fit: fit_options::validate_with_ema needs fit_options::ema");
  if (o.top_k == 0) throw config_error("lockstep::fit: fit_options::top_k must be >= 1");
  const shard_plan plan = w.plan();
  if constexpr (!requires(trace_recorder* r) { s.set_trace(r); })
    if (!o.trace_file.empty())
      throw config_error("lockstep::fit: fit_options::trace_file needs a strategy with set_trace(trace_recorder*)");
  if (!o.trace_file.empty() && w.is_chief()) check_output_directory(o.trace_file, "fit_options::trace_file");
  fit_session run(o, optimizer.lr, plan.parts, w.is_chief(), m.step());  // plan.parts: the replicas of every worker
  run.open_metrics_file();  // a file that cannot be opened is refused before a resume changes anything
  // Automatic optimiser sharding is decided before a checkpoint's state is restored into slices.
  if constexpr (requires { s.prepare_update(m, optimizer); }) s.prepare_update(m, optimizer);
  auto ck = run.checkpoint_to_resume();
  if (ck) {
    try {
      check_resumable(m, optimizer, ck->first, ck->second, o);
    } catch (const checkpoint_error& e) {  // the checkpoint is another run's: say what to do
      throw checkpoint_error(std::string(e.what()) +
                             " (resume with the model, seed and optimiser that wrote it, or use another checkpoint_dir)");
    }
  }
  agreement.agree([&] {
    return start_plan(false, o, optimizer.lr, optimizer_hyperparameters(optimizer), loss_hyperparameters(loss),
                      model_seed(m, o), ck ? &ck->first : nullptr, m.step());
  });
  // the callbacks' states before this fit: a resume that fails gives them back
  const auto callbacks_before = ck ? callback_states(o.callbacks) : std::vector<std::vector<double>>{};
  for (const auto& c : o.callbacks)  // stateful callbacks forget an earlier fit (a resume then restores theirs)
    if (c.train_begin) c.train_begin();
  if (ck) {
    try {
      run.resume_from(ck->first, ck->second);  // refuses callback states that do not fit, before the model changes
      if constexpr (requires { m.precision(); })
        run.note_precision(static_cast<const model_state&>(ck->first).precision,
                           std::string(precision_name(m.precision())));
      restore(m, static_cast<const model_state&>(ck->first), optimizer, ck->second);
      if constexpr (requires { m.has_ema(); })
        if (o.ema.decay == 0 && m.has_ema()) {  // nothing would update it
          run.note_ema_dropped(m.ema_updates());
          m.load_ema({}, 0);
        }
    } catch (...) {  // the callbacks get their states back
      reload_callbacks(o.callbacks, callbacks_before);
      throw;
    }
  }
  ck.reset();  // its parameters and optimiser state are in the model now: not held for the whole run
  run.open_outputs();
  if constexpr (requires { typename Strategy::kind_type; })
    if constexpr (std::is_same_v<typename Strategy::kind_type, cpus>) {
      if (o.show_kernels)
        run.note("lockstep: host GEMM " + host_gemm_name() + ", loops " + host_loops_name() + ", precision " +
                 host_precision_description(m.precision()));
      if (const std::string warning = host_gemm_warning(); !warning.empty()) run.note(warning);
      if (const std::string warning = host_precision_warning(m.precision()); !warning.empty()) run.note(warning);
    }
  fit_tracer<Strategy> trace(s, w, o.trace_file, o.trace_steps, s.num_replicas());
  const auto save = [&](std::uint64_t epoch, std::uint64_t batches) {
    run.check_factor();  // on every worker alike (only the chief writes; the others must not go on)
    if (w.is_chief()) {
      const std::int64_t t0 = trace.now();
      run.save(capture(m, optimizer), epoch, batches, model_seed(m, o));
      trace.driver_span("checkpoint", "io", t0, trace.now(), "step", static_cast<std::int64_t>(m.step()));
    }
  };
  const std::size_t k = o.accumulate;
  if constexpr (requires { s.abandon_update(); }) s.abandon_update();  // no batch of an earlier call is part of an update
  std::size_t group = 0;  // global batches of the update in progress
  // The last batch of an update completes it (train_step); the ones before it accumulate.
  // Returns true when training must stop.
  // strategy_options::defer_readback: the statistics of the update train_step has not returned yet.
  const auto late = [&]() -> step_stats {
    if constexpr (requires { s.flush_stats(m); })
      return s.flush_stats(m);
    else
      return {};
  };
  std::int64_t waited_from = trace.now();  // the driver's pipeline wait: from the last step's end to the next batch
  // More than one worker: the batches of the epoch that this worker trained (accumulated, or dropped
  // as a partial update), compared at the epoch's end (agree_on_epoch). Counted when trained, not
  // when loaded: a batch past a stop that loaded on some workers only is not part of it.
  const bool compare_pipelines = w.size() > 1;
  batch_tally trained;
  const auto batch_of_update = [&](const data::distributed_batch& db, bool epoch_ends) -> bool {
    ++group;
    run.consume(db);
    if (compare_pipelines) trained.add(db);
    trace.begin_step(m.step());
    const std::int64_t t0 = trace.now();
    trace.driver_span("pipeline wait", "pipeline", waited_from, t0, "step", static_cast<std::int64_t>(m.step()));
    if (group < k && !epoch_ends) {
      if constexpr (requires { s.accumulate(m, loss, db); }) (void)s.accumulate(m, loss, db);
      trace.driver_span("accumulate", "step", t0, trace.now(), "step", static_cast<std::int64_t>(m.step()));
      waited_from = trace.now();
      return false;
    }
    if (group < k && o.drop_partial_update) {  // an epoch's last batches that do not fill an update
      if constexpr (requires { s.abandon_update(); }) s.abandon_update();
      run.drop_batches(group);
      group = 0;
      return false;
    }
    Optimizer opt = optimizer;
    opt.lr = run.next_rate(m.step());
    step_stats r;
    const std::uint64_t step = m.step();
    if constexpr (takes_recipe)
      r = s.train_step(m, opt, loss, db, recipe);
    else
      r = s.train_step(m, opt, loss, db);
    trace.driver_span("train_step", "step", t0, trace.now(), "step", static_cast<std::int64_t>(step));
    const std::uint64_t used = group;
    group = 0;
    const bool stop = run.end_step(r, m.step(), save, used, late);
    waited_from = trace.now();
    return stop;
  };
  for (std::uint64_t e = run.first_epoch(); run.runs(e, m.step()); ++e) {
    run.begin_epoch(e);
    group = 0;
    trained = {};
    std::optional<data::distributed_batch> held;  // under accumulation, one batch is held back to know the epoch's last
    bool stopped = false;
    auto&& epoch_batches = train.epoch(e);
    auto it = std::ranges::begin(epoch_batches);
    const auto end = std::ranges::end(epoch_batches);
    for (bool first = true;; first = false) {
      std::optional<data::distributed_batch> db;
      std::exception_ptr failed;  // under accumulation: the batch after the held one failed to load
      try {
        if (!first) ++it;
        if (it == end) break;
        auto&& b = *it;
        bool consumed = false;  // resume: the batch was consumed before the checkpoint
        try {
          consumed = run.skip_consumed(b);
        } catch (const checkpoint_error&) {  // another pipeline: the callbacks get their states back
          reload_callbacks(o.callbacks, callbacks_before);
          throw;
        }
        if (consumed) continue;
        db.emplace(data::detail::make_sharded(std::move(b), plan.parts, plan.first, s.num_replicas()));
      } catch (...) {
        if (k == 1 || !held) throw;
        failed = std::current_exception();
      }
      if (failed) {
        // The held batch is not the epoch's last (another follows): it is trained as such, and
        // the error is raised unless training stops there (the failed batch is then left for a
        // later run to meet, as without accumulation).
        stopped = batch_of_update(*held, false);
        held.reset();
        if (!stopped) std::rethrow_exception(failed);
        break;
      }
      if (k == 1) {
        if ((stopped = batch_of_update(*db, false))) break;
        continue;
      }
      if (held && (stopped = batch_of_update(*held, false))) break;
      held = std::move(db);
    }
    if (held && !stopped) (void)batch_of_update(*held, true);
    // Training stopped with batches of the epoch left (under accumulation the batch after the
    // held one is, loaded or failed; otherwise look at the next). A batch past the stop that
    // fails to load (a reader's error, a stage's) is left for a later run to meet: this run ends
    // as asked, with its checkpoint.
    const bool left = stopped && (k > 1 || [&] {
                        try {
                          return ++it != end;
                        } catch (const std::exception&) {
                          return true;
                        }
                      }());
    run.add_stats(late());  // defer_readback: the epoch's last update
    if (compare_pipelines) agree_on_epoch(w, e, trained);
    auto [st, finished] = run.end_steps(e, m.step(), save, left);
    if (o.validation) {
      const evaluation v =
          o.validate_with_ema && m.has_ema()
              ? with_ema_weights(m, [&] { return evaluate_core(s, m, loss, o.validation, evaluate_options{o.top_k}); })
              : evaluate_core(s, m, loss, o.validation, evaluate_options{o.top_k});
      st.val_loss = v.loss;
      st.val_accuracy = v.accuracy;
      st.val_top_k_accuracy = v.top_k_accuracy;
      st.val_top_k = v.k;
      st.val_samples = v.samples;
    }
    run.end_epoch(st, finished, save);
    waited_from = trace.now();  // validation and the epoch's end are not pipeline waits
  }
  const trace_written tw = trace.finish(w, w.is_chief());
  if (tw.bytes > 0) run.note(trace_line(o.trace_file, tw));
  return run.take_history();
}

}  // namespace detail

/// Trains `m` with synchronous data-parallel steps through strategy `s`: for each epoch e, the
/// global batches of `train.epoch(e)` are cut into one shard per replica and each is one
/// train_step; the learning rate of each update is optimizer.lr times the control's factor, passed
/// through the schedules of the callbacks. After each epoch: validation, callbacks, progress, the
/// metrics file and (with checkpoint_dir) a checkpoint. With `resume`, the newest checkpoint is
/// loaded and training continues at its exact position (epoch and batches consumed, the sums of
/// that epoch so far, the callbacks' states), so the result is bitwise the same as an
/// uninterrupted run.
/// @throws config_error when `m` was made by another strategy; checkpoint_error when resuming
///         from a bad checkpoint, one whose number of callback states differs from the number of
///         callbacks, or one whose optimiser state does not fit `optimizer`
///         (check_optimizer_state); anything a step throws.
template <class Strategy, class Replicated, class Optimizer, class Loss, batch_source Source>
history fit(Strategy& s, Replicated& m, const Optimizer& optimizer, const Loss& loss, const Source& train,
            const fit_options& o = {}) {
  // Member by member, so that a type that lacks one is told which.
  static_assert(detail::check_training_strategy<Strategy, Replicated, Optimizer, Loss>());
  static_assert(detail::check_optimizer<Optimizer, typename Replicated::value_type, typename Replicated::context_type>());
  static_assert(detail::check_loss<Loss, typename Replicated::value_type, typename Replicated::context_type,
                                   typename Replicated::model_type::output_shape>());
  return detail::fit_core(detail::core_of(s), m, optimizer, loss, train, o);
}

}  // namespace lockstep
