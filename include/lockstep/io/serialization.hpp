#pragma once
/// @file serialization.hpp
/// Little-endian binary encoding of the scalars, strings and arrays that checkpoints are made of,
/// CRC-32 (zlib's), and a bounds-checked reader that reports the offset of every failure.

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>

namespace lockstep::io {

static_assert(std::endian::native == std::endian::little,
              "lockstep::io: the checkpoint encoder assumes a little-endian host");

/// CRC-32 (the zlib / gzip polynomial) of `bytes`, continuing from `crc` (0 to start).
inline std::uint32_t crc32_of(std::span<const std::uint8_t> bytes, std::uint32_t crc = 0) noexcept {
  uLong c = crc;
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::size_t chunk = std::min<std::size_t>(bytes.size() - done, 1u << 30);
    c = ::crc32(c, bytes.data() + done, static_cast<uInt>(chunk));
    done += chunk;
  }
  return static_cast<std::uint32_t>(c);
}

/// Appends little-endian scalars, strings and arrays to a growing byte vector.
class writer {
public:
  /// Appends a trivially copyable scalar (integer or floating point) as its little-endian bytes.
  template <class T>
    requires std::is_arithmetic_v<T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
  }
  /// Appends raw bytes.
  void put_bytes(std::span<const std::uint8_t> b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  /// Appends a string as a u32 length and its characters.
  void put_string(std::string_view s) {
    put(static_cast<std::uint32_t>(s.size()));
    put_bytes({reinterpret_cast<const std::uint8_t*>(s.data()), s.size()});
  }
  /// Appends an array as a u64 element count and its elements.
  template <class T>
    requires std::is_arithmetic_v<T>
  void put_array(std::span<const T> a) {
    put(static_cast<std::uint64_t>(a.size()));
    put_bytes({reinterpret_cast<const std::uint8_t*>(a.data()), a.size_bytes()});
  }
  /// The bytes written so far.
  [[nodiscard]] const std::vector<std::uint8_t>& bytes() const noexcept { return bytes_; }
  /// Takes the bytes out.
  [[nodiscard]] std::vector<std::uint8_t> take() noexcept { return std::move(bytes_); }

private:
  std::vector<std::uint8_t> bytes_;
};

/// Reads what `writer` wrote from a byte range; every read is bounds-checked and a failure
/// throws checkpoint_error naming the source, the section and the absolute file offset.
class reader {
public:
  /// A reader of `bytes`, which start at file offset `base` of `source` inside section `section`.
  reader(std::span<const std::uint8_t> bytes, std::string source, std::string section, std::size_t base = 0)
      : bytes_(bytes), source_(std::move(source)), section_(std::move(section)), base_(base) {}

  /// Reads one little-endian scalar.
  template <class T>
    requires std::is_arithmetic_v<T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  /// Reads a string written by writer::put_string.
  std::string get_string(const char* what) {
    const auto n = get<std::uint32_t>(what);
    need(n, what);
    std::string s;
    if (n > 0) s.assign(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  /// Reads an array written by writer::put_array.
  template <class T>
    requires std::is_arithmetic_v<T>
  std::vector<T> get_array(const char* what) {
    const std::size_t at = offset();
    const auto n = get<std::uint64_t>(what);
    if (n > (bytes_.size() - pos_) / sizeof(T))
      fail_at(at, std::string(what) + ": declares " + std::to_string(n) + " elements, more than the section holds");
    std::vector<T> v(static_cast<std::size_t>(n));
    if (!v.empty()) std::memcpy(v.data(), bytes_.data() + pos_, v.size() * sizeof(T));  // never from null
    pos_ += v.size() * sizeof(T);
    return v;
  }
  /// Throws unless every byte was consumed.
  void expect_end() const {
    if (pos_ != bytes_.size())
      fail(std::to_string(bytes_.size() - pos_) + " unexpected trailing bytes in the section");
  }
  /// Current absolute file offset.
  [[nodiscard]] std::size_t offset() const noexcept { return base_ + pos_; }
  /// Throws checkpoint_error "<source>: section '<section>' at offset <n>: <what>" (n: the current offset).
  [[noreturn]] void fail(const std::string& what) const { fail_at(offset(), what); }
  /// Throws checkpoint_error as fail, naming absolute file offset `at` (that of a field already read).
  [[noreturn]] void fail_at(std::size_t at, const std::string& what) const {
    throw checkpoint_error("lockstep::checkpoint: " + source_ + ": section '" + section_ + "' at offset " +
                           std::to_string(at) + ": " + what);
  }

private:
  void need(std::size_t n, const char* what) const {
    if (n > bytes_.size() - pos_)
      fail(std::string("truncated: ") + what + " needs " + std::to_string(n) + " bytes, " +
           std::to_string(bytes_.size() - pos_) + " remain");
  }

  std::span<const std::uint8_t> bytes_;
  std::string source_;
  std::string section_;
  std::size_t base_;
  std::size_t pos_ = 0;
};

}  // namespace lockstep::io
