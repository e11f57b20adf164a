#pragma once
/// @file safetensors.hpp
/// Weights as safetensors files with the names and layouts of PyTorch's `nn.Sequential`, so that
/// `model.load_state_dict(safetensors.torch.load_file(path), strict=True)` takes lockstep's trained
/// weights, and lockstep takes weights PyTorch wrote.
///
/// Names are dotted positions: layer i of a sequential is `i`, a layer inside a nested sequential or
/// a residual block (a PyTorch `nn.Sequential` subclass adding its input) is `i.j`, and
/// parameter-free layers (activations, dropout, pooling, reshape, flatten) take a position as
/// PyTorch's `nn.ReLU`, `nn.Dropout` and `nn.Flatten` do. Layouts: dense `weight [out, in]`,
/// `bias [out]`; conv2d `weight [out, in, kh, kw]`, `bias [out]`; batch norm `weight`, `bias`,
/// `running_mean`, `running_var` (unbiased, as PyTorch keeps it) `[C]` and `num_batches_tracked`
/// (I64 scalar). `__metadata__` holds "lockstep.signature" (io::model_signature, as 0x and 16 hex
/// digits) and "lockstep.version".
///
/// Files are untrusted input: the header's size is capped and checked against the file before it
/// is read, the header is parsed by a strict reader of the format's structure, every tensor is
/// checked against the model (name, dtype, shape, byte count), the byte ranges must cover the data
/// exactly without gap or overlap, and nothing is loaded before all of it passed; every failure is
/// a checkpoint_error naming the file, the tensor and the byte offset.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/io/checkpoint.hpp>
#include <lockstep/io/detail/safetensors_format.hpp>
#include <lockstep/layers/batch_norm.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/layers/dense.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/layers/model.hpp>
#include <lockstep/layers/residual.hpp>
#include <lockstep/layers/sequential.hpp>
#include <lockstep/version.hpp>

namespace lockstep::io {

/// Options of save_safetensors and load_safetensors.
struct safetensors_options {
  /// Export: the element type of the floating-point tensors (f32, bf16 or f16; bf16 and f16 are
  /// rounded to nearest even). Import reads F32, BF16 and F16 whatever this says.
  safetensors_dtype dtype = safetensors_dtype::f32;
  /// Import: refuse a file whose "lockstep.signature" differs from the model's (a file without
  /// one, such as PyTorch writes, is checked by names and shapes alone).
  bool check_signature = true;
  /// Import: the largest header accepted, in bytes (the format allows 100 MB; the header of a
  /// model with thousands of tensors takes a few hundred KB).
  std::size_t max_header_bytes = std::size_t{16} << 20;
  /// Export: write the model's exponential moving average of the weights instead of its trained
  /// weights. The model must keep one (a replicated model with `ema_parameters_to_host`);
  /// otherwise save_safetensors throws config_error.
  bool ema = false;
};

/// How the parameters of a layer type L appear in a PyTorch state_dict. Specialise it for a layer
/// of your own that has parameters: `static constexpr bool known = true;` and
/// `template <class S> static void describe(safetensors_layout_builder& b)` (S: the layer's
/// input row shape), calling b.param / b.param_transposed / b.state / b.counter for each tensor
/// with offsets counted from the layer's own parameters (or state).
template <class L>
struct safetensors_layout {
  static constexpr bool known = false;  ///< no layout: a layer with parameters is refused at compile time
};

/// Collects the tensors of one layer for safetensors_layout<L>::describe.
class safetensors_layout_builder {
public:
  /// A builder appending to `out`.
  explicit safetensors_layout_builder(std::vector<safetensors_entry>& out) : out_(out) {}

  /// `count = product(shape)` trainable parameters from `offset` in the layer's parameters, in
  /// the file's order.
  void param(const char* name, std::vector<std::uint64_t> shape, std::size_t offset) {
    add(name, std::move(shape), safetensors_entry::source::copy, params_ + offset, 0, 0);
  }
  /// A rows x cols row-major matrix from `offset` in the layer's parameters, stored transposed
  /// (shape [cols, rows]), as a dense layer's In x Out weights become PyTorch's [out, in].
  void param_transposed(const char* name, std::size_t rows, std::size_t cols, std::size_t offset) {
    add(name, {cols, rows}, safetensors_entry::source::transpose, params_ + offset, rows, cols);
  }
  /// Non-trainable state from `offset` in the layer's state.
  void state(const char* name, std::vector<std::uint64_t> shape, std::size_t offset) {
    add(name, std::move(shape), safetensors_entry::source::copy, state_ + offset, 0, 0);
  }
  /// A scalar int64 counter that lockstep does not keep (written as the model's step, ignored on import).
  void counter(const char* name) { add(name, {}, safetensors_entry::source::counter, 0, 0, 0); }

  /// Starts a layer named `prefix` whose parameters start at `params` and state at `state` of the flat buffer.
  void begin(std::string prefix, std::size_t params, std::size_t state) {
    prefix_ = std::move(prefix);
    params_ = params;
    state_ = state;
  }

private:
  void add(const char* name, std::vector<std::uint64_t> shape, safetensors_entry::source from, std::size_t offset,
           std::size_t rows, std::size_t cols) {
    safetensors_entry e;
    e.name = prefix_.empty() ? std::string(name) : prefix_ + "." + name;
    e.shape = std::move(shape);
    e.from = from;
    e.offset = offset;
    e.rows = rows;
    e.cols = cols;
    out_.push_back(std::move(e));
  }

  std::vector<safetensors_entry>& out_;
  std::string prefix_;
  std::size_t params_ = 0, state_ = 0;
};

/// dense<In, Out>: weight [Out, In] (lockstep keeps In x Out), bias [Out] (nn.Linear).
template <std::size_t In, std::size_t Out, class Init>
struct safetensors_layout<dense<In, Out, Init>> {
  static constexpr bool known = true;  ///< has a layout
  /// The tensors of the layer bound to input rows S.
  template <class S>
  static void describe(safetensors_layout_builder& b) {
    b.param_transposed("weight", In, Out, 0);
    b.param("bias", {Out}, In * Out);
  }
};

/// conv2d<F, K, ...> on C channels: weight [F, C, K, K], bias [F] (nn.Conv2d).
template <std::size_t Filters, std::size_t Kernel, std::size_t Stride, std::size_t Padding, class Init>
struct safetensors_layout<conv2d<Filters, Kernel, Stride, Padding, Init>> {
  static constexpr bool known = true;  ///< has a layout
  /// The tensors of the layer bound to input images S = shape<C, H, W>.
  template <class S>
  static void describe(safetensors_layout_builder& b) {
    constexpr std::size_t c = S::dims[0];
    b.param("weight", {Filters, c, Kernel, Kernel}, 0);
    b.param("bias", {Filters}, Filters * c * Kernel * Kernel);
  }
};

/// batch_norm over C channels: weight, bias, running_mean, running_var [C], num_batches_tracked
/// (nn.BatchNorm1d / nn.BatchNorm2d).
template <std::intmax_t Num, std::intmax_t Den>
struct safetensors_layout<batch_norm<Num, Den>> {
  static constexpr bool known = true;  ///< has a layout
  /// The tensors of the layer bound to input rows S.
  template <class S>
  static void describe(safetensors_layout_builder& b) {
    constexpr std::size_t c = S::dims[0];
    b.param("weight", {c}, 0);
    b.param("bias", {c}, c);
    b.state("running_mean", {c}, 0);
    b.state("running_var", {c}, c);
    b.counter("num_batches_tracked");
  }
};

namespace detail::safetensors {

template <class L>
struct children_of {
  static constexpr bool container = false;
};
template <class... Ls>
struct children_of<sequential<Ls...>> {
  static constexpr bool container = true;
  template <class F>
  static void each(F&& f) {
    f.template operator()<Ls...>();
  }
};
template <class... Ls>
struct children_of<residual<Ls...>> : children_of<sequential<Ls...>> {};

inline std::string join(const std::string& prefix, std::size_t i) {
  return prefix.empty() ? std::to_string(i) : prefix + "." + std::to_string(i);
}

struct walker {
  safetensors_layout_builder& b;
  std::size_t params = 0;  // next parameter offset
  std::size_t state = 0;   // next state offset (absolute: the state follows every parameter)

  template <class L, class S>
  void layer(const std::string& name) {
    if constexpr (children_of<L>::container) {
      children_of<L>::each([&]<class... Ls>() { list<0, S, Ls...>(name); });
    } else {
      using bound = bind_shape_t<L, S>;
      if constexpr (safetensors_layout<L>::known) {
        b.begin(name, params, state);
        safetensors_layout<L>::template describe<S>(b);
      } else {
        static_assert(bound::param_count == 0 && state_count_v<bound> == 0,
                      "lockstep::io::safetensors: this layer has parameters but no PyTorch layout; specialise "
                      "lockstep::io::safetensors_layout<Layer> (see io/safetensors.hpp)");
      }
      params += bound::param_count;
      state += state_count_v<bound>;
    }
  }
  template <std::size_t I, class S, class L, class... Rest>
  void list(const std::string& prefix) {
    layer<L, S>(join(prefix, I));
    if constexpr (sizeof...(Rest) > 0) list<I + 1, output_shape_t<L, S>, Rest...>(prefix);
  }
};

}  // namespace detail::safetensors

/// The tensors of network Net as a PyTorch state_dict names them, in the network's order, each
/// with its shape and its place in the model's flat parameter buffer.
template <class Net>
[[nodiscard]] std::vector<safetensors_entry> safetensors_tensors() {
  std::vector<safetensors_entry> out;
  safetensors_layout_builder b(out);
  detail::safetensors::walker w{b, 0, model<Net>::param_count};
  w.template layer<Net, shape<Net::expected_input>>(std::string());
  if (w.params != model<Net>::param_count || w.state != model<Net>::stored_count)
    throw config_error("lockstep::io::safetensors: the layouts of the layers do not add up to the model's parameters");
  for (const auto& t : out)  // the format's names are JSON strings: its readers (this one too) refuse others
    if (!detail::valid_utf8(t.name))
      throw config_error("lockstep::io::safetensors: the tensor name " + detail::quoted_for_message(t.name) +
                         " (a layer's safetensors layout) is not valid UTF-8");
  return out;
}

/// The file content of network Net's flat buffer `stored` (parameters then state, as
/// replicated::parameters_to_host gives it) as a safetensors file: the header with the tensors in
/// the network's order and the metadata, padded with spaces to a multiple of 8 bytes, then the data.
/// `batches_tracked` is written as every batch norm's num_batches_tracked.
/// @throws shape_error when `stored` does not hold model<Net>::stored_count values.
template <class Net>
[[nodiscard]] std::vector<std::uint8_t> encode_safetensors(std::span<const float> stored, std::uint64_t batches_tracked,
                                                           const safetensors_options& o = {}) {
  namespace st = detail::safetensors;
  if (stored.size() != model<Net>::stored_count)
    throw shape_error("lockstep::io::encode_safetensors: " + std::to_string(stored.size()) +
                      " values given, the model stores " + std::to_string(model<Net>::stored_count));
  if (o.dtype == safetensors_dtype::i64)
    throw config_error("lockstep::io::safetensors_options::dtype: export as f32, bf16 or f16, not i64");
  const std::vector<safetensors_entry> tensors = safetensors_tensors<Net>();
  std::string h = "{\"__metadata__\":{\"format\":\"pt\",\"lockstep.signature\":\"" + st::hex_text(model_signature<Net>()) +
                  "\",\"lockstep.version\":\"" + std::to_string(version_major) + "." + std::to_string(version_minor) +
                  "." + std::to_string(version_patch) + "\"}";
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    const auto d = t.from == safetensors_entry::source::counter ? safetensors_dtype::i64 : o.dtype;
    const std::uint64_t bytes = t.elements() * st::dtype_size(d);
    h += ',';
    detail::append_json_string(h, t.name);
    h += ":{\"dtype\":\"" + std::string(st::dtype_name(d)) + "\",\"shape\":" + st::shape_json(t.shape) +
         ",\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + bytes) + "]}";
    at += bytes;
  }
  h += '}';
  while (h.size() % 8 != 0) h += ' ';
  std::vector<std::uint8_t> out(8 + h.size() + at);
  const std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, h.data(), h.size());
  std::uint8_t* p = out.data() + 8 + h.size();
  const auto put = [&](float v) {
    switch (o.dtype) {
      case safetensors_dtype::bf16: {
        const std::uint16_t b = st::float_to_bf16(v);
        std::memcpy(p, &b, 2);
        p += 2;
        break;
      }
      case safetensors_dtype::f16: {
        const std::uint16_t b = st::float_to_f16(v);
        std::memcpy(p, &b, 2);
        p += 2;
        break;
      }
      default:
        std::memcpy(p, &v, 4);
        p += 4;
    }
  };
  for (const auto& t : tensors) {
    switch (t.from) {
      case safetensors_entry::source::copy:
        for (std::size_t i = 0; i < t.elements(); ++i) put(stored[t.offset + i]);
        break;
      case safetensors_entry::source::transpose:
        for (std::size_t c = 0; c < t.cols; ++c)
          for (std::size_t r = 0; r < t.rows; ++r) put(stored[t.offset + r * t.cols + c]);
        break;
      case safetensors_entry::source::counter: {
        const auto v = static_cast<std::int64_t>(batches_tracked);
        std::memcpy(p, &v, 8);
        p += 8;
        break;
      }
    }
  }
  return out;
}

/// Reads safetensors file content `file` (named `source` in messages) into network Net's flat
/// buffer `stored` (model<Net>::stored_count values): every tensor of the model must be there once,
/// with its shape, as F32, BF16 or F16 (I64 for num_batches_tracked, whose value is not used), and
/// nothing else. `stored` is written only after the whole file passed every check.
/// @throws checkpoint_error naming the file, the tensor and the byte offset of the first fault;
///         shape_error when `stored` has the wrong length.
template <class Net>
void decode_safetensors(std::span<const std::uint8_t> file, std::span<float> stored, const safetensors_options& o = {},
                        const std::string& source = "safetensors") {
  namespace st = detail::safetensors;
  if (stored.size() != model<Net>::stored_count)
    throw shape_error("lockstep::io::decode_safetensors: the span holds " + std::to_string(stored.size()) +
                      " values, the model stores " + std::to_string(model<Net>::stored_count));
  const std::string prefix = "lockstep::safetensors: " + source + ": ";
  if (file.size() < 8)
    throw checkpoint_error(prefix + "offset 0: " + std::to_string(file.size()) +
                           " bytes: too short for the 8-byte header length");
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[static_cast<std::size_t>(i)];
  if (n > o.max_header_bytes)
    throw checkpoint_error(prefix + "offset 0: the header declares " + std::to_string(n) + " bytes, more than the " +
                           std::to_string(o.max_header_bytes) + " accepted (safetensors_options::max_header_bytes)");
  if (n > file.size() - 8)
    throw checkpoint_error(prefix + "offset 0: the header declares " + std::to_string(n) + " bytes, but only " +
                           std::to_string(file.size() - 8) + " follow");
  const std::vector<safetensors_entry> want = safetensors_tensors<Net>();
  st::header_reader r(std::string_view(reinterpret_cast<const char*>(file.data()) + 8, static_cast<std::size_t>(n)), 8,
                      source, want);
  r.read();
  if (o.check_signature && r.signature() && *r.signature() != model_signature<Net>())
    throw checkpoint_error(prefix + "header at offset " + std::to_string(r.signature_offset()) +
                           ": the file's lockstep.signature " + st::hex_text(*r.signature()) + " differs from this model's " +
                           st::hex_text(model_signature<Net>()) + " (" + model_name<Net>() +
                           "); set safetensors_options::check_signature = false to load it by names and shapes");
  const std::size_t base = 8 + static_cast<std::size_t>(n);
  const std::vector<st::found_tensor>& found = r.found();
  st::check_coverage(found, want, file.size() - base, base, prefix);
  const std::uint8_t* data = file.data() + base;
  for (std::size_t k = 0; k < want.size(); ++k) {
    const safetensors_entry& t = want[k];
    const st::found_tensor& f = found[k];
    if (t.from == safetensors_entry::source::counter) continue;
    const std::uint8_t* src = data + f.begin;
    const auto get = [&](std::size_t i) -> float {
      switch (f.dtype) {
        case safetensors_dtype::bf16: {
          std::uint16_t b;
          std::memcpy(&b, src + 2 * i, 2);
          return st::bf16_to_float(b);
        }
        case safetensors_dtype::f16: {
          std::uint16_t b;
          std::memcpy(&b, src + 2 * i, 2);
          return st::f16_to_float(b);
        }
        default: {
          float v;
          std::memcpy(&v, src + 4 * i, 4);
          return v;
        }
      }
    };
    if (t.from == safetensors_entry::source::copy) {
      for (std::size_t i = 0; i < t.elements(); ++i) stored[t.offset + i] = get(i);
    } else {
      std::size_t i = 0;
      for (std::size_t c = 0; c < t.cols; ++c)
        for (std::size_t row = 0; row < t.rows; ++row) stored[t.offset + row * t.cols + c] = get(i++);
    }
  }
}

namespace detail::safetensors {

/// The largest file network Net's tensors can make under options `o` (every float as F32, the
/// counters as I64, the largest header accepted).
template <class Net>
std::uint64_t largest_file(const safetensors_options& o) {
  constexpr std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t bytes = 8;
  const auto add = [&](std::uint64_t n) { bytes = n > most - bytes ? most : bytes + n; };  // saturates
  add(o.max_header_bytes);
  for (const auto& t : safetensors_tensors<Net>()) add(t.elements() * (t.from == safetensors_entry::source::counter ? 8 : 4));
  return bytes;
}

/// The bytes of file `path`, refused before reading when it is larger than `limit`.
inline std::vector<std::uint8_t> read_bounded(const std::filesystem::path& path, std::uint64_t limit) {
  const std::string prefix = "lockstep::safetensors: " + path.string() + ": ";
  // O_NONBLOCK: open(2) of a named pipe with no writer would block forever (cleared below)
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw checkpoint_error(prefix + "cannot open file: " + std::strerror(errno));
  struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } guard{fd};
  struct ::stat sb {};
  if (::fstat(fd, &sb) != 0) throw checkpoint_error(prefix + "cannot stat file: " + std::strerror(errno));
  if (!S_ISREG(sb.st_mode)) throw checkpoint_error(prefix + "not a regular file");
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
    throw checkpoint_error(prefix + "cannot open file: " + std::strerror(errno));
  const auto size = static_cast<std::uint64_t>(sb.st_size);
  if (size > limit)
    throw checkpoint_error(prefix + "offset 0: the file holds " + std::to_string(size) +
                           " bytes, more than any safetensors file of this model can (" + std::to_string(limit) + ")");
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(size));
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ::ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw checkpoint_error(prefix + "read error at offset " + std::to_string(done) + ": " + std::strerror(errno));
    if (got == 0) throw checkpoint_error(prefix + "the file shrank while being read, at offset " + std::to_string(done));
    done += static_cast<std::size_t>(got);
  }
  return bytes;
}

}  // namespace detail::safetensors

/// Writes the weights of replicated model `m` (replica 0's: all are identical) to `path` as a
/// safetensors file with PyTorch's names and layouts (see the file comment), atomically
/// (write_file_atomically), readable as a file created under the process's umask. Batch norm's
/// num_batches_tracked is written as the model's step.
/// @throws config_error when options.ema is set and the model keeps no moving average; whatever
///         writing the file throws.
template <class Replicated>
void save_safetensors(const Replicated& m, const std::filesystem::path& path, const safetensors_options& o = {}) {
  using net = typename Replicated::model_type::network;
  std::vector<float> stored(model<net>::stored_count);
  if (o.ema) {
    if constexpr (requires { m.ema_parameters_to_host(std::span<float>(stored)); })
      m.ema_parameters_to_host(std::span<float>(stored));
    else
      throw config_error("lockstep::io::save_safetensors: safetensors_options::ema is set, but this model keeps no "
                         "moving average of its weights");
  } else {
    m.parameters_to_host(std::span<float>(stored));
  }
  write_file_atomically(path, encode_safetensors<net>(stored, m.step(), o));  // mode 0666 less the umask
}

/// Loads the safetensors file `path` into every replica of `m` (see decode_safetensors for what
/// is checked). The step and the optimiser state are left as they are. Nothing is loaded unless
/// the whole file passed; a file larger than any file of this model could be is refused before it
/// is read.
/// @throws checkpoint_error naming the file, the tensor and the offset of the first fault.
template <class Replicated>
void load_safetensors(Replicated& m, const std::filesystem::path& path, const safetensors_options& o = {}) {
  using net = typename Replicated::model_type::network;
  const std::vector<std::uint8_t> bytes =
      detail::safetensors::read_bounded(path, detail::safetensors::largest_file<net>(o));
  std::vector<float> stored(model<net>::stored_count);
  decode_safetensors<net>(bytes, std::span<float>(stored), o, path.string());
  m.load_parameters(std::span<const float>(stored));
}

}  // namespace lockstep::io

namespace lockstep {
using io::load_safetensors;
using io::save_safetensors;
}  // namespace lockstep
