#pragma once
// Fashion-MNIST written as a PNG folder and as WebDataset tar shards (PNG is lossless, so both
// decode to the IDX bytes): `<dir>/<split>/NNNNN.png` with the list file `<dir>/<split>.txt`
// ("NNNNN.png label" lines; the zero-padded names sort in IDX order), and
// `<dir>/<split>-SSSSSS.tar` holding NNNNN.png and NNNNN.cls per sample.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <lockstep/data.hpp>
#include <lockstep/data/images.hpp>

namespace fashion_test {

/// Where Fashion-MNIST's IDX files are (Debian's dataset-fashion-mnist).
inline const std::string idx_dir = "/usr/share/datasets/fashion-mnist";

/// True when the IDX files are installed.
inline bool available() { return std::filesystem::exists(idx_dir + "/train-images-idx3-ubyte.gz"); }

/// The IDX table of a split ("train" or "t10k").
inline std::shared_ptr<const lockstep::data::table> idx_table(const std::string& split) {
  return lockstep::data::idx_table(idx_dir + "/" + split + "-images-idx3-ubyte.gz", idx_dir + "/" + split + "-labels-idx1-ubyte.gz");
}

/// What write() made.
struct files {
  std::string folder;               ///< the PNG folder
  std::string list;                 ///< its list file
  std::vector<std::string> shards;  ///< the tar shards
  std::uint64_t folder_bytes = 0;   ///< bytes of all PNG files
  std::uint64_t tar_bytes = 0;      ///< bytes of all shards
  std::uint64_t member_bytes = 0;   ///< bytes of all members' data (PNG and .cls)
};

/// The zero-padded name of sample i.
inline std::string key(std::size_t i) {
  std::string s = std::to_string(i);
  return std::string(s.size() < 5 ? 5 - s.size() : 0, '0') + s;
}

/// Writes the first `n` samples of `t` (0: all) into `dir` as a PNG folder and `shards` tar shards.
inline files write(const lockstep::data::table& t, const std::string& dir, const std::string& split, std::size_t shards,
                   std::size_t n = 0) {
  namespace fs = std::filesystem;
  if (n == 0 || n > t.rows) n = t.rows;
  files f;
  f.folder = dir + "/" + split;
  f.list = dir + "/" + split + ".txt";
  fs::create_directories(f.folder);
  std::ofstream list(f.list);
  std::vector<std::unique_ptr<lockstep::data::tar_writer>> tars;
  for (std::size_t s = 0; s < shards; ++s) {
    const std::string no = std::to_string(s);
    f.shards.push_back(dir + "/" + split + "-" + std::string(6 - std::min<std::size_t>(6, no.size()), '0') + no + ".tar");
    tars.push_back(std::make_unique<lockstep::data::tar_writer>(f.shards.back()));
  }
  const std::uint32_t side = 28;
  for (std::size_t i = 0; i < n; ++i) {
    const auto png = lockstep::data::encode_png(t.bytes.data() + t.byte_offset + i * t.width, side, side, 1, 6);
    const std::string k = key(i), label = std::to_string(t.labels[i]);
    std::FILE* out = std::fopen((f.folder + "/" + k + ".png").c_str(), "wb");
    if (!out || std::fwrite(png.data(), 1, png.size(), out) != png.size()) throw std::runtime_error("cannot write " + k);
    std::fclose(out);
    list << k << ".png " << label << "\n";
    auto& tar = *tars[i * shards / n];  // consecutive samples per shard
    tar.add(k + ".png", png.data(), png.size());
    tar.add(k + ".cls", label);
    f.folder_bytes += png.size();
    f.member_bytes += png.size() + label.size();
  }
  for (auto& t2 : tars) t2->close();
  for (const auto& s : f.shards) f.tar_bytes += fs::file_size(s);
  return f;
}

/// A scratch folder (under /dev/shm when it exists), removed when destroyed.
class scratch_dir {
public:
  scratch_dir() {
    const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string p = std::string(base) + "/lockstep-images-XXXXXX";
    if (!::mkdtemp(p.data())) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::string& path() const noexcept { return path_; }

private:
  std::string path_;
};

}  // namespace fashion_test
