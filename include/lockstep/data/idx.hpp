#pragma once
/// @file idx.hpp
/// The IDX source (MNIST, Fashion-MNIST): uint8 images of rank 3 and uint8 labels of rank 1, plain
/// or gzip-compressed (through zlib), validated and decoded once into one contiguous array.

#include <zlib.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/memory.hpp>

namespace lockstep::data {

/// The decoded content of one IDX file.
struct idx_file {
  std::vector<std::uint8_t> bytes;       ///< the whole decompressed file (header, then data)
  std::vector<std::uint32_t> dims;       ///< the dimensions from the header
  std::size_t header_size = 0;           ///< bytes before the data (4 + 4 * rank)
  /// Number of data bytes (the product of the dimensions).
  [[nodiscard]] std::size_t data_size() const noexcept { return bytes.size() - header_size; }
};

namespace detail {

inline std::string hex32(std::uint32_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s = "0x00000000";
  for (int i = 0; i < 8; ++i) s[9 - i] = digits[(v >> (4 * i)) & 0xf];
  return s;
}

/// RAII owner of a zlib gzFile (reads gzip and plain files alike).
class gz_reader {
public:
  explicit gz_reader(std::string path) : path_(std::move(path)), file_(gzopen(path_.c_str(), "rb")) {
    if (!file_) throw data_error("lockstep::data::idx: " + path_ + ": byte offset 0: cannot open file");
    gzbuffer(file_, 1u << 18);
  }
  gz_reader(const gz_reader&) = delete;
  gz_reader& operator=(const gz_reader&) = delete;
  ~gz_reader() { gzclose(file_); }

  [[noreturn]] void fail(std::size_t offset, const std::string& what) const {
    throw data_error("lockstep::data::idx: " + path_ + ": byte offset " + std::to_string(offset) + ": " + what);
  }

  /// Reads up to n bytes; returns how many were read (short only at the end of the data).
  std::size_t read_some(std::uint8_t* dst, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
      const int got = gzread(file_, dst + done, chunk);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        fail(offset_ + done, std::string("corrupt gzip data (zlib: ") + (msg ? msg : "unknown error") +
                                 ", compressed offset " + std::to_string(static_cast<long long>(gzoffset(file_))) + ")");
      }
      if (got == 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        if (code != Z_OK && code != Z_STREAM_END)
          fail(offset_ + done, std::string("corrupt or truncated gzip data (zlib: ") + (msg ? msg : "?") + ")");
        break;
      }
      done += static_cast<std::size_t>(got);
    }
    offset_ += done;
    return done;
  }

  /// Reads exactly n bytes or throws naming what was expected.
  void read_exact(std::uint8_t* dst, std::size_t n, const char* what) {
    const std::size_t start = offset_;
    const std::size_t got = read_some(dst, n);
    if (got != n)
      fail(start + got, std::string("truncated file: ") + what + " needs " + std::to_string(n) + " bytes from offset " +
                            std::to_string(start) + ", the file ends after " + std::to_string(start + got) + " bytes");
  }

  [[nodiscard]] const std::string& path() const noexcept { return path_; }

private:
  std::string path_;
  gzFile file_;
  std::size_t offset_ = 0;
};

inline std::uint32_t load_be32(const std::uint8_t* p) noexcept {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
}

}  // namespace detail

/// Reads and validates one uint8 IDX file of the given rank (magic 0x0000080R, big-endian
/// dimensions, exactly prod(dims) data bytes, no trailing bytes).
/// @throws data_error naming the file and the byte offset of the problem.
inline idx_file read_idx(const std::string& path, std::uint8_t rank) {
  detail::gz_reader in(path);
  idx_file f;
  std::uint8_t head[4];
  in.read_exact(head, 4, "the magic number");
  const std::uint32_t magic = detail::load_be32(head);
  const std::uint32_t expected = 0x800u | rank;
  if (magic != expected) {
    std::string why = "bad magic " + detail::hex32(magic) + ", expected " + detail::hex32(expected) +
                      " (uint8 data of rank " + std::to_string(rank) + ")";
    if (head[0] != 0 || head[1] != 0) why += "; not an IDX file";
    else if (head[2] != 0x08) why += "; element type code " + std::to_string(head[2]) + " is not uint8 (8)";
    else why += "; the file has rank " + std::to_string(head[3]);
    in.fail(0, why);
  }
  std::vector<std::uint8_t> dimbytes(4u * rank);
  in.read_exact(dimbytes.data(), dimbytes.size(), "the dimensions");
  std::size_t total = 1;
  for (std::uint8_t i = 0; i < rank; ++i) {
    const std::uint32_t d = detail::load_be32(dimbytes.data() + 4u * i);
    if (i > 0 && d == 0) in.fail(4 + 4u * i, "dimension " + std::to_string(i) + " is 0");
    if (d != 0 && total > (std::size_t{1} << 40) / d)
      in.fail(4 + 4u * i, "dimensions too large (more than 2^40 bytes of data)");
    total *= d;
    f.dims.push_back(d);
  }
  f.header_size = 4 + 4u * rank;
  f.bytes.resize(f.header_size + total);
  std::copy(head, head + 4, f.bytes.begin());
  std::copy(dimbytes.begin(), dimbytes.end(), f.bytes.begin() + 4);
  in.read_exact(f.bytes.data() + f.header_size, total, "the data");
  std::uint8_t extra = 0;
  if (in.read_some(&extra, 1) != 0)
    in.fail(f.bytes.size(), "trailing bytes after the " + std::to_string(total) + " data bytes the header declares");
  return f;
}

/// Images (IDX rank 3, magic 0x00000803) and their labels (IDX rank 1, magic 0x00000801), plain
/// or gzip. Decoded once into one contiguous uint8 array; each sample is a view of one image row
/// (width = rows * cols) with its label; `map(scale(1.0f / 255))` normalises it to [0, 1] while the
/// batch is assembled. @throws data_error (file and byte offset) on any malformed input, or
/// when the image and label counts disagree.
inline dataset<sample> idx(const std::string& images_path, const std::string& labels_path) {
  idx_file images = read_idx(images_path, 3);
  idx_file labels = read_idx(labels_path, 1);
  if (images.dims[0] != labels.dims[0])
    throw data_error("lockstep::data::idx: " + images_path + " has " + std::to_string(images.dims[0]) +
                     " images but " + labels_path + " has " + std::to_string(labels.dims[0]) +
                     " labels (count at byte offset 4 of both files)");
  auto t = std::make_shared<table>();
  t->rows = images.dims[0];
  t->width = std::size_t{images.dims[1]} * images.dims[2];
  t->byte_offset = images.header_size;
  t->bytes = std::move(images.bytes);
  t->labels.assign(labels.bytes.begin() + static_cast<std::ptrdiff_t>(labels.header_size), labels.bytes.end());
  return from_table(std::move(t));
}

/// Unlabelled images from one IDX rank-3 file. @throws data_error as idx(images, labels).
inline dataset<sample> idx(const std::string& images_path) {
  idx_file images = read_idx(images_path, 3);
  auto t = std::make_shared<table>();
  t->rows = images.dims[0];
  t->width = std::size_t{images.dims[1]} * images.dims[2];
  t->byte_offset = images.header_size;
  t->bytes = std::move(images.bytes);
  return from_table(std::move(t));
}

}  // namespace lockstep::data
