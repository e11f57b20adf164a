#pragma once
/// @file update_phase.hpp
/// Internal: the update of a replicated model once its replicas hold the reduced gradient sums of
/// an update — what every step policy hands the end of an update to (step_policy.hpp), written
/// once for every world and device kind: the epilogue (epilogue.hpp) decides the scale, the
/// clip factor and whether the update is skipped, then the sharded or whole optimiser update
/// (sharded_update.hpp) applies the optimiser and the EMA.
///
/// Host replicas decide on the host, each from the same chunk sums (which a policy may have
/// filled while it summed, else each replica scans its own reduced gradient: one pass), so every
/// replica decides the same. Replicas in device memory decide on their device
/// (`reduced_gradient_epilogue`, found by argument-dependent lookup on the context: the CUDA
/// backend's backend/cuda/epilogue.cuh) and the optimiser's kernel reads the decision there, so
/// the host does not wait for it before the update is queued; the decision is read back after
/// (with the next step under strategy_options::defer_readback: copied to the context's readback
/// page, backend/readback.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include <lockstep/backend/context.hpp>
#include <lockstep/core/trace.hpp>
#include <lockstep/distribute/epilogue.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/sharded_update.hpp>
#include <lockstep/losses/loss.hpp>
#include <lockstep/memory/buffer.hpp>
#include <lockstep/optimizers/optimizer.hpp>

namespace lockstep::detail {

/// The epilogue's buffers a strategy keeps between updates (grown on first use, then reused).
template <class Kind>
struct epilogue_workspace {
  std::vector<double> shared;                          ///< chunk sums a step policy fills while summing
  std::vector<std::vector<double>> per_replica;        ///< chunk sums each replica scanned itself
  std::vector<epilogue_result> results;                ///< each replica's decision
  std::vector<char> nonfinite_loss;                    ///< per replica: a batch of the update had a non-finite loss
  std::vector<basic_buffer<double, Kind>> device_chunks;        ///< device kinds: chunk sums on the device
  std::vector<basic_buffer<update_decision, Kind>> device_decision;  ///< device kinds: the decision on the device

  /// Sized for `replicas` replicas and `params` parameters (models of several sizes may take
  /// turns on one strategy: the buffers keep their capacity, so a steady alternation allocates
  /// nothing).
  void prepare(std::size_t replicas, std::size_t params) {
    const std::size_t chunks = epilogue_chunks(params);
    if (shared.size() != chunks) shared.assign(chunks, 0.0);
    if (per_replica.size() != replicas) per_replica.resize(replicas);
    for (auto& c : per_replica)
      if (c.size() != chunks) c.assign(chunks, 0.0);
    if (results.size() != replicas) results.assign(replicas, epilogue_result{});
    if (nonfinite_loss.size() != replicas) nonfinite_loss.assign(replicas, 0);
    if constexpr (!device_memory<Kind>::host_accessible) {
      device_chunks.resize(replicas);
      device_decision.resize(replicas);
    }
  }
};

/// True when context Ctx's backend makes the epilogue's decision on its device.
template <class Ctx>
concept device_epilogue = requires(Ctx& ctx, const float* g, std::size_t n, const epilogue_inputs& in, double* c,
                                   update_decision* d) { reduced_gradient_epilogue(ctx, g, n, in, c, d); };

/// The batches of an update before its last one: nothing to apply; notes non-finite losses.
template <class Kind>
class accumulate_phase {
public:
  /// A phase recording into `ws`.
  explicit accumulate_phase(epilogue_workspace<Kind>& ws) : ws_(&ws) {}
  /// Records replica r's loss of one (micro-)shard.
  void observe(std::size_t r, const loss_sum& l) noexcept {
    if (!(l.sum - l.sum == 0)) ws_->nonfinite_loss[r] = 1;
  }
  /// No chunk sums are wanted.
  [[nodiscard]] bool wants_chunks() const noexcept { return false; }
  /// No chunk sums.
  [[nodiscard]] double* chunks() noexcept { return nullptr; }
  /// Never called before the last batch.
  void apply(std::size_t, bool) noexcept {}
  /// No second phase.
  [[nodiscard]] bool gathers() const noexcept { return false; }
  /// Never called.
  void gather(std::size_t) noexcept {}

private:
  epilogue_workspace<Kind>* ws_;
};

/// Replica r's copy of the other replicas' updated slices of `m`: through `reducer` when the
/// update is sharded on the epilogue's grid for it (reduces_to_slices_v: an all-gather, ordered on
/// the replica's context), else the update plan's copies.
template <class Replicated, class Reducer>
void gather_update(Replicated& m, Reducer& reducer, std::size_t r) {
  if constexpr (reduces_to_slices_v<Reducer>) {
    if (m.update_plan().on_grid()) {
      auto& rep = m.replica(r);
      reducer.gather_slices(r, rep.context(), rep.model().parameters().data(), m.update_plan().slices());
      m.update_plan().gather_weight_copy(m.replicas(), r);
      return;
    }
  }
  (void)reducer;
  m.update_plan().gather(m.replicas(), r);
}

/// A whole update with the optimiser alone (no recipe): what run_update (steps/step_policy.hpp) runs.
template <class Replicated, class Optimizer, class Reducer>
struct plain_update_phase {
  Replicated* m;          ///< the model
  const Optimizer* opt;   ///< the optimiser
  update_info update;     ///< lr, step and grad_scale of the update
  Reducer* reducer;       ///< the strategy's reducer (it gathers the slices of an update sharded on its grid)
  /// Nothing to record.
  void observe(std::size_t, const loss_sum&) noexcept {}
  /// No chunk sums are wanted.
  [[nodiscard]] bool wants_chunks() const noexcept { return false; }
  /// No chunk sums.
  [[nodiscard]] double* chunks() noexcept { return nullptr; }
  /// Replica r applies the optimiser to its slice.
  void apply(std::size_t r, bool) { m->update_plan().apply(m->replica(r), r, *opt, update, false, 0.0); }
  /// True when the update is sharded.
  [[nodiscard]] bool gathers() const noexcept { return m->optimizer_sharded(); }
  /// Replica r copies the others' slices.
  void gather(std::size_t r) { gather_update(*m, *reducer, r); }
};

/// The update of model `m` with optimiser `opt` (see the file comment); the reducer sums the
/// epilogue's chunk sums and gathers the slices of an update sharded on its grid
/// (reduces_to_slices_v), whose replicas each hold the reduced sums of their own slice only.
template <class Replicated, class Optimizer, class Reducer>
class update_phase {
public:
  using kind_type = typename Replicated::replica_type::device_type;  ///< the device kind
  using value_type = typename Replicated::value_type;                ///< parameter type
  static constexpr std::size_t param_count = Replicated::param_count;  ///< parameters

  /// The update of `m` by `opt` following `recipe`, from `base` (lr and step), over `rows` rows
  /// whose sums carry `loss_scale`, with the buffers of `ws` and the strategy's `reducer`.
  update_phase(Replicated& m, const Optimizer& opt, const update_recipe& recipe, const update_info& base,
               std::size_t rows, double loss_scale, epilogue_workspace<kind_type>& ws, Reducer& reducer)
      : m_(&m), opt_(&opt), recipe_(&recipe), base_(base), ws_(&ws), reducer_(&reducer) {
    in_.rows = rows;
    in_.loss_scale = loss_scale;
    in_.clip_global_norm = recipe.clip_global_norm;
    in_.nonfinite = recipe.nonfinite;
    base_.clip_value = recipe.clip_value;
    base_.grad_scale = 1.0 / (static_cast<double>(rows) * loss_scale);
    ema_ = recipe.ema_at(m.step() + 1);
    ema_decay_ = m.has_ema() ? recipe.ema.decay : 0.0;  // the EMA's first update takes the weights
    ws.prepare(m.size(), param_count);
  }

  /// Records the epilogue of each replica as a span on `rec` (null: none).
  void set_trace(trace_recorder* rec) noexcept { trace_ = rec; }

  /// Records replica r's loss of one (micro-)shard.
  void observe(std::size_t r, const loss_sum& l) noexcept {
    if (!(l.sum - l.sum == 0)) ws_->nonfinite_loss[r] = 1;
  }
  /// True when a policy that sums every element should fill chunks() (host replicas and an
  /// epilogue to run).
  [[nodiscard]] bool wants_chunks() const noexcept {
    return device_memory<kind_type>::host_accessible && recipe_->needs_epilogue();
  }
  /// The shared chunk sums (epilogue_chunks(param_count) doubles).
  [[nodiscard]] double* chunks() noexcept { return ws_->shared.data(); }

  /// Replica r's update, on its worker: the epilogue's decision (from the shared chunk sums when
  /// `chunks_ready`, else from a scan of its own gradient), then the optimiser and the EMA on its
  /// slice unless the update is skipped.
  void apply(std::size_t r, bool chunks_ready) {
    auto& rep = m_->replica(r);
    auto& ctx = rep.context();
    const value_type* g = rep.model().gradients().data();
    epilogue_result res;
    res.scale = base_.grad_scale;
    update_info u = base_;
    bool read_back = false;
    if (recipe_->needs_epilogue()) {
      const work_span span(ctx, trace_, r, "epilogue", "compute");
      if constexpr (device_memory<kind_type>::host_accessible) {
        const double* c = chunks_ready ? ws_->shared.data()
                          : on_grid()  ? grid_scan(r, ctx, g, ws_->per_replica[r])
                                       : scan(g, ws_->per_replica[r]);
        res = decide_update(c, epilogue_chunks(param_count), in_);
      } else if constexpr (device_epilogue<typename Replicated::context_type> && std::is_same_v<value_type, float>) {
        auto& dc = ws_->device_chunks[r];
        auto& dd = ws_->device_decision[r];
        if (dc.size() < epilogue_chunks(param_count) + 1) {
          backend::place_memory(ctx);
          dc = basic_buffer<double, kind_type>(epilogue_chunks(param_count) + 1);
          dd = basic_buffer<update_decision, kind_type>(1);
        }
        if (on_grid()) {  // this replica holds the reduced sums of its slice only (reduces_to_slices_v)
          grid_epilogue(r, ctx, g, dc.data(), dd.data());
        } else {
          reduced_gradient_epilogue(ctx, g, param_count, in_, dc.data(), dd.data());
        }
        if constexpr (optimizer_applies_recipe_v<Optimizer>) {
          u.decision = dd.data();  // the update kernel reads it: no host wait before the update
          read_back = true;
        } else {
          res = read_decision(ctx, dd.data());  // an optimiser of the user's takes host values
        }
      } else {  // a kind without a device epilogue: the sums are read back and scanned here
        std::vector<value_type> host(param_count);
        copy_to_host(ctx, host.data(), g, param_count);
        ctx.synchronize();
        res = decide_update(scan(host.data(), ws_->per_replica[r]), epilogue_chunks(param_count), in_);
      }
    }
    if (!read_back) {
      ws_->results[r] = res;
      if (res.skip) return;
      u.grad_scale = res.scale;
    }
    m_->update_plan().apply(rep, r, *opt_, u, ema_, ema_decay_);
    if (read_back) {  // after the update is queued
      if constexpr (requires { ctx.defer_decision(u.decision); }) {
        if (ctx.defers_readback()) {  // strategy_options::defer_readback: read with the next step
          ctx.defer_decision(u.decision);
          ws_->results[r] = epilogue_result{};
          return;
        }
      }
      ws_->results[r] = read_decision(ctx, u.decision);
    }
  }

  /// True when the sharded update's second phase (the copy of the others' slices) is needed.
  [[nodiscard]] bool gathers() const noexcept { return m_->optimizer_sharded(); }
  /// Replica r copies the other replicas' updated slices (nothing to copy after a skipped update).
  void gather(std::size_t r) {
    if (!ws_->results[r].skip) gather_update(*m_, *reducer_, r);
  }

  /// The decision of replica r (every replica's is the same).
  [[nodiscard]] const epilogue_result& result(std::size_t r = 0) const noexcept { return ws_->results[r]; }
  /// True when this update also updates the EMA.
  [[nodiscard]] bool updates_ema() const noexcept { return ema_; }

private:
  // True when the update is sharded on the epilogue's grid for the reducer: each replica then
  // holds the reduced sums of its own slice only.
  [[nodiscard]] bool on_grid() const noexcept {
    if constexpr (reduces_to_slices_v<Reducer>) return m_->update_plan().on_grid();
    else return false;
  }

  // Replica r's epilogue of an update sharded on the grid: its own chunks' sums from its slice
  // of the reduced sums, 0 for the others, the sum over the replicas through the reducer, then
  // the decision from it (all on the device). Each chunk has one replica that computes it, and
  // x + 0 is x, so every replica holds the chunk sums of an unsharded epilogue, bit for bit, and
  // decides the same.
  template <class Ctx, class V>
  void grid_epilogue(std::size_t r, Ctx& ctx, const V* g, double* chunks, update_decision* decision) {
    if constexpr (reduces_to_slices_v<Reducer>) {
      const auto [first, last] = grid_slice_chunks(param_count, r, m_->size());
      const std::size_t count = epilogue_chunks(param_count);
      reduced_gradient_chunk_sums(ctx, g, param_count, first, last, chunks);
      reducer_->sum_chunks(r, ctx, chunks, count);
      reduced_gradient_decision(ctx, chunks, count, in_, decision);
    }
  }

  // The host's grid_epilogue: replica r's own chunks scanned from its slice, 0 for the others,
  // then summed over the replicas through the reducer (the same bits as a scan of every chunk).
  template <class Ctx, class V>
  const double* grid_scan(std::size_t r, Ctx& ctx, const V* g, std::vector<double>& out) {
    if constexpr (reduces_to_slices_v<Reducer>) {
      const auto [first, last] = grid_slice_chunks(param_count, r, m_->size());
      std::fill(out.begin(), out.end(), 0.0);
      scan_chunks(g, param_count, first, last, out.data());
      reducer_->sum_chunks(r, ctx, out.data(), out.size());
    }
    return out.data();
  }

  template <class V>
  static const double* scan(const V* g, std::vector<double>& out) {
    scan_chunks(g, param_count, 0, out.size(), out.data());
    return out.data();
  }

  template <class Ctx>
  static epilogue_result read_decision(Ctx& ctx, const update_decision* d) {
    update_decision h;
    copy_to_host(ctx, &h, d, 1);
    ctx.synchronize();
    epilogue_result r;
    r.finite = h.finite != 0;
    r.norm = h.norm;
    r.factor = h.factor;
    r.scale = static_cast<double>(h.scale);
    r.skip = h.skip != 0;
    return r;
  }

  Replicated* m_;
  const Optimizer* opt_;
  const update_recipe* recipe_;
  update_info base_;
  epilogue_workspace<kind_type>* ws_;
  epilogue_inputs in_;
  bool ema_ = false;
  double ema_decay_ = 0;
  trace_recorder* trace_ = nullptr;
  Reducer* reducer_;
};

}  // namespace lockstep::detail
