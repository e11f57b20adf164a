#pragma once
/// @file tar.hpp
/// Uncompressed tar archives read by offset: `scan_tar` reads a shard's headers once (never the
/// members' data) into a member index; `webdataset_samples` groups the members into samples the
/// way WebDataset does (`dir/key.ext`: members with the same key, consecutive, form one sample);
/// `read_member` reads one member's bytes with pread. ustar, GNU (long names, base-256 sizes) and
/// pax (path, size) headers are understood. Every archive is untrusted: a bad checksum, a size
/// past the end of the file, a link, device or sparse member, or a compressed archive is a
/// data_error naming the file, the member and the byte offset.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>

namespace lockstep::data {

/// One regular file of a tar archive.
struct tar_member {
  std::string name;             ///< its path inside the archive
  std::uint64_t header = 0;     ///< byte offset of its (first) header
  std::uint64_t offset = 0;     ///< byte offset of its data
  std::uint64_t size = 0;       ///< bytes of data
};

/// Limits of scan_tar (what an archive may declare before it is refused).
struct tar_limits {
  std::uint64_t max_members = std::uint64_t{1} << 26;      ///< members per archive
  std::uint64_t max_member_bytes = std::uint64_t{1} << 32;  ///< bytes of one member
  std::size_t max_name = 4096;                              ///< bytes of a member's path
};

/// The members of one archive and the bytes read to find them.
struct tar_index {
  std::vector<tar_member> members;  ///< regular files, in archive order
  std::uint64_t file_size = 0;      ///< bytes of the archive
  std::uint64_t bytes_read = 0;     ///< header bytes read by the scan (plus long names and pax records)
};

namespace detail {

/// An open file descriptor, closed on destruction.
class file_handle {
public:
  file_handle() = default;
  explicit file_handle(int fd) noexcept : fd_(fd) {}
  file_handle(file_handle&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  file_handle& operator=(file_handle&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  file_handle(const file_handle&) = delete;
  file_handle& operator=(const file_handle&) = delete;
  ~file_handle() { close(); }
  [[nodiscard]] int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void close() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

private:
  int fd_ = -1;
};

/// Opens `path` for reading or throws data_error "<who>: <path>: cannot open (<reason>)". It opens
/// without blocking (a named pipe with no writer would block open(2) forever), then clears
/// O_NONBLOCK; the callers refuse what is not a regular file.
inline file_handle open_read(const std::string& path, const char* who) {
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0)
    throw data_error(std::string("lockstep::data::") + who + ": " + path + ": cannot open (" + std::strerror(errno) + ")");
  file_handle h(fd);
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
    throw data_error(std::string("lockstep::data::") + who + ": " + path + ": cannot open (" + std::strerror(errno) + ")");
  return h;
}

/// Reads exactly n bytes at offset `at`; returns the bytes read (short only at the end of the file).
inline std::size_t pread_full(int fd, void* dst, std::size_t n, std::uint64_t at) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, static_cast<char*>(dst) + done, n - done, static_cast<off_t>(at + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return static_cast<std::size_t>(-1);
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

/// The compression a file's first bytes announce, or nullptr.
inline const char* compression_of(const std::uint8_t* p, std::size_t n) noexcept {
  if (n >= 2 && p[0] == 0x1f && p[1] == 0x8b) return "gzip";
  if (n >= 3 && p[0] == 'B' && p[1] == 'Z' && p[2] == 'h') return "bzip2";
  if (n >= 6 && p[0] == 0xfd && p[1] == '7' && p[2] == 'z' && p[3] == 'X' && p[4] == 'Z' && p[5] == 0) return "xz";
  if (n >= 4 && p[0] == 0x28 && p[1] == 0xb5 && p[2] == 0x2f && p[3] == 0xfd) return "zstd";
  if (n >= 4 && p[0] == 0x04 && p[1] == 0x22 && p[2] == 0x4d && p[3] == 0x18) return "lz4";
  if (n >= 4 && p[0] == 0x02 && p[1] == 0x21 && p[2] == 0x4c && p[3] == 0x18) return "lz4";  // its legacy frame
  return nullptr;
}

inline bool ends_with(std::string_view s, std::string_view suffix) noexcept {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

/// Refuses a compressed archive, naming the fix.
[[noreturn]] inline void refuse_compressed(const std::string& path, const char* kind) {
  throw data_error("lockstep::data::tar: " + path + ": byte offset 0: the archive is " + kind +
                   "-compressed; a compressed shard cannot be read by offset, so each worker would have to "
                   "decompress all of it. Decompress it once (for gzip: gunzip -k " + path +
                   ") and read the uncompressed .tar");
}

/// A numeric header field: octal ASCII (spaces and NULs around it allowed) or GNU base-256.
inline bool tar_number(const std::uint8_t* f, std::size_t n, std::uint64_t& out) noexcept {
  out = 0;
  if (n > 0 && (f[0] & 0x80)) {  // base-256: big-endian, first byte's top bit set
    if (f[0] & 0x40) return false;  // negative
    std::uint64_t v = f[0] & 0x3f;
    for (std::size_t i = 1; i < n; ++i) {
      if (v >> 56) return false;
      v = (v << 8) | f[i];
    }
    out = v;
    return true;
  }
  std::size_t i = 0;
  while (i < n && (f[i] == ' ' || f[i] == 0)) ++i;
  for (; i < n && f[i] >= '0' && f[i] <= '7'; ++i) {  // an all-blank field reads as 0
    if (out >> 61) return false;
    out = (out << 3) | static_cast<std::uint64_t>(f[i] - '0');
  }
  for (; i < n; ++i)
    if (f[i] != ' ' && f[i] != 0) return false;
  return true;
}

/// A NUL-terminated (or full-width) string field.
inline std::string tar_string(const std::uint8_t* f, std::size_t n) {
  std::size_t len = 0;
  while (len < n && f[len] != 0) ++len;
  return std::string(reinterpret_cast<const char*>(f), len);
}

/// Parses pax records ("<len> <key>=<value>\n"); sets path and size when present, and `sparse`
/// when a GNU.sparse.* key marks a sparse member.
inline bool parse_pax(const std::string& data, std::string& path, std::uint64_t& size, bool& has_size, bool& sparse) {
  std::size_t pos = 0;
  while (pos < data.size()) {
    std::size_t i = pos;
    std::uint64_t len = 0;
    while (i < data.size() && data[i] >= '0' && data[i] <= '9') {
      if (len > (std::uint64_t{1} << 40)) return false;
      len = len * 10 + static_cast<std::uint64_t>(data[i] - '0');
      ++i;
    }
    if (i == pos || i >= data.size() || data[i] != ' ' || len < 5 || len > data.size() - pos) return false;
    const std::string rec = data.substr(i + 1, pos + len - i - 1);
    if (rec.empty() || rec.back() != '\n') return false;
    const std::size_t eq = rec.find('=');
    if (eq == std::string::npos) return false;
    const std::string key = rec.substr(0, eq), value = rec.substr(eq + 1, rec.size() - eq - 2);
    if (key.rfind("GNU.sparse.", 0) == 0) sparse = true;
    if (key == "path") {
      path = value;
    } else if (key == "size") {
      std::uint64_t v = 0;
      if (value.empty()) return false;
      for (char ch : value) {
        if (ch < '0' || ch > '9' || v > (std::uint64_t{1} << 60)) return false;
        v = v * 10 + static_cast<std::uint64_t>(ch - '0');
      }
      size = v;
      has_size = true;
    }
    pos += len;
  }
  return true;
}

}  // namespace detail

/// Reads the headers of the tar archive at `path` (one pread of 512 bytes per member, plus the
/// data of GNU long-name and pax members) into its member index. Directories and pax global
/// headers are skipped; any other non-regular member (link, device, FIFO, GNU sparse file) is
/// refused. The archive ends at two zero blocks, at one zero block at the end of the file, or at
/// the end of the file after a member. A GNU long name or pax record applies to the next member
/// header (not to another extended header).
/// @throws data_error naming the archive, the member and the byte offset: a path that is not a
///         regular file, a compressed archive (with the command that fixes it), a bad header
///         checksum or field, a member extending past the end of the file, a lone zero block
///         followed by more headers, a long name or pax record with no member after it, a limit
///         exceeded.
inline tar_index scan_tar(const std::string& path, const tar_limits& limits = {}) {
  detail::file_handle fd = detail::open_read(path, "tar");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
    throw data_error("lockstep::data::tar: " + path + ": not a regular file");
  tar_index idx;
  idx.file_size = static_cast<std::uint64_t>(st.st_size);
  const auto fail = [&](std::uint64_t at, const std::string& member, const std::string& what) -> void {
    throw data_error("lockstep::data::tar: " + path + (member.empty() ? "" : ": member '" + member + "'") +
                     ": byte offset " + std::to_string(at) + ": " + what);
  };
  std::uint8_t h[512];
  std::uint64_t at = 0;
  std::string long_name, pax_path;
  std::uint64_t pax_size = 0;
  bool has_long = false, has_pax_path = false, has_pax_size = false, pax_sparse = false;
  constexpr std::uint64_t none = ~std::uint64_t{0};
  std::uint64_t pending = none;  // the offset of the first extended header still waiting for its member
  char pending_type = 0;
  const auto zero = [](std::uint8_t b) { return b == 0; };
  const auto read_data = [&](std::uint64_t off, std::uint64_t n, const std::string& what) {
    if (n > limits.max_name * 16 + 4096) fail(off, "", what + " of " + std::to_string(n) + " bytes is too large");
    std::string s(static_cast<std::size_t>(n), '\0');
    if (detail::pread_full(fd.get(), s.data(), s.size(), off) != s.size()) fail(off, "", what + " is truncated");
    idx.bytes_read += n;
    return s;
  };
  while (true) {
    if (at == idx.file_size) break;  // the end of the file at a header boundary
    const std::size_t got = detail::pread_full(fd.get(), h, 512, at);
    if (got == static_cast<std::size_t>(-1)) fail(at, "", std::string("read error (") + std::strerror(errno) + ")");
    idx.bytes_read += got;
    if (at == 0)
      if (const char* kind = detail::compression_of(h, got)) detail::refuse_compressed(path, kind);
    if (got < 512) fail(at, "", "truncated header (" + std::to_string(got) + " of 512 bytes)");
    if (std::all_of(h, h + 512, zero)) {  // the end of the archive: two zero blocks, or one at the end of the file
      const std::uint64_t next = at + 512;
      if (next < idx.file_size) {
        std::uint8_t z[512];
        const std::size_t n = detail::pread_full(fd.get(), z, 512, next);
        if (n == static_cast<std::size_t>(-1)) fail(next, "", std::string("read error (") + std::strerror(errno) + ")");
        idx.bytes_read += n;
        if (!std::all_of(z, z + n, zero))
          fail(at, "", "a lone zero block followed by a header at byte offset " + std::to_string(next) +
                           ": the end of an archive is two zero blocks; the members after it would be lost (a damaged archive)");
      }
      break;
    }
    // The checksum: the header's bytes with its checksum field read as spaces (unsigned or signed sum).
    std::uint64_t want = 0;
    if (!detail::tar_number(h + 148, 8, want)) fail(at, "", "bad checksum field (not a tar header?)");
    std::uint64_t usum = 0;
    std::int64_t ssum = 0;
    for (int i = 0; i < 512; ++i) {
      const std::uint8_t b = (i >= 148 && i < 156) ? std::uint8_t{' '} : h[i];
      usum += b;
      ssum += static_cast<std::int8_t>(b);
    }
    if (usum != want && static_cast<std::uint64_t>(ssum) != want)
      fail(at, "", "header checksum " + std::to_string(want) + " does not match the header (" + std::to_string(usum) +
                       "); not a tar archive, or a damaged one");
    std::uint64_t size = 0;
    if (!detail::tar_number(h + 124, 12, size)) fail(at + 124, "", "bad size field");
    const char type = static_cast<char>(h[156]);
    std::string name = detail::tar_string(h, 100);
    if (std::memcmp(h + 257, "ustar", 6) == 0 && h[345] != 0) {  // POSIX ustar (GNU's "ustar  " has no prefix)
      const std::string prefix = detail::tar_string(h + 345, 155);
      name = prefix + "/" + name;
    }
    const bool extended = type == 'L' || type == 'x' || type == 'g' || type == 'K';
    // GNU's pax sparse formats name the member [dir/]GNUSparseFile.<n>/<name> in its own header
    bool sparse_name = false;
    for (std::size_t k = name.find("GNUSparseFile."); k != std::string::npos && !sparse_name;
         k = name.find("GNUSparseFile.", k + 1)) {
      std::size_t e = k + 14;
      while (e < name.size() && name[e] >= '0' && name[e] <= '9') ++e;
      sparse_name = (k == 0 || name[k - 1] == '/') && e > k + 14 && e < name.size() && name[e] == '/';
    }
    if (!extended) {  // the long name and pax records describe the next member, not another extended header
      if (has_long) name = long_name;
      if (has_pax_path) name = pax_path;
      if (has_pax_size) size = pax_size;
    }
    const std::uint64_t data = at + 512;
    const std::uint64_t padded = (size + 511) / 512 * 512;
    if (size > idx.file_size || data > idx.file_size - size)
      fail(at, name, "the member's " + std::to_string(size) + " bytes extend past the end of the file (" +
                         std::to_string(idx.file_size) + " bytes): truncated archive");
    if (extended) {
      if (type != 'g' && pending == none) {
        pending = at;
        pending_type = type;
      }
      const std::string d = read_data(data, size, type == 'L' || type == 'K' ? "a long name" : "a pax header");
      if (type == 'L') {
        long_name = detail::tar_string(reinterpret_cast<const std::uint8_t*>(d.data()), d.size());
        if (long_name.empty() || long_name.size() > limits.max_name) fail(at, "", "bad GNU long name");
        has_long = true;
      } else if (type == 'x') {
        std::string p;
        std::uint64_t s = 0;
        bool hs = false;
        if (!detail::parse_pax(d, p, s, hs, pax_sparse)) fail(data, name, "malformed pax header");
        if (!p.empty()) {
          if (p.size() > limits.max_name) fail(data, name, "pax path longer than the limit");
          pax_path = p;
          has_pax_path = true;
        }
        if (hs) {
          pax_size = s;
          has_pax_size = true;
        }
      }  // 'g' (global pax header) and 'K' (long link name) carry nothing a member index needs
    } else {
      if (type == 'S' || pax_sparse || sparse_name)
        fail(at, name, "a GNU sparse member: sparse members are not supported (only regular files can be read by offset)");
      if (type == '0' || type == '\0' || type == '7') {
        if (name.empty()) fail(at, "", "a member without a name");
        if (name.size() > limits.max_name) fail(at, "", "member name longer than the limit");
        if (size > limits.max_member_bytes)
          fail(at, name, "member of " + std::to_string(size) + " bytes exceeds the limit of " +
                             std::to_string(limits.max_member_bytes));
        if (idx.members.size() >= limits.max_members)
          fail(at, name, "more than " + std::to_string(limits.max_members) + " members");
        idx.members.push_back({name, at, data, size});
      } else if (type == '5') {
        // a directory: nothing to index
      } else {
        fail(at, name, std::string("member of type '") + (type >= 32 && type < 127 ? std::string(1, type) : "?") +
                           "' (link, device or FIFO): only regular files can be read by offset");
      }
      has_long = has_pax_path = has_pax_size = pax_sparse = false;
      pending = none;
    }
    if (padded > idx.file_size - data) {  // the data ends inside the last block: a truncated final block
      if (data + size != idx.file_size) fail(at, name, "truncated archive");
      break;
    }
    at = data + padded;
  }
  if (pending != none)
    fail(pending, "", std::string("the extended header (type '") + pending_type +
                          "', a GNU long name or pax record) has no member: the archive ends after it");
  return idx;
}

/// One WebDataset sample: its key and the members that carry its fields.
struct webdataset_sample {
  std::string key;                              ///< the path without the extensions
  std::vector<std::pair<std::string, std::size_t>> fields;  ///< extension -> index into tar_index::members
  /// The member of extension `ext`, or nullptr.
  [[nodiscard]] const std::size_t* field(std::string_view ext) const noexcept {
    for (const auto& [e, i] : fields)
      if (e == ext) return &i;
    return nullptr;
  }
  /// The member of extension `ext` compared without ASCII case (`JPEG` for `jpeg`): an exact
  /// match first, else the first in member order; null when there is none.
  [[nodiscard]] const std::size_t* field_ignoring_case(std::string_view ext) const noexcept {
    if (const std::size_t* exact = field(ext)) return exact;
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
    for (const auto& [e, i] : fields)
      if (e.size() == ext.size() && std::equal(e.begin(), e.end(), ext.begin(), [&](char a, char b) {
            return lower(a) == lower(b);
          }))
        return &i;
    return nullptr;
  }
};

/// Groups an archive's members into WebDataset samples: a member `dir/name.ext` (the extension is
/// everything after the first dot of the file name, so `a.seg.png` has key `a` and extension
/// `seg.png`) belongs to the sample of key `dir/name`; a sample's members are consecutive.
/// @throws data_error naming the archive and member for a name without an extension, a key that
///         appears again after other keys, or an extension twice in one sample.
inline std::vector<webdataset_sample> webdataset_samples(const tar_index& idx, const std::string& path) {
  std::vector<webdataset_sample> out;
  std::unordered_set<std::string> done;
  for (std::size_t i = 0; i < idx.members.size(); ++i) {
    const tar_member& m = idx.members[i];
    const std::size_t slash = m.name.rfind('/');
    const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
    const std::size_t dot = m.name.find('.', base);
    const auto fail = [&](const std::string& what) {
      throw data_error("lockstep::data::tar: " + path + ": member '" + m.name + "': byte offset " +
                       std::to_string(m.header) + ": " + what);
    };
    if (dot == std::string::npos || dot == base || dot + 1 == m.name.size())
      fail("the file name has no key and extension (WebDataset layout: key.ext)");
    std::string key = m.name.substr(0, dot), ext = m.name.substr(dot + 1);
    if (out.empty() || out.back().key != key) {
      if (!out.empty()) done.insert(out.back().key);
      if (done.count(key)) fail("key '" + key + "' appears again after other keys (a sample's members must be consecutive)");
      out.push_back({std::move(key), {}});
    }
    if (out.back().field(ext)) fail("extension '" + ext + "' appears twice in sample '" + out.back().key + "'");
    out.back().fields.emplace_back(std::move(ext), i);
  }
  return out;
}

/// Reads member `m` of the archive open as `fd` (named `path`) into `out`.
/// @throws data_error naming the archive, member and offset when the file ends early or a read fails.
inline void read_member(int fd, const std::string& path, const tar_member& m, std::vector<std::uint8_t>& out) {
  out.resize(static_cast<std::size_t>(m.size));
  const std::size_t got = detail::pread_full(fd, out.data(), out.size(), m.offset);
  if (got != out.size())
    throw data_error("lockstep::data::tar: " + path + ": member '" + m.name + "': byte offset " + std::to_string(m.offset) +
                     ": " + (got == static_cast<std::size_t>(-1) ? std::string("read error (") + std::strerror(errno) + ")"
                                                                 : "the archive ends inside the member (it changed since it was indexed?)"));
}

/// Writes an uncompressed tar archive (POSIX ustar headers; a GNU long-name record before a
/// member whose path exceeds 100 bytes), such as a WebDataset shard: `add` members in order, then
/// `close` (or let the destructor close it). Files are written to `path` + ".partial", synced and
/// renamed when closed, so a reader never sees half a shard: a writer destroyed while an exception
/// unwinds, or after a failed write, removes the .partial file instead of publishing it.
class tar_writer {
public:
  /// Creates the archive. @throws data_error when the file cannot be created.
  explicit tar_writer(std::string path)
      : path_(std::move(path)), partial_(path_ + ".partial"), exceptions_(std::uncaught_exceptions()) {
    file_ = std::fopen(partial_.c_str(), "wb");
    if (!file_) throw data_error("lockstep::data::tar_writer: " + partial_ + ": cannot create (" + std::strerror(errno) + ")");
  }
  tar_writer(const tar_writer&) = delete;
  tar_writer& operator=(const tar_writer&) = delete;
  /// Closes the archive (errors are lost here: call close() to see them); while an exception
  /// unwinds, or after a failed write, it removes the unfinished file instead.
  ~tar_writer() {
    if (failed_ || std::uncaught_exceptions() > exceptions_) {
      discard();
      return;
    }
    try {
      close();
    } catch (...) {
    }
  }
  /// Appends a regular file member. @throws data_error on a write error.
  void add(const std::string& name, const std::uint8_t* data, std::size_t size) {
    if (!file_) throw data_error("lockstep::data::tar_writer: " + path_ + ": already closed");
    if (failed_) throw data_error("lockstep::data::tar_writer: " + partial_ + ": an earlier write failed");
    if (name.empty()) throw config_error("lockstep::data::tar_writer: a member needs a name");
    if (name.size() > 100) {
      header("././@LongLink", name.size() + 1, 'L');
      put(name.data(), name.size());
      put("", 1);
      pad(name.size() + 1);
    }
    header(name.substr(0, 100), size, '0');
    put(data, size);
    pad(size);
  }
  /// Appends a member holding `text`.
  void add(const std::string& name, const std::string& text) {
    add(name, reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  }
  /// Writes the end-of-archive blocks, syncs the file and renames it into place.
  /// @throws data_error on failure (or after a failed write), having removed the unfinished file.
  void close() {
    if (!file_) return;
    if (failed_) {
      discard();
      throw data_error("lockstep::data::tar_writer: " + path_ + ": an earlier write failed; the unfinished archive was removed");
    }
    static constexpr char zeros[1024] = {};
    try {
      put(zeros, sizeof zeros);
    } catch (...) {
      discard();
      throw;
    }
    bool ok = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
    int err = ok ? 0 : errno;
    if (std::fclose(file_) != 0 && ok) {
      ok = false;
      err = errno;
    }
    file_ = nullptr;
    if (ok && std::rename(partial_.c_str(), path_.c_str()) != 0) {
      ok = false;
      err = errno;
    }
    if (!ok) {
      std::remove(partial_.c_str());
      throw data_error("lockstep::data::tar_writer: " + path_ + ": cannot finish the archive (" + std::strerror(err) + ")");
    }
  }

private:
  void put(const void* p, std::size_t n) {
    if (n && std::fwrite(p, 1, n, file_) != n) {
      failed_ = true;
      throw data_error("lockstep::data::tar_writer: " + partial_ + ": write error (" + std::strerror(errno) + ")");
    }
  }
  /// Closes the file without finishing it and removes it (nothing once closed: the name may be
  /// another writer's by then).
  void discard() noexcept {
    if (!file_) return;
    std::fclose(file_);
    file_ = nullptr;
    std::remove(partial_.c_str());
  }
  void pad(std::size_t n) {
    static constexpr char zeros[512] = {};
    if (n % 512) put(zeros, 512 - n % 512);
  }
  void header(const std::string& name, std::uint64_t size, char type) {
    char h[512] = {};
    std::memcpy(h, name.data(), std::min<std::size_t>(name.size(), 100));
    std::snprintf(h + 100, 8, "%07o", 0644);
    std::snprintf(h + 108, 8, "%07o", 0);
    std::snprintf(h + 116, 8, "%07o", 0);
    if (size >= (std::uint64_t{1} << 33)) {  // beyond 11 octal digits: GNU base-256
      h[124] = static_cast<char>(0x80);
      for (int i = 0; i < 8; ++i) h[135 - i] = static_cast<char>((size >> (8 * i)) & 0xff);
    } else {
      std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(size));
    }
    std::snprintf(h + 136, 12, "%011o", 0);
    h[156] = type;
    std::memcpy(h + 257, "ustar", 6);
    std::memcpy(h + 263, "00", 2);
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (char c : h) sum += static_cast<unsigned char>(c);
    std::snprintf(h + 148, 8, "%06o", sum);
    h[155] = ' ';
    put(h, sizeof h);
  }

  std::string path_, partial_;
  int exceptions_ = 0;  // std::uncaught_exceptions() when constructed
  bool failed_ = false;
  std::FILE* file_ = nullptr;
};

}  // namespace lockstep::data
