#pragma once
/// @file idx.hpp
/// The IDX source (MNIST, Fashion-MNIST): uint8 images of rank 3 and uint8 labels of rank 1, plain
/// or gzip-compressed (through zlib), validated and decoded once into one contiguous array.
/// Memory follows the bytes the file really holds, never what its header declares.

#include <zlib.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
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

/// Reads one IDX file, plain or gzip (one or more concatenated members), in bounded chunks.
/// Offsets in messages count bytes of the decompressed stream; for gzip input the message says
/// so and adds the compressed offset where zlib stopped. Nothing after the last gzip member is
/// accepted (as nothing after the data of a plain file is).
class idx_stream {
public:
  explicit idx_stream(std::string path) : path_(std::move(path)), file_(std::fopen(path_.c_str(), "rb")) {
    if (!file_) throw data_error("lockstep::data::idx: " + path_ + ": cannot open file: " + os_reason(errno));
    in_.resize(std::size_t{1} << 16);
    refill();
    gzip_ = avail_ >= 2 && in_[0] == 0x1f && in_[1] == 0x8b;
    if (gzip_) {
      if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) {
        std::fclose(file_);
        throw data_error("lockstep::data::idx: " + path_ + ": byte offset 0: cannot start zlib");
      }
      z_ready_ = true;
    } else {
      struct stat st {};
      if (::fstat(::fileno(file_), &st) == 0 && S_ISREG(st.st_mode)) plain_size_ = static_cast<std::size_t>(st.st_size);
    }
  }
  idx_stream(const idx_stream&) = delete;
  idx_stream& operator=(const idx_stream&) = delete;
  ~idx_stream() {
    if (z_ready_) inflateEnd(&z_);
    std::fclose(file_);
  }

  /// Throws data_error "lockstep::data::idx: <file>: byte offset <offset>: <what>" (for gzip,
  /// the file is followed by a note that offsets are in the decompressed stream).
  [[noreturn]] void fail(std::size_t offset, const std::string& what) const {
    throw data_error("lockstep::data::idx: " + path_ + (gzip_ ? " (gzip; offsets in the decompressed stream)" : "") +
                     ": byte offset " + std::to_string(offset) + ": " + what);
  }

  /// Reads up to n bytes; returns how many were read (short only at the end of the data).
  std::size_t read_some(std::uint8_t* dst, std::size_t n) {
    const std::size_t got = gzip_ ? inflate_some(dst, n) : copy_some(dst, n);
    offset_ += got;
    return got;
  }

  /// Reads exactly n bytes or throws naming what was expected.
  void read_exact(std::uint8_t* dst, std::size_t n, const char* what) {
    const std::size_t start = offset_;
    const std::size_t got = read_some(dst, n);
    if (got != n) truncated(start, got, n, what);
  }

  /// Throws "truncated file: <what> needs <n> bytes from offset <start>, the file ends after ...".
  [[noreturn]] void truncated(std::size_t start, std::size_t got, std::size_t n, const char* what) const {
    fail(start + got, std::string("truncated file: ") + what + " needs " + std::to_string(n) + " bytes from offset " +
                          std::to_string(start) + ", the file ends after " + std::to_string(start + got) + " bytes");
  }

  /// The size of a plain regular file (nullopt for gzip input or when it is not a regular file).
  [[nodiscard]] std::optional<std::size_t> plain_size() const noexcept { return plain_size_; }
  /// Bytes delivered so far (the offset of the next byte in the decompressed stream).
  [[nodiscard]] std::size_t offset() const noexcept { return offset_; }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

private:
  // Moves the unread input to the front of the buffer and tops it up from the file.
  void refill() {
    if (pos_ > 0) {
      std::memmove(in_.data(), in_.data() + pos_, avail_);
      pos_ = 0;
    }
    while (!eof_ && avail_ < in_.size()) {
      const std::size_t got = std::fread(in_.data() + avail_, 1, in_.size() - avail_, file_);
      if (got == 0) {
        if (std::ferror(file_)) fail(offset_, "read error: " + os_reason(errno));
        eof_ = true;
      }
      avail_ += got;
    }
  }

  std::size_t copy_some(std::uint8_t* dst, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      if (avail_ == 0) {
        refill();
        if (avail_ == 0) break;
      }
      const std::size_t k = std::min(n - done, avail_);
      std::memcpy(dst + done, in_.data() + pos_, k);
      pos_ += k;
      avail_ -= k;
      done += k;
    }
    return done;
  }

  std::string where() const { return "compressed offset " + std::to_string(consumed_); }

  std::size_t inflate_some(std::uint8_t* dst, std::size_t n) {
    std::size_t done = 0;
    while (done < n) {
      if (member_done_) {
        if (avail_ < 2) refill();
        if (avail_ == 0) break;  // the end of the last member: a clean end of the stream
        if (avail_ < 2 || in_[pos_] != 0x1f || in_[pos_ + 1] != 0x8b)
          fail(offset_ + done, "trailing bytes after the gzip stream (" + where() + ")");
        inflateReset(&z_);
        member_done_ = false;
      }
      if (avail_ == 0) {
        refill();
        if (avail_ == 0)
          fail(offset_ + done, "truncated gzip data: the compressed file ends inside a member (" + where() + ")");
      }
      z_.next_in = in_.data() + pos_;
      z_.avail_in = static_cast<uInt>(avail_);
      z_.next_out = dst + done;
      z_.avail_out = static_cast<uInt>(std::min<std::size_t>(n - done, 1u << 30));
      const uInt out_before = z_.avail_out;
      const int rc = inflate(&z_, Z_NO_FLUSH);
      const std::size_t used = avail_ - z_.avail_in;
      pos_ += used;
      avail_ -= used;
      consumed_ += used;
      done += out_before - z_.avail_out;
      if (rc == Z_STREAM_END) {
        member_done_ = true;
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        fail(offset_ + done, std::string("corrupt gzip data (zlib: ") + (z_.msg ? z_.msg : "error " + std::to_string(rc)) +
                                 ", " + where() + ")");
      }
    }
    return done;
  }

  std::string path_;
  std::FILE* file_;
  std::vector<std::uint8_t> in_;   // compressed (or plain) input buffer
  std::size_t pos_ = 0;            // first unread byte of in_
  std::size_t avail_ = 0;          // unread bytes in in_
  bool eof_ = false;
  bool gzip_ = false;
  bool z_ready_ = false;
  bool member_done_ = false;
  z_stream z_{};
  std::size_t consumed_ = 0;       // compressed bytes consumed by zlib
  std::size_t offset_ = 0;         // decompressed bytes delivered
  std::optional<std::size_t> plain_size_;
};

inline std::uint32_t load_be32(const std::uint8_t* p) noexcept {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | std::uint32_t{p[3]};
}

}  // namespace detail

/// Reads and validates one uint8 IDX file of the given rank (magic 0x0000080R, big-endian
/// dimensions, exactly prod(dims) data bytes, no trailing bytes; plain or gzip). Memory grows
/// with the data actually read, never with what the header merely declares: a plain file is
/// checked against its size first, gzip data is read in chunks.
/// @throws data_error naming the file and the byte offset of the problem (offsets count bytes
/// of the decompressed stream for gzip input).
inline idx_file read_idx(const std::string& path, std::uint8_t rank) {
  detail::idx_stream in(path);
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
  std::uint8_t dimbytes[4 * 255];
  in.read_exact(dimbytes, 4u * rank, "the dimensions");
  std::size_t total = 1, row = 1;
  for (std::uint8_t i = 0; i < rank; ++i) {
    const std::uint32_t d = detail::load_be32(dimbytes + 4u * i);
    if (i > 0 && d == 0) in.fail(4 + 4u * i, "dimension " + std::to_string(i) + " is 0");
    if (i > 0) {
      row *= d;
      if (row > 0xffffffffu)
        in.fail(4 + 4u * i, "a sample of " + std::to_string(row) + "+ bytes (dimensions 1.." + std::to_string(i) +
                                ") does not fit 32 bits");
    }
    if (d != 0 && total > (std::size_t{1} << 40) / d)
      in.fail(4 + 4u * i, "dimensions too large (more than 2^40 bytes of data)");
    total *= d;
    f.dims.push_back(d);
  }
  f.header_size = 4 + 4u * rank;
  if (const auto size = in.plain_size(); size && *size < f.header_size + total)
    in.truncated(f.header_size, *size - f.header_size, total, "the data");
  try {
    if (in.plain_size()) {
      f.bytes.resize(f.header_size + total);  // the file holds these bytes (checked above)
      in.read_exact(f.bytes.data() + f.header_size, total, "the data");
    } else {
      // Grow with the data that arrives (at most doubling), so a short stream declaring a huge
      // size allocates little before it is found truncated.
      f.bytes.resize(f.header_size);
      std::size_t have = 0;
      while (have < total) {
        const std::size_t want = std::min(total - have, std::max<std::size_t>(have, std::size_t{1} << 16));
        f.bytes.resize(f.header_size + have + want);
        const std::size_t got = in.read_some(f.bytes.data() + f.header_size + have, want);
        if (got != want) in.truncated(f.header_size, have + got, total, "the data");
        have += got;
      }
    }
  } catch (const std::bad_alloc&) {
    in.fail(4, "cannot allocate " + std::to_string(f.header_size + total) + " bytes for the data the header declares");
  }
  std::copy(head, head + 4, f.bytes.begin());
  std::copy(dimbytes, dimbytes + 4u * rank, f.bytes.begin() + 4);
  std::uint8_t extra = 0;
  if (in.read_some(&extra, 1) != 0)
    in.fail(f.bytes.size(), "trailing bytes after the " + std::to_string(total) + " data bytes the header declares");
  return f;
}

/// Images (IDX rank 3) and their labels (IDX rank 1) decoded into one table (what idx() serves;
/// `indexed(idx_table(...), 1, rows, cols)` serves the same rows index-first).
/// @throws data_error as idx(images, labels).
inline std::shared_ptr<const table> idx_table(const std::string& images_path, const std::string& labels_path) {
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
  return t;
}

/// Images (IDX rank 3, magic 0x00000803) and their labels (IDX rank 1, magic 0x00000801), plain
/// or gzip. Decoded once into one contiguous uint8 array; each sample is a view of one image row
/// (width = rows * cols) with its label; `map(scale(1.0f / 255))` normalises it to [0, 1] while the
/// batch is assembled. @throws data_error (file and byte offset) on any malformed input, or
/// when the image and label counts disagree.
inline dataset<sample> idx(const std::string& images_path, const std::string& labels_path) {
  return from_table(idx_table(images_path, labels_path));
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
