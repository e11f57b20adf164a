#pragma once
/// @file fit_trace.hpp
/// The timeline of one fit run (fit_options::trace_file): a trace_recorder (core/trace.hpp) with
/// one thread per local replica and one for the driver (the thread that runs fit: pipeline
/// waits, steps, checkpoint writes), handed to the strategy (set_trace) for the steps' own
/// spans. The workers' clocks are related once, at a barrier before the first step; at the end
/// every worker's events reach the chief (the world's gather_blocks), which writes one Chrome
/// trace-event file (io/trace.hpp).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/core/trace.hpp>
#include <lockstep/io/trace.hpp>

namespace lockstep::detail {

/// What finishing a trace wrote (on the chief; zeros elsewhere).
struct trace_written {
  std::uintmax_t bytes = 0;  ///< size of the file
  std::size_t spans = 0;     ///< spans of every worker
  std::size_t dropped = 0;   ///< spans dropped because a buffer was full (every worker's)
};

/// The line fit prints after writing a trace.
[[nodiscard]] inline std::string trace_line(const std::string& file, const trace_written& w) {
  std::string line = "trace: " + file + " (" + std::to_string(w.spans) + " spans, " +
                     std::to_string((w.bytes + 1023) / 1024) + " KiB; open it in ui.perfetto.dev or chrome://tracing)";
  if (w.dropped > 0)
    line += "; " + std::to_string(w.dropped) + " spans did not fit the recorder's buffers and were dropped";
  return line;
}

/// The trace of one fit run over strategy S (see the file comment). Inactive when no file is
/// asked for; clears the strategy's recorder when destroyed, so that a failed run leaves none.
template <class S>
class fit_tracer {
public:
  /// Starts tracing `s` in world `w` into `file` for the steps `steps` ("" : no trace), with
  /// `replicas` local replicas. Collective when a file is asked for (a barrier, one sum).
  /// @throws config_error when the strategy cannot be traced (no set_trace).
  template <class World>
  fit_tracer(S& s, World& w, const std::string& file, trace_window steps, std::size_t replicas)
      : s_(&s), file_(file) {
    if (file.empty()) return;
    if constexpr (requires(trace_recorder* r) { s.set_trace(r); }) {
      rec_.emplace(replicas + 1, trace_options{steps});
      for (std::size_t r = 0; r < replicas; ++r) rec_->name_thread(r, "replica " + std::to_string(r));
      driver_ = replicas;
      rec_->name_thread(driver_, "driver");
      s.set_trace(&*rec_);
      // One reading of every worker's clock at the same instant: the offset onto the chief's.
      if constexpr (requires { w.barrier(); w.rank(); w.size(); }) {
        w.barrier();
        std::vector<double> t(w.size(), 0.0);
        t[w.rank()] = static_cast<double>(rec_->now());
        w.sum(t);
        offset_ns_ = static_cast<std::int64_t>(t[0]) - static_cast<std::int64_t>(t[w.rank()]);
      }
    } else {
      throw config_error("lockstep::fit: fit_options::trace_file needs a strategy with set_trace(trace_recorder*)");
    }
  }
  fit_tracer(const fit_tracer&) = delete;
  fit_tracer& operator=(const fit_tracer&) = delete;
  ~fit_tracer() {
    if constexpr (requires(trace_recorder* r) { s_->set_trace(r); })
      if (rec_) s_->set_trace(nullptr);
  }

  /// The recorder (null when not tracing).
  [[nodiscard]] trace_recorder* recorder() noexcept { return rec_ ? &*rec_ : nullptr; }
  /// The driver's thread index in the recorder.
  [[nodiscard]] std::size_t driver() const noexcept { return driver_; }
  /// Starts (or ends) recording for update `step`.
  void begin_step(std::uint64_t step) noexcept {
    if (rec_) rec_->begin_step(step);
  }
  /// Records a span of the driver.
  void driver_span(const char* name, const char* category, std::int64_t start_ns, std::int64_t end_ns,
                   const char* arg_name = nullptr, std::int64_t arg = 0) noexcept {
    if (rec_) rec_->record(driver_, name, category, start_ns, end_ns, arg_name, arg);
  }
  /// The recorder's clock (0 when not tracing).
  [[nodiscard]] std::int64_t now() const noexcept { return rec_ ? rec_->now() : 0; }

  /// Ends recording and brings every worker's events to the chief, which writes the file.
  /// Collective (every worker calls it). Returns what was written (zeros on other workers).
  template <class World>
  trace_written finish(World& w, bool chief) {
    trace_written out;
    if (!rec_) return out;
    rec_->stop();
    if constexpr (requires(trace_recorder* r) { s_->set_trace(r); }) s_->set_trace(nullptr);
    std::size_t rank = 0, workers = 1;
    if constexpr (requires { w.rank(); w.size(); }) {
      rank = w.rank();
      workers = w.size();
    }
    const std::vector<std::uint8_t> mine =
        rec_->serialize(static_cast<std::uint32_t>(rank), "worker " + std::to_string(rank));
    std::vector<std::vector<std::uint8_t>> blocks;
    std::vector<double> offsets(workers, 0.0);
    offsets[rank] = static_cast<double>(offset_ns_);
    if constexpr (requires { w.gather_blocks(std::span<const std::uint8_t>(mine)); }) {
      blocks = w.gather_blocks(std::span<const std::uint8_t>(mine));
      w.sum(offsets);
    } else {
      blocks.push_back(mine);
    }
    rec_.reset();
    if (!chief) return out;
    std::vector<io::trace_block> parts;
    for (std::size_t p = 0; p < blocks.size(); ++p)
      parts.push_back(io::trace_block{blocks[p], static_cast<std::int64_t>(offsets[p])});
    out.dropped = 0;
    for (const auto& b : parts) {
      const trace_block_content c = read_trace_block(b.bytes);
      out.spans += c.events.size();
      out.dropped += static_cast<std::size_t>(c.dropped);
    }
    out.bytes = io::write_chrome_trace(file_, parts);
    return out;
  }

private:
  S* s_;
  std::string file_;
  std::optional<trace_recorder> rec_;
  std::size_t driver_ = 0;
  std::int64_t offset_ns_ = 0;
};

}  // namespace lockstep::detail
