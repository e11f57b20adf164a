#pragma once
/// @file progress.hpp
/// Progress display for fit: on a terminal a live bar on stderr (epoch, step/steps, samples/s,
/// loss, ETA) redrawn at most every `interval`; elsewhere one plain line per epoch. Told the run's
/// step budget (fit_options::max_steps), the bar, the epoch count and the summary count only the
/// steps that will run. Also the lines that say where a run starts (resume_line,
/// fresh_start_line) and the optional JSON-lines metrics file (one object per epoch).

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

#include <lockstep/core/error.hpp>
#include <lockstep/train/callbacks.hpp>

namespace lockstep {

/// How fit shows its progress.
struct progress_options {
  bool quiet = false;                                  ///< print nothing
  std::FILE* stream = nullptr;                         ///< where to print (nullptr: stderr)
  std::optional<bool> live;                            ///< live bar (default: when the stream is a terminal)
  std::chrono::milliseconds interval{100};             ///< least time between two redraws of the bar
};

namespace detail {
inline std::string progress_format(const char* fmt, auto... args) {
  char buf[512];
  const int n = std::snprintf(buf, sizeof buf, fmt, args...);
  return std::string(buf, n < 0 ? 0 : std::min<std::size_t>(static_cast<std::size_t>(n), sizeof buf - 1));
}

inline std::string metric_or_dash(const char* fmt, double v) {
  return std::isnan(v) ? std::string("-") : progress_format(fmt, v);
}

/// A loss over `rows` rows: "-" when none was measured, "nan" when one was and diverged (so a
/// diverged epoch does not read as an empty one), else v in `fmt`.
inline std::string loss_or_dash(const char* fmt, double v, std::uint64_t rows) {
  return std::isnan(v) && rows > 0 ? std::string("nan") : metric_or_dash(fmt, v);
}

inline std::string json_number(double v) {
  if (std::isnan(v) || std::isinf(v)) return "null";
  return progress_format("%.9g", v);
}
}  // namespace detail

/// The line a run that resumes prints first: `resuming from <file> (epoch E, step S)`, where E is
/// the epoch it continues (`epoch`, counted from 0 as checkpoints store it, shown counted from 1 as
/// the progress lines count) and S the updates already done.
inline std::string resume_line(const std::string& file, std::uint64_t epoch, std::uint64_t step) {
  return "resuming from " + file + " (epoch " + std::to_string(epoch + 1) + ", step " + std::to_string(step) + ")";
}

/// The line a run asked to resume prints when `dir` holds no checkpoint:
/// `no checkpoint in <dir>: starting fresh`.
inline std::string fresh_start_line(const std::string& dir) { return "no checkpoint in " + dir + ": starting fresh"; }

/// The epochs a run of `epochs` epochs will show when at most `max_steps` updates run in total (0:
/// no limit), seen from epoch `epoch` (counted from 0) with `steps_done` updates done, `consumed`
/// batches of that epoch already consumed and `steps_per_epoch` steps in an epoch (0: unknown,
/// then `epochs`).
inline std::uint64_t epochs_within_budget(std::uint64_t epochs, std::uint64_t max_steps, std::uint64_t epoch,
                                          std::uint64_t steps_done, std::uint64_t consumed,
                                          std::uint64_t steps_per_epoch) noexcept {
  if (max_steps == 0 || steps_per_epoch == 0) return epochs;
  const std::uint64_t left = max_steps > steps_done ? max_steps - steps_done : 0;
  const std::uint64_t in_this = steps_per_epoch > consumed ? steps_per_epoch - consumed : 0;
  std::uint64_t last = epoch;  // the last epoch that runs a step (counted from 0)
  if (left > in_this) last += (left - in_this + steps_per_epoch - 1) / steps_per_epoch;
  return std::min(epochs, last + 1);
}

/// The one-line summary of an epoch, as printed by the plain display: `epoch E/N: loss … acc …`,
/// then validation, samples/s, the learning rate and the time. With a step budget `max_steps`
/// (0: none), N counts the epochs the budget lets run, and the epoch at which the budget runs out
/// says so (`| max_steps 100 reached`).
inline std::string epoch_line(const epoch_stats& s, std::uint64_t epochs, std::uint64_t max_steps = 0) {
  std::string line = detail::progress_format("epoch %llu/%llu: loss %s acc %s", static_cast<unsigned long long>(s.epoch + 1),
                                    static_cast<unsigned long long>(epochs),
                                    detail::loss_or_dash("%.4f", s.train_loss, s.samples).c_str(),
                                    detail::metric_or_dash("%.4f", s.train_accuracy).c_str());
  if (!std::isnan(s.val_loss) || !std::isnan(s.val_accuracy))
    line += " | val_loss " + detail::loss_or_dash("%.4f", s.val_loss, s.val_samples) + " val_acc " +
            detail::metric_or_dash("%.4f", s.val_accuracy) +
            (s.val_top_k > 1 ? " val_top" + std::to_string(s.val_top_k) + " " +
                                   detail::metric_or_dash("%.4f", s.val_top_k_accuracy)
                             : std::string());
  line += detail::progress_format(" | %.0f samples/s | lr %.3g", s.samples_per_second, static_cast<double>(s.lr));
  if (!std::isnan(s.grad_norm))
    line += detail::progress_format(" | norm %.4g clip %.3g", s.grad_norm, s.clip_factor);
  if (s.skipped_updates > 0)
    line += detail::progress_format(" | skipped %llu", static_cast<unsigned long long>(s.skipped_updates));
  line += detail::progress_format(" | %.1f s", s.seconds);
  if (max_steps != 0 && s.global_step >= max_steps)
    line += " | max_steps " + std::to_string(max_steps) + " reached";
  return line;
}

/// The display fit drives: begin_epoch, step (often), end_epoch.
class progress {
public:
  /// A display for a run of `epochs` epochs that ends after `max_steps` updates in total (0: no
  /// limit, fit_options::max_steps).
  explicit progress(progress_options o, std::uint64_t epochs, std::uint64_t max_steps = 0)
      : o_(o), out_(o.stream ? o.stream : stderr), epochs_(epochs), shown_epochs_(epochs), max_steps_(max_steps) {
    live_ = o_.live ? *o_.live : ::isatty(::fileno(out_)) != 0;
  }

  /// True when the live bar is in use.
  [[nodiscard]] bool live() const noexcept { return live_ && !o_.quiet; }

  /// Prints one line (a newline is added) unless quiet: what fit says before the first epoch,
  /// such as resume_line or fresh_start_line.
  void note(const std::string& line) {
    if (o_.quiet) return;
    std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
  }

  /// Starts epoch `epoch`; `steps` is the expected number of steps of an epoch (0 when unknown),
  /// `steps_done` the updates done so far in the run (the model's step), `consumed` the steps
  /// of this epoch done before (a run resumed in the middle of it) and `samples_before` their
  /// samples: the rate and the ETA count this process's steps only. With a step budget, the bar
  /// ends where the budget does, and the epoch count shown is the epochs the budget lets run.
  void begin_epoch(std::uint64_t epoch, std::uint64_t steps, std::uint64_t steps_done = 0, std::uint64_t consumed = 0,
                   std::uint64_t samples_before = 0) {
    epoch_ = epoch;
    steps_ = steps;
    steps_before_ = consumed;
    samples_before_ = samples_before;
    if (max_steps_ != 0 && steps != 0) {
      const std::uint64_t left = max_steps_ > steps_done ? max_steps_ - steps_done : 0;
      steps_ = std::min(steps, consumed + left);
    }
    shown_epochs_ = epochs_within_budget(epochs_, max_steps_, epoch, steps_done, consumed, steps);
    start_ = std::chrono::steady_clock::now();
    last_draw_ = start_ - o_.interval;
    drawn_ = false;
  }

  /// Reports that `step` steps and `samples` samples of the epoch are done, mean loss `loss`,
  /// and the last update's gradient norm and clip factor (NaN: not computed) and the epoch's
  /// skipped updates.
  void step(std::uint64_t step, std::uint64_t samples, double loss, double norm = std::numeric_limits<double>::quiet_NaN(),
            double clip = 1, std::uint64_t skipped = 0) {
    if (!live()) return;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_draw_ < o_.interval && !(steps_ && step == steps_)) return;
    last_draw_ = now;
    const double t = std::chrono::duration<double>(now - start_).count();
    // what this process did since begin_epoch (a resumed epoch's earlier steps took no time here)
    const std::uint64_t samples_here = samples > samples_before_ ? samples - samples_before_ : 0;
    const std::uint64_t steps_here = step > steps_before_ ? step - steps_before_ : 0;
    const double rate = t > 0 ? static_cast<double>(samples_here) / t : 0;
    std::string bar;
    if (steps_) {
      constexpr int width = 24;
      const int filled = static_cast<int>(static_cast<double>(width) * static_cast<double>(std::min(step, steps_)) /
                                          static_cast<double>(steps_));
      // Appended piece by piece: g++ 12 warns (-Wrestrict, wrongly) about `"[" + std::string(...)`
      // once the widths are known constants.
      bar.reserve(width + 3);
      bar += '[';
      bar.append(static_cast<std::size_t>(filled), '=');
      bar.append(static_cast<std::size_t>(width - filled), ' ');
      bar += "] ";
    }
    std::string eta = "?";
    if (steps_ && steps_here > 0 && step <= steps_)
      eta = detail::progress_format("%.0fs", t / static_cast<double>(steps_here) * static_cast<double>(steps_ - step));
    const std::string total = steps_ ? std::to_string(steps_) : std::string("?");
    std::string recipe;
    if (!std::isnan(norm)) recipe += detail::progress_format(" | norm %.4g clip %.3g", norm, clip);
    if (skipped > 0) recipe += detail::progress_format(" | skipped %llu", static_cast<unsigned long long>(skipped));
    std::fprintf(out_, "\r\033[Kepoch %llu/%llu %s%llu/%s | %.0f samples/s | loss %s%s | ETA %s",
                 static_cast<unsigned long long>(epoch_ + 1), static_cast<unsigned long long>(shown_epochs_), bar.c_str(),
                 static_cast<unsigned long long>(step), total.c_str(), rate,
                 detail::loss_or_dash("%.4f", loss, samples).c_str(), recipe.c_str(), eta.c_str());
    std::fflush(out_);
    drawn_ = true;
  }

  /// Ends the epoch: replaces the bar (or prints a line) with the epoch's summary.
  void end_epoch(const epoch_stats& s) {
    if (o_.quiet) return;
    if (live() && drawn_) std::fputs("\r\033[K", out_);
    // the epoch in which the budget ran out is the last one, whether or not its length was known
    const std::uint64_t shown = max_steps_ != 0 && s.global_step >= max_steps_ ? s.epoch + 1 : shown_epochs_;
    std::fprintf(out_, "%s\n", epoch_line(s, shown, max_steps_).c_str());
    std::fflush(out_);
  }

private:
  progress_options o_;
  std::FILE* out_;
  std::uint64_t epochs_;
  std::uint64_t shown_epochs_;  // epochs_, or fewer when the step budget ends the run sooner
  std::uint64_t max_steps_;
  bool live_ = false;
  std::uint64_t epoch_ = 0;
  std::uint64_t steps_ = 0;
  std::uint64_t steps_before_ = 0, samples_before_ = 0;  // the resumed epoch's, done before this process
  std::chrono::steady_clock::time_point start_{}, last_draw_{};
  bool drawn_ = false;
};

/// The JSON object (one line, no newline) describing an epoch, as written to a metrics file.
inline std::string epoch_json(const epoch_stats& s) {
  using detail::json_number;
  return "{\"epoch\":" + std::to_string(s.epoch) + ",\"step\":" + std::to_string(s.global_step) +
         ",\"train_loss\":" + json_number(s.train_loss) + ",\"train_accuracy\":" + json_number(s.train_accuracy) +
         ",\"val_loss\":" + json_number(s.val_loss) + ",\"val_accuracy\":" + json_number(s.val_accuracy) +
         ",\"val_top_k_accuracy\":" + json_number(s.val_top_k_accuracy) + ",\"val_top_k\":" + std::to_string(s.val_top_k) +
         ",\"samples_per_second\":" + json_number(s.samples_per_second) + ",\"seconds\":" + json_number(s.seconds) +
         ",\"lr\":" + json_number(static_cast<double>(s.lr)) + ",\"steps\":" + std::to_string(s.steps) +
         ",\"samples\":" + std::to_string(s.samples) + ",\"val_samples\":" + std::to_string(s.val_samples) +
         ",\"grad_norm\":" + json_number(s.grad_norm) + ",\"clip_factor\":" + json_number(s.clip_factor) +
         ",\"skipped_updates\":" + std::to_string(s.skipped_updates) + "}";
}

/// A JSON-lines file receiving one object per epoch (flushed after each line).
class metrics_log {
public:
  /// Opens (appends to) `path`; a last line left unfinished (a write cut short by a full disk or a
  /// crash) is ended first, so every object starts a line of its own. @throws config_error when it
  /// cannot be opened or written (with the operating system's reason).
  explicit metrics_log(const std::string& path) : f_(std::fopen(path.c_str(), "a+")), path_(path) {
    const bool readable = f_ != nullptr;
    if (!f_) f_ = std::fopen(path.c_str(), "a");  // a file that may be written but not read: appended to as it is
    if (!f_) throw config_error("lockstep: metrics_file '" + path + "' cannot be opened for writing: " + os_reason(errno));
    if (readable && std::fseek(f_, -1, SEEK_END) == 0) {  // not empty
      const int last = std::fgetc(f_);
      std::fseek(f_, 0, SEEK_END);  // a write follows a read only after a seek
      if (last != '\n' && last != EOF && (std::fputc('\n', f_) == EOF || std::fflush(f_) != 0)) {
        const int e = errno;
        std::fclose(f_);
        throw config_error("lockstep: cannot write to metrics_file '" + path + "': " + os_reason(e));
      }
    }
  }
  metrics_log(const metrics_log&) = delete;
  metrics_log& operator=(const metrics_log&) = delete;
  ~metrics_log() { std::fclose(f_); }

  /// Appends the line of one epoch. @throws config_error when the write fails.
  void write(const epoch_stats& s) {
    const std::string line = epoch_json(s) + "\n";
    if (std::fputs(line.c_str(), f_) < 0 || std::fflush(f_) != 0)
      throw config_error("lockstep: cannot write to metrics_file '" + path_ + "': " + os_reason(errno));
  }

private:
  std::FILE* f_;
  std::string path_;
};

}  // namespace lockstep
