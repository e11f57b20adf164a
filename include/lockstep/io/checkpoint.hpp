#pragma once
/// @file checkpoint.hpp
/// Versioned, checksummed, atomically written training checkpoints.
///
/// File layout (all integers little-endian):
///   header   "LSCKPT\r\n" (8 bytes), u32 version, u32 section count, u32 CRC-32 of those 16 bytes
///   sections in a fixed order, each: u32 tag, u64 payload length, payload, u32 CRC-32 of tag,
///            length and payload. Tags: MODL (model), PARM (parameters), OPTM (optimizer),
///            PROG (progress), SCHD (schedule), RNGS (rng), CBKS (callbacks; version 2 on).
/// Version 1 files (without CBKS) are still read, with no callback state.
/// Nothing may follow the last section. Every failure to read names the file, the section and the
/// byte offset, and throws lockstep::checkpoint_error.

#include <cxxabi.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/io/serialization.hpp>
#include <lockstep/layers/model.hpp>

namespace lockstep::io {

/// The checkpoint format version this library writes (it also reads every version from
/// checkpoint_oldest_version on).
inline constexpr std::uint32_t checkpoint_version = 2;

/// The oldest checkpoint format version this library reads (version 1 has no callback state).
inline constexpr std::uint32_t checkpoint_oldest_version = 1;

/// The 8 magic bytes every checkpoint starts with.
inline constexpr std::array<std::uint8_t, 8> checkpoint_magic{'L', 'S', 'C', 'K', 'P', 'T', '\r', '\n'};

/// Everything needed to continue a training run exactly where it stopped.
struct checkpoint_state {
  std::uint64_t signature = 0;          ///< model_signature<Net>() of the model that wrote it
  std::string model_name;               ///< the network's type name (diagnostics only)
  std::vector<float> parameters;        ///< the flat parameter buffer (identical on every replica)
  std::vector<float> optimizer_state;   ///< the flat optimiser state (empty before the first update)
  std::uint64_t step = 0;               ///< updates applied so far
  std::uint64_t epoch = 0;              ///< the epoch in progress (pipeline position)
  std::uint64_t batches = 0;            ///< global batches of `epoch` already consumed
  float base_lr = 0;                    ///< the optimiser's base learning rate
  float lr_factor = 1;                  ///< multiplier set by callbacks (e.g. on plateau)
  float lr = 0;                         ///< learning rate of the last update
  std::uint64_t seed = 0;               ///< the model seed (keys init and dropout)
  std::uint64_t data_seed = 0;          ///< the input pipeline's seed (informational)
  std::uint32_t replicas = 0;           ///< replicas of the run that wrote it (informational)
  std::vector<std::vector<double>> callback_states;  ///< each callback's saved state, in callback order
  bool stop_requested = false;          ///< a callback had asked training to stop when it was written
  double epoch_loss_sum = 0;            ///< training loss sum of the batches of `epoch` consumed so far
  std::uint64_t epoch_samples = 0;      ///< training samples of the batches of `epoch` consumed so far
  std::uint64_t epoch_steps = 0;        ///< updates of `epoch` done so far
  std::uint64_t epoch_labelled = 0;     ///< labelled training rows of `epoch` so far (accuracy denominator)
  std::uint64_t epoch_correct = 0;      ///< top-1 hits among them
  std::uint32_t version = checkpoint_version;  ///< format version it was read from (1: no callback state)
};

/// A structural fingerprint of network Net: a 64-bit FNV-1a hash of its input width, output
/// width, total parameter count, number of top-level layers, and each top-level layer's parameter
/// count and output width. It changes when any width or parameter count changes; it does not see
/// parameter-free differences that keep every shape (relu vs tanh, a dropout rate).
template <class Net>
[[nodiscard]] constexpr std::uint64_t model_signature() noexcept {
  using bound = typename model<Net>::bound;
  std::uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  };
  mix(bound::input_size);
  mix(bound::output_size);
  mix(bound::param_count);
  if constexpr (state_count_v<bound> > 0) mix(state_count_v<bound>);  // models without state keep their signature
  if constexpr (requires { bound::layer_count; }) {
    mix(bound::layer_count);
    for (std::size_t i = 0; i < bound::layer_count; ++i) {
      mix(bound::params[i]);
      mix(bound::outputs[i]);
    }
  } else {
    mix(1);
  }
  return h;
}

/// The type name recorded in checkpoints of Net (the compiler's name, demangled; diagnostics only).
template <class Net>
[[nodiscard]] std::string model_name() {
  const char* mangled = typeid(Net).name();
  int status = 0;
  char* readable = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && readable ? readable : mangled;
  std::free(readable);
  return name;
}

namespace detail {

enum class tag : std::uint32_t {
  model = 0x4c444f4d,       // "MODL"
  parameters = 0x4d524150,  // "PARM"
  optimizer = 0x4d54504f,   // "OPTM"
  progress = 0x474f5250,    // "PROG"
  schedule = 0x44484353,    // "SCHD"
  rng = 0x53474e52,         // "RNGS"
  callbacks = 0x534b4243,   // "CBKS"
};

struct section_info {
  tag t;
  const char* name;
};
inline constexpr std::array<section_info, 7> sections{{{tag::model, "model"},
                                                       {tag::parameters, "parameters"},
                                                       {tag::optimizer, "optimizer"},
                                                       {tag::progress, "progress"},
                                                       {tag::schedule, "schedule"},
                                                       {tag::rng, "rng"},
                                                       {tag::callbacks, "callbacks"}}};

/// Number of sections of a file of format `version` (version 1 lacks the callbacks section).
[[nodiscard]] constexpr std::size_t section_count(std::uint32_t version) noexcept {
  return version == 1 ? sections.size() - 1 : sections.size();
}
inline constexpr std::size_t header_size = 8 + 4 + 4 + 4;

inline std::string hex64(std::uint64_t v) {
  char buf[19];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

inline void append_section(writer& out, tag t, const writer& payload) {
  writer s;
  s.put(static_cast<std::uint32_t>(t));
  s.put(static_cast<std::uint64_t>(payload.bytes().size()));
  s.put_bytes(payload.bytes());
  const std::uint32_t crc = crc32_of(s.bytes());
  out.put_bytes(s.bytes());
  out.put(crc);
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

}  // namespace detail

/// Encodes a checkpoint into its file bytes.
[[nodiscard]] inline std::vector<std::uint8_t> encode_checkpoint(const checkpoint_state& s) {
  writer out;
  out.put_bytes(checkpoint_magic);
  out.put(checkpoint_version);
  out.put(static_cast<std::uint32_t>(detail::sections.size()));
  out.put(crc32_of(out.bytes()));

  writer model;
  model.put(s.signature);
  model.put(static_cast<std::uint64_t>(s.parameters.size()));
  model.put_string(s.model_name);
  detail::append_section(out, detail::tag::model, model);

  writer params;
  params.put_array<float>(s.parameters);
  detail::append_section(out, detail::tag::parameters, params);

  writer opt;
  opt.put_array<float>(s.optimizer_state);
  detail::append_section(out, detail::tag::optimizer, opt);

  writer prog;
  prog.put(s.step);
  prog.put(s.epoch);
  prog.put(s.batches);
  detail::append_section(out, detail::tag::progress, prog);

  writer sched;
  sched.put(s.base_lr);
  sched.put(s.lr_factor);
  sched.put(s.lr);
  detail::append_section(out, detail::tag::schedule, sched);

  writer rng;
  rng.put(s.seed);
  rng.put(s.data_seed);
  rng.put(s.replicas);
  detail::append_section(out, detail::tag::rng, rng);

  writer cbks;
  cbks.put(static_cast<std::uint8_t>(s.stop_requested ? 1 : 0));
  cbks.put(s.epoch_loss_sum);
  cbks.put(s.epoch_samples);
  cbks.put(s.epoch_steps);
  cbks.put(s.epoch_labelled);
  cbks.put(s.epoch_correct);
  cbks.put(static_cast<std::uint64_t>(s.callback_states.size()));
  for (const auto& c : s.callback_states) cbks.put_array<double>(c);
  detail::append_section(out, detail::tag::callbacks, cbks);
  return out.take();
}

/// Decodes and verifies checkpoint bytes; `source` names them in error messages.
/// @throws checkpoint_error naming the source, section and offset of a bad magic or version, a
///         CRC mismatch, a truncation, a wrong section or trailing bytes.
[[nodiscard]] inline checkpoint_state decode_checkpoint(std::span<const std::uint8_t> bytes, const std::string& source) {
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
  const std::size_t expected_sections = detail::section_count(version);
  if (count != expected_sections)
    reader(bytes, source, "header", 12).fail("expected " + std::to_string(expected_sections) + " sections in version " +
                                            std::to_string(version) + ", the header says " + std::to_string(count));

  checkpoint_state s;
  s.version = version;
  std::uint64_t declared_params = 0;
  std::size_t pos = detail::header_size;
  for (const auto& info : std::span(detail::sections).first(expected_sections)) {
    const std::size_t start = pos;
    reader frame(bytes.subspan(std::min(pos, bytes.size())), source, info.name, pos);
    const auto t = frame.get<std::uint32_t>("the section tag");
    if (t != static_cast<std::uint32_t>(info.t)) frame.fail("wrong section tag (expected the " + std::string(info.name) + " section)");
    const auto len = frame.get<std::uint64_t>("the section length");
    const std::size_t payload_at = pos + 12;
    if (len > bytes.size() - payload_at || bytes.size() - payload_at - len < 4)
      reader(bytes, source, info.name, payload_at)
          .fail("truncated: the section declares " + std::to_string(len) + " payload bytes plus a 4-byte checksum, " +
                std::to_string(bytes.size() - payload_at) + " remain in the file");
    const std::size_t n = static_cast<std::size_t>(len);
    const auto payload = bytes.subspan(payload_at, n);
    reader tail(bytes.subspan(payload_at + n, 4), source, info.name, payload_at + n);
    const auto stored = tail.get<std::uint32_t>("the checksum");
    const auto computed = crc32_of(bytes.subspan(start, 12 + n));
    if (stored != computed)
      reader(bytes, source, info.name, start)
          .fail("checksum mismatch (stored " + std::to_string(stored) + ", computed " + std::to_string(computed) +
                ") over bytes " + std::to_string(start) + ".." + std::to_string(payload_at + n));
    reader r(payload, source, info.name, payload_at);
    switch (info.t) {
      case detail::tag::model: {
        s.signature = r.get<std::uint64_t>("the model signature");
        declared_params = r.get<std::uint64_t>("the parameter count");
        s.model_name = r.get_string("the model name");
        break;
      }
      case detail::tag::parameters: {
        const std::size_t at = r.offset();
        s.parameters = r.get_array<float>("the parameters");
        if (s.parameters.size() != declared_params)
          r.fail_at(at, "holds " + std::to_string(s.parameters.size()) + " parameters, the model section says " +
                            std::to_string(declared_params));
        break;
      }
      case detail::tag::optimizer:
        s.optimizer_state = r.get_array<float>("the optimizer state");
        break;
      case detail::tag::progress:
        s.step = r.get<std::uint64_t>("the step");
        s.epoch = r.get<std::uint64_t>("the epoch");
        s.batches = r.get<std::uint64_t>("the batches consumed");
        break;
      case detail::tag::schedule: {
        // A rate or factor that is negative or not finite has no meaning: refuse it where it lies.
        auto rate = [&r](const char* what) {
          const std::size_t at = r.offset();
          const float v = r.get<float>(what);
          if (!(v >= 0.0f) || !std::isfinite(v))
            r.fail_at(at, std::string(what) + " is " + std::to_string(v) + ", not a finite value >= 0");
          return v;
        };
        s.base_lr = rate("the base learning rate");
        s.lr_factor = rate("the learning-rate factor");
        s.lr = rate("the learning rate");
        break;
      }
      case detail::tag::rng:
        s.seed = r.get<std::uint64_t>("the seed");
        s.data_seed = r.get<std::uint64_t>("the data seed");
        s.replicas = r.get<std::uint32_t>("the replica count");
        break;
      case detail::tag::callbacks: {
        const std::size_t stop_at = r.offset();
        const auto stop = r.get<std::uint8_t>("the stop flag");
        if (stop > 1) r.fail_at(stop_at, "stop flag " + std::to_string(stop) + " is neither 0 nor 1");
        s.stop_requested = stop == 1;
        const std::size_t sum_at = r.offset();
        s.epoch_loss_sum = r.get<double>("the epoch's loss sum");
        if (!std::isfinite(s.epoch_loss_sum))
          r.fail_at(sum_at, "the epoch's loss sum is " + std::to_string(s.epoch_loss_sum) + ", not a finite number");
        s.epoch_samples = r.get<std::uint64_t>("the epoch's sample count");
        s.epoch_steps = r.get<std::uint64_t>("the epoch's step count");
        s.epoch_labelled = r.get<std::uint64_t>("the epoch's labelled count");
        const std::size_t correct_at = r.offset();
        s.epoch_correct = r.get<std::uint64_t>("the epoch's top-1 hits");
        if (s.epoch_correct > s.epoch_labelled)
          r.fail_at(correct_at, "the epoch's top-1 hits (" + std::to_string(s.epoch_correct) +
                                    ") exceed its labelled rows (" + std::to_string(s.epoch_labelled) + ")");
        const std::size_t count_at = r.offset();
        const auto n_cb = r.get<std::uint64_t>("the callback count");
        if (n_cb > (payload.size() - 49) / 8)
          r.fail_at(count_at, "declares " + std::to_string(n_cb) + " callback states, more than the section holds");
        s.callback_states.reserve(static_cast<std::size_t>(n_cb));
        for (std::uint64_t i = 0; i < n_cb; ++i) s.callback_states.push_back(r.get_array<double>("a callback state"));
        break;
      }
    }
    r.expect_end();
    pos = payload_at + n + 4;
  }
  if (pos != bytes.size())
    reader(bytes, source, "end", pos).fail(std::to_string(bytes.size() - pos) + " trailing bytes after the last section");
  return s;
}

/// Throws checkpoint_error unless `s` was written by a model with signature `expected`.
inline void check_signature(const checkpoint_state& s, std::uint64_t expected, const std::string& source,
                            const std::string& expected_name = {}) {
  if (s.signature != expected)
    throw checkpoint_error("lockstep::checkpoint: " + source + ": section 'model' at offset " +
                           std::to_string(detail::header_size + 12) + ": model signature " + detail::hex64(s.signature) +
                           " (" + s.model_name + ", " + std::to_string(s.parameters.size()) +
                           " parameters) does not match this model's " + detail::hex64(expected) +
                           (expected_name.empty() ? std::string() : " (" + expected_name + ")"));
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory is written and
/// fsync'ed, renamed over `path`, and the directory is fsync'ed. A crash at any moment leaves
/// either the old file or the new one, never a torn one (a stray temporary may remain).
inline void write_file_atomically(const std::filesystem::path& path, std::span<const std::uint8_t> bytes) {
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::string tmpl = dir.string();  // built by appending: GCC 12 warns falsely on "." + string
  tmpl.append("/.").append(path.filename().string()).append(".tmp.XXXXXX");
  const int fd = ::mkstemp(tmpl.data());
  if (fd < 0) detail::sys_fail("cannot create a temporary file in " + dir.string(), path.string());
  try {
    detail::write_all(fd, bytes.data(), bytes.size(), tmpl);
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
  ::close(dfd);
  if (rc != 0) detail::sys_fail("fsync of the directory failed", dir.string());
}

/// Writes checkpoint `s` to `path` atomically (see write_file_atomically).
inline void save_checkpoint(const std::filesystem::path& path, const checkpoint_state& s) {
  write_file_atomically(path, encode_checkpoint(s));
}

/// Reads and verifies the checkpoint at `path`.
/// @throws checkpoint_error when the file cannot be read or is corrupt, truncated or of another version.
[[nodiscard]] inline checkpoint_state load_checkpoint(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw checkpoint_error("lockstep::checkpoint: " + path.string() + ": cannot open file");
  std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw checkpoint_error("lockstep::checkpoint: " + path.string() + ": read error");
  return decode_checkpoint(bytes, path.string());
}

/// Reads and verifies the checkpoint at `path` and checks that it belongs to a model with
/// signature `signature`. @throws checkpoint_error as load_checkpoint, or on a model mismatch.
[[nodiscard]] inline checkpoint_state load_checkpoint(const std::filesystem::path& path, std::uint64_t signature) {
  checkpoint_state s = load_checkpoint(path);
  check_signature(s, signature, path.string());
  return s;
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

  /// Writes `s` atomically as path_for(s.step), then deletes all but the newest `keep`
  /// checkpoints and any temporaries left by an interrupted save. Returns the path written.
  std::filesystem::path save(const checkpoint_state& s) {
    const auto path = path_for(s.step);
    save_checkpoint(path, s);
    auto all = list();
    std::error_code ec;
    for (std::size_t i = 0; i + keep_ < all.size(); ++i) std::filesystem::remove(all[i], ec);
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(".ckpt-", 0) == 0 && name.find(".tmp.") != std::string::npos) std::filesystem::remove(e.path(), ec);
    }
    return path;
  }

  /// The checkpoints in the directory, oldest (smallest step) first.
  [[nodiscard]] std::vector<std::filesystem::path> list() const {
    std::vector<std::filesystem::path> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() == 22 && name.rfind("ckpt-", 0) == 0 && name.ends_with(".lsck")) out.push_back(e.path());
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
  /// @throws checkpoint_error when it is corrupt or belongs to another model.
  [[nodiscard]] std::optional<checkpoint_state> load_latest(std::uint64_t signature) const {
    const auto p = latest();
    if (!p) return std::nullopt;
    return load_checkpoint(*p, signature);
  }

  /// The managed directory.
  [[nodiscard]] const std::filesystem::path& directory() const noexcept { return dir_; }

private:
  std::filesystem::path dir_;
  std::size_t keep_;
};

}  // namespace lockstep::io

namespace lockstep {
using io::checkpoint_manager;
using io::checkpoint_state;
using io::load_checkpoint;
using io::model_signature;
using io::save_checkpoint;
}  // namespace lockstep

namespace lockstep::io {

/// The network type of a replicated model (what strategy.replicate<Net>() returned).
template <class Replicated>
using network_of = typename std::remove_cvref_t<decltype(std::declval<Replicated&>().replica(0))>::model_type::network;

/// Fills a checkpoint with the parameters, optimiser state and step of a replicated model `m`
/// (replica 0's copy: all replicas are identical) and its model fields; the caller sets the
/// pipeline position, schedule and seeds.
template <class Replicated>
[[nodiscard]] checkpoint_state capture(Replicated& m) {
  using net = network_of<Replicated>;
  checkpoint_state s;
  s.signature = model_signature<net>();
  s.model_name = model_name<net>();
  s.parameters.resize(model<net>::stored_count);
  m.parameters_to_host(std::span<float>(s.parameters.data(), s.parameters.size()));
  s.optimizer_state = m.optimizer_state_to_host();
  s.step = m.step();
  return s;
}

/// A readable name for optimiser `o`: its type name, with its momentum when it has a nonzero one.
template <class Optimizer>
[[nodiscard]] std::string optimizer_name(const Optimizer& o) {
  std::string name = model_name<Optimizer>();
  if constexpr (requires { o.momentum; })
    if (o.momentum != 0) {
      char m[32];
      std::snprintf(m, sizeof m, "%g", static_cast<double>(o.momentum));
      name += std::string(" with momentum ") + m;
    }
  return name;
}

namespace detail {
// What kind of optimiser keeps `values` state values for `params` parameters.
inline std::string optimizer_kind(std::size_t values, std::size_t params) {
  if (values == 0) return "an optimiser that keeps no state (lockstep::sgd without momentum)";
  if (params == 0 || values % params != 0)
    return "an optimiser with " + std::to_string(values) + " state values, not a whole number per parameter";
  const std::size_t k = values / params;
  const std::string per = std::to_string(k) + " state value" + (k == 1 ? "" : "s") + " per parameter";
  if (k == 1) return "an optimiser with " + per + " (lockstep::sgd with momentum)";
  if (k == 2) return "an optimiser with " + per + " (lockstep::adam or lockstep::adamw)";
  return "an optimiser with " + per;
}
}  // namespace detail

/// Throws checkpoint_error, naming both optimisers, unless the optimiser state of `s` fits
/// `optimizer` for a model of `param_count` parameters: exactly optimizer.state_size(param_count)
/// values, or none when no update has been applied yet (step 0). Resuming with another kind of
/// optimiser would silently start its state from zero, so the resume would not be exact.
template <class Optimizer>
void check_optimizer_state(const checkpoint_state& s, const Optimizer& optimizer, std::size_t param_count,
                           const std::string& source = "checkpoint") {
  const std::size_t want = optimizer.state_size(param_count);
  const std::size_t have = s.optimizer_state.size();
  if (have == want || (have == 0 && s.step == 0)) return;
  throw checkpoint_error("lockstep::checkpoint: " + source + ": section 'optimizer': the checkpoint holds " +
                         std::to_string(have) + " optimizer state values after " + std::to_string(s.step) +
                         " updates, written by " + detail::optimizer_kind(have, param_count) +
                         "; this run's optimizer " + optimizer_name(optimizer) + " keeps " + std::to_string(want) +
                         ", so resuming with it would not be exact");
}

/// Loads parameters, optimiser state and step of `s` into every replica of `m` (the optimiser
/// state is loaded as it is: prefer the overload that takes the optimiser and checks it).
/// @throws checkpoint_error when `s` belongs to another model.
template <class Replicated>
void restore(Replicated& m, const checkpoint_state& s, const std::string& source = "checkpoint") {
  using net = network_of<Replicated>;
  check_signature(s, model_signature<net>(), source, model_name<net>());
  if (s.parameters.size() != model<net>::stored_count)
    throw checkpoint_error("lockstep::checkpoint: " + source + ": section 'parameters': holds " +
                           std::to_string(s.parameters.size()) + " values, the model has " +
                           std::to_string(model<net>::stored_count) + " (parameters and non-trainable state)");
  m.load_parameters(std::span<const float>(s.parameters.data(), s.parameters.size()));
  if (!s.optimizer_state.empty())
    m.load_optimizer_state(std::span<const float>(s.optimizer_state.data(), s.optimizer_state.size()));
  m.set_step(s.step);
}

/// Loads parameters, optimiser state and step of `s` into every replica of `m`, after checking
/// that the state fits `optimizer` (check_optimizer_state).
/// @throws checkpoint_error when `s` belongs to another model or another kind of optimiser.
template <class Replicated, class Optimizer>
  requires requires(const Optimizer& o) { o.state_size(std::size_t{1}); }
void restore(Replicated& m, const checkpoint_state& s, const Optimizer& optimizer, const std::string& source = "checkpoint") {
  check_optimizer_state(s, optimizer, model<network_of<Replicated>>::param_count, source);
  restore(m, s, source);
}

}  // namespace lockstep::io
