#pragma once
/// @file image_folder.hpp
/// A folder of PNG and JPEG files as an index-first source (part of the optional image component,
/// CMake target lockstep::images). The index is the list of files in byte-wise order of their
/// paths relative to the root (never the order the file system lists them in); a class per
/// top-level subfolder (ids from the subfolders' sorted names), or a list file of paths and
/// labels. A file is opened, read and decoded only when the batch holding it is cut for this
/// process.

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/image_decode.hpp>
#include <lockstep/data/indexed.hpp>
#include <lockstep/data/tar.hpp>

namespace lockstep::data {

/// Options of image_folder().
struct image_folder_options {
  image_options image{};              ///< channels (3: RGB, 1: grey), limits, strictness
  std::string list_file{};            ///< when set: the samples are the lines of this file (see image_folder)
  std::vector<std::string> extensions{".jpg", ".jpeg", ".png"};  ///< file name endings that are samples (any case)
  load_options load{};                ///< load threads, memory of the decoded rows
  std::function<void(const std::string& path)> on_open{};  ///< called with every file opened to load a sample (from the load threads, concurrently)
};

namespace detail {

/// Paths packed into one buffer (a million paths cost their bytes plus 8 each).
class path_list {
public:
  void push_back(std::string_view p) {
    offsets_.push_back(chars_.size());
    chars_.append(p);
  }
  [[nodiscard]] std::size_t size() const noexcept { return offsets_.size(); }
  [[nodiscard]] std::string_view operator[](std::size_t i) const noexcept {
    const std::size_t end = i + 1 < offsets_.size() ? offsets_[i + 1] : chars_.size();
    return std::string_view(chars_).substr(offsets_[i], end - offsets_[i]);
  }

private:
  std::string chars_;
  std::vector<std::size_t> offsets_;
};

inline bool has_extension(std::string_view name, const std::vector<std::string>& exts) {
  for (const std::string& e : exts) {
    if (name.size() < e.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < e.size() && same; ++i) {
      const auto a = static_cast<unsigned char>(name[name.size() - e.size() + i]);
      const auto b = static_cast<unsigned char>(e[i]);
      same = std::tolower(a) == std::tolower(b);
    }
    if (same) return true;
  }
  return false;
}

/// Every file under `dir` (relative paths, '/'-separated) whose name has one of `exts`, following
/// symbolic links but visiting each directory once: under the first of its paths in a walk that
/// takes each folder's entries in byte-wise order of their names (never the order the file system
/// lists them in, so a folder linked from two classes belongs to the same one on every machine).
inline void list_files(const std::filesystem::path& root, const std::filesystem::path& rel, const std::vector<std::string>& exts,
                       std::set<std::pair<dev_t, ino_t>>& seen, std::vector<std::string>& out) {
  namespace fs = std::filesystem;
  const fs::path dir = root / rel;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    throw data_error("lockstep::data::image_folder: " + dir.string() + ": cannot read the folder (" + std::strerror(errno) + ")");
  if (!seen.insert({st.st_dev, st.st_ino}).second) return;  // a link back to a folder already listed
  std::error_code ec;
  std::vector<std::string> names;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  if (ec) throw data_error("lockstep::data::image_folder: " + dir.string() + ": cannot list the folder (" + ec.message() + ")");
  std::sort(names.begin(), names.end());  // std::string's order is byte-wise
  for (const std::string& name : names) {
    const fs::path child = rel.empty() ? fs::path(name) : rel / name;
    std::error_code sec;
    const fs::file_status s = fs::status(dir / name, sec);
    if (sec) throw data_error("lockstep::data::image_folder: " + (dir / name).string() + ": " + sec.message());
    if (fs::is_directory(s)) {
      list_files(root, child, exts, seen, out);
    } else if (fs::is_regular_file(s) && has_extension(name, exts)) {
      out.push_back(child.generic_string());
    }
  }
}

}  // namespace detail

/// The image-folder source (see image_folder()).
class image_folder_source final : public sample_source {
public:
  /// Lists the folder (or reads the list file) and builds the index.
  image_folder_source(std::string root, image_folder_options o) : root_(std::move(root)), o_(std::move(o)) {
    detail::check_image_options(o_.image, "image_folder");
    namespace fs = std::filesystem;
    if (!fs::is_directory(root_)) throw data_error("lockstep::data::image_folder: " + root_ + ": not a folder");
    std::vector<std::pair<std::string, std::int32_t>> files;
    if (o_.list_file.empty()) {
      // Classes: the top-level subfolders, sorted byte-wise.
      std::vector<std::string> all;
      std::set<std::pair<dev_t, ino_t>> seen;
      detail::list_files(root_, {}, o_.extensions, seen, all);
      std::set<std::string> class_dirs;
      for (fs::directory_iterator it(root_), end; it != end; ++it)
        if (fs::is_directory(it->status())) class_dirs.insert(it->path().filename().string());
      classes_.assign(class_dirs.begin(), class_dirs.end());  // std::string's order is byte-wise
      std::vector<std::size_t> per_class(classes_.size(), 0);
      for (std::string& f : all) {
        const std::size_t slash = f.find('/');
        if (slash == std::string::npos)
          throw data_error("lockstep::data::image_folder: " + root_ + "/" + f +
                           ": an image outside any class folder (each top-level subfolder is a class; or give a list_file)");
        const std::string cls = f.substr(0, slash);
        const auto it = std::lower_bound(classes_.begin(), classes_.end(), cls);
        const auto id = static_cast<std::int32_t>(it - classes_.begin());
        ++per_class[static_cast<std::size_t>(id)];
        files.emplace_back(std::move(f), id);
      }
      for (std::size_t c = 0; c < classes_.size(); ++c)
        if (per_class[c] == 0)
          throw data_error("lockstep::data::image_folder: " + root_ + "/" + classes_[c] +
                           ": a class folder without images (class ids come from every top-level subfolder)");
    } else {
      read_list(files);
    }
    std::sort(files.begin(), files.end());  // byte-wise by relative path
    for (std::size_t i = 1; i < files.size(); ++i)
      if (files[i].first == files[i - 1].first)
        throw data_error("lockstep::data::image_folder: " + o_.list_file + ": '" + files[i].first + "' is listed twice");
    labelled_ = !files.empty() && files.front().second >= 0;
    std::string last_dir;
    std::uint32_t group = 0;
    for (std::size_t i = 0; i < files.size(); ++i) {
      const std::string& f = files[i].first;
      const std::size_t slash = f.rfind('/');
      std::string dir = slash == std::string::npos ? std::string() : f.substr(0, slash);
      if (i > 0 && dir != last_dir) ++group;
      last_dir = std::move(dir);
      paths_.push_back(f);
      labels_.push_back(files[i].second);
      groups_.push_back(group);
    }
  }

  std::uint64_t size() const override { return paths_.size(); }
  bool labels_in_index() const override { return labelled_; }
  std::int32_t label(std::uint64_t i) const override { return labelled_ ? labels_[i] : no_label; }
  std::uint32_t group(std::uint64_t i) const override { return groups_[i]; }
  std::uint32_t channels() const override { return o_.image.channels; }
  void load(std::uint64_t i, const region_planner& regions, decoded_sample& out, load_scratch& s) const override {
    pipeline_counters& k = counters();
    const std::string path = path_of(i);
    const auto t0 = std::chrono::steady_clock::now();
    {
      detail::file_handle fd = detail::open_read(path, "image_folder");
      ++k.opens;
      if (o_.on_open) o_.on_open(path);
      struct stat st {};
      if (::fstat(fd.get(), &st) != 0) throw data_error("lockstep::data::image_folder: " + path + ": cannot stat");
      const auto size = static_cast<std::uint64_t>(st.st_size);
      if (size > o_.image.limits.max_file_bytes)
        throw data_error("lockstep::data::image_folder: " + path + ": byte offset 0: a file of " + std::to_string(size) +
                         " bytes, beyond image_limits::max_file_bytes");
      s.bytes.resize(static_cast<std::size_t>(size));
      const std::size_t got = detail::pread_full(fd.get(), s.bytes.data(), s.bytes.size(), 0);
      if (got != s.bytes.size())
        throw data_error("lockstep::data::image_folder: " + path + ": byte offset " +
                         std::to_string(got == static_cast<std::size_t>(-1) ? 0 : got) + ": read error");
      k.bytes_read += size;
    }
    k.read_ns += detail::ns_since(t0);
    decode_image(s.bytes.data(), s.bytes.size(), path, o_.image, regions, out, s, k);
  }
  std::string name_of(std::uint64_t i) const override { return path_of(i); }
  std::string describe() const override {
    return "image_folder " + root_ + " (" + std::to_string(paths_.size()) + " images" +
           (o_.list_file.empty() ? ", " + std::to_string(classes_.size()) + " classes" : ", list " + o_.list_file) + "; " +
           image_library_versions() + ")";
  }
  /// The class names (sorted top-level subfolders; empty with a list file): class id i is classes()[i].
  [[nodiscard]] const std::vector<std::string>& classes() const noexcept { return classes_; }
  /// The path of sample i relative to the root.
  [[nodiscard]] std::string relative_path(std::uint64_t i) const { return std::string(paths_[i]); }

private:
  std::string path_of(std::uint64_t i) const { return root_ + "/" + std::string(paths_[i]); }

  void read_list(std::vector<std::pair<std::string, std::int32_t>>& files) const {
    std::ifstream in(o_.list_file, std::ios::binary);
    if (!in) throw data_error("lockstep::data::image_folder: " + o_.list_file + ": cannot open the list file");
    std::string line;
    std::size_t no = 0;
    int labelled = -1;
    while (std::getline(in, line)) {
      ++no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const auto fail = [&](const std::string& what) {
        throw data_error("lockstep::data::image_folder: " + o_.list_file + ":" + std::to_string(no) + ": " + what);
      };
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      std::string path = line;
      std::int32_t label = -1;
      const std::size_t ws = line.find_last_of(" \t");
      if (ws != std::string::npos) {
        const std::string tail = line.substr(ws + 1);
        path = line.substr(0, line.find_last_not_of(" \t", ws) + 1);
        std::int64_t v = 0;
        if (tail.empty() || tail.size() > 10) fail("expected 'path label' (the label an integer >= 0)");
        for (char c : tail) {
          if (c < '0' || c > '9') fail("the label '" + tail + "' is not an integer >= 0");
          v = v * 10 + (c - '0');
        }
        if (v > 0x7fffffff) fail("the label " + tail + " is beyond int32");
        label = static_cast<std::int32_t>(v);
      }
      if ((label >= 0 ? 1 : 0) != labelled && labelled >= 0) fail("every line needs a label, or none does");
      labelled = label >= 0 ? 1 : 0;
      if (path.empty() || path.front() == '/' || path.find("..") != std::string::npos)
        fail("the path must be relative to the folder, without '..'");
      files.emplace_back(std::move(path), label);
    }
  }

  std::string root_;
  image_folder_options o_;
  detail::path_list paths_;
  std::vector<std::int32_t> labels_;
  std::vector<std::uint32_t> groups_;
  std::vector<std::string> classes_;
  bool labelled_ = false;
};

/// The images under `root` as an index-first dataset, decoded to channels-first RGB (or grey with
/// `image.channels = 1`) 8-bit rows. Without a list file, every top-level subfolder is a class
/// (ids 0, 1, ... in byte-wise order of their names) and holds that class's images at any depth;
/// files whose names do not end in one of `extensions` are not samples. With `list_file`, each
/// non-blank line is `relative/path` or `relative/path label` (a path containing blanks must be
/// followed by a label; every line labelled or none). Samples are in byte-wise order of their
/// relative paths; their groups (for interleave) are their folders. Symbolic links are followed;
/// a folder is listed once. Images of different sizes need a resize or crop stage to be batched.
/// @throws data_error for a missing or unreadable folder, an image outside a class folder, a
///         class folder without images, a malformed list file; config_error for bad options.
inline indexed_dataset image_folder(const std::string& root, const image_folder_options& o = {}) {
  return indexed_dataset(std::make_shared<image_folder_source>(root, o), o.load);
}

}  // namespace lockstep::data
