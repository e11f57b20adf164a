#pragma once
/// @file checkpoint.hpp
/// The checkpoint file: a versioned, checksummed container of named, versioned sections, written
/// atomically. It knows the format and files only; what goes into the sections belongs to their
/// owners: the replicated model writes its parameters and optimiser state
/// (distribute/checkpoint.hpp), `fit` its position and schedule (train/checkpoint.hpp), and later
/// features add sections of their own without changing the file format.
///
/// File layout of format 3 (all integers little-endian):
///   header   "LSCKPT\r\n" (8 bytes), u32 format version, u32 section count, u32 CRC-32 of those 16 bytes
///   sections each: u32 tag (four ASCII characters), u32 section version, u64 payload length,
///            payload, u32 CRC-32 of tag, version, length and payload. Tags are unique; their
///            order is free; a reader ignores sections it does not know.
/// Formats 1 and 2 (fixed sections MODL, PARM, OPTM, PROG, SCHD, RNGS and, from 2 on, CBKS, each
/// "u32 tag, u64 length, payload, u32 CRC") are still read: their sections come out as version 1
/// of the same tags. Nothing may follow the last section. Every failure to read names the file,
/// the section and the byte offset, and throws lockstep::checkpoint_error.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/io/detail/file_mode.hpp>
#include <lockstep/io/serialization.hpp>
#include <lockstep/layers/signature.hpp>

namespace lockstep::io {

/// The checkpoint format version this library writes (it also reads every version from
/// checkpoint_oldest_version on).
inline constexpr std::uint32_t checkpoint_version = 3;

/// The oldest checkpoint format version this library reads.
inline constexpr std::uint32_t checkpoint_oldest_version = 1;

/// The 8 magic bytes every checkpoint starts with.
inline constexpr std::array<std::uint8_t, 8> checkpoint_magic{'L', 'S', 'C', 'K', 'P', 'T', '\r', '\n'};

/// A section tag from its four characters ("MODL" -> 0x4c444f4d, little-endian).
[[nodiscard]] constexpr std::uint32_t section_tag(const char (&name)[5]) noexcept {
  return static_cast<std::uint32_t>(static_cast<unsigned char>(name[0])) |
         static_cast<std::uint32_t>(static_cast<unsigned char>(name[1])) << 8 |
         static_cast<std::uint32_t>(static_cast<unsigned char>(name[2])) << 16 |
         static_cast<std::uint32_t>(static_cast<unsigned char>(name[3])) << 24;
}

/// The tags of the library's own sections (their owners say what each holds).
namespace tags {
inline constexpr std::uint32_t model = section_tag("MODL");       ///< the model: signature, sizes, type name, step
inline constexpr std::uint32_t parameters = section_tag("PARM");  ///< the flat parameters (and non-trainable state)
inline constexpr std::uint32_t optimizer = section_tag("OPTM");   ///< the optimiser state (and, from version 2, its name)
inline constexpr std::uint32_t progress = section_tag("PROG");    ///< formats 1-2: step, epoch, batches consumed
inline constexpr std::uint32_t schedule = section_tag("SCHD");    ///< formats 1-2: base rate, factor, last rate
inline constexpr std::uint32_t rng = section_tag("RNGS");         ///< formats 1-2: seeds and replica count
inline constexpr std::uint32_t callbacks = section_tag("CBKS");   ///< format 2: callback states and epoch sums
inline constexpr std::uint32_t fit = section_tag("FITS");         ///< format 3: fit's resume state
}  // namespace tags

/// The name of tag `t` ("MODL"), for messages.
[[nodiscard]] inline std::string tag_text(std::uint32_t t) {
  std::string s(4, '?');
  for (int i = 0; i < 4; ++i) {
    const char c = static_cast<char>((t >> (8 * i)) & 0xffu);
    s[static_cast<std::size_t>(i)] = (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return s;
}

/// One section: its tag, its own version, its payload and where the payload lies in the file.
struct checkpoint_section {
  std::uint32_t tag = 0;              ///< four ASCII characters (section_tag)
  std::uint32_t version = 1;          ///< the owner's version of the payload layout
  std::vector<std::uint8_t> payload;  ///< the bytes
  std::size_t offset = 0;             ///< file offset of the payload (0 for a section not read from a file)
};

/// A checkpoint in memory: its sections (see the file comment).
class checkpoint_file {
public:
  /// An empty checkpoint, to fill with put().
  checkpoint_file() = default;
  /// An empty checkpoint named `source` in messages.
  explicit checkpoint_file(std::string source) : source_(std::move(source)) {}

  /// Adds section `tag` of version `version` with `payload`.
  /// @throws config_error when the tag is already present (tags are unique).
  void put(std::uint32_t tag, std::uint32_t version, std::vector<std::uint8_t> payload) {
    if (find(tag)) throw config_error("lockstep::checkpoint: section '" + tag_text(tag) + "' added twice");
    sections_.push_back(checkpoint_section{tag, version, std::move(payload), 0});
  }
  /// Adds section `tag` from what a writer wrote.
  void put(std::uint32_t tag, std::uint32_t version, writer payload) { put(tag, version, payload.take()); }

  /// Section `tag`, or null.
  [[nodiscard]] const checkpoint_section* find(std::uint32_t tag) const noexcept {
    for (const auto& s : sections_)
      if (s.tag == tag) return &s;
    return nullptr;
  }
  /// Section `tag` (named `name` in messages). @throws checkpoint_error when it is missing.
  [[nodiscard]] const checkpoint_section& get(std::uint32_t tag, const char* name) const {
    if (const auto* s = find(tag)) return *s;
    throw checkpoint_error("lockstep::checkpoint: " + source_ + ": section '" + name + "' (" + tag_text(tag) +
                           ") is missing (format version " + std::to_string(format_) + ")");
  }
  /// A bounds-checked reader of section `s` whose failures name `name` and the file offsets.
  [[nodiscard]] reader read(const checkpoint_section& s, const char* name) const {
    return reader(s.payload, source_, name, s.offset);
  }
  /// Throws checkpoint_error naming section `s` (`name`) unless its version is one of
  /// [oldest, newest] that this library reads.
  void check_version(const checkpoint_section& s, const char* name, std::uint32_t oldest, std::uint32_t newest) const {
    if (s.version < oldest || s.version > newest)
      throw checkpoint_error("lockstep::checkpoint: " + source_ + ": section '" + name + "' at offset " +
                             std::to_string(s.offset) + ": unsupported section version " + std::to_string(s.version) +
                             " (this library reads versions " + std::to_string(oldest) + " to " +
                             std::to_string(newest) + ")");
  }

  /// Every section, in file order.
  [[nodiscard]] const std::vector<checkpoint_section>& sections() const noexcept { return sections_; }
  /// The format version the file was read from (checkpoint_version for one made in memory).
  [[nodiscard]] std::uint32_t format() const noexcept { return format_; }
  /// What names the checkpoint in messages (its path).
  [[nodiscard]] const std::string& source() const noexcept { return source_; }

private:
  friend checkpoint_file decode_checkpoint_file(std::span<const std::uint8_t>, const std::string&);
  std::vector<checkpoint_section> sections_;
  std::uint32_t format_ = checkpoint_version;
  std::string source_ = "checkpoint";
};

namespace detail {

/// The fixed sections of formats 1 and 2, in file order (format 1 lacks the last).
struct legacy_section {
  std::uint32_t tag;
  const char* name;
};
inline constexpr std::array<legacy_section, 7> legacy_sections{{{tags::model, "model"},
                                                                {tags::parameters, "parameters"},
                                                                {tags::optimizer, "optimizer"},
                                                                {tags::progress, "progress"},
                                                                {tags::schedule, "schedule"},
                                                                {tags::rng, "rng"},
                                                                {tags::callbacks, "callbacks"}}};

/// Header bytes: magic, version, section count, CRC.
inline constexpr std::size_t header_size = 8 + 4 + 4 + 4;
/// The most sections a format-3 file may declare (the library writes a handful).
inline constexpr std::size_t max_sections = 1024;

inline std::string hex64(std::uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

[[noreturn]] inline void sys_fail(const std::string& what, const std::string& path) {
  throw checkpoint_error("lockstep::checkpoint: " + path + ": " + what + ": " + std::strerror(errno));
}

inline void write_all(int fd, const std::uint8_t* p, std::size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      sys_fail("write failed", path);
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

/// The name of a tag for messages: the library's sections by their names, others by their tag.
inline std::string section_name(std::uint32_t tag) {
  for (const auto& s : legacy_sections)
    if (s.tag == tag) return s.name;
  if (tag == tags::fit) return "fit";
  return tag_text(tag);
}

}  // namespace detail

/// Encodes checkpoint `f` into the bytes of a format-3 file.
[[nodiscard]] inline std::vector<std::uint8_t> encode_checkpoint_file(const checkpoint_file& f) {
  writer out;
  out.put_bytes(checkpoint_magic);
  out.put(checkpoint_version);
  out.put(static_cast<std::uint32_t>(f.sections().size()));
  out.put(crc32_of(out.bytes()));
  for (const auto& s : f.sections()) {
    writer frame;
    frame.put(s.tag);
    frame.put(s.version);
    frame.put(static_cast<std::uint64_t>(s.payload.size()));
    frame.put_bytes(s.payload);
    const std::uint32_t crc = crc32_of(frame.bytes());
    out.put_bytes(frame.bytes());
    out.put(crc);
  }
  return out.take();
}

/// Decodes and verifies checkpoint bytes of any format this library reads; `source` names them in
/// error messages.
/// @throws checkpoint_error naming the source, section and offset of a bad magic or version, a
///         CRC mismatch, a truncation, a wrong or repeated section, or trailing bytes.
[[nodiscard]] inline checkpoint_file decode_checkpoint_file(std::span<const std::uint8_t> bytes, const std::string& source) {
  reader head(bytes.first(std::min(bytes.size(), detail::header_size)), source, "header");
  for (std::size_t i = 0; i < checkpoint_magic.size(); ++i)
    if (head.get<std::uint8_t>("the magic") != checkpoint_magic[i])
      reader(bytes, source, "header", i).fail("bad magic: not a lockstep checkpoint");
  const auto version = head.get<std::uint32_t>("the version");
  const auto count = head.get<std::uint32_t>("the section count");
  const auto crc = head.get<std::uint32_t>("the header checksum");
  if (crc != crc32_of(bytes.first(16))) reader(bytes, source, "header", 0).fail("header checksum mismatch");
  if (version < checkpoint_oldest_version || version > checkpoint_version)
    reader(bytes, source, "header", 8).fail("unsupported version " + std::to_string(version) + " (this library reads versions " +
                                           std::to_string(checkpoint_oldest_version) + " to " +
                                           std::to_string(checkpoint_version) + ")");
  const bool legacy = version < 3;
  const std::size_t expected_legacy = version == 1 ? detail::legacy_sections.size() - 1 : detail::legacy_sections.size();
  if (legacy && count != expected_legacy)
    reader(bytes, source, "header", 12).fail("expected " + std::to_string(expected_legacy) + " sections in version " +
                                            std::to_string(version) + ", the header says " + std::to_string(count));
  if (!legacy && count > detail::max_sections)
    reader(bytes, source, "header", 12).fail("declares " + std::to_string(count) + " sections, more than the " +
                                            std::to_string(detail::max_sections) + " a checkpoint may hold");

  checkpoint_file f(source);
  f.format_ = version;
  std::size_t pos = detail::header_size;
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t start = pos;
    const std::string expected_name = legacy ? detail::legacy_sections[k].name : "section " + std::to_string(k);
    reader frame(bytes.subspan(std::min(pos, bytes.size())), source, expected_name, pos);
    const auto t = frame.get<std::uint32_t>("the section tag");
    if (legacy && t != detail::legacy_sections[k].tag)
      frame.fail("wrong section tag (expected the " + std::string(detail::legacy_sections[k].name) + " section)");
    const std::string name = legacy ? expected_name : detail::section_name(t);
    const std::uint32_t section_version = legacy ? 1 : frame.get<std::uint32_t>("the section version");
    const auto len = frame.get<std::uint64_t>("the section length");
    const std::size_t payload_at = pos + (legacy ? 12 : 16);
    if (len > bytes.size() - payload_at || bytes.size() - payload_at - len < 4)
      reader(bytes, source, name, payload_at)
          .fail("truncated: the section declares " + std::to_string(len) + " payload bytes plus a 4-byte checksum, " +
                std::to_string(bytes.size() - payload_at) + " remain in the file");
    const std::size_t n = static_cast<std::size_t>(len);
    reader tail(bytes.subspan(payload_at + n, 4), source, name, payload_at + n);
    const auto stored = tail.get<std::uint32_t>("the checksum");
    const auto computed = crc32_of(bytes.subspan(start, payload_at - start + n));
    if (stored != computed)
      reader(bytes, source, name, start)
          .fail("checksum mismatch (stored " + std::to_string(stored) + ", computed " + std::to_string(computed) +
                ") over bytes " + std::to_string(start) + ".." + std::to_string(payload_at + n));
    if (f.find(t)) reader(bytes, source, name, start).fail("section '" + tag_text(t) + "' appears twice");
    const auto payload = bytes.subspan(payload_at, n);
    f.sections_.push_back(checkpoint_section{t, section_version, {payload.begin(), payload.end()}, payload_at});
    pos = payload_at + n + 4;
  }
  if (pos != bytes.size())
    reader(bytes, source, "end", pos).fail(std::to_string(bytes.size() - pos) + " trailing bytes after the last section");
  return f;
}

/// The directory a file at `path` goes into: its parent, or "." for a bare file name.
inline std::filesystem::path directory_of(const std::filesystem::path& path) {
  return path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory is written, given
/// the mode open(2) with 0666 would give it under the process's umask, fsync'ed, renamed over
/// `path`, and the directory is fsync'ed. A crash at any moment leaves either the old file or the
/// new one, never a torn one (a stray temporary may remain).
inline void write_file_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
  const std::filesystem::path dir = directory_of(path);
  std::string tmpl = dir.string();  // built by appending: GCC 12 warns falsely on "." + string
  tmpl.append("/.").append(path.filename().string()).append(".tmp.XXXXXX");
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) detail::sys_fail("cannot create a temporary file in " + dir.string(), path.string());
  try {
    detail::write_all(fd, bytes.data(), bytes.size(), tmpl);
    // mkstemp made it 0600: the mode open(2) with 0666 would give, before it has its name (best
    // effort: a file system without modes, as vfat, keeps its own)
    (void)::fchmod(fd, static_cast<mode_t>(0666u & ~detail::current_umask()));
    if (::fsync(fd) != 0) detail::sys_fail("fsync failed", tmpl);
  } catch (...) {
    ::close(fd);
    ::unlink(tmpl.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmpl.c_str());
    detail::sys_fail("close failed", tmpl);
  }
  if (::rename(tmpl.c_str(), path.c_str()) != 0) {
    ::unlink(tmpl.c_str());
    detail::sys_fail("rename failed", path.string());
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd < 0) detail::sys_fail("cannot open the directory to fsync it", dir.string());
  const int rc = ::fsync(dfd);
  const int err = errno;
  ::close(dfd);
  // Some file systems (FUSE, 9p and vboxsf mounts) cannot fsync a directory: the file itself is
  // synced and renamed, so only a real failure of the sync is one.
  if (rc != 0 && err != EINVAL && err != ENOTSUP) {
    errno = err;
    detail::sys_fail("fsync of the directory failed", dir.string());
  }
}

/// Writes checkpoint `f` to `path` atomically (see write_file_atomically: readable by the accounts
/// the process's umask lets read its files, as an evaluation job on a shared file system).
inline void save_checkpoint_file(const std::filesystem::path& path, const checkpoint_file& f) {
  write_file_atomically(path, encode_checkpoint_file(f));
}

/// Reads and verifies the checkpoint at `path`.
/// @throws checkpoint_error when the file cannot be read (with the system's reason; also when it
///         does not fit in memory) or is corrupt, truncated or of another version.
[[nodiscard]] inline checkpoint_file load_checkpoint_file(const std::filesystem::path& path) {
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(status))
    throw checkpoint_error("lockstep::checkpoint: " + path.string() + ": is a directory, not a checkpoint file");
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))  // a FIFO would block the open
    throw checkpoint_error("lockstep::checkpoint: " + path.string() + ": not a regular file");
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw checkpoint_error("lockstep::checkpoint: " + path.string() + ": cannot open file" +
                           (errno ? std::string(": ") + std::strerror(errno) : std::string()));
  std::vector<std::uint8_t> bytes;
  try {
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::bad_alloc&) {  // a file larger than memory
    throw checkpoint_error("lockstep::checkpoint: " + path.string() + ": cannot allocate memory for the file (" +
                           std::to_string(bytes.size()) + "+ bytes read)");
  } catch (const std::exception& e) {  // the stream's read failed (libstdc++ throws from underflow)
    throw checkpoint_error("lockstep::checkpoint: " + path.string() + ": read error after " +
                           std::to_string(bytes.size()) + " bytes: " + e.what());
  }
  if (in.bad()) throw checkpoint_error("lockstep::checkpoint: " + path.string() + ": read error");
  return decode_checkpoint_file(bytes, path.string());
}

/// A directory of checkpoints named `ckpt-<step>.lsck` that keeps the newest `keep`.
class checkpoint_manager {
public:
  /// Manages `dir` (created if missing), keeping the newest `keep` checkpoints (keep >= 1).
  explicit checkpoint_manager(std::filesystem::path dir, std::size_t keep = 3) : dir_(std::move(dir)), keep_(keep) {
    if (keep_ == 0) throw config_error("lockstep::checkpoint_manager: keep must be >= 1");
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw checkpoint_error("lockstep::checkpoint: " + dir_.string() + ": cannot create directory: " + ec.message());
  }

  /// The file name used for a checkpoint taken after `step` updates.
  [[nodiscard]] std::filesystem::path path_for(std::uint64_t step) const {
    char name[40];
    std::snprintf(name, sizeof name, "ckpt-%012llu.lsck", static_cast<unsigned long long>(step));
    return dir_ / name;
  }

  /// The step in the name of checkpoint `path` (one of list()'s; 0 for another name).
  [[nodiscard]] static std::uint64_t step_of(const std::filesystem::path& path) {
    const std::string name = path.filename().string();
    std::uint64_t step = 0;
    if (name.size() > 5 && name.rfind("ckpt-", 0) == 0)
      (void)std::from_chars(name.data() + 5, name.data() + name.size(), step);
    return step;
  }

  /// Writes `f` atomically as path_for(step), then deletes all but the newest `keep`
  /// checkpoints and any temporaries left by an interrupted save. Returns the path written.
  /// @throws checkpoint_error when the directory holds a checkpoint of a later step (another
  ///         run's): keeping the newest would delete this one, and latest() would not return it.
  std::filesystem::path save(const checkpoint_file& f, std::uint64_t step) {
    const auto path = path_for(step);
    if (const auto newest = latest(); newest && newest->filename() > path.filename())
      throw checkpoint_error("lockstep::checkpoint: " + dir_.string() + " holds " + newest->filename().string() +
                             ", of a later step than " + std::to_string(step) +
                             " (another run's): saving would delete this checkpoint to keep the later ones; save "
                             "into an empty directory, or remove the later checkpoints");
    save_checkpoint_file(path, f);
    auto all = list();
    std::error_code ec;
    for (std::size_t i = 0; i + keep_ < all.size(); ++i) std::filesystem::remove(all[i], ec);
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(".ckpt-", 0) == 0 && name.find(".tmp.") != std::string::npos) std::filesystem::remove(e.path(), ec);
    }
    return path;
  }
  /// Writes a checkpoint that knows its step (anything with `step` and `to_file()`, such as
  /// lockstep::checkpoint_state) as path_for(s.step); see save(file, step).
  template <class State>
    requires requires(const State& s) {
      { s.to_file() } -> std::convertible_to<checkpoint_file>;
      s.step;
    }
  std::filesystem::path save(const State& s) {
    return save(s.to_file(), static_cast<std::uint64_t>(s.step));
  }

  /// The checkpoints in the directory, oldest (smallest step) first (none when it does not exist).
  /// @throws checkpoint_error naming the directory when it cannot be read: an unreadable one
  ///         listed as empty would make a resume start over and keep every checkpoint.
  [[nodiscard]] std::vector<std::filesystem::path> list() const {
    std::vector<std::filesystem::path> out;
    std::error_code ec;
    std::filesystem::directory_iterator it(dir_, ec);
    if (ec && ec != std::errc::no_such_file_or_directory)
      throw checkpoint_error("lockstep::checkpoint: " + dir_.string() + ": cannot list the directory: " + ec.message());
    for (const auto& e : it) {
      const std::string name = e.path().filename().string();
      std::error_code kind;
      if (name.size() == 22 && name.rfind("ckpt-", 0) == 0 && name.ends_with(".lsck") && e.is_regular_file(kind))
        out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  /// The newest checkpoint, if any.
  [[nodiscard]] std::optional<std::filesystem::path> latest() const {
    auto all = list();
    if (all.empty()) return std::nullopt;
    return all.back();
  }

  /// Loads and verifies the newest checkpoint (nullopt when there is none).
  /// @throws checkpoint_error when it is corrupt.
  [[nodiscard]] std::optional<checkpoint_file> load_latest_file() const {
    const auto p = latest();
    if (!p) return std::nullopt;
    return load_checkpoint_file(*p);
  }

  /// Loads and verifies the newest checkpoint and checks that its model section names model
  /// signature `signature` (nullopt when there is none).
  /// @throws checkpoint_error when it is corrupt or belongs to another model.
  [[nodiscard]] std::optional<checkpoint_file> load_latest(std::uint64_t signature) const {
    auto f = load_latest_file();
    if (f) {
      const auto& m = f->get(tags::model, "model");
      reader r = f->read(m, "model");
      const auto have = r.get<std::uint64_t>("the model signature");
      if (have != signature)
        throw checkpoint_error("lockstep::checkpoint: " + f->source() + ": section 'model' at offset " +
                               std::to_string(m.offset) + ": model signature " + detail::hex64(have) +
                               " does not match this model's " + detail::hex64(signature));
    }
    return f;
  }

  /// The managed directory.
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }

private:
  std::filesystem::path dir_;
  std::size_t keep_;
};

/// The network fingerprint (layers/signature.hpp), also reachable from io.
using lockstep::model_signature;
/// The readable type name (layers/signature.hpp), also reachable from io.
using lockstep::model_name;

}  // namespace lockstep::io

namespace lockstep {
using io::checkpoint_manager;
}  // namespace lockstep
