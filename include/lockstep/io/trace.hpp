#pragma once
/// @file trace.hpp
/// The timeline file: the blocks of every worker's trace_recorder (core/trace.hpp) merged into one
/// file in the Chrome trace-event format, which Perfetto (ui.perfetto.dev) and chrome://tracing
/// open. Each worker is a process (pid = worker, named by a "process_name" metadata event), each
/// recorder thread a thread (tid, named by "thread_name"); every span is a complete event ("ph":
/// "X") with "ts" and "dur" in microseconds on the chief's clock: a worker's block comes with the
/// offset from its clock to the chief's.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <lockstep/core/trace.hpp>
#include <lockstep/io/checkpoint.hpp>
#include <lockstep/io/detail/json.hpp>
#include <lockstep/version.hpp>

namespace lockstep::io {

/// One worker's serialized trace (trace_recorder::serialize) and the offset, in ns, that maps
/// its clock onto the chief's (chief time = worker time + offset; 0 for the chief itself).
struct trace_block {
  std::span<const std::uint8_t> bytes;  ///< the block
  std::int64_t clock_offset_ns = 0;     ///< worker clock to chief clock
};

namespace detail::trace_json {

// ns as microseconds with three decimals ("-12.345"), exactly.
inline void append_us(std::string& out, std::int64_t ns) {
  const bool neg = ns < 0;
  const std::uint64_t a = neg ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%llu.%03llu", neg ? "-" : "", static_cast<unsigned long long>(a / 1000),
                static_cast<unsigned long long>(a % 1000));
  out += buf;
}

}  // namespace detail::trace_json

/// The Chrome trace-event JSON of `blocks` (one per worker): metadata events naming every
/// process and named thread, then every span as a complete event, sorted by time within each
/// thread. The top-level object also says how many spans were dropped ("otherData").
/// @throws data_error when a block is malformed.
[[nodiscard]] inline std::string chrome_trace_json(std::span<const trace_block> blocks) {
  namespace tj = detail::trace_json;
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  const auto sep = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  std::uint64_t dropped = 0;
  for (const trace_block& b : blocks) {
    trace_block_content c = read_trace_block(b.bytes);
    dropped += c.dropped;
    const std::string pid = std::to_string(c.worker);
    sep();
    out += "{\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":0,\"ts\":0,\"name\":\"process_name\",\"cat\":\"__metadata\",\"args\":{\"name\":";
    detail::append_json_string(out, c.worker_name.empty() ? "worker " + pid : c.worker_name);
    out += "}}";
    sep();
    out += "{\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":0,\"ts\":0,\"name\":\"process_sort_index\",\"cat\":\"__metadata\",\"args\":{\"sort_index\":" + pid + "}}";
    for (const auto& [tid, name] : c.thread_names) {
      sep();
      out += "{\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + std::to_string(tid) +
             ",\"ts\":0,\"name\":\"thread_name\",\"cat\":\"__metadata\",\"args\":{\"name\":";
      detail::append_json_string(out, name);
      out += "}}";
    }
    std::stable_sort(c.events.begin(), c.events.end(), [](const trace_block_event& x, const trace_block_event& y) {
      if (x.thread != y.thread) return x.thread < y.thread;
      if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
      return x.duration_ns > y.duration_ns;  // an enclosing span before the spans inside it
    });
    for (const trace_block_event& e : c.events) {
      sep();
      out += "{\"ph\":\"X\",\"pid\":" + pid + ",\"tid\":" + std::to_string(e.thread) + ",\"ts\":";
      tj::append_us(out, e.start_ns + b.clock_offset_ns);
      out += ",\"dur\":";
      tj::append_us(out, e.duration_ns);
      out += ",\"name\":";
      detail::append_json_string(out, e.name);
      out += ",\"cat\":";
      detail::append_json_string(out, e.category);
      out += ",\"args\":{";
      if (!e.arg_name.empty()) {
        detail::append_json_string(out, e.arg_name);
        out += ':' + std::to_string(e.arg);
      }
      out += "}}";
    }
  }
  out += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"lockstep " + std::to_string(version_major) + "." +
         std::to_string(version_minor) + "." + std::to_string(version_patch) +
         "\",\"dropped_spans\":" + std::to_string(dropped) + "}}\n";
  return out;
}

/// Writes the trace of `blocks` (chrome_trace_json) to `path` atomically (write_file_atomically),
/// readable as a file created under the process's umask, and returns its size in bytes. Only the chief calls it, with every worker's block.
/// @throws data_error when a block is malformed; whatever writing the file throws.
inline std::uintmax_t write_chrome_trace(const std::filesystem::path& path, std::span<const trace_block> blocks) {
  const std::string json = chrome_trace_json(blocks);
  write_file_atomically(path, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(json.data()), json.size()));
  return json.size();
}

/// Writes the trace of one process's recorder `r` (worker 0, no other worker) to `path`; returns its size.
inline std::uintmax_t write_chrome_trace(const std::filesystem::path& path, const trace_recorder& r) {
  const std::vector<std::uint8_t> block = r.serialize(0);
  const trace_block b{block, 0};
  return write_chrome_trace(path, std::span<const trace_block>(&b, 1));
}

}  // namespace lockstep::io
