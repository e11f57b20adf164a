#pragma once
/// @file tensorboard.hpp
/// TensorBoard event files, written without protobuf or TensorFlow: the file is a sequence of
/// TFRecords (u64 length, u32 masked CRC32C of the length, the bytes, u32 masked CRC32C of the
/// bytes; little-endian), each holding one `Event` message encoded here by hand: wall_time
/// (field 1, double), step (field 2, int64), file_version (field 3, string), summary (field 5,
/// a `Summary` of repeated `Value`s with tag (field 1) and simple_value (field 2, float)) or
/// session_log (field 7, a `SessionLog` whose status (field 1) is START, 1: a restart, after
/// which TensorBoard drops the directory's earlier events at this step and later).
/// The first record is file_version "brain.Event:2". Every record goes out in one write(2) on a
/// file opened for appending, with no buffer in the process, so a process killed at any moment
/// loses at most the record it was writing.

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/io/detail/json.hpp>

static_assert(std::endian::native == std::endian::little,
              "lockstep::io: the TensorBoard writer copies scalars as a little-endian host holds them");

namespace lockstep::io {

namespace detail::tensorboard {

/// The CRC-32C (Castagnoli, reflected polynomial 0x82f63b78) lookup table.
inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82f63b78u : c >> 1;
    t[i] = c;
  }
  return t;
}();

/// CRC-32C of `bytes`.
[[nodiscard]] constexpr std::uint32_t crc32c(std::span<const std::uint8_t> bytes) noexcept {
  std::uint32_t c = 0xffffffffu;
  for (const std::uint8_t b : bytes) c = crc32c_table[(c ^ b) & 0xffu] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

/// The masked CRC TFRecord stores: rotated right by 15 bits plus a constant.
[[nodiscard]] constexpr std::uint32_t masked_crc32c(std::span<const std::uint8_t> bytes) noexcept {
  const std::uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/// Appends protobuf's base-128 varint of `v`.
inline void put_varint(std::vector<std::uint8_t>& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<std::uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<std::uint8_t>(v));
}
/// Appends a field key (field number, wire type).
inline void put_key(std::vector<std::uint8_t>& out, std::uint32_t field, std::uint32_t wire) {
  put_varint(out, (static_cast<std::uint64_t>(field) << 3) | wire);
}
/// Appends the little-endian bytes of a fixed-width value.
template <class T>
inline void put_fixed(std::vector<std::uint8_t>& out, T v) {
  std::uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}
/// Appends a length-delimited field.
inline void put_bytes(std::vector<std::uint8_t>& out, std::uint32_t field, std::span<const std::uint8_t> bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.insert(out.end(), bytes.begin(), bytes.end());
}

}  // namespace detail::tensorboard

/// One scalar of an event: a tag ("epoch/loss") and its value.
struct tensorboard_scalar {
  std::string_view tag;  ///< the chart it belongs to
  double value = 0;      ///< its value (written as a float, as TensorBoard's simple_value)
};

/// Appends events to a new TensorBoard event file `events.out.tfevents.<unix time>.<host>` in a
/// directory (see the file comment). Not thread-safe: one thread writes.
class tensorboard_writer {
public:
  /// Creates `dir` if needed and a new event file in it (a name already taken gets a suffix
  /// .1, .2, ...), and writes the file_version record.
  /// @throws config_error when the directory or the file cannot be created.
  explicit tensorboard_writer(const std::filesystem::path& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw config_error("lockstep::tensorboard: cannot create directory " + dir.string() + ": " + ec.message());
    const auto secs = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
    const std::string base = "events.out.tfevents." + std::to_string(secs) + "." + host;
    for (int k = 0; fd_ < 0; ++k) {
      path_ = dir / (k == 0 ? base : base + "." + std::to_string(k));
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
      if (fd_ < 0 && (errno != EEXIST || k > 1000))
        throw config_error("lockstep::tensorboard: cannot create " + path_.string() + ": " + std::strerror(errno));
    }
    using namespace detail::tensorboard;
    event_.clear();
    put_key(event_, 1, 1);
    put_fixed(event_, wall_time());
    static constexpr std::string_view version = "brain.Event:2";
    put_bytes(event_, 3, {reinterpret_cast<const std::uint8_t*>(version.data()), version.size()});
    try {
      write_record();
    } catch (...) {  // no half-made file, and no descriptor, is left behind
      ::close(fd_);
      std::error_code ignored;
      std::filesystem::remove(path_, ignored);
      throw;
    }
  }
  tensorboard_writer(const tensorboard_writer&) = delete;
  tensorboard_writer& operator=(const tensorboard_writer&) = delete;
  /// Closes the file.
  ~tensorboard_writer() {
    if (fd_ >= 0) ::close(fd_);
  }

  /// The event file's path.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  /// Appends one event at `step` holding every scalar of `values` (one record, one write).
  /// @throws config_error, writing nothing, when a tag is not valid UTF-8 (a protobuf string:
  ///         TensorBoard's readers refuse the record); error when the write fails (the message
  ///         names the file); the file is cut back to its last whole record, so later events
  ///         still follow a readable file.
  void scalars(std::int64_t step, std::span<const tensorboard_scalar> values, double wall = wall_time()) {
    using namespace detail::tensorboard;
    for (const auto& v : values)
      if (!io::detail::valid_utf8(v.tag))
        throw config_error("lockstep::io::tensorboard_writer: the tag " + io::detail::quoted_for_message(v.tag) +
                           " is not valid UTF-8 (in " + path_.string() + ")");
    summary_.clear();
    for (const auto& v : values) {
      value_.clear();
      put_bytes(value_, 1, {reinterpret_cast<const std::uint8_t*>(v.tag.data()), v.tag.size()});
      put_key(value_, 2, 5);
      put_fixed(value_, static_cast<float>(v.value));
      put_bytes(summary_, 1, value_);
    }
    write_event(step, wall, 5);
  }
  /// Appends a restart at `step` (a SessionLog START event): TensorBoard's readers then drop the
  /// events of this directory's earlier files at `step` and later (those a resumed run writes
  /// again), so a curve shows each step once. @throws error as scalars().
  void session_start(std::int64_t step, double wall = wall_time()) {
    using namespace detail::tensorboard;
    summary_.clear();
    put_key(summary_, 1, 0);  // SessionLog.status = START
    put_varint(summary_, 1);
    write_event(step, wall, 7);
  }

  /// Appends one event at `step` with one scalar.
  void scalar(std::string_view tag, std::int64_t step, double value, double wall = wall_time()) {
    const tensorboard_scalar v{tag, value};
    scalars(step, std::span<const tensorboard_scalar>(&v, 1), wall);
  }

  /// Seconds since the Unix epoch, now (what an event's wall_time holds).
  [[nodiscard]] static double wall_time() {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

private:
  /// Writes the Event of `wall` and `step` whose field `field` (5: summary, 7: session_log) holds
  /// the message in summary_.
  void write_event(std::int64_t step, double wall, std::uint32_t field) {
    using namespace detail::tensorboard;
    event_.clear();
    put_key(event_, 1, 1);
    put_fixed(event_, wall);
    put_key(event_, 2, 0);
    put_varint(event_, static_cast<std::uint64_t>(step));
    put_bytes(event_, field, summary_);
    write_record();
  }

  void write_record() {
    using namespace detail::tensorboard;
    record_.clear();
    put_fixed(record_, static_cast<std::uint64_t>(event_.size()));
    put_fixed(record_, masked_crc32c(std::span<const std::uint8_t>(record_.data(), 8)));
    record_.insert(record_.end(), event_.begin(), event_.end());
    put_fixed(record_, masked_crc32c(event_));
    std::size_t done = 0;
    while (done < record_.size()) {  // one write(2) unless the kernel takes less
      const ::ssize_t w = ::write(fd_, record_.data() + done, record_.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        const int why = errno;
        if (done > 0) (void)::ftruncate(fd_, static_cast<::off_t>(written_));  // drop the torn record
        throw error("lockstep::tensorboard: " + path_.string() + ": write failed: " + std::strerror(why));
      }
      done += static_cast<std::size_t>(w);
    }
    written_ += record_.size();
  }

  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t written_ = 0;  // bytes of whole records in the file
  std::vector<std::uint8_t> value_, summary_, event_, record_;  // reused: steady writes do not allocate
};

}  // namespace lockstep::io
