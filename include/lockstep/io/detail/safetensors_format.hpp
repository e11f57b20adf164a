#pragma once
/// @file safetensors_format.hpp
/// The model-independent half of safetensors files: element types and their conversions (fp32 to
/// bf16 and fp16 rounded to nearest even, and back), the header written as JSON, and a strict
/// reader of untrusted headers that checks every entry against the tensors a model expects.
///
/// A safetensors file is: u64 little-endian header length n, n bytes of JSON (an object mapping each
/// tensor name to {"dtype", "shape", "data_offsets": [begin, end)} and an optional "__metadata__"
/// object of strings; spaces may pad it), then the data buffer, in which the tensors' byte ranges
/// must follow each other without gap or overlap and cover it exactly.

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/io/detail/json.hpp>

namespace lockstep::io {

/// Element types of safetensors tensors that lockstep reads and writes.
enum class safetensors_dtype : std::uint8_t {
  f32,   ///< IEEE binary32 ("F32")
  bf16,  ///< bfloat16: the upper half of a binary32 ("BF16")
  f16,   ///< IEEE binary16 ("F16")
  i64,   ///< signed 64-bit integer ("I64"; batch norm's num_batches_tracked)
};

/// How one tensor of a file maps onto a model's flat parameter buffer.
struct safetensors_entry {
  /// Where the values come from.
  enum class source : std::uint8_t {
    copy,       ///< `count` consecutive values of the flat buffer, in the file's order
    transpose,  ///< a rows x cols row-major matrix of the flat buffer, stored as cols x rows
    counter,    ///< not in the flat buffer: a scalar int64 counter (batch norm's num_batches_tracked)
  };
  std::string name;                    ///< the PyTorch state_dict key ("3.1.weight")
  std::vector<std::uint64_t> shape;    ///< the PyTorch shape ([] for a scalar)
  source from = source::copy;          ///< how the values map onto the flat buffer
  std::size_t offset = 0;              ///< first element in the flat buffer (parameters, then state)
  std::size_t rows = 0;                ///< transpose: rows of the matrix in the flat buffer
  std::size_t cols = 0;                ///< transpose: columns of the matrix in the flat buffer

  /// Number of elements (the product of the shape; 1 for a scalar).
  [[nodiscard]] std::uint64_t elements() const noexcept {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
};

namespace detail::safetensors {

/// The dtype's name in the file ("F32", "BF16", "F16", "I64").
[[nodiscard]] constexpr std::string_view dtype_name(safetensors_dtype d) noexcept {
  switch (d) {
    case safetensors_dtype::f32: return "F32";
    case safetensors_dtype::bf16: return "BF16";
    case safetensors_dtype::f16: return "F16";
    case safetensors_dtype::i64: return "I64";
  }
  return "?";
}

/// Bytes per element of `d`.
[[nodiscard]] constexpr std::size_t dtype_size(safetensors_dtype d) noexcept {
  switch (d) {
    case safetensors_dtype::f32: return 4;
    case safetensors_dtype::bf16: return 2;
    case safetensors_dtype::f16: return 2;
    case safetensors_dtype::i64: return 8;
  }
  return 0;
}

/// The dtype named `s` in a file, if lockstep reads it.
[[nodiscard]] constexpr std::optional<safetensors_dtype> dtype_from_name(std::string_view s) noexcept {
  for (auto d : {safetensors_dtype::f32, safetensors_dtype::bf16, safetensors_dtype::f16, safetensors_dtype::i64})
    if (s == dtype_name(d)) return d;
  return std::nullopt;
}

/// fp32 to bfloat16, rounded to nearest even; NaN stays a (quiet) NaN of the same sign.
[[nodiscard]] constexpr std::uint16_t float_to_bf16(float f) noexcept {
  std::uint32_t b = std::bit_cast<std::uint32_t>(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((b >> 16) | 0x0040u);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<std::uint16_t>(b >> 16);
}

/// bfloat16 to fp32 (exact).
[[nodiscard]] constexpr float bf16_to_float(std::uint16_t h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16);
}

/// fp32 to IEEE binary16, rounded to nearest even (overflow to infinity, gradual underflow to
/// subnormals and zero); NaN stays a quiet NaN of the same sign.
[[nodiscard]] constexpr std::uint16_t float_to_f16(float f) noexcept {
  const std::uint32_t b = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((b >> 16) & 0x8000u);
  const std::uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds past 65504: infinity
  if (a < 0x38800000u) {                                                     // below 2^-14: a subnormal half
    if (a <= 0x33000000u) return sign;                                       // at most 2^-25: rounds to zero
    const std::uint32_t e = a >> 23;
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // 14..24: the value is m * 2^-(shift) units of 2^-24
    std::uint32_t q = m >> shift;
    const std::uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (q & 1u))) ++q;  // may carry into the smallest normal
    return static_cast<std::uint16_t>(sign | q);
  }
  std::uint32_t r = a - 0x38000000u;  // the exponent rebiased from 127 to 15
  r += 0xfffu + ((r >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | (r >> 13));
}

/// IEEE binary16 to fp32 (exact).
[[nodiscard]] constexpr float f16_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t e = (h >> 10) & 0x1fu;
  std::uint32_t m = h & 0x3ffu;
  std::uint32_t bits = 0;
  if (e == 0x1fu) {
    bits = sign | 0x7f800000u | (m << 13);
  } else if (e == 0) {
    if (m == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      e = 113;
      while (!(m & 0x400u)) {
        m <<= 1;
        --e;
      }
      bits = sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
  } else {
    bits = sign | ((e + 112u) << 23) | (m << 13);
  }
  return std::bit_cast<float>(bits);
}

/// `v` as "0x" and 16 lowercase hex digits (how the metadata writes a model signature).
[[nodiscard]] inline std::string hex_text(std::uint64_t v) {
  std::string s = "0x";
  for (int shift = 60; shift >= 0; shift -= 4) s += "0123456789abcdef"[(v >> shift) & 15u];
  return s;
}

/// `shape` as a JSON array ("[5,27]").
[[nodiscard]] inline std::string shape_json(std::span<const std::uint64_t> shape) {
  std::string t = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) t += ',';
    t += std::to_string(shape[i]);
  }
  t += ']';
  return t;
}

/// What the header says about one tensor the model expects.
struct found_tensor {
  bool seen = false;                  ///< the header names it
  safetensors_dtype dtype{};          ///< its element type
  std::uint64_t begin = 0, end = 0;   ///< its byte range in the data buffer
  std::size_t at = 0;                 ///< file offset of its name in the header
};

/// The most dimensions a tensor of a file may have.
inline constexpr std::size_t max_rank = 8;

/// A strict reader of a safetensors header against the tensors a model expects. It accepts JSON
/// of the format's own structure only (an object of tensor objects and one metadata object of
/// strings: three levels), so no input nests deeper; every failure throws checkpoint_error naming
/// the file, the byte offset and, once known, the tensor.
class header_reader {
public:
  /// A reader of header text `text`, which starts at byte `base` of file `source`, for tensors `want`.
  header_reader(std::string_view text, std::size_t base, std::string source, std::span<const safetensors_entry> want)
      : text_(text), base_(base), source_(std::move(source)), want_(want), found_(want.size()) {
    index_.reserve(want.size());
    for (std::size_t i = 0; i < want.size(); ++i) index_.emplace(want[i].name, i);
  }

  /// Reads the whole header; afterwards found() holds one entry per wanted tensor, every one seen.
  void read() {
    skip_ws();
    expect('{', "the header must be a JSON object");
    skip_ws();
    if (peek() == '}') {
      ++pos_;
    } else {
      for (;;) {
        skip_ws();
        const std::size_t at = pos_;
        read_string(key_, "a tensor name");
        skip_ws();
        expect(':', "':' after a name");
        skip_ws();
        if (key_ == "__metadata__") {
          if (metadata_seen_) fail_at(at, "'__metadata__' appears twice");
          metadata_seen_ = true;
          read_metadata();
        } else {
          read_tensor(at);
        }
        skip_ws();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}', "',' or '}' after a tensor");
        break;
      }
    }
    skip_ws();
    if (pos_ != text_.size()) fail("trailing characters after the header object");
    for (std::size_t i = 0; i < want_.size(); ++i)
      if (!found_[i].seen)
        throw checkpoint_error(prefix() + "tensor '" + want_[i].name + "' of the model is missing from the file");
  }

  /// The tensors found, in the order of the wanted list.
  [[nodiscard]] const std::vector<found_tensor>& found() const noexcept { return found_; }
  /// The model signature the metadata gives ("lockstep.signature"), if any.
  [[nodiscard]] const std::optional<std::uint64_t>& signature() const noexcept { return signature_; }
  /// File offset of the signature's value (meaningful when signature() has one).
  [[nodiscard]] std::size_t signature_offset() const noexcept { return base_ + signature_at_; }
  /// "lockstep::safetensors: <file>: ".
  [[nodiscard]] std::string prefix() const { return "lockstep::safetensors: " + source_ + ": "; }

private:
  [[noreturn]] void fail_at(std::size_t at, const std::string& what) const {
    throw checkpoint_error(prefix() + "header at offset " + std::to_string(base_ + at) + ": " + what);
  }
  [[noreturn]] void fail(const std::string& what) const { fail_at(pos_, what); }
  [[noreturn]] void fail_tensor(std::size_t at, std::string_view name, const std::string& what) const {
    throw checkpoint_error(prefix() + "tensor '" + std::string(name) + "' at offset " + std::to_string(base_ + at) +
                           ": " + what);
  }

  [[nodiscard]] char peek() const {
    if (pos_ >= text_.size()) fail("the header ends too early");
    return text_[pos_];
  }
  void expect(char c, const char* what) {
    if (peek() != c) fail(std::string("expected ") + what);
    ++pos_;
  }
  void skip_ws() noexcept {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  static int hex_digit(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  std::uint32_t read_hex4() {
    if (text_.size() - pos_ < 4) fail("truncated \\u escape");
    std::uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const int d = hex_digit(text_[pos_++]);
      if (d < 0) fail("bad hex digit in a \\u escape");
      v = (v << 4) | static_cast<std::uint32_t>(d);
    }
    return v;
  }
  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  // Reads a JSON string into `out` (reused: it never holds more than the header's length).
  void read_string(std::string& out, const char* what) {
    if (peek() != '"') fail(std::string("expected ") + what + " (a JSON string)");
    const std::size_t start = ++pos_;
    out.clear();
    for (;;) {
      if (pos_ >= text_.size()) fail_at(start - 1, "unterminated string");
      const char c = text_[pos_++];
      if (c == '"') break;
      if (static_cast<unsigned char>(c) < 0x20) fail_at(pos_ - 1, "control character in a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail_at(start - 1, "unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = read_hex4();
          if (cp >= 0xdc00 && cp <= 0xdfff) fail_at(pos_ - 6, "unpaired low surrogate in a \\u escape");
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (text_.size() - pos_ < 6 || text_[pos_] != '\\' || text_[pos_ + 1] != 'u')
              fail_at(pos_ - 6, "unpaired high surrogate in a \\u escape");
            pos_ += 2;
            const std::uint32_t lo = read_hex4();
            if (lo < 0xdc00 || lo > 0xdfff) fail_at(pos_ - 6, "a high surrogate not followed by a low one");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          append_utf8(out, cp);
          break;
        }
        default: fail_at(pos_ - 2, "bad escape in a string");
      }
    }
    if (!valid_utf8(out)) fail_at(start - 1, "a string that is not valid UTF-8");
  }
  // A non-negative integer without sign, fraction, exponent or leading zero, below 2^64.
  std::uint64_t read_uint(const char* what) {
    const std::size_t start = pos_;
    const char c = peek();
    if (c < '0' || c > '9') fail(std::string("expected ") + what + " (a non-negative integer)");
    std::uint64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      const auto d = static_cast<std::uint64_t>(text_[pos_] - '0');
      if (v > (~std::uint64_t{0} - d) / 10) fail_at(start, std::string(what) + " does not fit in 64 bits");
      v = v * 10 + d;
      ++pos_;
    }
    if (text_[start] == '0' && pos_ - start > 1) fail_at(start, std::string(what) + " has a leading zero");
    if (pos_ < text_.size() && (text_[pos_] == '.' || text_[pos_] == 'e' || text_[pos_] == 'E'))
      fail_at(start, std::string(what) + " must be an integer");
    return v;
  }
  void read_metadata() {
    expect('{', "'__metadata__' to be an object of strings");
    skip_ws();
    if (peek() == '}') {
      ++pos_;
      return;
    }
    for (;;) {
      skip_ws();
      const std::size_t at = pos_;
      read_string(key_, "a metadata key");
      skip_ws();
      expect(':', "':' after a metadata key");
      skip_ws();
      const std::size_t value_at = pos_;
      read_string(value_, "a metadata value (metadata values are strings)");
      if (key_ == "lockstep.signature") {
        if (signature_) fail_at(at, "'lockstep.signature' appears twice in the metadata");
        signature_ = parse_hex64(value_, value_at);
        signature_at_ = value_at;
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      expect('}', "',' or '}' in the metadata");
      return;
    }
  }
  std::uint64_t parse_hex64(std::string_view v, std::size_t at) const {
    if (v.size() < 3 || v.size() > 18 || v[0] != '0' || v[1] != 'x')
      fail_at(at, "'lockstep.signature' must be 0x followed by 1 to 16 hex digits");
    std::uint64_t r = 0;
    for (std::size_t i = 2; i < v.size(); ++i) {
      const int d = hex_digit(v[i]);
      if (d < 0) fail_at(at, "'lockstep.signature' must be 0x followed by 1 to 16 hex digits");
      r = (r << 4) | static_cast<std::uint64_t>(d);
    }
    return r;
  }
  void read_tensor(std::size_t at) {
    const auto it = index_.find(key_);
    if (it == index_.end())
      fail_tensor(at, key_,
                  "no tensor of this name in the model (its first is '" +
                      (want_.empty() ? std::string() : want_.front().name) + "')");
    const std::size_t i = it->second;
    found_tensor& f = found_[i];
    const safetensors_entry& w = want_[i];
    if (f.seen) fail_tensor(at, w.name, "appears twice in the header");
    f.seen = true;
    f.at = base_ + at;
    expect('{', "a tensor to be an object");
    bool has_dtype = false, has_shape = false, has_offsets = false;
    std::array<std::uint64_t, max_rank> dims{};
    std::size_t rank = 0;
    skip_ws();
    if (peek() != '}') {
      for (;;) {
        skip_ws();
        const std::size_t field_at = pos_;
        read_string(field_, "a field name");
        skip_ws();
        expect(':', "':' after a field name");
        skip_ws();
        if (field_ == "dtype") {
          if (has_dtype) fail_tensor(field_at, w.name, "'dtype' appears twice");
          has_dtype = true;
          const std::size_t value_at = pos_;
          read_string(value_, "the dtype");
          const auto d = dtype_from_name(value_);
          if (!d) fail_tensor(value_at, w.name, "dtype '" + value_ + "' is not one lockstep reads (F32, BF16, F16; I64 for counters)");
          f.dtype = *d;
        } else if (field_ == "shape") {
          if (has_shape) fail_tensor(field_at, w.name, "'shape' appears twice");
          has_shape = true;
          expect('[', "the shape to be an array");
          skip_ws();
          if (peek() != ']') {
            for (;;) {
              skip_ws();
              if (rank == max_rank) fail_tensor(pos_, w.name, "the shape has more than " + std::to_string(max_rank) + " dimensions");
              dims[rank++] = read_uint("a dimension");
              skip_ws();
              if (peek() == ',') {
                ++pos_;
                continue;
              }
              expect(']', "',' or ']' in the shape");
              break;
            }
          } else {
            ++pos_;
          }
        } else if (field_ == "data_offsets") {
          if (has_offsets) fail_tensor(field_at, w.name, "'data_offsets' appears twice");
          has_offsets = true;
          expect('[', "data_offsets to be an array [begin, end]");
          skip_ws();
          f.begin = read_uint("the first data offset");
          skip_ws();
          expect(',', "two data offsets");
          skip_ws();
          f.end = read_uint("the second data offset");
          skip_ws();
          expect(']', "exactly two data offsets");
          if (f.end < f.begin)
            fail_tensor(field_at, w.name, "data_offsets [" + std::to_string(f.begin) + ", " + std::to_string(f.end) + ") end before they begin");
        } else {
          fail_tensor(field_at, w.name, "unknown field '" + field_ + "' (a tensor has dtype, shape and data_offsets)");
        }
        skip_ws();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}', "',' or '}' in a tensor");
        break;
      }
    } else {
      ++pos_;
    }
    if (!has_dtype || !has_shape || !has_offsets)
      fail_tensor(at, w.name, std::string("lacks '") + (!has_dtype ? "dtype" : !has_shape ? "shape" : "data_offsets") + "'");
    check_against_model(at, w, f, std::span<const std::uint64_t>(dims.data(), rank));
  }
  void check_against_model(std::size_t at, const safetensors_entry& w, const found_tensor& f,
                           std::span<const std::uint64_t> dims) const {
    const bool counter = w.from == safetensors_entry::source::counter;
    if (counter != (f.dtype == safetensors_dtype::i64))
      fail_tensor(at, w.name, "dtype " + std::string(dtype_name(f.dtype)) + ", but the model keeps it as " +
                                  (counter ? "I64" : "a floating-point tensor (F32, BF16 or F16)"));
    if (!std::equal(dims.begin(), dims.end(), w.shape.begin(), w.shape.end()))
      fail_tensor(at, w.name, "shape " + shape_text(dims) + ", but the model's is " + shape_text(w.shape));
    const std::uint64_t bytes = w.elements() * dtype_size(f.dtype);  // the model's shape: no overflow
    if (f.end - f.begin != bytes)
      fail_tensor(at, w.name, "data_offsets [" + std::to_string(f.begin) + ", " + std::to_string(f.end) + ") hold " +
                                  std::to_string(f.end - f.begin) + " bytes, but shape " + shape_text(w.shape) + " of " +
                                  std::string(dtype_name(f.dtype)) + " needs " + std::to_string(bytes));
  }

public:
  /// "[a, b, c]".
  static std::string shape_text(std::span<const std::uint64_t> s) {
    std::string t = "[";
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (i) t += ", ";
      t += std::to_string(s[i]);
    }
    t += ']';
    return t;
  }

private:
  std::string_view text_;
  std::size_t base_;
  std::string source_;
  std::span<const safetensors_entry> want_;
  std::vector<found_tensor> found_;
  std::unordered_map<std::string_view, std::size_t> index_;
  std::size_t pos_ = 0;
  std::string key_, field_, value_;
  bool metadata_seen_ = false;
  std::optional<std::uint64_t> signature_;
  std::size_t signature_at_ = 0;
};

/// Checks that the byte ranges of `found` (all seen) follow each other from 0 without gap or
/// overlap and end exactly at `data_size`; a failure names the tensor and its range.
inline void check_coverage(std::span<const found_tensor> found, std::span<const safetensors_entry> want,
                           std::uint64_t data_size, std::size_t data_base, const std::string& prefix) {
  std::vector<std::size_t> order(found.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return found[a].begin != found[b].begin ? found[a].begin < found[b].begin : found[a].end < found[b].end;
  });
  std::uint64_t next = 0;
  std::size_t prev = found.size();
  for (const std::size_t i : order) {
    const found_tensor& f = found[i];
    const std::string range = "data_offsets [" + std::to_string(f.begin) + ", " + std::to_string(f.end) + ")";
    if (f.begin < next)
      throw checkpoint_error(prefix + "tensor '" + want[i].name + "' at offset " + std::to_string(f.at) + ": " + range +
                             " overlap tensor '" + want[prev].name + "', which ends at " + std::to_string(next));
    if (f.begin > next)
      throw checkpoint_error(prefix + "tensor '" + want[i].name + "' at offset " + std::to_string(f.at) + ": " + range +
                             " leave bytes [" + std::to_string(next) + ", " + std::to_string(f.begin) +
                             ") of the data (file offset " + std::to_string(data_base + next) + ") to no tensor");
    if (f.end > data_size)
      throw checkpoint_error(prefix + "tensor '" + want[i].name + "' at offset " + std::to_string(f.at) + ": " + range +
                             " pass the end of the data, which holds " + std::to_string(data_size) + " bytes");
    next = f.end;
    prev = i;
  }
  if (next != data_size)
    throw checkpoint_error(prefix + "data at offset " + std::to_string(data_base + next) + ": " +
                           std::to_string(data_size - next) + " bytes after the last tensor belong to no tensor");
}

}  // namespace detail::safetensors
}  // namespace lockstep::io
