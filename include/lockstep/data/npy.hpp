#pragma once
/// @file npy.hpp
/// NumPy `.npy` arrays as an index-first source: `npy(features, labels)` reads the headers and
/// the labels, keeps the features file open, and each load reads one row with pread, so a worker
/// touches only the bytes of its own rows. Features are uint8 or float32 (little-endian, C order)
/// of shape (N, ...); labels an integer array of shape (N,). Every header is untrusted: the
/// declared shape is checked against the file's size before any row is read, and a file that
/// shrinks afterwards makes the load of a row past its new end a data_error (a memory mapping would
/// have died of SIGBUS there).

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/indexed.hpp>
#include <lockstep/data/tar.hpp>

namespace lockstep::data {

/// The header of a .npy file.
struct npy_header {
  char kind = 0;                      ///< 'u' unsigned, 'i' signed, 'f' float, 'b' bool
  std::size_t item_size = 0;          ///< bytes per element
  std::vector<std::uint64_t> shape;   ///< the dimensions
  std::size_t data_offset = 0;        ///< where the data starts
  std::uint64_t elements = 0;         ///< product of the dimensions
};

namespace detail {

/// A strict reader of the Python dict literal of a .npy header.
class npy_dict_parser {
public:
  npy_dict_parser(std::string_view text, const std::string& path, std::size_t base) : t_(text), path_(path), base_(base) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw data_error("lockstep::data::npy: " + path_ + ": byte offset " + std::to_string(base_ + i_) + ": " + what);
  }
  void ws() {
    while (i_ < t_.size() && (t_[i_] == ' ' || t_[i_] == '\t' || t_[i_] == '\n' || t_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    ws();
    if (i_ < t_.size() && t_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "' in the header");
  }
  std::string str() {
    ws();
    if (i_ >= t_.size() || (t_[i_] != '\'' && t_[i_] != '"')) fail("expected a string in the header");
    const char q = t_[i_++];
    const std::size_t start = i_;
    while (i_ < t_.size() && t_[i_] != q) {
      if (t_[i_] == '\\') fail("escaped characters are not supported in the header");
      ++i_;
    }
    if (i_ >= t_.size()) fail("unterminated string in the header");
    return std::string(t_.substr(start, i_++ - start));
  }
  std::uint64_t number() {
    ws();
    const std::size_t start = i_;
    std::uint64_t v = 0;
    while (i_ < t_.size() && t_[i_] >= '0' && t_[i_] <= '9') {
      if (v > (std::uint64_t{1} << 56)) fail("a dimension is too large");
      v = v * 10 + static_cast<std::uint64_t>(t_[i_++] - '0');
    }
    if (i_ == start) fail("expected a non-negative integer in the shape");
    if (i_ < t_.size() && t_[i_] == 'L') ++i_;  // Python 2 long suffix
    return v;
  }
  bool boolean() {
    ws();
    if (t_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (t_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    fail("expected True or False");
  }
  bool at_end() {
    ws();
    return i_ == t_.size();
  }

private:
  std::string_view t_;
  const std::string& path_;
  std::size_t base_;
  std::size_t i_ = 0;
};

}  // namespace detail

/// Parses and checks the header of a .npy file from its first bytes (`head`, at least the whole
/// header) and the file's size. Accepts format versions 1-3, little-endian or byte-free dtypes of
/// one element ('|u1', '<f4', '<i8', ...), C order, rank >= 1; the data must fill the rest of the
/// file exactly.
/// @throws data_error naming the file and the byte offset: bad magic or version, a malformed
///         header, a big-endian, structured or Fortran-ordered array, a shape whose data does not
///         fit the file.
inline npy_header parse_npy_header(const std::uint8_t* head, std::size_t n, std::uint64_t file_size,
                                   const std::string& path) {
  const auto fail = [&](std::size_t at, const std::string& what) {
    throw data_error("lockstep::data::npy: " + path + ": byte offset " + std::to_string(at) + ": " + what);
  };
  static constexpr std::uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (n < 10 || std::memcmp(head, magic, 6) != 0) fail(0, "not a .npy file (bad magic)");
  const std::uint8_t major = head[6];
  std::size_t len = 0, start = 0;
  if (major == 1) {
    len = std::size_t{head[8]} | (std::size_t{head[9]} << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (n < 12) fail(8, "truncated header");
    len = std::size_t{head[8]} | (std::size_t{head[9]} << 8) | (std::size_t{head[10]} << 16) | (std::size_t{head[11]} << 24);
    start = 12;
  } else {
    fail(6, "format version " + std::to_string(major) + " is not supported (1, 2 or 3)");
  }
  if (len > (std::size_t{1} << 20)) fail(8, "the header declares " + std::to_string(len) + " bytes (limit 1 MiB)");
  if (start + len > n) fail(start, "truncated header (" + std::to_string(len) + " bytes declared)");
  detail::npy_dict_parser p(std::string_view(reinterpret_cast<const char*>(head + start), len), path, start);
  npy_header h;
  h.data_offset = start + len;
  bool got_descr = false, got_order = false, got_shape = false;
  p.expect('{');
  while (!p.eat('}')) {
    const std::string key = p.str();
    p.expect(':');
    if (key == "descr") {
      if (p.eat('[')) p.fail("structured dtypes are not supported");
      const std::string d = p.str();
      if (d.size() < 3) p.fail("unknown dtype '" + d + "'");
      if (d[0] == '>') p.fail("big-endian dtype '" + d + "' is not supported (save with arr.astype(arr.dtype.newbyteorder('<')))");
      if (d[0] != '<' && d[0] != '|' && d[0] != '=') p.fail("unknown dtype '" + d + "'");
      h.kind = d[1];
      h.item_size = 0;
      for (std::size_t i = 2; i < d.size(); ++i) {
        if (d[i] < '0' || d[i] > '9' || h.item_size > 64) p.fail("unknown dtype '" + d + "'");
        h.item_size = h.item_size * 10 + static_cast<std::size_t>(d[i] - '0');
      }
      if (h.item_size == 0 || h.item_size > 16) p.fail("unknown dtype '" + d + "'");
      got_descr = true;
    } else if (key == "fortran_order") {
      if (p.boolean()) p.fail("Fortran-ordered arrays are not supported (save with np.ascontiguousarray)");
      got_order = true;
    } else if (key == "shape") {
      p.expect('(');
      h.shape.clear();
      while (!p.eat(')')) {
        if (h.shape.size() >= 32) p.fail("more than 32 dimensions");
        h.shape.push_back(p.number());
        if (!p.eat(',')) {
          p.expect(')');
          break;
        }
      }
      got_shape = true;
    } else {
      p.fail("unknown header key '" + key + "'");
    }
    if (!p.eat(',')) {
      p.expect('}');
      break;
    }
  }
  if (!p.at_end()) p.fail("unexpected text after the header's dict");
  if (!got_descr || !got_order || !got_shape) fail(start, "the header lacks descr, fortran_order or shape");
  if (h.shape.empty()) fail(start, "a 0-dimensional array has no rows");
  std::uint64_t count = 1;
  for (const std::uint64_t d : h.shape) {
    if (d != 0 && count > (std::uint64_t{1} << 62) / d) fail(start, "the shape's element count overflows");
    count *= d;
  }
  h.elements = count;
  if (count > ((std::uint64_t{1} << 62) / h.item_size)) fail(start, "the shape's byte count overflows");
  const std::uint64_t bytes = count * h.item_size;
  if (file_size < h.data_offset || file_size - h.data_offset != bytes)
    fail(h.data_offset, "the shape declares " + std::to_string(bytes) + " data bytes, the file holds " +
                            std::to_string(file_size < h.data_offset ? 0 : file_size - h.data_offset));
  return h;
}

namespace detail {

/// A regular file opened for positional reads (pread), with its size when it was opened.
class npy_file {
public:
  npy_file() = default;
  /// Opens `path`, refusing what is not a regular file.
  explicit npy_file(const std::string& path) : path_(path), fd_(open_read(path, "npy")) {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0 || !S_ISREG(st.st_mode))
      throw data_error("lockstep::data::npy: " + path + ": not a regular file");
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  /// Reads n bytes at offset `at` into dst: `what` (with its `index` unless npos) of the file.
  /// @throws data_error naming the file, the offset and what: a read error, or fewer bytes than
  ///         asked (the file has shrunk since it was opened).
  void read(void* dst, std::size_t n, std::uint64_t at, const char* what_, std::uint64_t index = npos) const {
    const std::size_t got = pread_full(fd_.get(), dst, n, at);
    if (got == n) return;
    const int err = errno;  // before the messages' allocations
    const std::string what = index == npos ? std::string(what_) : what_ + (" " + std::to_string(index));
    const std::string head = "lockstep::data::npy: " + path_ + ": byte offset " + std::to_string(at) + ": ";
    if (got == static_cast<std::size_t>(-1)) throw data_error(head + "cannot read " + what + " (" + std::strerror(err) + ")");
    throw data_error(head + what + " is truncated (" + std::to_string(got) + " of " + std::to_string(n) +
                     " bytes): the file has shrunk since it was opened");
  }
  /// The file's first bytes: the whole header when the file holds it (at most the header's
  /// 1 MiB limit), else as many bytes as parse_npy_header needs to say what is wrong.
  [[nodiscard]] std::vector<std::uint8_t> head() const {
    constexpr std::uint64_t probe = 4096, limit = 12 + (std::uint64_t{1} << 20);
    std::vector<std::uint8_t> h(static_cast<std::size_t>(std::min(size_, probe)));
    read(h.data(), h.size(), 0, "the header");
    if (h.size() >= 12 && h[6] >= 1 && h[6] <= 3) {
      const std::uint64_t end = h[6] == 1 ? 10 + (std::uint64_t{h[8]} | (std::uint64_t{h[9]} << 8))
                                          : 12 + (std::uint64_t{h[8]} | (std::uint64_t{h[9]} << 8) |
                                                  (std::uint64_t{h[10]} << 16) | (std::uint64_t{h[11]} << 24));
      if (end > h.size() && end <= limit) {
        h.resize(static_cast<std::size_t>(std::min(end, size_)));
        read(h.data(), h.size(), 0, "the header");
      }
    }
    return h;
  }
  /// The file's size when it was opened.
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  /// read()'s "no index".
  static constexpr std::uint64_t npos = ~std::uint64_t{0};

private:
  std::string path_;
  file_handle fd_;
  std::uint64_t size_ = 0;
};

}  // namespace detail

/// How the rows of a uint8 .npy are images (for the image stages).
enum class npy_layout {
  rows,  ///< each row is a flat row of values (1 channel, 1 × width)
  hwc,   ///< shape (N, height, width, channels)
  chw,   ///< shape (N, channels, height, width)
};

/// Options of npy().
struct npy_options {
  npy_layout layout = npy_layout::rows;  ///< how uint8 rows are images
  load_options load{};                   ///< load threads, memory of the decoded rows
};

/// The .npy source (see npy()).
class npy_source final : public sample_source {
public:
  /// Opens `features` (and reads `labels`, unless empty) and checks them.
  npy_source(std::string features, std::string labels, const npy_options& o)
      : path_(std::move(features)), labels_path_(std::move(labels)), file_(path_), layout_(o.layout) {
    const std::vector<std::uint8_t> head = file_.head();
    header_ = parse_npy_header(head.data(), head.size(), file_.size(), path_);
    if (!((header_.kind == 'u' && header_.item_size == 1) || (header_.kind == 'f' && header_.item_size == 4)))
      throw data_error("lockstep::data::npy: " + path_ + ": features of dtype " + std::string(1, header_.kind) +
                       std::to_string(header_.item_size) + " are not supported: use uint8 or float32 "
                       "(arr.astype(np.float32))");
    rows_ = header_.shape[0];
    width_ = 1;
    for (std::size_t i = 1; i < header_.shape.size() && width_ <= 0xffffffffu; ++i)
      width_ = header_.shape[i] > 0xffffffffu ? header_.shape[i] : width_ * header_.shape[i];
    if (width_ == 0 || width_ > 0xffffffffu)
      throw data_error("lockstep::data::npy: " + path_ + ": rows of " + std::to_string(width_) + " values");
    if (layout_ != npy_layout::rows) {
      if (header_.kind != 'u' || header_.shape.size() != 4)
        throw config_error("lockstep::data::npy: " + path_ + ": an image layout needs uint8 data of shape (N, ., ., .)");
      const auto d = header_.shape;
      if (layout_ == npy_layout::hwc) {
        h_ = d[1], w_ = d[2], c_ = d[3];
      } else {
        c_ = d[1], h_ = d[2], w_ = d[3];
      }
      if (h_ > 0xffffffu || w_ > 0xffffffu || c_ > 4 || c_ == 0)
        throw data_error("lockstep::data::npy: " + path_ + ": images of " + std::to_string(c_) + " channels, " +
                         std::to_string(h_) + "x" + std::to_string(w_) + " are not supported (1 to 4 channels)");
    } else {
      c_ = 1, h_ = 1, w_ = width_;
    }
    if (!labels_path_.empty()) read_labels();
  }

  std::uint64_t size() const override { return rows_; }
  bool labels_in_index() const override { return !labels_.empty() || (rows_ == 0 && !labels_path_.empty()); }
  std::int32_t label(std::uint64_t i) const override { return labels_.empty() ? no_label : labels_[i]; }
  bool float_rows() const override { return header_.kind == 'f'; }
  std::uint32_t channels() const override { return static_cast<std::uint32_t>(c_); }
  std::optional<std::pair<std::uint32_t, std::uint32_t>> fixed_size() const override {
    return std::pair{static_cast<std::uint32_t>(h_), static_cast<std::uint32_t>(w_)};
  }
  void load(std::uint64_t i, const region_planner& regions, decoded_sample& out, load_scratch& scratch) const override {
    pipeline_counters& k = counters();
    const auto t0 = std::chrono::steady_clock::now();
    const std::size_t bytes = width_ * header_.item_size;
    const std::uint64_t at = header_.data_offset + i * bytes;
    if (header_.kind == 'f') {
      out.values.resize(width_);
      file_.read(out.values.data(), bytes, at, "row", i);
      out.channels = 1;
      out.height = 1;
      out.width = static_cast<std::uint32_t>(width_);
    } else {
      out.channels = static_cast<std::uint32_t>(c_);
      out.height = static_cast<std::uint32_t>(h_);
      out.width = static_cast<std::uint32_t>(w_);
      (void)regions.plan(out.height, out.width);
      out.region = {0, 0, out.width, out.height};
      out.pixels.resize(bytes);
      if (layout_ == npy_layout::chw && c_ > 1) {
        scratch.bytes.resize(bytes);
        file_.read(scratch.bytes.data(), bytes, at, "row", i);
        const std::uint8_t* row = scratch.bytes.data();
        const std::size_t plane = h_ * w_;
        for (std::size_t p = 0; p < plane; ++p)
          for (std::size_t c = 0; c < c_; ++c) out.pixels[p * c_ + c] = row[c * plane + p];
      } else {
        file_.read(out.pixels.data(), bytes, at, "row", i);
      }
    }
    k.bytes_read += bytes;
    k.read_ns += detail::ns_since(t0);
  }
  std::string name_of(std::uint64_t i) const override { return path_ + ": row " + std::to_string(i); }
  std::string describe() const override {
    return "npy " + path_ + " (" + std::to_string(rows_) + " rows of " + std::to_string(width_) + " " +
           (header_.kind == 'f' ? "float32" : "uint8") + (labels_path_.empty() ? ")" : ", labels " + labels_path_ + ")");
  }

private:
  void read_labels() {
    const detail::npy_file f(labels_path_);
    const std::vector<std::uint8_t> head = f.head();
    const npy_header h = parse_npy_header(head.data(), head.size(), f.size(), labels_path_);
    if ((h.kind != 'i' && h.kind != 'u') || (h.item_size != 1 && h.item_size != 2 && h.item_size != 4 && h.item_size != 8))
      throw data_error("lockstep::data::npy: " + labels_path_ + ": labels must be integers (int8..int64, uint8..uint64)");
    if (h.shape.size() != 1 || h.shape[0] != rows_)
      throw data_error("lockstep::data::npy: " + labels_path_ + ": " + std::to_string(h.shape.size() == 1 ? h.shape[0] : 0) +
                       " labels in an array of rank " + std::to_string(h.shape.size()) + " for the " +
                       std::to_string(rows_) + " rows of " + path_ + " (need shape (" + std::to_string(rows_) + ",))");
    labels_.resize(static_cast<std::size_t>(rows_));
    // Read in blocks (the size was checked against the file's, so the labels exist).
    std::vector<std::uint8_t> block(std::min<std::size_t>(labels_.size() * h.item_size, 65536));
    const std::size_t per_block = block.size() / h.item_size;
    const std::uint8_t* p = block.data();
    for (std::size_t i = 0; i < labels_.size(); ++i, p += h.item_size) {
      if (i % per_block == 0) {
        const std::size_t n = std::min(per_block, labels_.size() - i) * h.item_size;
        f.read(block.data(), n, h.data_offset + i * h.item_size, "label", i);
        p = block.data();
      }
      std::uint64_t u = 0;
      std::memcpy(&u, p, h.item_size);  // little-endian host (x86, arm64)
      std::int64_t v = 0;
      if (h.kind == 'i') {
        const unsigned shift = 64 - 8 * static_cast<unsigned>(h.item_size);
        v = static_cast<std::int64_t>(u << shift) >> shift;
      } else {
        v = u > 0x7fffffffu ? -1 : static_cast<std::int64_t>(u);
      }
      if (v < 0 || v > 0x7fffffff)
        throw data_error("lockstep::data::npy: " + labels_path_ + ": byte offset " +
                         std::to_string(h.data_offset + i * h.item_size) + ": label " + std::to_string(i) +
                         " is negative or beyond int32");
      labels_[i] = static_cast<std::int32_t>(v);
    }
  }

  std::string path_, labels_path_;
  detail::npy_file file_;
  npy_layout layout_;
  npy_header header_;
  std::uint64_t rows_ = 0;
  std::size_t width_ = 0, c_ = 1, h_ = 1, w_ = 1;
  std::vector<std::int32_t> labels_;
};

/// Unlabelled rows of a .npy file (uint8 or float32), index-first: each row is read from the
/// file when its batch is cut. @throws data_error as parse_npy_header.
inline indexed_dataset npy(const std::string& features, const npy_options& o = {}) {
  return indexed_dataset(std::make_shared<npy_source>(features, "", o), o.load);
}

/// Rows of `features` with the integer labels of `labels` (shape (N,), values 0 .. 2^31-1).
/// @throws data_error as parse_npy_header, or when the label count or a label is wrong.
inline indexed_dataset npy(const std::string& features, const std::string& labels, const npy_options& o = {}) {
  return indexed_dataset(std::make_shared<npy_source>(features, labels, o), o.load);
}

}  // namespace lockstep::data
