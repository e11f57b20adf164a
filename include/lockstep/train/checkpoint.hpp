#pragma once
/// @file checkpoint.hpp (train)
/// What `fit` keeps in a checkpoint to continue a run exactly where it stopped, and the whole
/// training checkpoint as one value.
///  - `fit_resume_state`: the pipeline position, the learning-rate schedule, the seeds, the
///    callbacks' states and the sums of the epoch in progress. Its section of the checkpoint file
///    (io/checkpoint.hpp), FITS version 1: epoch, batches consumed (u64); base rate, factor, last
///    rate (f32, each finite and >= 0); model seed, pipeline seed (u64); replicas (u32); stop
///    flag (u8); the epoch's loss sum (f64, any value), samples, steps, labelled rows, top-1 hits
///    (u64, hits <= labelled rows); the number of callbacks (u64) and each one's state (f64
///    array). Checkpoints of formats 1 and 2 hold the same values in their PROG, SCHD, RNGS and
///    CBKS sections (no CBKS in format 1: no callback state, no epoch sums), which are read too.
///  - `checkpoint_state`: the model's part (model_state, distribute/checkpoint.hpp) and fit's,
///    with `to_file()` / `from_file()`, and `encode_checkpoint`, `decode_checkpoint`,
///    `save_checkpoint`, `load_checkpoint` over it.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/distribute/checkpoint.hpp>
#include <lockstep/io/checkpoint.hpp>
#include <lockstep/io/serialization.hpp>

namespace lockstep {

/// What fit needs besides the model to continue a run at its exact position.
struct fit_resume_state {
  std::uint64_t epoch = 0;              ///< the epoch in progress (pipeline position)
  std::uint64_t batches = 0;            ///< global batches of `epoch` already consumed
  float base_lr = 0;                    ///< the optimiser's base learning rate
  float lr_factor = 1;                  ///< multiplier set by callbacks (e.g. on plateau)
  float lr = 0;                         ///< learning rate of the last update
  std::uint64_t seed = 0;               ///< the model seed (keys init and dropout)
  std::uint64_t data_seed = 0;          ///< the input pipeline's seed (fit_options::data_seed; a resume must give the same)
  std::uint32_t replicas = 0;           ///< replicas of the run that wrote it (informational)
  std::vector<std::vector<double>> callback_states;  ///< each callback's saved state, in callback order
  bool stop_requested = false;          ///< a callback had asked training to stop when it was written
  double epoch_loss_sum = 0;            ///< training loss sum of the batches of `epoch` consumed so far
  std::uint64_t epoch_samples = 0;      ///< training samples of the batches of `epoch` consumed so far
  std::uint64_t epoch_steps = 0;        ///< updates of `epoch` done so far
  std::uint64_t epoch_labelled = 0;     ///< labelled training rows of `epoch` so far (accuracy denominator)
  std::uint64_t epoch_correct = 0;      ///< top-1 hits among them
  bool has_callback_state = true;       ///< false for a format-1 checkpoint (no callback state, no epoch sums)
  double epoch_norm_sum = 0;            ///< sum of the gradient norms of `epoch`'s updates so far (section FREC)
  std::uint64_t epoch_norm_updates = 0; ///< updates of `epoch` so far whose norm was computed
  double epoch_clip_sum = 0;            ///< sum of their clip factors
  std::uint64_t epoch_skipped = 0;      ///< updates of `epoch` so far the non-finite guard skipped
  /// Hash of the row counts and dataset indices of the `batches` consumed (section FPIP, written
  /// when set; fit's batch_tally hash): a resume whose pipeline gives other batches is refused.
  /// Empty for a state filled by hand or read from a file without FPIP: a resume unchecked.
  std::optional<std::uint64_t> consumed_rows_hash;
};

namespace detail {

// A rate or factor that is negative or not finite has no meaning: refused where it lies.
inline float read_rate(io::reader& r, const char* what) {
  const std::size_t at = r.offset();
  const float v = r.get<float>(what);
  if (!finite_nonnegative(v)) r.fail_at(at, std::string(what) + " is " + option_value(v) + ", not a finite value >= 0");
  return v;
}

// The stop flag, the epoch's sums and the callbacks' states (the tail of FITS, all of CBKS).
inline void read_callbacks_part(io::reader& r, fit_resume_state& s, std::size_t payload_size, std::size_t before) {
  const std::size_t stop_at = r.offset();
  const auto stop = r.get<std::uint8_t>("the stop flag");
  if (stop > 1) r.fail_at(stop_at, "stop flag " + std::to_string(stop) + " is neither 0 nor 1");
  s.stop_requested = stop == 1;
  s.epoch_loss_sum = r.get<double>("the epoch's loss sum");  // any value: an overflowing loss, NaN under nonfinite = apply
  s.epoch_samples = r.get<std::uint64_t>("the epoch's sample count");
  s.epoch_steps = r.get<std::uint64_t>("the epoch's step count");
  s.epoch_labelled = r.get<std::uint64_t>("the epoch's labelled count");
  const std::size_t correct_at = r.offset();
  s.epoch_correct = r.get<std::uint64_t>("the epoch's top-1 hits");
  if (s.epoch_correct > s.epoch_labelled)
    r.fail_at(correct_at, "the epoch's top-1 hits (" + std::to_string(s.epoch_correct) + ") exceed its labelled rows (" +
                              std::to_string(s.epoch_labelled) + ")");
  const std::size_t count_at = r.offset();
  const auto n_cb = r.get<std::uint64_t>("the callback count");
  const std::size_t used = before + 49;  // bytes of the section before the callback states
  if (n_cb > (payload_size - std::min(payload_size, used)) / 8)
    r.fail_at(count_at, "declares " + std::to_string(n_cb) + " callback states, more than the section holds");
  s.callback_states.reserve(static_cast<std::size_t>(n_cb));
  for (std::uint64_t i = 0; i < n_cb; ++i) s.callback_states.push_back(r.get_array<double>("a callback state"));
}

}  // namespace detail

/// The tag of fit's section of update-recipe sums of the epoch in progress (FREC version 1: the
/// sum of its updates' gradient norms (f64, any value), how many (u64), the sum of their clip
/// factors (f64, any value), the updates skipped (u64)). Checkpoints without it hold zeros.
inline constexpr std::uint32_t fit_recipe_tag = io::section_tag("FREC");

/// The tag of fit's section of the pipeline position (FPIP version 1: a hash (u64) of the row
/// counts and dataset indices of the batches of the epoch in progress consumed so far, fit's
/// batch_tally hash). Checkpoints without it are resumed unchecked.
inline constexpr std::uint32_t fit_pipeline_tag = io::section_tag("FPIP");

/// Adds fit's sections (FITS version 1, FREC version 1, and FPIP version 1 when `s` has a
/// consumed_rows_hash) of `s` to checkpoint `f`.
inline void write_fit_state(io::checkpoint_file& f, const fit_resume_state& s) {
  io::writer w;
  w.put(s.epoch);
  w.put(s.batches);
  w.put(s.base_lr);
  w.put(s.lr_factor);
  w.put(s.lr);
  w.put(s.seed);
  w.put(s.data_seed);
  w.put(s.replicas);
  w.put(static_cast<std::uint8_t>(s.stop_requested ? 1 : 0));
  w.put(s.epoch_loss_sum);
  w.put(s.epoch_samples);
  w.put(s.epoch_steps);
  w.put(s.epoch_labelled);
  w.put(s.epoch_correct);
  w.put(static_cast<std::uint64_t>(s.callback_states.size()));
  for (const auto& c : s.callback_states) w.put_array<double>(c);
  io::writer r;  // before FITS, which stays the file's last section
  r.put(s.epoch_norm_sum);
  r.put(s.epoch_norm_updates);
  r.put(s.epoch_clip_sum);
  r.put(s.epoch_skipped);
  f.put(fit_recipe_tag, 1, std::move(r));
  if (s.consumed_rows_hash) {  // fit's own checkpoints (a state filled by hand records none)
    io::writer q;
    q.put(*s.consumed_rows_hash);
    f.put(fit_pipeline_tag, 1, std::move(q));
  }
  f.put(io::tags::fit, 1, std::move(w));
}

/// fit's part of checkpoint `f` (any format this library reads).
/// @throws checkpoint_error naming the file, section and offset of a missing or malformed part.
[[nodiscard]] inline fit_resume_state read_fit_state(const io::checkpoint_file& f) {
  fit_resume_state s;
  if (const auto* fs = f.find(io::tags::fit)) {
    f.check_version(*fs, "fit", 1, 1);
    io::reader r = f.read(*fs, "fit");
    s.epoch = r.get<std::uint64_t>("the epoch");
    s.batches = r.get<std::uint64_t>("the batches consumed");
    s.base_lr = detail::read_rate(r, "the base learning rate");
    s.lr_factor = detail::read_rate(r, "the learning-rate factor");
    s.lr = detail::read_rate(r, "the learning rate");
    s.seed = r.get<std::uint64_t>("the seed");
    s.data_seed = r.get<std::uint64_t>("the data seed");
    s.replicas = r.get<std::uint32_t>("the replica count");
    detail::read_callbacks_part(r, s, fs->payload.size(), 48);
    r.expect_end();
    if (const auto* rs = f.find(fit_recipe_tag)) {  // sums of any value, as the epoch's loss sum
      f.check_version(*rs, "fit recipe sums", 1, 1);
      io::reader q = f.read(*rs, "fit recipe sums");
      s.epoch_norm_sum = q.get<double>("the epoch's gradient norm sum");
      s.epoch_norm_updates = q.get<std::uint64_t>("the epoch's updates with a norm");
      s.epoch_clip_sum = q.get<double>("the epoch's clip factor sum");
      s.epoch_skipped = q.get<std::uint64_t>("the epoch's skipped updates");
      q.expect_end();
    }
    if (const auto* ps = f.find(fit_pipeline_tag)) {  // a hash: any value
      f.check_version(*ps, "fit pipeline position", 1, 1);
      io::reader q = f.read(*ps, "fit pipeline position");
      s.consumed_rows_hash = q.get<std::uint64_t>("the hash of the consumed batches' rows");
      q.expect_end();
    }
    return s;
  }
  // Formats 1 and 2.
  const auto& ps = f.get(io::tags::progress, "progress");
  io::reader p = f.read(ps, "progress");
  (void)p.get<std::uint64_t>("the step");  // the model's (read_model_state)
  s.epoch = p.get<std::uint64_t>("the epoch");
  s.batches = p.get<std::uint64_t>("the batches consumed");
  p.expect_end();
  const auto& ss = f.get(io::tags::schedule, "schedule");
  io::reader sc = f.read(ss, "schedule");
  s.base_lr = detail::read_rate(sc, "the base learning rate");
  s.lr_factor = detail::read_rate(sc, "the learning-rate factor");
  s.lr = detail::read_rate(sc, "the learning rate");
  sc.expect_end();
  const auto& rs = f.get(io::tags::rng, "rng");
  io::reader rg = f.read(rs, "rng");
  s.seed = rg.get<std::uint64_t>("the seed");
  s.data_seed = rg.get<std::uint64_t>("the data seed");
  s.replicas = rg.get<std::uint32_t>("the replica count");
  rg.expect_end();
  if (const auto* cs = f.find(io::tags::callbacks)) {
    io::reader c = f.read(*cs, "callbacks");
    detail::read_callbacks_part(c, s, cs->payload.size(), 0);
    c.expect_end();
  } else {
    s.has_callback_state = false;
  }
  return s;
}

/// Everything needed to continue a training run exactly where it stopped: the model's part and
/// fit's part (see the file comment).
struct checkpoint_state : model_state, fit_resume_state {
  std::uint32_t version = io::checkpoint_version;  ///< format version it was read from (1: no callback state)

  /// An empty state (fill in its fields).
  checkpoint_state() = default;
  /// The model's part `m` (from capture) with an empty fit part.
  checkpoint_state(model_state m) : model_state(std::move(m)) {}  // NOLINT(google-explicit-constructor): save_checkpoint(path, capture(m))

  /// The checkpoint file of this state (the model's sections and fit's section).
  [[nodiscard]] io::checkpoint_file to_file() const {
    io::checkpoint_file f;
    write_model_state(f, *this);
    write_fit_state(f, *this);
    return f;
  }
  /// The state held by checkpoint `f` (any format this library reads).
  /// @throws checkpoint_error naming the file, section and offset of a missing or malformed part.
  [[nodiscard]] static checkpoint_state from_file(const io::checkpoint_file& f) {
    checkpoint_state s;
    static_cast<model_state&>(s) = read_model_state(f);
    static_cast<fit_resume_state&>(s) = read_fit_state(f);
    s.version = f.format();
    return s;
  }
};

/// Encodes a training checkpoint into the bytes of a file (the format checkpoint_version).
[[nodiscard]] inline std::vector<std::uint8_t> encode_checkpoint(const checkpoint_state& s) {
  return io::encode_checkpoint_file(s.to_file());
}

/// Decodes and verifies the bytes of a training checkpoint of any format this library reads;
/// `source` names them in error messages.
/// @throws checkpoint_error naming the source, section and offset of what is wrong.
[[nodiscard]] inline checkpoint_state decode_checkpoint(std::span<const std::uint8_t> bytes, const std::string& source) {
  return checkpoint_state::from_file(io::decode_checkpoint_file(bytes, source));
}

/// Writes training checkpoint `s` to `path` atomically.
inline void save_checkpoint(const std::filesystem::path& path, const checkpoint_state& s) {
  io::save_checkpoint_file(path, s.to_file());
}

/// Reads and verifies the training checkpoint at `path`.
/// @throws checkpoint_error when the file cannot be read or is corrupt, truncated or of another version.
[[nodiscard]] inline checkpoint_state load_checkpoint(const std::filesystem::path& path) {
  return checkpoint_state::from_file(io::load_checkpoint_file(path));
}

/// Reads the training checkpoint at `path` and checks that it belongs to a model with signature
/// `signature`. @throws checkpoint_error as load_checkpoint, or on a model mismatch.
[[nodiscard]] inline checkpoint_state load_checkpoint(const std::filesystem::path& path, std::uint64_t signature) {
  checkpoint_state s = load_checkpoint(path);
  check_signature(s, signature, path.string());
  return s;
}

/// Loads the model's part of checkpoint file `f` into every replica of `m` (see restore).
template <class Replicated>
void restore(Replicated& m, const io::checkpoint_file& f) {
  restore(m, read_model_state(f), f.source());
}

/// The names checkpoints had when they lived in io/ (kept for one release).
namespace io {
/// lockstep::checkpoint_state, which now lives in train/.
using checkpoint_state [[deprecated("use lockstep::checkpoint_state")]] = lockstep::checkpoint_state;
/// lockstep::capture (the model's part of a checkpoint), as a whole checkpoint_state.
template <class Replicated>
[[deprecated("use lockstep::capture")]] [[nodiscard]] lockstep::checkpoint_state capture(Replicated& m) {
  return lockstep::capture(m);
}
/// lockstep::restore.
template <class Replicated, class... Rest>
[[deprecated("use lockstep::restore")]] void restore(Replicated& m, const lockstep::checkpoint_state& s, Rest&&... rest) {
  lockstep::restore(m, static_cast<const model_state&>(s), std::forward<Rest>(rest)...);
}
/// lockstep::restore from a checkpoint file.
template <class Replicated>
[[deprecated("use lockstep::restore")]] void restore(Replicated& m, const checkpoint_file& f) {
  lockstep::restore(m, f);
}
/// lockstep::encode_checkpoint.
[[deprecated("use lockstep::encode_checkpoint")]] inline std::vector<std::uint8_t> encode_checkpoint(
    const lockstep::checkpoint_state& s) {
  return lockstep::encode_checkpoint(s);
}
/// lockstep::decode_checkpoint.
[[deprecated("use lockstep::decode_checkpoint")]] inline lockstep::checkpoint_state decode_checkpoint(
    std::span<const std::uint8_t> bytes, const std::string& source) {
  return lockstep::decode_checkpoint(bytes, source);
}
}  // namespace io

}  // namespace lockstep
