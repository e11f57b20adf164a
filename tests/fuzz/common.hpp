#pragma once
/// @file common.hpp
/// What the fuzz harnesses and the seed generator share: how one fuzz input is split into the
/// reader's files and options, scratch files on a fast file system, gzip compression, and the
/// rule that only lockstep::error may escape a reader.

#include <zlib.h>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace lockstep::fuzz {

/// Bytes of a fuzz input.
using bytes = std::vector<std::uint8_t>;

/// A scratch directory private to this process (under /dev/shm when it exists), removed at exit.
class scratch_dir {
public:
  scratch_dir() {
    const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    path_ = std::string(base) + "/lockstep-fuzz-XXXXXX";
    if (!::mkdtemp(path_.data())) std::abort();
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    for (const char* name : {"a", "b"}) ::unlink((path_ + "/" + name).c_str());
    ::rmdir(path_.c_str());
  }
  /// Writes `data` to file `name` of the directory and returns its path.
  [[nodiscard]] std::string write(const char* name, std::span<const std::uint8_t> data) const {
    const std::string p = path_ + "/" + name;
    std::FILE* f = std::fopen(p.c_str(), "wb");
    if (!f) std::abort();
    if (!data.empty() && std::fwrite(data.data(), 1, data.size(), f) != data.size()) std::abort();
    std::fclose(f);
    return p;
  }

private:
  std::string path_;
};

/// `data` as one gzip member (zlib's deflate, default level).
inline bytes gzip(std::span<const std::uint8_t> data) {
  z_stream z{};
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  bytes out(deflateBound(&z, static_cast<uLong>(data.size())) + 32);
  z.next_in = const_cast<Bytef*>(data.data());
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

/// A fuzz input that holds two files: byte 0 holds flags, bytes 1-2 the length of the first file
/// (little-endian, clamped to what is there); the first file follows, the second is the rest.
struct two_files_input {
  std::uint8_t flags = 0;  ///< the harness's flag bits
  bytes first;             ///< the first file
  bytes second;            ///< the second file

  /// Splits a fuzz input.
  static two_files_input parse(const std::uint8_t* data, std::size_t size) {
    two_files_input in;
    if (size < 3) return in;
    in.flags = data[0];
    std::size_t n = std::size_t{data[1]} | (std::size_t{data[2]} << 8);
    data += 3;
    size -= 3;
    if (n > size) n = size;
    in.first.assign(data, data + n);
    in.second.assign(data + n, data + size);
    return in;
  }
  /// The fuzz input that parse() splits into this.
  [[nodiscard]] bytes encode() const {
    bytes out{flags, static_cast<std::uint8_t>(first.size() & 0xff), static_cast<std::uint8_t>(first.size() >> 8)};
    out.insert(out.end(), first.begin(), first.end());
    out.insert(out.end(), second.begin(), second.end());
    return out;
  }
};

/// One IDX fuzz input: the images file, then the labels file (both before optional
/// compression); flags bit 0: compress the images with gzip first, bit 1: the same for the
/// labels, bit 2: read images alone.
using idx_input = two_files_input;

/// One CSV fuzz input: byte 0 holds flags (bit 0: header line, bit 1: a label column, bit 2: a
/// target column, (byte 1 >> 3) mod 8, bit 3: a second one, byte 0 >> 4), byte 1 the label
/// column (0..7 used), byte 2 picks the delimiter (from ",;\t| " by value mod 5, or the byte
/// itself when it is >= 128); the file text is the rest.
struct csv_input {
  std::uint8_t flags = 0;     ///< the flag bits above
  std::uint8_t label = 0;     ///< label column (mod 8)
  std::uint8_t delim = 0;     ///< delimiter selector
  bytes text;                 ///< the file's content

  /// Splits a fuzz input.
  static csv_input parse(const std::uint8_t* data, std::size_t size) {
    csv_input in;
    if (size < 3) return in;
    in.flags = data[0];
    in.label = data[1];
    in.delim = data[2];
    in.text.assign(data + 3, data + size);
    return in;
  }
  /// The delimiter this input selects.
  [[nodiscard]] char delimiter() const {
    static constexpr char common[] = {',', ';', '\t', '|', ' '};
    return delim >= 128 ? static_cast<char>(delim) : common[delim % 5];
  }
  /// The fuzz input that parse() splits into this.
  [[nodiscard]] bytes encode() const {
    bytes out{flags, label, delim};
    out.insert(out.end(), text.begin(), text.end());
    return out;
  }
};

/// One .npy fuzz input: the features file, then the labels file; flags bit 0: a labels file,
/// bits 1-2: the layout (rows, HWC or CHW images), bit 3: which of two workers cuts.
using npy_input = two_files_input;

/// The image limits of the image harnesses: small enough that every image a header may declare
/// is decoded in milliseconds and allocates well under the 64 MiB the suite allows.
struct image_limits {
  static constexpr std::uint32_t side = 2048;                       ///< width and height
  static constexpr std::uint64_t pixels = std::uint64_t{1} << 20;   ///< width x height
  static constexpr std::uint64_t decoder = std::uint64_t{32} << 20; ///< libjpeg's memory
  static constexpr std::uint32_t scans = 100;                       ///< scans of a progressive JPEG
};

/// Reads every value of every sample of one epoch of `d` (so every byte of the input is decoded).
template <class Dataset>
void touch_every_sample(const Dataset& d) {
  double sum = 0;
  for (auto&& s : d.epoch()) {
    for (std::uint32_t i = 0; i < s.width; ++i) sum += s.feature(i);
    for (std::uint32_t i = 0; i < s.target_width; ++i) sum += s.targets[i];
    sum += s.label;
  }
  static volatile double sink;
  sink = sum;
}

}  // namespace lockstep::fuzz
