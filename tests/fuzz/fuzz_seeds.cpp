// Writes the seed corpora of the fuzz harnesses: fuzz_seeds <dir> creates <dir>/idx, <dir>/csv,
// <dir>/checkpoint (also the seeds of fuzz_checkpoint_crc), <dir>/safetensors, <dir>/tar, <dir>/npy
// and, with the image libraries, <dir>/png and <dir>/jpeg. Every seed is built here, from the
// formats' own definitions and encoders, so the repository holds no binary blobs.
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <lockstep/io/checkpoint.hpp>
#ifndef LOCKSTEP_FUZZ_NO_IMAGES
#include <png.h>

#include <csetjmp>

#include <lockstep/data/jpeg.hpp>
#include <lockstep/data/png.hpp>
#endif

#include "../data/tar_writer.hpp"
#include "../support/legacy_checkpoint.hpp"
#include "checkpoint_body.hpp"
#include "common.hpp"
#include "safetensors_body.hpp"

namespace lf = lockstep::fuzz;
namespace fs = std::filesystem;

namespace {

void put_be32(lf::bytes& out, std::uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(v >> s));
}

lf::bytes idx_file(std::uint32_t magic, const std::vector<std::uint32_t>& dims, std::size_t data) {
  lf::bytes out;
  put_be32(out, magic);
  for (auto d : dims) put_be32(out, d);
  for (std::size_t i = 0; i < data; ++i) out.push_back(static_cast<std::uint8_t>((i * 37 + 11) % 256));
  return out;
}

void write(const fs::path& dir, const std::string& name, const lf::bytes& b) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  if (!out) {
    std::fprintf(stderr, "fuzz_seeds: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

lf::bytes text(const char* s) { return lf::bytes(s, s + std::strlen(s)); }

void idx_seeds(const fs::path& dir) {
  const lf::bytes images = idx_file(0x803, {3, 4, 5}, 60);
  lf::bytes labels = idx_file(0x801, {3}, 0);
  for (std::uint8_t l : {1, 0, 7}) labels.push_back(l);
  int n = 0;
  auto add = [&](std::uint8_t flags, const lf::bytes& im, const lf::bytes& lb) {
    write(dir, "seed-" + std::to_string(n++), lf::idx_input{flags, im, lb}.encode());
  };
  for (std::uint8_t flags = 0; flags < 8; ++flags) add(flags, images, labels);
  add(0, lf::gzip(images), lf::gzip(labels));            // gzip bytes as they are: mutations hit the deflate stream
  lf::bytes two = lf::gzip(lf::bytes(images.begin(), images.begin() + 30));
  const lf::bytes rest = lf::gzip(lf::bytes(images.begin() + 30, images.end()));
  two.insert(two.end(), rest.begin(), rest.end());
  add(0, two, labels);                                   // two gzip members
  add(0, idx_file(0x803, {1, 28, 28}, 784), idx_file(0x801, {1}, 1));
  add(3, idx_file(0x803, {2, 1, 1}, 2), idx_file(0x801, {2}, 2));
  add(0, idx_file(0x803, {0, 1, 1}, 0), idx_file(0x801, {0}, 0));
}

void csv_seeds(const fs::path& dir) {
  int n = 0;
  auto add = [&](std::uint8_t flags, std::uint8_t label, std::uint8_t delim, const char* s) {
    write(dir, "seed-" + std::to_string(n++), lf::csv_input{flags, label, delim, text(s)}.encode());
  };
  add(0, 0, 0, "1,2,3\n4,5,6\n");
  add(1, 0, 0, "a,b,c\n1.5,-2e3,+0.25\n\n7,8,9\r\n");
  add(3, 2, 0, "x,y,label\n0.1,0.2,3\n0.3,0.4,0\n");
  add(2, 0, 1, "2;1e-50;3.4e38\n0;-0;1E+5\n");
  add(0, 0, 2, "1\t2\n3\t4");
  add(2, 1, 3, "9|1|8\n7|2|6\n");
  add(0, 0, 0, "nan,inf\n1e999,-1e-999\n0x10,1..2\n");
}

lockstep::checkpoint_state state(std::size_t opt_per_param, std::size_t callbacks) {
  using net = lf::checkpoint_net;
  lockstep::checkpoint_state s;
  s.signature = lockstep::model_signature<net>();
  s.model_name = lockstep::io::model_name<net>();
  const std::size_t p = lockstep::model<net>::param_count;
  for (std::size_t i = 0; i < p; ++i) s.parameters.push_back(0.5f * static_cast<float>(i) - 2.0f);
  for (std::size_t i = 0; i < opt_per_param * p; ++i) s.optimizer_state.push_back(0.01f * static_cast<float>(i));
  s.step = 12;
  s.epoch = 2;
  s.batches = 3;
  s.base_lr = 0.1f;
  s.lr_factor = 0.5f;
  s.lr = 0.05f;
  s.seed = 7;
  s.data_seed = 9;
  s.replicas = 2;
  for (std::size_t c = 0; c < callbacks; ++c) s.callback_states.push_back({1.0 + double(c), 2.5, -3.0});
  s.epoch_loss_sum = 4.25;
  s.epoch_samples = 96;
  s.epoch_steps = 3;
  s.epoch_labelled = 96;
  s.epoch_correct = 40;
  return s;
}

void checkpoint_seeds(const fs::path& dir) {
  write(dir, "seed-adam", lockstep::encode_checkpoint(state(2, 2)));
  write(dir, "seed-momentum", lockstep::encode_checkpoint(state(1, 1)));
  auto fresh = state(0, 0);
  fresh.step = 0;
  write(dir, "seed-fresh", lockstep::encode_checkpoint(fresh));
  // formats 2 and 1, as the library wrote them before format 3
  write(dir, "seed-format2", lockstep::testing_support::legacy_checkpoint_bytes(state(2, 2), 2));
  auto v1 = lockstep::testing_support::legacy_checkpoint_bytes(state(1, 0), 1);
  lf::fix_checkpoint_crcs(v1);
  write(dir, "seed-v1", v1);
}

void safetensors_seeds(const fs::path& dir) {
  using net = lf::safetensors_net;
  std::vector<float> p(lockstep::model<net>::stored_count);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = 0.125f * static_cast<float>(i % 37) - 2.0f;
  namespace io = lockstep::io;
  write(dir, "seed-f32", io::encode_safetensors<net>(p, 3));
  write(dir, "seed-bf16", io::encode_safetensors<net>(p, 0, {.dtype = io::safetensors_dtype::bf16}));
  write(dir, "seed-f16", io::encode_safetensors<net>(p, 9, {.dtype = io::safetensors_dtype::f16}));
  // as another writer lays it out: no metadata, tensors in reverse order in the header and the data
  const auto tensors = io::safetensors_tensors<net>();
  const auto ref = io::encode_safetensors<net>(p, 0);
  std::uint64_t n = 0;
  std::memcpy(&n, ref.data(), 8);
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    const std::uint64_t bytes = t.elements() * (t.from == io::safetensors_entry::source::counter ? 8 : 4);
    ranges.emplace_back(at, at + bytes);
    at += bytes;
  }
  std::string json = "{";
  lf::bytes data;
  std::uint64_t pos = 0;
  for (std::size_t k = tensors.size(); k-- > 0;) {
    const auto& t = tensors[k];
    const auto [b, e] = ranges[k];
    std::string shape = "[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
      if (i) shape += ", ";
      shape += std::to_string(t.shape[i]);
    }
    json += (k + 1 == tensors.size() ? "" : ", ") + std::string("\"") + t.name + "\": {\"dtype\": \"" +
            (t.from == io::safetensors_entry::source::counter ? "I64" : "F32") + "\", \"shape\": " + shape +
            "], \"data_offsets\": [" + std::to_string(pos) + ", " + std::to_string(pos + (e - b)) + "]}";
    data.insert(data.end(), ref.begin() + static_cast<std::ptrdiff_t>(8 + n + b),
                ref.begin() + static_cast<std::ptrdiff_t>(8 + n + e));
    pos += e - b;
  }
  json += "}";
  while (json.size() % 8) json += ' ';
  lf::bytes file(8);
  const std::uint64_t len = json.size();
  std::memcpy(file.data(), &len, 8);
  file.insert(file.end(), json.begin(), json.end());
  file.insert(file.end(), data.begin(), data.end());
  write(dir, "seed-reordered", file);
}

// Pixels of a small test image.
std::vector<std::uint8_t> pattern(std::uint32_t w, std::uint32_t h, std::uint32_t c) {
  std::vector<std::uint8_t> p(std::size_t{w} * h * c);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::uint8_t>(i * 37 + (i / c) * 11);
  return p;
}

#ifndef LOCKSTEP_FUZZ_NO_IMAGES
// A PNG of any colour type and bit depth (libpng's write API), rows filled with a pattern.
lf::bytes variant_png(std::uint32_t w, std::uint32_t h, int color, int depth, bool interlace) {
  lf::bytes out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) std::abort();
  png_set_write_fn(
      png, &out, [](png_structp p, png_bytep d, std::size_t n) {
        auto* o = static_cast<lf::bytes*>(png_get_io_ptr(p));
        o->insert(o->end(), d, d + n);
      },
      [](png_structp) {});
  png_set_IHDR(png, info, w, h, depth, color, interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> palette;
  if (color == PNG_COLOR_TYPE_PALETTE) {
    for (int k = 0; k < (1 << depth); ++k)
      palette.push_back({static_cast<png_byte>(k * 13), static_cast<png_byte>(255 - k), static_cast<png_byte>(k * 7)});
    png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  }
  png_set_gAMA(png, info, 0.45455);
  png_text text{};
  text.compression = PNG_TEXT_COMPRESSION_zTXt;
  text.key = const_cast<char*>("Comment");
  text.text = const_cast<char*>("a compressed text chunk");
  png_set_text(png, info, &text, 1);
  const int comps = color == PNG_COLOR_TYPE_RGB ? 3 : color == PNG_COLOR_TYPE_RGB_ALPHA ? 4 : color == PNG_COLOR_TYPE_GRAY_ALPHA ? 2 : 1;
  const std::size_t rowbytes = (std::size_t{w} * comps * depth + 7) / 8;
  std::vector<std::vector<png_byte>> rows(h, std::vector<png_byte>(rowbytes));
  std::vector<png_bytep> ptrs;
  for (std::uint32_t y = 0; y < h; ++y) {
    for (std::size_t i = 0; i < rowbytes; ++i) rows[y][i] = static_cast<png_byte>(y * 31 + i * 17);
    ptrs.push_back(rows[y].data());
  }
  png_set_rows(png, info, ptrs.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

void png_seeds(const fs::path& dir) {
  int n = 0;
  auto add = [&](std::uint8_t flags, const lf::bytes& png) {
    lf::bytes in{flags};
    in.insert(in.end(), png.begin(), png.end());
    write(dir, "seed-" + std::to_string(n++), in);
  };
  const auto grey = pattern(9, 7, 1), rgb = pattern(6, 5, 3);
  add(0, lockstep::data::encode_png(grey.data(), 9, 7, 1));
  add(1, lockstep::data::encode_png(rgb.data(), 6, 5, 3));
  add(1, lockstep::data::encode_png(rgb.data(), 6, 5, 3, 0));
  for (int depth : {1, 2, 4, 8, 16}) add(static_cast<std::uint8_t>(depth & 1), variant_png(11, 5, PNG_COLOR_TYPE_GRAY, depth, depth == 2));
  for (int depth : {1, 4, 8}) add(1, variant_png(7, 6, PNG_COLOR_TYPE_PALETTE, depth, depth == 4));
  add(1, variant_png(5, 4, PNG_COLOR_TYPE_RGB, 16, true));
  add(0, variant_png(5, 4, PNG_COLOR_TYPE_RGB_ALPHA, 8, false));
  add(1, variant_png(5, 4, PNG_COLOR_TYPE_GRAY_ALPHA, 16, false));
}

void jpeg_seeds(const fs::path& dir) {
  int n = 0;
  auto add = [&](std::uint8_t flags, std::array<std::uint8_t, 4> region, const lf::bytes& jpg) {
    lf::bytes in{flags, region[0], region[1], region[2], region[3]};
    in.insert(in.end(), jpg.begin(), jpg.end());
    write(dir, "seed-" + std::to_string(n++), in);
  };
  const auto rgb = pattern(40, 24, 3), grey = pattern(17, 33, 1);
  namespace ld = lockstep::data;
  add(1, {0, 0, 255, 255}, ld::encode_jpeg(rgb.data(), 40, 24, 3));
  add(1, {60, 90, 100, 80}, ld::encode_jpeg(rgb.data(), 40, 24, 3, {.quality = 60}));
  add(0, {0, 0, 255, 255}, ld::encode_jpeg(rgb.data(), 40, 24, 3, {.quality = 90, .progressive = true}));
  add(3, {128, 40, 60, 200}, ld::encode_jpeg(rgb.data(), 40, 24, 3, {.quality = 95, .progressive = true, .subsample = false}));
  add(0, {0, 0, 255, 255}, ld::encode_jpeg(grey.data(), 17, 33, 1));
  add(1, {200, 10, 20, 255}, ld::encode_jpeg(grey.data(), 17, 33, 1, {.quality = 40, .progressive = true}));
}
#endif

void tar_seeds(const fs::path& dir) {
  int n = 0;
  auto add = [&](const tar_test::writer& w) { write(dir, "seed-" + std::to_string(n++), w.finish()); };
  tar_test::writer a;
  a.add("shard/0001.png", std::string(700, 'x'));
  a.add("shard/0001.cls", "3\n");
  a.add("shard/0002.jpg", "jpeg bytes");
  a.add("shard/0002.cls", "4");
  add(a);
  tar_test::writer b;
  b.add("dir/", std::vector<std::uint8_t>{}, '5');
  b.add("dir/" + std::string(150, 'n') + ".seg.png", "long");
  b.pax({{"path", "pax/k.cls"}, {"size", "1"}});
  b.add("ignored", "7");
  add(b);
  tar_test::writer c;
  c.add("a.txt", "");
  c.add("link.png", std::vector<std::uint8_t>{}, '2');
  add(c);
}

// A .npy file: a version-1 header with the dict, padded, then the data.
lf::bytes npy_file(const std::string& dict, const lf::bytes& data) {
  lf::bytes out{0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  std::string h = dict;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  out.push_back(static_cast<std::uint8_t>(h.size()));
  out.push_back(static_cast<std::uint8_t>(h.size() >> 8));
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

void npy_seeds(const fs::path& dir) {
  int n = 0;
  auto add = [&](std::uint8_t flags, const lf::bytes& x, const lf::bytes& y) {
    write(dir, "seed-" + std::to_string(n++), lf::npy_input{flags, x, y}.encode());
  };
  const auto px = pattern(12, 4, 1);
  lf::bytes labels64;
  for (int i = 0; i < 4; ++i) labels64.insert(labels64.end(), {static_cast<std::uint8_t>(i), 0, 0, 0, 0, 0, 0, 0});
  const lf::bytes labels8{1, 0, 2, 5};
  add(1, npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (4, 12), }", px),
      npy_file("{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", labels64));
  add(3, npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (4, 2, 2, 3), }", px),
      npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (4,), }", labels8));
  add(12, npy_file("{'descr': '|u1', 'fortran_order': False, 'shape': (4, 3, 2, 2), }", px), {});
  lf::bytes floats(4 * 3 * 4);
  for (std::size_t i = 0; i < floats.size(); ++i) floats[i] = static_cast<std::uint8_t>(i % 4 == 3 ? 0x3f : i);
  add(0, npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3), }", floats), {});
  add(1, npy_file("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (4, 3)}", floats),
      npy_file("{'descr': '<u2', 'fortran_order': False, 'shape': (4,), }", {1, 0, 2, 0, 3, 0, 4, 0}));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds <dir>\n");
    return 2;
  }
  const fs::path root = argv[1];
  idx_seeds(root / "idx");
  csv_seeds(root / "csv");
  checkpoint_seeds(root / "checkpoint");
  safetensors_seeds(root / "safetensors");
  tar_seeds(root / "tar");
  npy_seeds(root / "npy");
#ifndef LOCKSTEP_FUZZ_NO_IMAGES
  png_seeds(root / "png");
  jpeg_seeds(root / "jpeg");
#endif
  return 0;
}
