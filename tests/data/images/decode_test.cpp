// The image decoders: every PNG colour type and bit depth to 8-bit grey and RGB as documented,
// JPEG (baseline, progressive, grey) within JPEG's error and the cropped decode equal to the
// full one, and refusals (CMYK, truncated, oversized headers, other formats) naming the file.
#include <doctest/doctest.h>

#include <png.h>
#include <zlib.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <climits>
#include <fstream>
#include <new>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <lockstep/data.hpp>
#include <lockstep/data/images.hpp>

#include "support/sanitizers.hpp"

namespace ld = lockstep::data;

namespace {

// A PNG of any colour type, bit depth and interlacing, written with libpng's classic API. `rows`
// holds the samples as libpng expects them (packed for < 8 bits, big-endian for 16 bits).
std::vector<std::uint8_t> write_png(std::uint32_t w, std::uint32_t h, int color, int depth, bool interlace,
                                    const std::vector<std::vector<std::uint8_t>>& rows,
                                    const std::vector<png_color>& palette = {}, bool gamma = false) {
  std::vector<std::uint8_t> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return {};
  }
  png_set_write_fn(
      png, &out, [](png_structp p, png_bytep d, std::size_t n) {
        auto* o = static_cast<std::vector<std::uint8_t>*>(png_get_io_ptr(p));
        o->insert(o->end(), d, d + n);
      },
      [](png_structp) {});
  png_set_IHDR(png, info, w, h, depth, color, interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  if (gamma) png_set_gAMA(png, info, 1.0);  // a gamma that would change values if it were applied
  std::vector<png_bytep> ptrs;
  for (const auto& r : rows) ptrs.push_back(const_cast<png_bytep>(r.data()));
  png_set_rows(png, info, ptrs.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

// Decodes a whole image.
ld::decoded_sample decode(const std::vector<std::uint8_t>& bytes, std::uint32_t channels, ld::image_options o = {}) {
  o.channels = channels;
  struct all final : ld::region_planner {
    ld::pixel_rect plan(std::uint32_t h, std::uint32_t w) const override { return {0, 0, w, h}; }
  } everything;
  ld::load_scratch s;
  ld::pipeline_counters k;
  ld::decode_image(bytes.data(), bytes.size(), "test.img", o, everything, s.sample, s, k);
  return s.sample;
}

std::string error_of(const std::vector<std::uint8_t>& bytes, std::uint32_t channels = 3, ld::image_options o = {}) {
  try {
    (void)decode(bytes, channels, o);
  } catch (const lockstep::data_error& e) {
    return e.what();
  }
  return "(no data_error)";
}

std::uint8_t grey_of(std::uint8_t r, std::uint8_t g, std::uint8_t b) {  // libpng's default Rec. 709 weights
  return static_cast<std::uint8_t>((6968u * r + 23434u * g + 2366u * b + 16384u) >> 15);
}

}  // namespace

TEST_CASE("png: every colour type and bit depth becomes 8-bit grey or RGB as documented") {
  const std::uint32_t w = 13, h = 5;  // odd sizes exercise packing and interlace passes
  for (bool interlace : {false, true}) {
    CAPTURE(interlace);
    // Grey of 1, 2, 4, 8, 16 bits.
    for (int depth : {1, 2, 4, 8, 16}) {
      CAPTURE(depth);
      const unsigned maxv = (1u << depth) - 1;
      std::vector<std::vector<std::uint8_t>> rows(h);
      std::vector<unsigned> v(w * h);
      for (std::uint32_t y = 0; y < h; ++y) {
        rows[y].assign((w * depth + 7) / 8 + (depth == 16 ? w : 0), 0);
        for (std::uint32_t x = 0; x < w; ++x) {
          const unsigned s = (x * 7 + y * 3) % (maxv + 1);
          v[y * w + x] = s;
          if (depth == 16) {
            rows[y][2 * x] = static_cast<std::uint8_t>(s >> 8);
            rows[y][2 * x + 1] = static_cast<std::uint8_t>(s);
          } else {
            const unsigned bit = x * depth;
            rows[y][bit / 8] |= static_cast<std::uint8_t>(s << (8 - depth - bit % 8));
          }
        }
      }
      const auto png = write_png(w, h, PNG_COLOR_TYPE_GRAY, depth, interlace, rows);
      const auto g = decode(png, 1), rgb = decode(png, 3);
      REQUIRE(g.pixels.size() == w * h);
      REQUIRE(rgb.pixels.size() == 3 * w * h);
      for (std::uint32_t i = 0; i < w * h; ++i) {
        const unsigned want = depth == 16 ? (v[i] + 128) / 257 : v[i] * 255 / maxv;  // 16 bits: round(v / 257)
        CHECK(g.pixels[i] == want);
        CHECK(rgb.pixels[3 * i] == want);
        CHECK(rgb.pixels[3 * i + 2] == want);
      }
    }
    // RGB and RGBA of 8 and 16 bits, grey + alpha, palette: alpha dropped, grey from Rec. 709 weights.
    for (int color : {PNG_COLOR_TYPE_RGB, PNG_COLOR_TYPE_RGB_ALPHA, PNG_COLOR_TYPE_GRAY_ALPHA, PNG_COLOR_TYPE_PALETTE})
      for (int depth : {8, 16}) {
        if (color == PNG_COLOR_TYPE_PALETTE && depth == 16) continue;
        CAPTURE(color);
        CAPTURE(depth);
        const int comps = color == PNG_COLOR_TYPE_RGB ? 3 : color == PNG_COLOR_TYPE_RGB_ALPHA ? 4 : color == PNG_COLOR_TYPE_GRAY_ALPHA ? 2 : 1;
        std::vector<png_color> palette;
        for (int k = 0; k < 16; ++k)
          palette.push_back({static_cast<png_byte>(k * 16), static_cast<png_byte>(255 - k * 9), static_cast<png_byte>(k * 5)});
        std::vector<std::vector<std::uint8_t>> rows(h);
        std::vector<std::array<std::uint8_t, 3>> want(w * h);
        for (std::uint32_t y = 0; y < h; ++y)
          for (std::uint32_t x = 0; x < w; ++x) {
            std::uint8_t c[4];
            for (int k = 0; k < 4; ++k) c[k] = static_cast<std::uint8_t>((x * 37 + y * 11 + k * 71) % 256);
            if (color == PNG_COLOR_TYPE_PALETTE) {
              const int idx = static_cast<int>((x + y) % 16);
              rows[y].push_back(static_cast<std::uint8_t>(idx));
              want[y * w + x] = {palette[idx].red, palette[idx].green, palette[idx].blue};
              continue;
            }
            for (int k = 0; k < comps; ++k) {
              rows[y].push_back(c[k]);
              if (depth == 16) rows[y].push_back(static_cast<std::uint8_t>(c[k] ^ 0x5a));
            }
            const auto s8 = [&](int k) {
              const unsigned v16 = depth == 16 ? (unsigned{c[k]} << 8 | (c[k] ^ 0x5au)) : c[k];
              return static_cast<std::uint8_t>(depth == 16 ? (v16 + 128) / 257 : v16);
            };
            if (comps >= 3)
              want[y * w + x] = {s8(0), s8(1), s8(2)};
            else
              want[y * w + x] = {s8(0), s8(0), s8(0)};
          }
        const auto png = write_png(w, h, color, depth, interlace, rows, color == PNG_COLOR_TYPE_PALETTE ? palette : std::vector<png_color>{});
        const auto rgb = decode(png, 3), g = decode(png, 1);
        for (std::uint32_t i = 0; i < w * h; ++i) {
          CHECK(rgb.pixels[3 * i] == want[i][0]);
          CHECK(rgb.pixels[3 * i + 1] == want[i][1]);
          CHECK(rgb.pixels[3 * i + 2] == want[i][2]);
          if (comps >= 3 && depth == 8) {
            CHECK(std::abs(int(g.pixels[i]) - int(grey_of(want[i][0], want[i][1], want[i][2]))) <= 1);
          } else if (comps < 3 && color != PNG_COLOR_TYPE_PALETTE) {
            CHECK(g.pixels[i] == want[i][0]);
          }
        }
      }
  }
  // gAMA (and the other colour chunks) are ignored: the stored values come out.
  std::vector<std::vector<std::uint8_t>> rows(2, std::vector<std::uint8_t>{10, 128, 250});
  CHECK(decode(write_png(3, 2, PNG_COLOR_TYPE_GRAY, 8, false, rows, {}, true), 1).pixels ==
        std::vector<std::uint8_t>{10, 128, 250, 10, 128, 250});
  // The library's encoder round-trips exactly.
  std::vector<std::uint8_t> px(31 * 17 * 3);
  for (std::size_t i = 0; i < px.size(); ++i) px[i] = static_cast<std::uint8_t>(i * 13);
  CHECK(decode(ld::encode_png(px.data(), 31, 17, 3), 3).pixels == px);
}

TEST_CASE("png: malformed, truncated and oversized files are refused naming the file and offset") {
  std::vector<std::uint8_t> px(20 * 10, 7);
  const auto good = ld::encode_png(px.data(), 20, 10, 1);
  auto cut = good;
  cut.resize(good.size() - 20);
  const auto m1 = error_of(cut);
  CHECK(m1.find("test.img: PNG: byte offset") != std::string::npos);
  auto crc = good;
  crc[40] ^= 1;  // inside IDAT: a CRC or zlib error
  CHECK(error_of(crc).find("PNG") != std::string::npos);
  // A header declaring 60000 x 60000: refused before any pixel is allocated.
  auto huge = good;
  const std::uint32_t side = 60000;
  for (int k = 0; k < 2; ++k)
    for (int b = 0; b < 4; ++b) huge[16 + 4 * k + b] = static_cast<std::uint8_t>(side >> (24 - 8 * b));
  const std::uint32_t c = static_cast<std::uint32_t>(crc32(0, huge.data() + 12, 17));
  for (int b = 0; b < 4; ++b) huge[29 + b] = static_cast<std::uint8_t>(c >> (24 - 8 * b));
  const auto m2 = error_of(huge);
  CHECK(m2.find("PNG") != std::string::npos);
  CHECK(m2.find("60000") != std::string::npos);
  ld::image_options small;
  small.limits.max_pixels = 100;
  CHECK(error_of(good, 1, small).find("beyond the limits") != std::string::npos);
  CHECK(error_of({'G', 'I', 'F', '8', '9', 'a'}).find("neither a PNG nor a JPEG") != std::string::npos);
  CHECK(error_of({}).find("neither a PNG nor a JPEG") != std::string::npos);
}

TEST_CASE("png: an encoder out of memory gives a data_error, and no C++ exception crosses libpng") {
  // AddressSanitizer reserves more address space than the limit below leaves, and aborts on a
  // failed allocation instead of throwing.
  if (test_support::address_sanitizer) return;
  // 16 MiB of grey pixels, stored (level 0): the file would be as large, but a child process
  // leaves itself 4 MiB of address space, so the growing output runs out of memory in libpng's
  // write callback.
  const std::uint32_t w = 4096, h = 4096;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int rc = 0;
    try {
      const std::vector<std::uint8_t> px(std::size_t{w} * h, 7);
      long pages = 0;
      std::ifstream("/proc/self/statm") >> pages;  // the address space in use, in pages
      ::rlimit lim{};
      if (pages <= 0 || ::getrlimit(RLIMIT_AS, &lim) != 0) ::_exit(6);
      lim.rlim_cur = static_cast<::rlim_t>(pages) * static_cast<::rlim_t>(::sysconf(_SC_PAGESIZE)) + (::rlim_t{4} << 20);
      if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(6);
      (void)ld::encode_png(px.data(), w, h, 1, 0);
      rc = 5;  // the limit did not bite
    } catch (const lockstep::data_error& e) {
      rc = std::string(e.what()).find("encode_png: cannot allocate memory for the encoded PNG") != std::string::npos ? 0 : 4;
    } catch (const std::bad_alloc&) {
      rc = 3;  // the exception went through libpng's C frames
    } catch (...) {
      rc = 4;
    }
    ::_exit(rc);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("jpeg: image_limits::max_decoder_bytes of 0 or beyond LONG_MAX is refused, as libjpeg would read it as no limit") {
  std::vector<std::uint8_t> rgb(16 * 8 * 3, 90);
  const auto jpg = ld::encode_jpeg(rgb.data(), 16, 8, 3);
  const auto png = ld::encode_png(rgb.data(), 16, 8, 3);
  for (const std::uint64_t bad : {std::uint64_t{0}, std::uint64_t{LONG_MAX} + 1, ~std::uint64_t{0}}) {
    CAPTURE(bad);
    ld::image_options o;
    o.limits.max_decoder_bytes = bad;
    for (const auto* bytes : {&jpg, &png}) {
      try {
        (void)decode(*bytes, 3, o);
        FAIL("no config_error");
      } catch (const lockstep::config_error& e) {
        const std::string msg = e.what();
        CAPTURE(msg);
        CHECK(msg.find("image_limits::max_decoder_bytes must be 1 to " + std::to_string(LONG_MAX)) != std::string::npos);
        CHECK(msg.find("got " + std::to_string(bad)) != std::string::npos);
      }
    }
  }
  ld::image_options most;
  most.limits.max_decoder_bytes = LONG_MAX;
  CHECK(decode(jpg, 3, most).pixels.size() == rgb.size());
}

TEST_CASE("jpeg: baseline, progressive and grey decode within JPEG's error and the cropped decode equals the full one") {
  const std::uint32_t w = 67, h = 45;
  std::vector<std::uint8_t> rgb(w * h * 3), grey(w * h);
  for (std::uint32_t y = 0; y < h; ++y)
    for (std::uint32_t x = 0; x < w; ++x) {
      for (int k = 0; k < 3; ++k) rgb[(y * w + x) * 3 + k] = static_cast<std::uint8_t>(60 + x * 2 + y * (k + 1));
      grey[y * w + x] = static_cast<std::uint8_t>(20 + x + 2 * y);
    }
  for (bool progressive : {false, true})
    for (bool subsample : {false, true}) {
      CAPTURE(progressive);
      CAPTURE(subsample);
      const auto jpg = ld::encode_jpeg(rgb.data(), w, h, 3, {.quality = 95, .progressive = progressive, .subsample = subsample});
      const auto d = decode(jpg, 3);
      REQUIRE(d.pixels.size() == rgb.size());
      double err = 0;
      for (std::size_t i = 0; i < rgb.size(); ++i) err += std::abs(int(d.pixels[i]) - int(rgb[i]));
      CHECK(err / rgb.size() < 3.0);
      CHECK(decode(jpg, 3).pixels == d.pixels);  // the same bits every time
      // Decoding a part (rows skipped, columns cropped to iMCU boundaries) gives the same pixels.
      for (auto r : {ld::pixel_rect{17, 9, 20, 11}, ld::pixel_rect{0, 30, 67, 15}, ld::pixel_rect{50, 0, 17, 1}}) {
        ld::load_scratch s;
        ld::jpeg_decoder dec;
        ld::image_options o;
        dec.decode(jpg.data(), jpg.size(), "crop.jpg", o, [&](std::uint32_t, std::uint32_t) { return r; }, s.sample);
        const auto& p = s.sample;
        CHECK(p.region.x <= r.x);
        CHECK(p.region.x + p.region.width >= r.x + r.width);
        CHECK(p.region.y == r.y);
        CHECK(p.region.height == r.height);
        for (std::uint32_t y = r.y; y < r.y + r.height; ++y)
          for (std::uint32_t x = r.x; x < r.x + r.width; ++x)
            for (int k = 0; k < 3; ++k)
              CHECK(p.pixels[((y - p.region.y) * p.region.width + (x - p.region.x)) * 3 + k] == d.pixels[(y * w + x) * 3 + k]);
      }
    }
  const auto g = ld::encode_jpeg(grey.data(), w, h, 1, {.quality = 98});
  const auto dg = decode(g, 1), dg3 = decode(g, 3);
  double err = 0;
  for (std::size_t i = 0; i < grey.size(); ++i) {
    err += std::abs(int(dg.pixels[i]) - int(grey[i]));
    CHECK(dg3.pixels[3 * i] == dg.pixels[i]);  // grey to RGB replicates
    CHECK(dg3.pixels[3 * i + 1] == dg.pixels[i]);
  }
  CHECK(err / grey.size() < 2.0);
  const auto c1 = decode(ld::encode_jpeg(rgb.data(), w, h, 3), 1);  // colour to grey: libjpeg's Y
  CHECK(c1.pixels.size() == w * h);
}

TEST_CASE("jpeg: CMYK, truncated, corrupt and oversized files are refused naming the file and offset") {
  const std::uint32_t w = 128, h = 96;
  std::vector<std::uint8_t> rgb(w * h * 3);
  for (std::size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<std::uint8_t>((i * 2654435761u) >> 24);  // noise
  const auto good = ld::encode_jpeg(rgb.data(), w, h, 3);
  auto cut = good;
  cut.resize(good.size() / 2);
  const auto m1 = error_of(cut);
  CHECK(m1.find("test.img: JPEG: byte offset " + std::to_string(cut.size())) != std::string::npos);  // where it ran out
  CHECK(m1.find("strict") != std::string::npos);
  ld::image_options lenient;
  lenient.strict = false;
  CHECK(decode(cut, 3, lenient).pixels.size() == rgb.size());  // libjpeg fills the missing part
  // The frame header (SOF0) declaring 60000 x 60000.
  auto huge = good;
  for (std::size_t i = 2; i + 9 < huge.size(); ++i)
    if (huge[i] == 0xff && huge[i + 1] == 0xc0) {
      huge[i + 5] = 0xea;
      huge[i + 6] = 0x60;
      huge[i + 7] = 0xea;
      huge[i + 8] = 0x60;
      break;
    }
  const auto m2 = error_of(huge);
  CHECK(m2.find("60000x60000") != std::string::npos);
  CHECK(m2.find("beyond the limits") != std::string::npos);
  // A CMYK JPEG (written with libjpeg directly).
  jpeg_compress_struct c{};
  jpeg_error_mgr err{};
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = 8;
  c.image_height = 8;
  c.input_components = 4;
  c.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&c);
  jpeg_start_compress(&c, TRUE);
  std::vector<std::uint8_t> row(8 * 4, 50);
  while (c.next_scanline < 8) {
    JSAMPROW r = row.data();
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  const std::vector<std::uint8_t> cmyk(buf, buf + size);
  std::free(buf);
  CHECK(error_of(cmyk).find("CMYK") != std::string::npos);
  // Garbage after the SOI marker.
  std::vector<std::uint8_t> junk{0xff, 0xd8, 0xff, 0x00, 0x12, 0x34};
  CHECK(error_of(junk).find("JPEG") != std::string::npos);
  // The decoder is reused after an error.
  CHECK(decode(good, 3).pixels.size() == rgb.size());
}
