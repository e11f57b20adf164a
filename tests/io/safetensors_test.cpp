#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <lockstep/distribute.hpp>
#include <lockstep/io/safetensors.hpp>
#include <lockstep/layers.hpp>
#include <lockstep/losses.hpp>
#include <lockstep/optimizers.hpp>

namespace ls = lockstep;
namespace st = lockstep::io::detail::safetensors;
namespace fs = std::filesystem;

namespace {

// Every layer kind with a PyTorch layout, a residual block, a nested sequential and
// parameter-free layers that still take a position.
using image_net =
    ls::sequential<ls::reshape<2, 6, 6>, ls::conv2d<3, 3, 1, 1>, ls::batch_norm<>, ls::relu,
                   ls::residual<ls::conv2d<3, 3, 1, 1>, ls::batch_norm<>, ls::relu>, ls::max_pool2d<2>, ls::flatten,
                   ls::dense<27, 5>, ls::dropout<1, 5>, ls::sequential<ls::relu, ls::dense<5, 4>>, ls::batch_norm<>>;
using flat_net = ls::sequential<ls::dense<6, 5>, ls::relu, ls::dense<5, 3>>;
using other_net = ls::sequential<ls::dense<6, 4>, ls::relu, ls::dense<4, 3>>;

constexpr std::size_t image_stored = ls::model<image_net>::stored_count;

std::vector<float> sample_params(std::size_t n, std::uint64_t seed) {
  const ls::counter_rng rng(seed, 5);
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = (static_cast<float>(rng.u32(i) % 20001) - 10000.0f) / 3001.0f;
  return v;
}

// The image net's flat buffer with positive running variances.
std::vector<float> image_params(std::uint64_t seed = 1) {
  auto v = sample_params(image_stored, seed);
  for (const auto& t : ls::io::safetensors_tensors<image_net>())
    if (t.name.ends_with("running_var"))
      for (std::size_t i = 0; i < t.elements(); ++i) v[t.offset + i] = std::abs(v[t.offset + i]) + 0.5f;
  return v;
}

std::string error_of(std::span<const std::uint8_t> file, ls::io::safetensors_options o = {}) {
  std::vector<float> out(image_stored);
  try {
    ls::io::decode_safetensors<image_net>(file, out, o, "mem.safetensors");
  } catch (const ls::checkpoint_error& e) {
    return e.what();
  }
  return {};
}

// A file made of header text `json` and `data` bytes.
std::vector<std::uint8_t> file_of(const std::string& json, const std::vector<std::uint8_t>& data) {
  std::vector<std::uint8_t> f(8 + json.size() + data.size());
  const std::uint64_t n = json.size();
  for (std::size_t i = 0; i < 8; ++i) f[i] = static_cast<std::uint8_t>(n >> (8 * i));
  std::copy(json.begin(), json.end(), f.begin() + 8);
  std::copy(data.begin(), data.end(), f.begin() + 8 + static_cast<std::ptrdiff_t>(json.size()));
  return f;
}

std::string header_of(const std::vector<std::uint8_t>& f) {
  std::uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  return std::string(reinterpret_cast<const char*>(f.data()) + 8, static_cast<std::size_t>(n));
}
std::vector<std::uint8_t> data_of(const std::vector<std::uint8_t>& f) {
  std::uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  return {f.begin() + 8 + static_cast<std::ptrdiff_t>(n), f.end()};
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto p = s.find(from);
  REQUIRE(p != std::string::npos);
  return s.replace(p, from.size(), to);
}

fs::path st_temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("lockstep_st_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

double value_of_half(std::uint16_t h) { return static_cast<double>(st::f16_to_float(h)); }

}  // namespace

TEST_CASE("safetensors: every half converts to float and back unchanged") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float f = st::f16_to_float(b);
    CAPTURE(h);
    if (std::isnan(f)) {
      CHECK((st::float_to_f16(f) & 0x7c00u) == 0x7c00u);
      CHECK((st::float_to_f16(f) & 0x3ffu) != 0);
      continue;
    }
    CHECK(st::float_to_f16(f) == b);
    CHECK(st::float_to_bf16(st::bf16_to_float(b)) == b);  // every bf16 bit pattern too (NaNs stay NaN)
  }
  // known values
  CHECK(st::f16_to_float(0x3c00) == 1.0f);
  CHECK(st::f16_to_float(0x7bff) == 65504.0f);
  CHECK(st::f16_to_float(0x0001) == std::ldexp(1.0f, -24));
  CHECK(st::f16_to_float(0xfc00) == -std::numeric_limits<float>::infinity());
}

TEST_CASE("safetensors: float to f16 and bf16 rounds to the nearest, ties to even") {
  const ls::counter_rng rng(11, 3);
  std::vector<float> xs = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e9f, -1e9f, std::ldexp(1.0f, -25),
                           std::ldexp(1.5f, -25), std::ldexp(1.0f, -24), std::ldexp(3.0f, -26), 1.0f + std::ldexp(1.0f, -11),
                           1.0f + std::ldexp(3.0f, -11), std::ldexp(1.0f, -14), std::ldexp(1023.5f, -24),
                           std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min()};
  for (std::uint64_t i = 0; i < 200000; ++i) {
    const std::uint32_t bits = rng.u32(i);
    const float f = std::bit_cast<float>(bits);
    if (!std::isnan(f)) xs.push_back(f);
    // values near the f16 range, where rounding matters most
    xs.push_back(std::ldexp(static_cast<float>(rng.u32(i + (1ull << 40)) % 4096) / 2048.0f, static_cast<int>(i % 50) - 30));
  }
  for (const float x : xs) {
    CAPTURE(x);
    // f16: no other half is nearer, and a tie goes to the even one
    const std::uint16_t h = st::float_to_f16(x);
    const double got = value_of_half(h), xd = static_cast<double>(x);
    if (std::abs(xd) >= 65520.0) {
      CHECK(std::isinf(got));
      CHECK(std::signbit(got) == std::signbit(xd));
    } else {
      for (const int step : {-1, 1}) {
        const auto n = static_cast<std::uint16_t>(h + step);
        if ((n & 0x7fffu) > 0x7bffu || ((h & 0x7fffu) == 0 && step < 0)) continue;  // past the finite range / sign flip
        const double other = value_of_half(n);
        const double de = std::abs(got - xd), dn = std::abs(other - xd);
        CHECK(de <= dn);
        if (de == dn) CHECK((h & 1u) == 0);
      }
    }
    // bf16: the same with the neighbours of the result
    const std::uint16_t b = st::float_to_bf16(x);
    const double bg = static_cast<double>(st::bf16_to_float(b));
    if (std::isinf(x)) {
      CHECK(bg == xd);
      continue;
    }
    if (std::isinf(bg)) {  // only past the halfway point between the largest bf16 and 2^128
      CHECK(std::abs(xd) >= std::ldexp(1.0, 128) - std::ldexp(1.0, 119));
      continue;
    }
    for (const int step : {-1, 1}) {
      const auto n = static_cast<std::uint16_t>(b + step);
      if ((n & 0x7fffu) >= 0x7f80u || ((b & 0x7fffu) == 0 && step < 0)) continue;
      const double other = static_cast<double>(st::bf16_to_float(n));
      const double de = std::abs(bg - xd), dn = std::abs(other - xd);
      CHECK(de <= dn);
      if (de == dn) CHECK((b & 1u) == 0);
    }
  }
  CHECK(std::isnan(st::f16_to_float(st::float_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isnan(st::bf16_to_float(st::float_to_bf16(-std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("safetensors: PyTorch names, shapes and layouts of nn.Sequential") {
  const auto t = ls::io::safetensors_tensors<image_net>();
  std::vector<std::string> names;
  for (const auto& e : t) names.push_back(e.name);
  const std::vector<std::string> want = {
      "1.weight",        "1.bias",           "2.weight",     "2.bias",          "2.running_mean",
      "2.running_var",   "2.num_batches_tracked", "4.0.weight", "4.0.bias",   "4.1.weight",
      "4.1.bias",        "4.1.running_mean", "4.1.running_var", "4.1.num_batches_tracked", "7.weight",
      "7.bias",          "9.1.weight",       "9.1.bias",     "10.weight",       "10.bias",
      "10.running_mean", "10.running_var",   "10.num_batches_tracked"};
  CHECK(names == want);
  using shape = std::vector<std::uint64_t>;
  CHECK(t[0].shape == shape{3, 2, 3, 3});  // conv: [out, in, kh, kw]
  CHECK(t[1].shape == shape{3});
  CHECK(t[4].shape == shape{3});
  CHECK(t[6].shape == shape{});            // num_batches_tracked: a scalar
  CHECK(t[14].shape == shape{5, 27});      // dense: [out, in]
  CHECK(t[14].from == ls::io::safetensors_entry::source::transpose);
  CHECK(t[16].shape == shape{4, 5});
  CHECK(t[19].shape == shape{4});
  // parameters in order from 0, then the state from param_count, covering every stored value once
  std::vector<int> covered(image_stored, 0);
  for (const auto& e : t)
    if (e.from != ls::io::safetensors_entry::source::counter)
      for (std::size_t i = 0; i < e.elements(); ++i) ++covered.at(e.offset + i);
  for (std::size_t i = 0; i < image_stored; ++i) CHECK(covered[i] == 1);
  // a bare layer has plain names
  const auto bare = ls::io::safetensors_tensors<ls::dense<4, 2>>();
  REQUIRE(bare.size() == 2);
  CHECK(bare[0].name == "weight");
  CHECK(bare[1].name == "bias");
}

TEST_CASE("safetensors: F32 files round-trip bitwise, and dense weights are stored [out, in]") {
  const auto p = image_params(3);
  const auto file = ls::io::encode_safetensors<image_net>(p, 17);
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  CHECK(n % 8 == 0);  // padded with spaces, as PyTorch's writer does
  std::vector<float> back(image_stored, -1.0f);
  ls::io::decode_safetensors<image_net>(file, back);
  CHECK(std::memcmp(back.data(), p.data(), p.size() * sizeof(float)) == 0);
  // find "7.weight" and check its first row is the first output's column of W (In x Out)
  const std::string h = header_of(file);
  CHECK(h.find("\"lockstep.signature\":\"" + st::hex_text(ls::model_signature<image_net>()) + "\"") != std::string::npos);
  CHECK(h.find("\"7.weight\":{\"dtype\":\"F32\",\"shape\":[5,27]") != std::string::npos);
  CHECK(h.find("\"2.num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[]") != std::string::npos);
  const auto t = ls::io::safetensors_tensors<image_net>();
  std::uint64_t at = 0;
  for (const auto& e : t) {
    if (e.name == "7.weight") break;
    at += e.elements() * (e.from == ls::io::safetensors_entry::source::counter ? 8 : 4);
  }
  const std::uint8_t* w = file.data() + 8 + n + at;
  const std::size_t off = t[14].offset;
  for (std::size_t o = 0; o < 5; ++o)
    for (std::size_t i = 0; i < 27; ++i) {
      float v;
      std::memcpy(&v, w + 4 * (o * 27 + i), 4);
      CHECK(v == p[off + i * 5 + o]);
    }
  // the counter holds the given value
  at = 0;
  for (const auto& e : t) {
    if (e.name == "2.num_batches_tracked") break;
    at += e.elements() * (e.from == ls::io::safetensors_entry::source::counter ? 8 : 4);
  }
  std::int64_t c = 0;
  std::memcpy(&c, file.data() + 8 + n + at, 8);
  CHECK(c == 17);
}

namespace {
/// y = x * a per feature: a user layer whose safetensors layout names its tensor with a byte that
/// is not UTF-8 (`odd_names`), or in UTF-8 (`good_names`).
template <bool Odd>
struct named_scale {
  using layer_concept = ls::layer_tag;
  static constexpr std::size_t expected_input = 0;
  template <std::size_t In>
  struct bind {
    static constexpr std::size_t input_size = In, output_size = In, param_count = In, workspace_per_sample = 0;
    template <class T>
    static void init(T* p, const ls::counter_rng&) {
      for (std::size_t j = 0; j < In; ++j) p[j] = T(1);
    }
    template <class T, class Ctx>
    static void forward(Ctx&, const ls::forward_args<T, Ctx, ls::shape<In>, ls::shape<In>>& a) {
      for (std::size_t i = 0; i < a.x.size(); ++i) a.y.data()[i] = a.x.data()[i] * a.params[i % In];
    }
    template <class T, class Ctx>
    static void backward(Ctx&, const ls::backward_args<T, Ctx, ls::shape<In>, ls::shape<In>>& a) {
      for (std::size_t j = 0; j < In; ++j) a.dparams[j] = T(0);
      for (std::size_t i = 0; i < a.dy.size(); ++i) {
        a.dparams[i % In] += a.dy.data()[i] * a.x.data()[i];
        if (a.dx) a.dx.data()[i] = a.dy.data()[i] * a.params[i % In];
      }
    }
  };
};
}  // namespace

template <bool Odd>
struct lockstep::io::safetensors_layout<named_scale<Odd>> {
  static constexpr bool known = true;
  template <class S>
  static void describe(safetensors_layout_builder& b) {
    b.param(Odd ? "scale\xff" : "scale\xc3\xa9", {S::dims[0]}, 0);
  }
};

TEST_CASE("safetensors: a tensor name that is not valid UTF-8 is refused when written, naming the byte") {
  using odd_net = ls::sequential<ls::dense<3, 4>, named_scale<true>>;
  using good_net = ls::sequential<ls::dense<3, 4>, named_scale<false>>;
  const std::vector<float> p(ls::model<odd_net>::stored_count, 0.5f);
  CHECK_THROWS_WITH_AS((void)ls::io::encode_safetensors<odd_net>(p, 0),
                       doctest::Contains("the tensor name \"1.scale\\xff\" (a layer's safetensors layout) is not valid UTF-8"),
                       ls::config_error);
  const auto file = ls::io::encode_safetensors<good_net>(p, 0);  // the same in UTF-8 ("scalé") is written
  const std::string text(file.begin(), file.end());
  CHECK(text.find("\"1.scale\xc3\xa9\"") != std::string::npos);
}

TEST_CASE("safetensors: BF16 and F16 exports read back as the rounded values") {
  const auto p = image_params(4);
  for (const auto d : {ls::io::safetensors_dtype::bf16, ls::io::safetensors_dtype::f16}) {
    CAPTURE(static_cast<int>(d));
    const auto file = ls::io::encode_safetensors<image_net>(p, 0, {.dtype = d});
    CHECK(header_of(file).find(d == ls::io::safetensors_dtype::bf16 ? "\"BF16\"" : "\"F16\"") != std::string::npos);
    std::vector<float> back(image_stored);
    ls::io::decode_safetensors<image_net>(file, back);
    for (std::size_t i = 0; i < p.size(); ++i) {
      const float want = d == ls::io::safetensors_dtype::bf16 ? st::bf16_to_float(st::float_to_bf16(p[i]))
                                                              : st::f16_to_float(st::float_to_f16(p[i]));
      CHECK(back[i] == want);
    }
  }
  CHECK_THROWS_AS((void)ls::io::encode_safetensors<image_net>(p, 0, {.dtype = ls::io::safetensors_dtype::i64}),
                  ls::config_error);
  std::vector<float> wrong(3);
  CHECK_THROWS_AS((void)ls::io::encode_safetensors<image_net>(wrong, 0), ls::shape_error);
  CHECK_THROWS_AS(ls::io::decode_safetensors<image_net>(ls::io::encode_safetensors<image_net>(p, 0), wrong),
                  ls::shape_error);
}

TEST_CASE("safetensors: a file laid out another way (key order, data order, no metadata, padding) loads") {
  // Written by hand as another writer would: tensors in reverse data order, keys reordered,
  // whitespace and escapes in the JSON, no __metadata__.
  const auto p = sample_params(ls::model<flat_net>::stored_count, 9);
  const auto ref = ls::io::encode_safetensors<flat_net>(p, 0);
  const auto data = data_of(ref);
  // reference layout: 0.weight (120 B), 0.bias (20), 2.weight (60), 2.bias (12) = 212 bytes
  std::vector<std::uint8_t> rev;
  const std::size_t cuts[] = {0, 120, 140, 200, 212};
  for (int k = 3; k >= 0; --k) rev.insert(rev.end(), data.begin() + cuts[k], data.begin() + cuts[k + 1]);
  const std::string json =
      "{ \"2.bias\" : {\"shape\":[3], \"data_offsets\":[0,12], \"dtype\":\"F32\"},\n"
      "  \"2.w\\u0065ight\": {\"dtype\":\"F32\",\"data_offsets\":[12,72],\"shape\":[3,5]},"
      "\"0.bias\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[72,92]},"
      "\"__metadata__\":{\"format\":\"pt\", \"note\":\"\\\"x\\\" \\ud83d\\ude00\"},"
      "\"0.weight\":{\"dtype\":\"F32\",\"shape\":[5,6],\"data_offsets\":[92,212]}}      \t\n";
  std::vector<float> back(p.size());
  ls::io::decode_safetensors<flat_net>(file_of(json, rev), back);
  CHECK(back == p);
}

TEST_CASE("safetensors: every truncation and every flipped header byte ends in checkpoint_error or loads the same") {
  const auto params = sample_params(ls::model<flat_net>::stored_count, 2);
  const auto file = ls::io::encode_safetensors<flat_net>(params, 0);
  std::vector<float> out(ls::model<flat_net>::stored_count);
  for (std::size_t len = 0; len < file.size(); ++len) {
    CAPTURE(len);
    CHECK_THROWS_AS(ls::io::decode_safetensors<flat_net>(std::span(file.data(), len), out), ls::checkpoint_error);
  }
  // A flip that loads can only be in what does not choose the values: a metadata key or value
  // (format, version, the signature's key, a hex letter's case). One in a tensor's name, dtype or
  // shape no longer matches the model, one in a data offset changes that tensor's byte count, one
  // in the length field leaves the data not covered exactly: the data is read as it was written.
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  std::size_t loaded = 0;
  for (std::size_t i = 0; i < 8 + n; ++i)
    for (const std::uint8_t x : {0x01, 0x20, 0x80, 0xff}) {
      auto bad = file;
      bad[i] ^= x;
      CAPTURE(i);
      CAPTURE(int(x));
      std::fill(out.begin(), out.end(), std::numeric_limits<float>::quiet_NaN());
      try {
        ls::io::decode_safetensors<flat_net>(bad, out);
      } catch (const ls::checkpoint_error&) {
        continue;
      }
      ++loaded;
      CHECK(out == params);
    }
  CHECK(loaded > 0);  // a flip in the metadata ("pt" to "qt") loads
}

TEST_CASE("safetensors: hostile or wrong headers are refused naming the tensor and the offset") {
  const auto p = image_params(5);
  const auto good = ls::io::encode_safetensors<image_net>(p, 0);
  const std::string h = header_of(good);
  const auto d = data_of(good);
  const auto refuse = [&](const std::string& json, const std::vector<std::uint8_t>& data, const std::string& part1,
                          const std::string& part2 = {}) {
    const std::string e = error_of(file_of(json, data));
    CAPTURE(json.substr(0, 200));
    CAPTURE(e);
    CHECK(e.find("mem.safetensors") != std::string::npos);
    CHECK(e.find(part1) != std::string::npos);
    if (!part2.empty()) CHECK(e.find(part2) != std::string::npos);
  };
  CHECK(error_of(good).empty());
  // names and shapes against the model
  refuse(replace(h, "\"1.bias\"", "\"1.bais\""), d, "tensor '1.bais' at offset", "no tensor of this name");
  refuse(replace(h, "\"7.weight\":{\"dtype\":\"F32\",\"shape\":[5,27]", "\"7.weight\":{\"dtype\":\"F32\",\"shape\":[27,5]"), d,
         "tensor '7.weight' at offset", "shape [27, 5], but the model's is [5, 27]");
  refuse(replace(h, "\"2.weight\":{\"dtype\":\"F32\"", "\"2.weight\":{\"dtype\":\"F64\""), d, "tensor '2.weight'",
         "dtype 'F64'");
  refuse(replace(h, "\"2.weight\":{\"dtype\":\"F32\"", "\"2.weight\":{\"dtype\":\"I64\""), d, "tensor '2.weight'",
         "dtype I64");
  refuse(replace(h, "\"2.num_batches_tracked\":{\"dtype\":\"I64\"", "\"2.num_batches_tracked\":{\"dtype\":\"F32\""), d,
         "tensor '2.num_batches_tracked'", "I64");
  refuse(replace(h, "\"shape\":[3,2,3,3]", "\"shape\":[3,2,3,3,1,1,1,1,1]"), d, "tensor '1.weight'", "more than 8 dimensions");
  // a duplicate, a missing tensor
  {
    const auto at = h.find("\"1.bias\"");
    const auto end = h.find('}', at);
    const std::string entry = h.substr(at, end + 1 - at);
    refuse(replace(h, "\"1.bias\"", entry.substr(0, entry.size()) + ",\"1.bias\""), d, "tensor '1.bias'", "appears twice");
    std::string without = h;
    without.erase(at, end + 2 - at);  // the entry and its comma
    refuse(without, d, "tensor '1.bias' of the model is missing");
  }
  // offsets: a gap, an overlap, bytes left over, too few bytes, past the end
  refuse(replace(h, "\"data_offsets\":[0,216]", "\"data_offsets\":[4,220]"), d, "tensor '1.weight'", "leave bytes [0, 4)");
  refuse(replace(h, "\"data_offsets\":[216,228]", "\"data_offsets\":[212,224]"), d, "tensor '1.bias'", "overlap");
  {
    auto more = d;
    more.push_back(0);
    refuse(h, more, "1 bytes after the last tensor belong to no tensor");
    auto fewer = d;
    fewer.pop_back();
    refuse(h, fewer, "pass the end of the data");
  }
  refuse(replace(h, "\"data_offsets\":[0,216]", "\"data_offsets\":[0,212]"), d, "tensor '1.weight'", "hold 212 bytes");
  refuse(replace(h, "\"data_offsets\":[0,216]", "\"data_offsets\":[216,0]"), d, "tensor '1.weight'", "end before they begin");
  refuse(replace(h, "\"data_offsets\":[0,216]", "\"data_offsets\":[0,18446744073709551616]"), d, "does not fit in 64 bits");
  refuse(replace(h, "\"data_offsets\":[0,216]", "\"data_offsets\":[0,216,4]"), d, "exactly two data offsets");
  refuse(replace(h, "\"data_offsets\":[0,216]", "\"data_offsets\":[0,0216]"), d, "leading zero");
  refuse(replace(h, "\"data_offsets\":[0,216]", "\"data_offsets\":[0,216.0]"), d, "must be an integer");
  refuse(replace(h, "\"data_offsets\":[0,216]", "\"data_offsets\":[-0,216]"), d, "non-negative integer");
  refuse(replace(h, "\"data_offsets\":[0,216]", "\"data_offsets\":[0,216],\"extra\":1"), d, "unknown field 'extra'");
  refuse(replace(h, "\"data_offsets\":[0,216]", "\"data_offsets\":[0,216],\"dtype\":\"F32\""), d, "'dtype' appears twice");
  // JSON: not an object, trailing garbage, trailing comma, bad strings, nesting the format has not
  refuse("[" + h.substr(1), d, "header at offset 8", "JSON object");
  refuse(h.substr(0, h.find_last_of('}') + 1) + "x", d, "trailing characters");
  refuse(replace(h, "}}", "},}"), d, "expected a tensor name");
  refuse(replace(h, "\"format\":\"pt\"", "\"format\":\"p\x01t\""), d, "control character");
  refuse(replace(h, "\"format\":\"pt\"", "\"format\":\"p\xc3t\""), d, "not valid UTF-8");
  refuse(replace(h, "\"format\":\"pt\"", "\"format\":\"\\ud800\""), d, "unpaired high surrogate");
  refuse(replace(h, "\"format\":\"pt\"", "\"format\":\"\\q\""), d, "bad escape");
  refuse(replace(h, "\"format\":\"pt\"", "\"format\":{\"a\":\"b\"}"), d, "metadata values are strings");
  refuse(replace(h, "\"format\":\"pt\"", "\"format\":[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]"), d,
         "metadata values are strings");
  refuse(replace(h, "\"1.weight\":{", "\"1.weight\":[{"), d, "a tensor to be an object");
  refuse(replace(h, "\"__metadata__\":{", "\"__metadata__\":{},\"__metadata__\":{"), d, "'__metadata__' appears twice");
  refuse(h.substr(0, h.size() / 2), {}, "header at offset");
  // the signature
  const std::string sig = st::hex_text(ls::model_signature<image_net>());
  const std::string other = st::hex_text(ls::model_signature<image_net>() ^ 1);
  refuse(replace(h, sig, other), d, "lockstep.signature " + other, "check_signature = false");
  CHECK(error_of(file_of(replace(h, sig, other), d), {.check_signature = false}).empty());
  refuse(replace(h, sig, "12"), d, "must be 0x followed by");
  // the header size field
  {
    auto f = good;
    const std::uint64_t big = 1ull << 40;
    std::memcpy(f.data(), &big, 8);
    CHECK(error_of(f).find("more than the 16777216 accepted") != std::string::npos);
    const std::uint64_t past = f.size();
    std::memcpy(f.data(), &past, 8);
    CHECK(error_of(f).find("but only") != std::string::npos);
    CHECK(error_of(std::span(good.data(), 5)).find("too short") != std::string::npos);
    CHECK(error_of(good, {.max_header_bytes = 64}).find("more than the 64 accepted") != std::string::npos);
  }
}

TEST_CASE("safetensors: save and load a replicated model, and the outputs are the same, and another model is refused") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto a = s.replicate<image_net>(ls::seed{21});
  auto p = image_params(6);
  a.load_parameters(p);
  a.set_step(33);
  const auto dir = st_temp_dir("save");
  for (const auto d : {ls::io::safetensors_dtype::f32, ls::io::safetensors_dtype::bf16}) {
    const fs::path f = dir / "w.safetensors";
    ls::save_safetensors(a, f, {.dtype = d});
    auto b = s.replicate<image_net>(ls::seed{22});
    ls::load_safetensors(b, f);
    const auto back = b.parameters_to_host();
    for (std::size_t i = 0; i < p.size(); ++i)
      CHECK(back[i] == (d == ls::io::safetensors_dtype::f32 ? p[i] : st::bf16_to_float(st::float_to_bf16(p[i]))));
    CHECK(b.replica(1).model().parameters().data()[7] == back[7]);  // every replica
    CHECK(b.step() == 0);                                             // the step is not the file's
    // no cap on the header: the file's size bound saturates instead of wrapping to a few bytes
    auto c = s.replicate<image_net>(ls::seed{24});
    ls::load_safetensors(c, f, {.max_header_bytes = std::numeric_limits<std::size_t>::max()});
    CHECK(c.parameters_to_host() == back);
  }
  // eval outputs of the reloaded F32 model equal the original's
  {
    ls::save_safetensors(a, dir / "f32.safetensors");
    auto b = s.replicate<image_net>(ls::seed{23});
    ls::load_safetensors(b, dir / "f32.safetensors");
    ls::model<image_net> ma(ls::seed{1}), mb(ls::seed{2});
    const auto pa = a.parameters_to_host(), pb = b.parameters_to_host();
    std::copy(pa.begin(), pa.end(), ma.parameters().data());
    std::copy(pb.begin(), pb.end(), mb.parameters().data());
    const auto x = sample_params(5 * 72, 8);
    ls::backend::host_context ctx;
    const float* ya = ma.forward(ctx, x.data(), 5, ls::pass_info{});
    std::vector<float> keep(ya, ya + 5 * 4);
    const float* yb = mb.forward(ctx, x.data(), 5, ls::pass_info{});
    for (std::size_t i = 0; i < keep.size(); ++i) CHECK(yb[i] == keep[i]);
  }
  // another network: refused by name or shape, nothing loaded
  {
    ls::mirrored<ls::cpu<0>> one;
    auto o = one.replicate<other_net>(ls::seed{1});
    auto f = one.replicate<flat_net>(ls::seed{1});
    ls::save_safetensors(f, dir / "flat.safetensors");
    const auto before = o.parameters_to_host();
    CHECK_THROWS_WITH_AS(ls::load_safetensors(o, dir / "flat.safetensors"),
                         doctest::Contains("tensor '0.weight' at offset"), ls::checkpoint_error);
    CHECK(o.parameters_to_host() == before);
    CHECK_THROWS_WITH_AS(ls::load_safetensors(o, dir / "missing.safetensors"), doctest::Contains("cannot open"),
                         ls::checkpoint_error);
    // a file far larger than any of this model is refused before it is read
    {
      std::ofstream big(dir / "big.safetensors", std::ios::binary);
      big.seekp((64 << 20) - 1);
      big.put(0);
    }
    CHECK_THROWS_WITH_AS(ls::load_safetensors(f, dir / "big.safetensors"),
                         doctest::Contains("more than any safetensors file of this model can"), ls::checkpoint_error);
    // readable by others as under the umask (the temporary file it was written as is 0600)
    const auto old_mask = ::umask(022);
    ls::save_safetensors(f, dir / "shared.safetensors");
    ::umask(old_mask);
    CHECK(fs::status(dir / "shared.safetensors").permissions() ==
          (fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read));
    // no EMA weights kept: refused
    CHECK_THROWS_AS(ls::save_safetensors(f, dir / "ema.safetensors", {.ema = true}), ls::config_error);
  }
  fs::remove_all(dir);
}

TEST_CASE("safetensors and checkpoints: a named pipe is refused, not waited on") {
  const auto dir = st_temp_dir("fifo");
  const fs::path fifo = dir / "pipe";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  ls::mirrored<ls::cpu<0>> one;
  auto m = one.replicate<flat_net>(ls::seed{1});
  CHECK_THROWS_WITH_AS(ls::load_safetensors(m, fifo), doctest::Contains("not a regular file"), ls::checkpoint_error);
  CHECK_THROWS_WITH_AS((void)ls::io::load_checkpoint_file(fifo), doctest::Contains("not a regular file"),
                       ls::checkpoint_error);
  fs::remove_all(dir);
}

TEST_CASE("safetensors: the EMA of the weights exports in place of the weights, sharded or not") {
  for (const bool sharded : {false, true}) {
    CAPTURE(sharded);
    ls::mirrored<ls::cpu<0>, ls::cpu<1>> s(ls::strategy_options{.shard_optimizer = sharded});
    auto m = s.replicate<flat_net>(ls::seed{5});
    const auto dir = st_temp_dir(sharded ? "ema_sharded" : "ema");
    CHECK_THROWS_WITH_AS(ls::save_safetensors(m, dir / "none.safetensors", {.ema = true}), doctest::Contains("no EMA"),
                         ls::config_error);
    ls::data::batch b;
    b.width = 6;
    for (std::size_t i = 0; i < 10 * 6; ++i) b.features.push_back(static_cast<float>((i * 37) % 11) / 11.0f - 0.5f);
    for (std::int32_t r = 0; r < 10; ++r) {
      b.labels.push_back(r % 3);
      b.indices.push_back(static_cast<std::uint64_t>(r));
    }
    const auto g = std::make_shared<const ls::data::batch>(b);
    const ls::data::distributed_batch d{g, ls::data::split(*g, 2)};
    for (int i = 0; i < 4; ++i)
      (void)s.train_step(m, ls::sgd{.lr = 0.3f}, ls::softmax_cross_entropy{}, d, ls::update_recipe{.ema = {.decay = 0.5}});
    const auto ema = m.ema_to_host();
    REQUIRE(ema.size() == m.parameters_to_host().size());
    CHECK(ema != m.parameters_to_host());  // the average lags the weights
    ls::save_safetensors(m, dir / "ema.safetensors", {.ema = true});
    auto back = s.replicate<flat_net>(ls::seed{6});
    ls::load_safetensors(back, dir / "ema.safetensors");
    CHECK(back.parameters_to_host() == ema);
    fs::remove_all(dir);
  }
}
