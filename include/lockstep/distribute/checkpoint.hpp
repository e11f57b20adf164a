#pragma once
/// @file checkpoint.hpp (distribute)
/// A replicated model in a checkpoint: `capture(m)` takes replica 0's parameters (all replicas are
/// identical), the optimiser state (put together from its slices when the update is sharded) and
/// the step; `restore(m, state, optimizer)` loads them into every replica after checking that they
/// belong to this network and this kind of optimiser. Its sections of the checkpoint file
/// (io/checkpoint.hpp):
///   MODL version 2: model signature (u64), parameter count (u64), the network's type name
///        (string), the step (u64; version 1, of formats 1 and 2, has no step: it is in PROG)
///   PARM version 1: the flat parameters, then the non-trainable state (f32 array)
///   OPTM version 2: the flat optimiser state (f32 array), then the optimiser's type name
///        (string; version 1 has no name)
///   EMAW version 1 (only when the model holds an EMA of its weights): the number of updates the
///        EMA took in (u64, >= 1), then the EMA of the parameters and of the non-trainable state
///        (f32 array of the PARM section's length)
///   GARD version 1: the non-finite guard's counters: updates skipped in all, and since the last
///        applied one (u64 each; consecutive <= all <= the step). Checkpoints without it hold zeros.
///   PREC version 1: the precision policy the model trained under (string: "fp32",
///        "mixed<bf16>", "mixed<fp16>", "tf32"); informational, since the weights are fp32 under
///        every policy.
///   LSCL version 1 (mixed<fp16> only): the dynamic loss scale (f64, a power of two in [1, 2^24]),
///        the finite updates since it last changed (u64, < 2000) and the overflows in a row at the
///        smallest scale (u64, < 50); restored only into a model of the same policy.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/core/precision.hpp>
#include <lockstep/io/checkpoint.hpp>
#include <lockstep/io/serialization.hpp>
#include <lockstep/layers/model.hpp>
#include <lockstep/layers/signature.hpp>

namespace lockstep {

/// The network type of a replicated model (what strategy.replicate<Net>() returned).
template <class Replicated>
using network_of = typename std::remove_cvref_t<decltype(std::declval<Replicated&>().replica(0))>::model_type::network;

/// What a checkpoint holds of a replicated model.
struct model_state {
  std::uint64_t signature = 0;          ///< model_signature<Net>() of the model that wrote it
  std::size_t signature_offset = 0;     ///< file offset of the signature (section MODL's payload; 0: not read from a file)
  std::string model_name;               ///< the network's type name (diagnostics only)
  std::vector<float> parameters;        ///< the flat parameter buffer, then the non-trainable state
  std::vector<float> optimizer_state;   ///< the flat optimiser state (empty before the first update)
  std::string optimizer_name;           ///< the optimiser's type name ("" in checkpoints of formats 1 and 2)
  std::uint64_t step = 0;               ///< updates applied so far
  std::vector<float> ema;               ///< the EMA of the parameters, then of the state (empty: none; section EMAW)
  std::uint64_t ema_updates = 0;        ///< updates the EMA took in (0 when there is none)
  std::uint64_t skipped_updates = 0;    ///< updates the non-finite guard skipped (section GARD)
  std::uint64_t consecutive_skips = 0;  ///< of which since the last applied update
  std::string precision;                ///< the policy it trained under ("fp32", "mixed<bf16>"; "" without section PREC)
  bool has_loss_scale = false;          ///< section LSCL was there (a mixed<fp16> model wrote it)
  loss_scaler scaler;                   ///< the dynamic loss scale's state (section LSCL)
};

/// The tags of the model's sections added by the training recipe (see the file comment).
namespace tags {
inline constexpr std::uint32_t ema = io::section_tag("EMAW");    ///< the EMA of the weights
inline constexpr std::uint32_t guard = io::section_tag("GARD");  ///< the non-finite guard's counters
inline constexpr std::uint32_t precision = io::section_tag("PREC");  ///< the precision policy
inline constexpr std::uint32_t loss_scale = io::section_tag("LSCL");  ///< mixed<fp16>'s loss scale
}  // namespace tags

/// A readable name for optimiser `o`: its type name, with its momentum when it has a nonzero one.
template <class Optimizer>
[[nodiscard]] std::string optimizer_name(const Optimizer& o) {
  std::string name = model_name<Optimizer>();
  if constexpr (requires { o.momentum; })
    if (o.momentum != 0) {
      char m[32];
      std::snprintf(m, sizeof m, "%g", static_cast<double>(o.momentum));
      name += std::string(" with momentum ") + m;
    }
  return name;
}

/// Replica 0's parameters, the optimiser state of all parameters and the step of `m`, with the
/// network's signature and name; `optimizer` names the optimiser kind (its type).
template <class Replicated>
[[nodiscard]] model_state capture(Replicated& m) {
  using net = network_of<Replicated>;
  model_state s;
  s.signature = model_signature<net>();
  s.model_name = model_name<net>();
  s.parameters.resize(model<net>::stored_count);
  m.parameters_to_host(std::span<float>(s.parameters.data(), s.parameters.size()));
  s.optimizer_state = m.optimizer_state_to_host();
  s.step = m.step();
  if constexpr (requires { m.ema_to_host(); m.skipped_updates(); }) {
    s.ema = m.ema_to_host();
    s.ema_updates = m.ema_updates();
    s.skipped_updates = m.skipped_updates();
    s.consecutive_skips = m.consecutive_skips();
  }
  if constexpr (requires { m.precision(); }) s.precision = std::string(precision_name(m.precision()));
  if constexpr (requires { m.loss_scaled(); })
    if (m.loss_scaled()) {
      s.has_loss_scale = true;
      s.scaler = m.scaler();
    }
  return s;
}
/// capture(m), recording that the optimiser state belongs to `optimizer`'s kind.
template <class Replicated, class Optimizer>
[[nodiscard]] model_state capture(Replicated& m, const Optimizer&) {
  model_state s = capture(m);
  s.optimizer_name = model_name<Optimizer>();
  return s;
}

/// Adds the model's sections (MODL, PARM, OPTM) of `s` to checkpoint `f`.
inline void write_model_state(io::checkpoint_file& f, const model_state& s) {
  io::writer model;
  model.put(s.signature);
  model.put(static_cast<std::uint64_t>(s.parameters.size()));
  model.put_string(s.model_name);
  model.put(s.step);
  f.put(io::tags::model, 2, std::move(model));
  io::writer params;
  params.put_array<float>(s.parameters);
  f.put(io::tags::parameters, 1, std::move(params));
  io::writer opt;
  opt.put_array<float>(s.optimizer_state);
  opt.put_string(s.optimizer_name);
  f.put(io::tags::optimizer, 2, std::move(opt));
  if (s.ema_updates > 0) {
    io::writer ema;
    ema.put(s.ema_updates);
    ema.put_array<float>(s.ema);
    f.put(tags::ema, 1, std::move(ema));
  }
  io::writer guard;
  guard.put(s.skipped_updates);
  guard.put(s.consecutive_skips);
  f.put(tags::guard, 1, std::move(guard));
  if (!s.precision.empty()) {
    io::writer precision;
    precision.put_string(s.precision);
    f.put(tags::precision, 1, std::move(precision));
  }
  if (s.has_loss_scale) {
    io::writer scale;
    scale.put(s.scaler.scale());
    scale.put(s.scaler.good_updates());
    scale.put(s.scaler.overflows_at_minimum());
    f.put(tags::loss_scale, 1, std::move(scale));
  }
}

/// The model's part of checkpoint `f` (any format this library reads).
/// @throws checkpoint_error naming the file, section and offset of a missing or malformed part.
[[nodiscard]] inline model_state read_model_state(const io::checkpoint_file& f) {
  model_state s;
  const auto& ms = f.get(io::tags::model, "model");
  f.check_version(ms, "model", 1, 2);
  io::reader m = f.read(ms, "model");
  s.signature_offset = ms.offset;
  s.signature = m.get<std::uint64_t>("the model signature");
  const auto declared = m.get<std::uint64_t>("the parameter count");
  s.model_name = m.get_string("the model name");
  if (ms.version >= 2) s.step = m.get<std::uint64_t>("the step");
  m.expect_end();
  if (ms.version < 2) {  // formats 1 and 2: the step is the progress section's first field
    const auto& gs = f.get(io::tags::progress, "progress");
    io::reader g = f.read(gs, "progress");
    s.step = g.get<std::uint64_t>("the step");
  }
  const auto& ps = f.get(io::tags::parameters, "parameters");
  f.check_version(ps, "parameters", 1, 1);
  io::reader p = f.read(ps, "parameters");
  const std::size_t at = p.offset();
  s.parameters = p.get_array<float>("the parameters");
  if (s.parameters.size() != declared)
    p.fail_at(at, "holds " + std::to_string(s.parameters.size()) + " parameters, the model section says " +
                      std::to_string(declared));
  p.expect_end();
  const auto& os = f.get(io::tags::optimizer, "optimizer");
  f.check_version(os, "optimizer", 1, 2);
  io::reader o = f.read(os, "optimizer");
  s.optimizer_state = o.get_array<float>("the optimizer state");
  if (os.version >= 2) s.optimizer_name = o.get_string("the optimizer name");
  o.expect_end();
  if (const auto* es = f.find(tags::ema)) {
    f.check_version(*es, "ema", 1, 1);
    io::reader e = f.read(*es, "ema");
    const std::size_t at = e.offset();
    s.ema_updates = e.get<std::uint64_t>("the EMA's update count");
    if (s.ema_updates == 0) e.fail_at(at, "an EMA section with no update taken in");
    const std::size_t values_at = e.offset();
    s.ema = e.get_array<float>("the EMA");
    if (s.ema.size() != s.parameters.size())
      e.fail_at(values_at, "holds " + std::to_string(s.ema.size()) + " EMA values, the parameters section " +
                               std::to_string(s.parameters.size()));
    e.expect_end();
  }
  if (const auto* gs = f.find(tags::guard)) {
    f.check_version(*gs, "guard", 1, 1);
    io::reader g = f.read(*gs, "guard");
    const std::size_t all_at = g.offset();
    s.skipped_updates = g.get<std::uint64_t>("the skipped updates");
    if (s.skipped_updates > s.step)
      g.fail_at(all_at, "the skipped updates (" + std::to_string(s.skipped_updates) + ") exceed the updates (" +
                            std::to_string(s.step) + ")");
    const std::size_t at = g.offset();
    s.consecutive_skips = g.get<std::uint64_t>("the consecutive skipped updates");
    if (s.consecutive_skips > s.skipped_updates)
      g.fail_at(at, "the consecutive skipped updates (" + std::to_string(s.consecutive_skips) + ") exceed all skipped (" +
                        std::to_string(s.skipped_updates) + ")");
    g.expect_end();
  }
  if (const auto* ps = f.find(tags::precision)) {
    f.check_version(*ps, "precision", 1, 1);
    io::reader r = f.read(*ps, "precision");
    s.precision = r.get_string("the precision policy");
    r.expect_end();
  }
  if (const auto* ls = f.find(tags::loss_scale)) {
    f.check_version(*ls, "loss scale", 1, 1);
    io::reader r = f.read(*ls, "loss scale");
    const std::size_t at = r.offset();
    const double scale = r.get<double>("the loss scale");
    const auto good = r.get<std::uint64_t>("the finite updates at this scale");
    const auto overflows = r.get<std::uint64_t>("the overflows at the smallest scale");
    if (!s.scaler.restore(scale, good, overflows))
      r.fail_at(at, "holds loss scale " + std::to_string(scale) + " with " + std::to_string(good) + " finite updates and " +
                        std::to_string(overflows) + " overflows: not a power of two in [1, 2^24] with fewer than " +
                        std::to_string(loss_scaler::growth_interval) + " and " +
                        std::to_string(loss_scaler::max_overflows_at_minimum));
    r.expect_end();
    s.has_loss_scale = true;
  }
  return s;
}

/// Throws checkpoint_error unless `s` was written by a model with signature `expected`.
inline void check_signature(const model_state& s, std::uint64_t expected, const std::string& source,
                            const std::string& expected_name = {}) {
  if (s.signature != expected)
    throw checkpoint_error("lockstep::checkpoint: " + source + ": section 'model'" +
                           (s.signature_offset ? " at offset " + std::to_string(s.signature_offset) : std::string()) +
                           ": model signature " +
                           io::detail::hex64(s.signature) + " (" + s.model_name + ", " +
                           std::to_string(s.parameters.size()) + " parameters) does not match this model's " +
                           io::detail::hex64(expected) + (expected_name.empty() ? std::string() : " (" + expected_name + ")"));
}

namespace detail {
// What kind of optimiser keeps `values` state values for `params` parameters.
inline std::string optimizer_kind(std::size_t values, std::size_t params) {
  if (values == 0) return "an optimiser that keeps no state (lockstep::sgd without momentum)";
  if (params == 0 || values % params != 0)
    return "an optimiser with " + std::to_string(values) + " state values, not a whole number per parameter";
  const std::size_t k = values / params;
  const std::string per = std::to_string(k) + " state value" + (k == 1 ? "" : "s") + " per parameter";
  if (k == 1) return "an optimiser with " + per + " (lockstep::sgd with momentum)";
  if (k == 2) return "an optimiser with " + per + " (lockstep::adam or lockstep::adamw)";
  return "an optimiser with " + per;
}
}  // namespace detail

/// Throws checkpoint_error, naming both optimisers, unless the optimiser state of `s` fits
/// `optimizer` for a model of `param_count` parameters: exactly optimizer.state_size(param_count)
/// values (or none when no update has been applied yet: step 0, or every update so far skipped
/// by the non-finite guard, which on host replicas leaves the optimiser untouched), and — when
/// the checkpoint names its optimiser — the same kind of optimiser (Adam's moments are not
/// AdamW's to continue).
template <class Optimizer>
void check_optimizer_state(const model_state& s, const Optimizer& optimizer, std::size_t param_count,
                           const std::string& source = "checkpoint") {
  const std::size_t want = optimizer.state_size(param_count);
  const std::size_t have = s.optimizer_state.size();
  if (have == 0 && s.skipped_updates >= s.step) return;  // before the first applied update no optimiser has state yet
  if (have != want)
    throw checkpoint_error("lockstep::checkpoint: " + source + ": section 'optimizer': the checkpoint holds " +
                           std::to_string(have) + " optimizer state values after " + std::to_string(s.step) +
                           " updates, written by " +
                           (s.optimizer_name.empty()
                                ? detail::optimizer_kind(have, param_count)
                                : s.optimizer_name + ", " + detail::optimizer_kind(have, param_count)) +
                           "; this run's optimizer " + optimizer_name(optimizer) + " keeps " + std::to_string(want) +
                           ", so resuming with it would not be exact");
  const std::string mine = model_name<Optimizer>();
  if (!s.optimizer_name.empty() && s.optimizer_name != mine)
    throw checkpoint_error("lockstep::checkpoint: " + source + ": section 'optimizer': the checkpoint's optimiser state "
                           "was written by " + s.optimizer_name + "; this run's optimizer " + optimizer_name(optimizer) +
                           " keeps as much state but would continue from another optimiser's, so resuming would not "
                           "be exact (resume with " + s.optimizer_name + ", or start a fresh run)");
}

/// Loads parameters, optimiser state and step of `s` into every replica of `m` (the optimiser
/// state is loaded as it is: prefer the overload that takes the optimiser and checks it).
/// @throws checkpoint_error when `s` belongs to another model.
template <class Replicated>
void restore(Replicated& m, const model_state& s, const std::string& source = "checkpoint") {
  using net = network_of<Replicated>;
  check_signature(s, model_signature<net>(), source, model_name<net>());
  if (s.parameters.size() != model<net>::stored_count)
    throw checkpoint_error("lockstep::checkpoint: " + source + ": section 'parameters': holds " +
                           std::to_string(s.parameters.size()) + " values, the model has " +
                           std::to_string(model<net>::stored_count) + " (parameters and non-trainable state)");
  m.load_parameters(std::span<const float>(s.parameters.data(), s.parameters.size()));
  // An empty state (no update applied yet) also replaces what the model held: a model that has
  // trained continues from the checkpoint's moments, none, not from its own.
  m.load_optimizer_state(std::span<const float>(s.optimizer_state.data(), s.optimizer_state.size()));
  m.set_step(s.step);
  if constexpr (requires { m.load_ema(std::span<const float>{}, s.ema_updates); }) {
    m.load_ema(std::span<const float>(s.ema.data(), s.ema.size()), s.ema_updates);
    m.set_skip_counters(s.skipped_updates, s.consecutive_skips);
  }
  // The loss scale's state only into a model of the same policy (one that scales its loss).
  if constexpr (requires { m.loss_scaled(); })
    if (m.loss_scaled() && s.has_loss_scale) m.scaler() = s.scaler;
}

/// Loads parameters, optimiser state and step of `s` into every replica of `m`, after checking
/// that the state fits `optimizer` (check_optimizer_state).
/// @throws checkpoint_error when `s` belongs to another model or another kind of optimiser.
template <class Replicated, class Optimizer>
  requires requires(const Optimizer& o) { o.state_size(std::size_t{1}); }
void restore(Replicated& m, const model_state& s, const Optimizer& optimizer, const std::string& source = "checkpoint") {
  check_optimizer_state(s, optimizer, model<network_of<Replicated>>::param_count, source);
  restore(m, s, source);
}

}  // namespace lockstep
