#pragma once
/// @file webdataset.hpp
/// Uncompressed tar shards in the WebDataset layout (`key.jpg` or `key.png`, with `key.cls`
/// holding the class as decimal text) as an index-first source (part of the optional image
/// component, CMake target lockstep::images). Each shard's headers are read once, when the source
/// is made, into a member index; a sample is then read by offset (pread of its image and label
/// members), so each worker reads only its own samples' bytes.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/image_decode.hpp>
#include <lockstep/data/indexed.hpp>
#include <lockstep/data/tar.hpp>

namespace lockstep::data {

/// Options of tar_shards().
struct tar_shards_options {
  image_options image{};                                         ///< channels, limits, strictness
  std::vector<std::string> image_extensions{"jpg", "jpeg", "png"};  ///< the member that is the image: the first of these a sample has (ASCII case ignored: `JPEG` is `jpeg`)
  std::string label_extension = "cls";                           ///< the member holding the label ("" : unlabelled)
  tar_limits tar{};                                              ///< limits of each shard's headers
  load_options load{};                                           ///< load threads, memory of the decoded rows
  std::function<void(const std::string& shard, const std::string& member)> on_read{};  ///< called for every member read (from the load threads, concurrently)
};

/// The tar-shard source (see tar_shards()).
class tar_shards_source final : public sample_source {
public:
  /// Indexes the shards (sorted byte-wise by path).
  tar_shards_source(std::vector<std::string> shards, tar_shards_options o) : o_(std::move(o)) {
    detail::check_image_options(o_.image, "tar_shards");
    std::sort(shards.begin(), shards.end());
    for (std::size_t i = 1; i < shards.size(); ++i)
      if (shards[i] == shards[i - 1]) throw config_error("lockstep::data::tar_shards: " + shards[i] + " is given twice");
    for (std::string& path : shards) {
      if (detail::ends_with(path, ".tar.gz") || detail::ends_with(path, ".tgz")) detail::refuse_compressed(path, "gzip");
      shard s;
      s.path = std::move(path);
      s.index = scan_tar(s.path, o_.tar);
      counters().index_bytes += s.index.bytes_read;
      const std::vector<webdataset_sample> samples = webdataset_samples(s.index, s.path);
      const auto shard_no = static_cast<std::uint32_t>(shards_.size());
      for (const webdataset_sample& ws : samples) {
        entry e;
        e.shard = shard_no;
        const std::size_t* image = nullptr;
        for (const std::string& ext : o_.image_extensions)
          if ((image = ws.field_ignoring_case(ext))) break;
        const auto fail = [&](const std::string& what) {
          throw data_error("lockstep::data::tar_shards: " + s.path + ": sample '" + ws.key + "': " + what);
        };
        if (!image) fail("no image member (none of the image extensions)");
        e.image = static_cast<std::uint32_t>(*image);
        if (!o_.label_extension.empty()) {
          const std::size_t* cls = ws.field(o_.label_extension);
          if (cls) {
            if (s.index.members[*cls].size > 32)
              fail("the label member '" + s.index.members[*cls].name + "' holds " +
                   std::to_string(s.index.members[*cls].size) + " bytes, not a class number");
            e.label = static_cast<std::int32_t>(*cls);
          }
          const bool has = cls != nullptr;
          if (first_) {
            labelled_ = has;
            first_ = false;
          } else if (has != labelled_) {
            fail(has ? "has a ." + o_.label_extension + " member, but other samples have none"
                     : "has no ." + o_.label_extension + " member, but other samples have one");
          }
        }
        entries_.push_back(e);
      }
      shards_.push_back(std::move(s));
    }
    if (shards_.size() <= 256) {  // keep the shards open (else open one per read)
      for (shard& s : shards_) s.fd = detail::open_read(s.path, "tar_shards");
    }
  }

  std::uint64_t size() const override { return entries_.size(); }
  std::uint32_t group(std::uint64_t i) const override { return entries_[i].shard; }
  std::uint32_t channels() const override { return o_.image.channels; }
  void load(std::uint64_t i, const region_planner& regions, decoded_sample& out, load_scratch& s) const override {
    pipeline_counters& k = counters();
    const entry& e = entries_[i];
    const shard& sh = shards_[e.shard];
    const auto t0 = std::chrono::steady_clock::now();
    detail::file_handle own;
    int fd = sh.fd.get();
    if (fd < 0) {
      own = detail::open_read(sh.path, "tar_shards");
      ++k.opens;
      fd = own.get();
    }
    std::int32_t label = no_label;
    if (e.label >= 0) {
      const tar_member& m = sh.index.members[static_cast<std::size_t>(e.label)];
      if (o_.on_read) o_.on_read(sh.path, m.name);
      read_member(fd, sh.path, m, s.bytes);
      k.bytes_read += m.size;
      label = parse_label(s.bytes, sh.path, m);
    }
    const tar_member& im = sh.index.members[e.image];
    if (im.size > o_.image.limits.max_file_bytes)  // checked before anything is read or allocated
      throw data_error("lockstep::data::tar_shards: " + sh.path + ": member '" + im.name + "': byte offset " +
                       std::to_string(im.offset) + ": " + std::to_string(im.size) + " bytes, beyond image_limits::max_file_bytes");
    if (o_.on_read) o_.on_read(sh.path, im.name);
    read_member(fd, sh.path, im, s.bytes);
    k.bytes_read += im.size;
    k.read_ns += detail::ns_since(t0);
    decode_image(s.bytes.data(), s.bytes.size(), name_of(i) + " (data at byte offset " + std::to_string(im.offset) + ")",
                 o_.image, regions, out, s, k);
    out.label = label;
  }
  std::string name_of(std::uint64_t i) const override {
    const entry& e = entries_[i];
    const shard& sh = shards_[e.shard];
    return sh.path + ": member '" + sh.index.members[e.image].name + "'";
  }
  std::string describe() const override {
    return "tar_shards (" + std::to_string(shards_.size()) + " shards, " + std::to_string(entries_.size()) + " samples" +
           (shards_.empty() ? "" : ", first " + shards_.front().path) + "; " + image_library_versions() + ")";
  }
  /// The shards, sorted.
  [[nodiscard]] std::vector<std::string> shard_paths() const {
    std::vector<std::string> out;
    for (const shard& s : shards_) out.push_back(s.path);
    return out;
  }

private:
  struct shard {
    std::string path;
    tar_index index;
    detail::file_handle fd;
  };
  struct entry {
    std::uint32_t shard = 0;
    std::uint32_t image = 0;   // member index in the shard
    std::int32_t label = -1;   // member index of the label, or -1
  };

  static std::int32_t parse_label(const std::vector<std::uint8_t>& b, const std::string& path, const tar_member& m) {
    std::size_t i = 0, n = b.size();
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n')) ++i;
    while (n > i && (b[n - 1] == ' ' || b[n - 1] == '\t' || b[n - 1] == '\r' || b[n - 1] == '\n')) --n;
    std::int64_t v = 0;
    const bool ok = n > i && n - i <= 10 && std::all_of(b.begin() + static_cast<std::ptrdiff_t>(i), b.begin() + static_cast<std::ptrdiff_t>(n),
                                                         [](std::uint8_t c) { return c >= '0' && c <= '9'; });
    if (ok)
      for (std::size_t k = i; k < n; ++k) v = v * 10 + (b[k] - '0');
    if (!ok || v > 0x7fffffff)
      throw data_error("lockstep::data::tar_shards: " + path + ": member '" + m.name + "': byte offset " +
                       std::to_string(m.offset) + ": the label is not a decimal integer 0 .. 2147483647");
    return static_cast<std::int32_t>(v);
  }

  tar_shards_options o_;
  std::vector<shard> shards_;
  std::vector<entry> entries_;
  bool labelled_ = false, first_ = true;
};

/// Tar shards in the WebDataset layout as an index-first dataset: the samples of the shards in
/// byte-wise order of their paths, each shard's samples in archive order; each sample's image
/// (the first of `image_extensions` it has) decoded like image_folder's, its label from its
/// `.cls` member (decimal text). A sample's group (for interleave) is its shard. Every sample has
/// a label member or none does. Compressed shards (`.tar.gz`) are refused: they cannot be read
/// by offset.
/// @throws data_error (shard, member, byte offset) for a malformed shard, a sample without an
///         image, a label that is not a number; config_error for bad options.
inline indexed_dataset tar_shards(std::vector<std::string> shards, const tar_shards_options& o = {}) {
  return indexed_dataset(std::make_shared<tar_shards_source>(std::move(shards), o), o.load);
}

/// The shards of a folder: every file in `folder` whose name ends in `.tar` (and, to be refused
/// with the fix, a compressed archive's: `.tar.gz`, `.tgz`, `.tar.zst`, `.tzst`, `.tar.xz`,
/// `.txz`, `.tar.bz2`, `.tbz2`, `.tar.lz4`), or the single shard `folder` names when it is a file.
/// @throws data_error when the folder does not exist or holds no such file.
inline indexed_dataset tar_shards(const std::string& folder, const tar_shards_options& o = {}) {
  namespace fs = std::filesystem;
  std::vector<std::string> shards;
  if (fs::is_regular_file(folder)) {
    shards.push_back(folder);
  } else {
    if (!fs::is_directory(folder)) throw data_error("lockstep::data::tar_shards: " + folder + ": no such file or folder");
    static constexpr std::string_view suffixes[] = {".tar",     ".tar.gz", ".tgz",     ".tar.zst", ".tzst",
                                                    ".tar.xz",  ".txz",    ".tar.bz2", ".tbz2",    ".tar.lz4"};
    for (const auto& e : fs::directory_iterator(folder)) {
      const std::string name = e.path().filename().string();
      if (!fs::is_regular_file(e.status())) continue;
      for (const std::string_view suffix : suffixes)
        if (detail::ends_with(name, suffix)) {
          shards.push_back(e.path().string());
          break;
        }
    }
    if (shards.empty())
      throw data_error("lockstep::data::tar_shards: " + folder + ": the folder holds no .tar shard");
  }
  return tar_shards(std::move(shards), o);
}

}  // namespace lockstep::data
