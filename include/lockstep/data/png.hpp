#pragma once
/// @file png.hpp
/// PNG decoding with libpng (part of the optional image component, CMake target
/// lockstep::images). Every colour type and bit depth becomes 8-bit grey or RGB: palettes are
/// expanded, 16-bit samples scaled to 8 bits (libpng's png_set_scale_16, rounding), grey of 1, 2
/// or 4 bits expanded, alpha dropped (not composited), grey replicated to RGB, RGB turned to grey
/// with libpng's default Rec. 709 weights (6968 R + 23434 G + 2366 B) / 32768 on the stored values.
/// Gamma, colour profiles (gAMA, cHRM, sRGB, iCCP), text and EXIF chunks are ignored: pixels are
/// the stored values. libpng reports errors through png_jmpbuf; each phase that calls libpng sets
/// its own jump point and holds no C++ object, and the error becomes a data_error naming the file
/// and the byte offset libpng had read to.

#include <png.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/detail/render.hpp>
#include <lockstep/data/image_options.hpp>

namespace lockstep::data {

/// The libpng version this program runs with.
inline std::string png_library_version() { return std::string("libpng ") + png_get_libpng_ver(nullptr); }

namespace detail {

/// What libpng's callbacks share with the decoder (plain data: it crosses longjmp).
struct png_io {
  char message[256];  // first: png_on_error writes here (also for png_sink)
  const std::uint8_t* data;
  std::size_t size;
  std::size_t pos;
};

/// The IHDR fields.
struct png_ihdr {
  png_uint_32 width, height;
  int bit_depth, color_type, interlace;
};

inline void png_on_read(png_structp png, png_bytep out, std::size_t n) {
  auto* io = static_cast<png_io*>(png_get_io_ptr(png));
  if (n > io->size - io->pos) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, io->data + io->pos, n);
  io->pos += n;
}

[[noreturn]] inline void png_on_error(png_structp png, png_const_charp msg) {
  // The error pointer is a png_io or a png_sink, both standard-layout with the message first.
  auto* message = static_cast<char*>(png_get_error_ptr(png));
  std::snprintf(message, 256, "%s", msg ? msg : "error");
  png_longjmp(png, 1);
}

inline void png_on_warning(png_structp, png_const_charp) {}

// The phases below call libpng under their own jump point and keep only trivial locals, so a
// longjmp out of libpng skips no destructor. Each returns 0, or 1 when libpng failed.

inline int png_phase_header(png_structp png, png_infop info, png_ihdr* h) {
  if (setjmp(png_jmpbuf(png))) return 1;
  png_read_info(png, info);
  png_get_IHDR(png, info, &h->width, &h->height, &h->bit_depth, &h->color_type, &h->interlace, nullptr, nullptr);
  return 0;
}

inline int png_phase_transform(png_structp png, png_infop info, const png_ihdr* h, std::uint32_t channels,
                               std::size_t* rowbytes, int* out_channels, int* out_depth) {
  if (setjmp(png_jmpbuf(png))) return 1;
  const bool grey = (h->color_type & PNG_COLOR_MASK_COLOR) == 0;
  if (h->color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (grey && h->bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (h->bit_depth == 16) png_set_scale_16(png);
  if (h->color_type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  if (channels == 3 && grey) png_set_gray_to_rgb(png);
  if (channels == 1 && !grey) png_set_rgb_to_gray_fixed(png, PNG_ERROR_ACTION_NONE, -1, -1);
  (void)png_set_interlace_handling(png);
  png_read_update_info(png, info);
  *rowbytes = png_get_rowbytes(png, info);
  *out_channels = png_get_channels(png, info);
  *out_depth = png_get_bit_depth(png, info);
  return 0;
}

inline int png_phase_rows(png_structp png, png_infop info, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return 1;
  png_read_image(png, rows);
  png_read_end(png, info);
  return 0;
}

/// The ancillary chunks libpng is told to skip unread (known ones included): they change no pixel
/// we produce, and skipping them keeps their decompression (iCCP, zTXt, iTXt) out of the way.
inline constexpr png_byte png_skipped_chunks[] = "bKGD\0cHRM\0eXIf\0gAMA\0hIST\0iCCP\0iTXt\0oFFs\0pCAL\0pHYs\0"
                                                 "sBIT\0sCAL\0sPLT\0sRGB\0tEXt\0tIME\0tRNS\0zTXt";

/// Frees libpng's structures.
struct png_guard {
  png_structp png = nullptr;
  png_infop info = nullptr;
  png_guard() = default;
  png_guard(const png_guard&) = delete;
  png_guard& operator=(const png_guard&) = delete;
  ~png_guard() {
    if (png) png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
  }
};

}  // namespace detail

/// True when the bytes start with the PNG signature.
inline bool is_png(const std::uint8_t* data, std::size_t size) noexcept {
  static constexpr std::uint8_t sig[8] = {0x89, 'P', 'N', 'G', 0x0d, 0x0a, 0x1a, 0x0a};
  return size >= 8 && std::memcmp(data, sig, 8) == 0;
}

/// Decodes the PNG `data` (named `name` in messages) into `out` as 8-bit interleaved grey or RGB
/// (`o.channels`), the whole image. `rows` is scratch (row pointers).
/// @throws data_error "lockstep::data: <name>: PNG: byte offset <n>: <what>" for a malformed,
///         truncated or oversized file (the size is checked against o.limits before any pixel is
///         allocated); config_error for bad options.
inline void decode_png(const std::uint8_t* data, std::size_t size, const std::string& name, const image_options& o,
                       decoded_sample& out, std::vector<png_bytep>& rows) {
  detail::check_image_options(o, "decode_png");
  detail::png_io io{{}, data, size, 0};
  detail::png_guard g;
  g.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &io, &detail::png_on_error, &detail::png_on_warning);
  if (!g.png) detail::image_fail(name, "PNG", 0, "cannot create libpng's decoder (out of memory)");
  g.info = png_create_info_struct(g.png);
  if (!g.info) detail::image_fail(name, "PNG", 0, "cannot create libpng's decoder (out of memory)");
  png_set_read_fn(g.png, &io, &detail::png_on_read);
  png_set_chunk_cache_max(g.png, 1000);
  png_set_chunk_malloc_max(g.png, 8u << 20);
  png_set_benign_errors(g.png, 0);  // a benign error (extra IDAT data, a bad ancillary CRC) is an error
  png_set_keep_unknown_chunks(g.png, PNG_HANDLE_CHUNK_NEVER, nullptr, 0);
  png_set_keep_unknown_chunks(g.png, PNG_HANDLE_CHUNK_NEVER, detail::png_skipped_chunks,
                              static_cast<int>(sizeof detail::png_skipped_chunks / 5));
  detail::png_ihdr h{};
  if (detail::png_phase_header(g.png, g.info, &h) != 0) detail::image_fail(name, "PNG", io.pos, io.message);
  detail::check_image_size(name, "PNG", 16, h.width, h.height, o.limits);
  std::size_t rowbytes = 0;
  int channels = 0, depth = 0;
  if (detail::png_phase_transform(g.png, g.info, &h, o.channels, &rowbytes, &channels, &depth) != 0)
    detail::image_fail(name, "PNG", io.pos, io.message);
  if (channels != static_cast<int>(o.channels) || depth != 8 || rowbytes != std::size_t{h.width} * o.channels)
    detail::image_fail(name, "PNG", 25,
                       "colour type " + std::to_string(h.color_type) + " at " + std::to_string(h.bit_depth) +
                           " bits cannot be converted to " + std::to_string(o.channels) + " 8-bit channels");
  out.pixels.resize(std::size_t{h.height} * rowbytes);
  rows.resize(h.height);
  for (png_uint_32 y = 0; y < h.height; ++y) rows[y] = out.pixels.data() + std::size_t{y} * rowbytes;
  if (detail::png_phase_rows(g.png, g.info, rows.data()) != 0) detail::image_fail(name, "PNG", io.pos, io.message);
  out.channels = o.channels;
  out.height = h.height;
  out.width = h.width;
  out.region = {0, 0, h.width, h.height};
}

namespace detail {

struct png_sink {
  char message[256];  // first, as in png_io
  std::vector<std::uint8_t>* out;
};

/// libpng's write callback. No C++ exception may cross libpng's C frames: a failed append
/// (out of memory) becomes a libpng error, which returns to png_phase_write through longjmp.
inline void png_on_write(png_structp png, png_bytep data, std::size_t n) {
  auto* sink = static_cast<png_sink*>(png_get_io_ptr(png));
  bool failed = false;
  try {
    sink->out->insert(sink->out->end(), data, data + n);
  } catch (...) {  // std::bad_alloc, std::length_error
    failed = true;
  }
  if (failed) png_error(png, "cannot allocate memory for the encoded PNG (out of memory)");
}

inline void png_on_flush(png_structp) {}

inline int png_phase_write(png_structp png, png_infop info, png_bytepp rows, std::uint32_t w, std::uint32_t h,
                           std::uint32_t channels, int level) {
  if (setjmp(png_jmpbuf(png))) return 1;
  png_set_IHDR(png, info, w, h, 8, channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_set_compression_level(png, level);
  png_set_rows(png, info, rows);
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  return 0;
}

}  // namespace detail

/// Encodes 8-bit grey (channels 1) or RGB (channels 3) pixels, interleaved row by row, as a PNG
/// (zlib level `level`, 0-9). Decoding it with the same channels gives the pixels back exactly.
/// @throws config_error for bad arguments; data_error when libpng fails.
inline std::vector<std::uint8_t> encode_png(const std::uint8_t* pixels, std::uint32_t width, std::uint32_t height,
                                            std::uint32_t channels, int level = 6) {
  if ((channels != 1 && channels != 3) || width == 0 || height == 0 || level < 0 || level > 9)
    throw config_error("lockstep::data::encode_png: need 1 or 3 channels, a non-empty image and level 0-9");
  std::vector<std::uint8_t> out;
  detail::png_sink sink{{}, &out};
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &sink, &detail::png_on_error, &detail::png_on_warning);
  if (!png) throw data_error("lockstep::data::encode_png: cannot create libpng's encoder");
  png_infop info = png_create_info_struct(png);
  struct guard {
    png_structp* p;
    png_infop* i;
    ~guard() { png_destroy_write_struct(p, i); }
  } g{&png, &info};
  if (!info) throw data_error("lockstep::data::encode_png: cannot create libpng's encoder");
  png_set_write_fn(png, &sink, &detail::png_on_write, &detail::png_on_flush);
  std::vector<png_bytep> rows(height);
  for (std::uint32_t y = 0; y < height; ++y)
    rows[y] = const_cast<png_bytep>(pixels + std::size_t{y} * width * channels);
  if (detail::png_phase_write(png, info, rows.data(), width, height, channels, level) != 0)
    throw data_error(std::string("lockstep::data::encode_png: ") + sink.message);
  return out;
}

}  // namespace lockstep::data
