#pragma once
/// @file trace.hpp
/// A timeline recorder: spans (name, category, start, duration, one integer argument) recorded
/// into preallocated per-thread buffers against one monotonic clock, within a window of training
/// steps. Recording allocates nothing and, while the recorder is not active, costs one branch.
/// At the end of a run each worker serializes its events into a block (trace_recorder::serialize)
/// that the chief merges into one Chrome trace-event file (io/trace.hpp).
///
/// Threads are the recorder's own indices (tid in the trace): by convention the replicas first
/// (0 .. replicas - 1), then any other thread that records (the pipeline, the driver), each named
/// with name_thread. Only thread t records into buffer t, so recording takes no lock.

#include <atomic>
#include <charconv>
#include <concepts>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>

namespace lockstep {

/// The training steps a trace records: from `first` up to, not including, `last` (0-based step
/// numbers, the model's update count before the step).
struct trace_window {
  std::uint64_t first = 10;  ///< first step recorded
  std::uint64_t last = 20;   ///< first step no longer recorded (std::uint64_t max: to the end)
  /// True when step `s` lies in the window.
  [[nodiscard]] constexpr bool contains(std::uint64_t s) const noexcept { return s >= first && s < last; }
};

/// Parses a `--trace-steps` value: "A:B" (steps A to B - 1) or "A:" (from A to the end).
/// @throws config_error naming `option` and the text when it is not of that form or B <= A.
[[nodiscard]] inline trace_window parse_trace_steps(std::string_view text, std::string_view option = "--trace-steps") {
  const auto bad = [&](const char* why) {
    return config_error("lockstep: " + std::string(option) + " '" + std::string(text) + "': " + why +
                        " (expected A:B, the steps A to B - 1, or A: for every step from A)");
  };
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) throw bad("no ':'");
  const auto number = [&](std::string_view s, std::uint64_t& v) {
    if (s.empty()) return false;
    const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc{} && p == s.data() + s.size();
  };
  trace_window w;
  if (!number(text.substr(0, colon), w.first)) throw bad("A is not a non-negative integer");
  const std::string_view rest = text.substr(colon + 1);
  if (rest.empty()) {
    w.last = std::numeric_limits<std::uint64_t>::max();
    return w;
  }
  if (!number(rest, w.last)) throw bad("B is not a non-negative integer");
  if (w.last <= w.first) throw bad("B must be larger than A");
  return w;
}

/// One recorded span. Names, categories and argument names are static strings (string literals):
/// recording copies a pointer, never characters.
struct trace_event {
  std::int64_t start_ns = 0;      ///< start on the recorder's clock (ns since its origin)
  std::int64_t duration_ns = 0;   ///< length in ns (>= 0)
  const char* name = "";          ///< what ran ("forward", "reduce bucket")
  const char* category = "";      ///< its kind ("compute", "communication", "io", "pipeline")
  const char* arg_name = nullptr; ///< name of the integer argument (null: none)
  std::int64_t arg = 0;           ///< the argument (a layer, a bucket)
};

/// Options of a trace_recorder.
struct trace_options {
  trace_window steps{};                        ///< the steps recorded
  std::size_t events_per_thread = 1u << 16;    ///< capacity of each thread's buffer (events past it are dropped and counted)
};

/// Records spans of several threads into preallocated buffers (see the file comment).
class trace_recorder {
public:
  /// A recorder for `threads` threads with buffers of o.events_per_thread events each (allocated
  /// here, once); its clock starts now.
  explicit trace_recorder(std::size_t threads, trace_options o = {})
      : o_(o), origin_(std::chrono::steady_clock::now()), threads_(threads) {
    for (auto& t : threads_) t.events.resize(o_.events_per_thread);
  }

  /// Number of threads (buffers).
  [[nodiscard]] std::size_t threads() const noexcept { return threads_.size(); }
  /// The options it was made with.
  [[nodiscard]] const trace_options& options() const noexcept { return o_; }

  /// Starts step `step` (call between steps, from the thread driving them): the recorder is
  /// active during the steps of its window. Returns whether it is.
  bool begin_step(std::uint64_t step) noexcept {
    const bool on = o_.steps.contains(step);
    active_.store(on, std::memory_order_relaxed);
    return on;
  }
  /// Stops recording (after the last step, or to pause).
  void stop() noexcept { active_.store(false, std::memory_order_relaxed); }
  /// True while spans are being recorded.
  [[nodiscard]] bool active() const noexcept { return active_.load(std::memory_order_relaxed); }

  /// Nanoseconds since the recorder's origin on the monotonic clock.
  [[nodiscard]] std::int64_t now() const noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin_).count();
  }
  /// The origin of the clock (a steady_clock time point), to compute offsets between workers.
  [[nodiscard]] std::chrono::steady_clock::time_point origin() const noexcept { return origin_; }

  /// Records a span [start_ns, end_ns) of thread `thread` when active (no allocation; a full
  /// buffer drops the span and counts it). Call only from the thread that owns index `thread`.
  void record(std::size_t thread, const char* name, const char* category, std::int64_t start_ns, std::int64_t end_ns,
              const char* arg_name = nullptr, std::int64_t arg = 0) noexcept {
    if (!active()) return;
    if (thread >= threads_.size()) return;
    per_thread& t = threads_[thread];
    if (t.count == t.events.size()) {
      ++t.dropped;
      return;
    }
    t.events[t.count++] = trace_event{start_ns, end_ns >= start_ns ? end_ns - start_ns : 0, name, category, arg_name, arg};
  }

  /// Names thread `thread` in the trace ("replica 0", "pipeline"). Not for the recording threads
  /// while they record (it may allocate).
  void name_thread(std::size_t thread, std::string name) {
    if (thread < threads_.size()) threads_[thread].name = std::move(name);
  }
  /// The events thread `thread` recorded, in the order recorded.
  [[nodiscard]] std::span<const trace_event> events(std::size_t thread) const {
    const per_thread& t = threads_.at(thread);
    return {t.events.data(), t.count};
  }
  /// Spans dropped because a buffer was full, over every thread.
  [[nodiscard]] std::size_t dropped() const noexcept {
    std::size_t n = 0;
    for (const auto& t : threads_) n += t.dropped;
    return n;
  }
  /// Forgets every recorded span (the buffers stay allocated).
  void clear() noexcept {
    for (auto& t : threads_) t.count = t.dropped = 0;
  }

  /// The recorded spans and thread names as a self-contained block (names copied as strings) for
  /// worker `worker` named `worker_name`, which merge_trace_blocks / io::write_chrome_trace read.
  /// Call once recording has ended.
  [[nodiscard]] std::vector<std::uint8_t> serialize(std::uint32_t worker, std::string_view worker_name = {}) const;

private:
  struct alignas(64) per_thread {
    std::vector<trace_event> events;
    std::size_t count = 0;
    std::size_t dropped = 0;
    std::string name;
  };
  trace_options o_;
  std::chrono::steady_clock::time_point origin_;
  std::vector<per_thread> threads_;
  std::atomic<bool> active_{false};
};

/// A span of the calling thread, recorded when it ends if the recorder was active when it began:
/// `{ trace_span s(rec, replica, "forward", "compute", "layer", i); ... }`. A null recorder or an
/// inactive one costs one branch on construction and one on destruction.
class trace_span {
public:
  /// Starts a span of thread `thread` on `recorder` (which may be null).
  trace_span(trace_recorder* recorder, std::size_t thread, const char* name, const char* category,
             const char* arg_name = nullptr, std::int64_t arg = 0) noexcept
      : r_(recorder != nullptr && recorder->active() ? recorder : nullptr) {
    if (r_) {
      thread_ = thread;
      name_ = name;
      category_ = category;
      arg_name_ = arg_name;
      arg_ = arg;
      start_ = r_->now();
    }
  }
  trace_span(const trace_span&) = delete;
  trace_span& operator=(const trace_span&) = delete;
  /// Records the span.
  ~trace_span() {
    if (r_) r_->record(thread_, name_, category_, start_, r_->now(), arg_name_, arg_);
  }

private:
  trace_recorder* r_;
  std::size_t thread_ = 0;
  const char* name_ = nullptr;
  const char* category_ = nullptr;
  const char* arg_name_ = nullptr;
  std::int64_t arg_ = 0;
  std::int64_t start_ = 0;
};

/// A span of work queued on context `ctx`: on a context that times its own stream (members
/// `trace_open` and `trace_close`, the CUDA backend's) a device span, read back at the end of the
/// step (end_device_spans), so that it shows when the work ran rather than when it was queued;
/// on any other context a trace_span of the calling thread. Costs what a trace_span costs while
/// the recorder is null or inactive.
template <class Ctx>
class work_span {
public:
  /// Starts a span of `thread` (a replica) on `recorder` (which may be null) for work on `ctx`.
  /// @throws what the context's trace_open throws (a device_error from CUDA), reported by the
  ///         step like any other failure of the replica.
  work_span(Ctx& ctx, trace_recorder* recorder, std::size_t thread, const char* name, const char* category,
            const char* arg_name = nullptr, std::int64_t arg = 0)
      : host_(device_timed ? nullptr : recorder, thread, name, category, arg_name, arg) {
    if constexpr (device_timed)
      if (recorder != nullptr && recorder->active()) {
        ctx_ = &ctx;
        index_ = ctx.trace_open(name, category, arg_name, arg);
      }
  }
  work_span(const work_span&) = delete;
  work_span& operator=(const work_span&) = delete;
  /// Ends the span.
  ~work_span() {
    if constexpr (device_timed)
      if (ctx_ != nullptr) ctx_->trace_close(index_);
  }

private:
  static constexpr bool device_timed = requires(Ctx& c, const char* s, std::int64_t a, std::size_t i) {
    { c.trace_open(s, s, s, a) } -> std::convertible_to<std::size_t>;
    c.trace_close(i);
  };
  trace_span host_;
  Ctx* ctx_ = nullptr;
  std::size_t index_ = 0;
};

/// Starts the device spans of a step on `ctx` (see work_span) when `recorder` records; nothing
/// on a context without them.
template <class Ctx>
void begin_device_spans(Ctx& ctx, trace_recorder* recorder) {
  if constexpr (requires(trace_recorder& r) { ctx.trace_begin(r); })
    if (recorder != nullptr && recorder->active()) ctx.trace_begin(*recorder);
}

/// Ends the device spans of a step on `ctx`: waits for its work and records them as thread
/// `thread` of `recorder` (call from that thread); nothing on a context without them.
template <class Ctx>
void end_device_spans(Ctx& ctx, trace_recorder* recorder, std::size_t thread) {
  if constexpr (requires(trace_recorder& r) { ctx.trace_flush(r, thread); })
    if (recorder != nullptr && recorder->active()) ctx.trace_flush(*recorder, thread);
}

/// One span of a serialized block, with its strings.
struct trace_block_event {
  std::int64_t start_ns = 0;     ///< start on the block's worker clock
  std::int64_t duration_ns = 0;  ///< length in ns
  std::uint32_t thread = 0;      ///< tid
  std::string name;              ///< what ran
  std::string category;          ///< its kind
  std::string arg_name;          ///< the argument's name ("" when none)
  std::int64_t arg = 0;          ///< the argument
};

/// A serialized block read back.
struct trace_block_content {
  std::uint32_t worker = 0;                                      ///< pid
  std::string worker_name;                                       ///< the process's name ("" : "worker N")
  std::vector<std::pair<std::uint32_t, std::string>> thread_names;  ///< (tid, name) of each named thread
  std::vector<trace_block_event> events;                         ///< the spans
  std::uint64_t dropped = 0;                                     ///< spans the worker dropped
};

namespace detail::trace {

inline constexpr std::uint32_t block_magic = 0x4b42534cu;  // "LSBK"

inline void put_u32(std::vector<std::uint8_t>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
inline void put_u64(std::vector<std::uint8_t>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
inline void put_string(std::vector<std::uint8_t>& out, std::string_view s) {
  put_u32(out, static_cast<std::uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

/// Bounds-checked reading of a block; a fault is a data_error naming the block's offset.
class block_reader {
public:
  explicit block_reader(std::span<const std::uint8_t> b) : b_(b) {}
  std::uint64_t u64() {
    need(8);
    std::uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | b_[pos_ + static_cast<std::size_t>(i)];
    pos_ += 8;
    return v;
  }
  std::uint32_t u32() {
    need(4);
    std::uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | b_[pos_ + static_cast<std::size_t>(i)];
    pos_ += 4;
    return v;
  }
  std::string str() {
    const std::uint32_t n = u32();
    need(n);
    std::string s(reinterpret_cast<const char*>(b_.data()) + pos_, n);
    pos_ += n;
    return s;
  }
  [[nodiscard]] std::size_t left() const noexcept { return b_.size() - pos_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw data_error("lockstep::trace: block at offset " + std::to_string(pos_) + ": " + what);
  }

private:
  void need(std::size_t n) const {
    if (n > b_.size() - pos_) fail("truncated (" + std::to_string(n) + " bytes needed, " + std::to_string(b_.size() - pos_) + " left)");
  }
  std::span<const std::uint8_t> b_;
  std::size_t pos_ = 0;
};

}  // namespace detail::trace

inline std::vector<std::uint8_t> trace_recorder::serialize(std::uint32_t worker, std::string_view worker_name) const {
  using namespace detail::trace;
  std::vector<std::uint8_t> out;
  put_u32(out, block_magic);
  put_u32(out, worker);
  put_string(out, worker_name);
  put_u64(out, dropped());
  std::uint32_t named = 0;
  for (const auto& t : threads_) named += t.name.empty() ? 0 : 1;
  put_u32(out, named);
  for (std::size_t i = 0; i < threads_.size(); ++i)
    if (!threads_[i].name.empty()) {
      put_u32(out, static_cast<std::uint32_t>(i));
      put_string(out, threads_[i].name);
    }
  std::uint64_t total = 0;
  for (const auto& t : threads_) total += t.count;
  put_u64(out, total);
  for (std::size_t i = 0; i < threads_.size(); ++i)
    for (const trace_event& e : events(i)) {
      put_u64(out, static_cast<std::uint64_t>(e.start_ns));
      put_u64(out, static_cast<std::uint64_t>(e.duration_ns));
      put_u32(out, static_cast<std::uint32_t>(i));
      put_string(out, e.name ? e.name : "");
      put_string(out, e.category ? e.category : "");
      put_string(out, e.arg_name ? e.arg_name : "");
      put_u64(out, static_cast<std::uint64_t>(e.arg));
    }
  return out;
}

/// Reads a block trace_recorder::serialize wrote (possibly on another worker).
/// @throws data_error naming the offset when the block is truncated or malformed.
[[nodiscard]] inline trace_block_content read_trace_block(std::span<const std::uint8_t> block) {
  detail::trace::block_reader r(block);
  if (r.u32() != detail::trace::block_magic) r.fail("not a trace block (bad magic)");
  trace_block_content c;
  c.worker = r.u32();
  c.worker_name = r.str();
  c.dropped = r.u64();
  const std::uint32_t named = r.u32();
  if (named > r.left() / 8) r.fail("more thread names than the block holds");
  for (std::uint32_t i = 0; i < named; ++i) {
    const std::uint32_t tid = r.u32();
    c.thread_names.emplace_back(tid, r.str());
  }
  const std::uint64_t n = r.u64();
  if (n > r.left() / 40) r.fail("more events than the block holds");
  c.events.reserve(static_cast<std::size_t>(n));
  for (std::uint64_t i = 0; i < n; ++i) {
    trace_block_event e;
    e.start_ns = static_cast<std::int64_t>(r.u64());
    e.duration_ns = static_cast<std::int64_t>(r.u64());
    if (e.duration_ns < 0) r.fail("a negative duration");
    e.thread = r.u32();
    e.name = r.str();
    e.category = r.str();
    e.arg_name = r.str();
    e.arg = static_cast<std::int64_t>(r.u64());
    c.events.push_back(std::move(e));
  }
  if (r.left() != 0) r.fail("trailing bytes");
  return c;
}

}  // namespace lockstep
