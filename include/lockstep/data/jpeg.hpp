#pragma once
/// @file jpeg.hpp
/// JPEG decoding with libjpeg-turbo's libjpeg API (part of the optional image component, CMake
/// target lockstep::images). The accurate integer inverse DCT (JDCT_ISLOW) and fancy upsampling,
/// so results are the same bits for a given libjpeg-turbo build. Output is 8-bit RGB or grey:
/// YCbCr, RGB and grey JPEGs (baseline, progressive, arithmetic-coded) are converted by libjpeg;
/// CMYK and YCCK JPEGs are refused, as are 12-bit ones. EXIF orientation and colour profiles are
/// ignored. Only the rows and iMCU columns that the image stages read are decoded
/// (jpeg_crop_scanline, jpeg_skip_scanlines), as tf.data's decode_and_crop_jpeg does.
///
/// libjpeg's default error handler calls exit(); here an error manager returns to the decoder
/// through longjmp (each phase that calls libjpeg sets its own jump point and holds no C++
/// object), the memory libjpeg may use is capped (image_limits::max_decoder_bytes), the scans of
/// a progressive file are counted (image_limits::max_jpeg_scans), and warnings about corrupt data
/// (a truncated file, bad markers) are errors unless image_options::strict is false.

#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <jpeglib.h>

#include <lockstep/core/error.hpp>
#include <lockstep/data/detail/render.hpp>
#include <lockstep/data/image_options.hpp>

namespace lockstep::data {

/// The libjpeg-turbo version this program was built with.
inline std::string jpeg_library_version() {
#define LOCKSTEP_JPEG_STRINGIFY2(x) #x
#define LOCKSTEP_JPEG_STRINGIFY(x) LOCKSTEP_JPEG_STRINGIFY2(x)
#ifdef LIBJPEG_TURBO_VERSION
  return std::string("libjpeg-turbo ") + LOCKSTEP_JPEG_STRINGIFY(LIBJPEG_TURBO_VERSION);
#else
  return "libjpeg (not libjpeg-turbo), API " + std::to_string(JPEG_LIB_VERSION);
#endif
#undef LOCKSTEP_JPEG_STRINGIFY
#undef LOCKSTEP_JPEG_STRINGIFY2
}

namespace detail {

/// libjpeg's error manager, extended with the jump point and the first message (plain data).
struct jpeg_errors {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  int warnings;
  char warning[JMSG_LENGTH_MAX];
  std::uint32_t max_scans;
};

[[noreturn]] inline void jpeg_on_error(j_common_ptr c) {
  auto* e = reinterpret_cast<jpeg_errors*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

inline void jpeg_on_message(j_common_ptr c, int level) {
  auto* e = reinterpret_cast<jpeg_errors*>(c->err);
  if (level < 0) {  // a warning: corrupt data that libjpeg works around
    if (e->warnings++ == 0) (*c->err->format_message)(c, e->warning);
  }
}

inline void jpeg_on_progress(j_common_ptr c) {
  if (!c->is_decompressor) return;
  auto* d = reinterpret_cast<j_decompress_ptr>(c);
  auto* e = reinterpret_cast<jpeg_errors*>(c->err);
  if (d->input_scan_number > static_cast<int>(e->max_scans)) {
    std::snprintf(e->message, sizeof e->message, "more than %u scans (image_limits::max_jpeg_scans)", e->max_scans);
    std::longjmp(e->jump, 1);
  }
}

/// One thread's libjpeg decompressor, reused from image to image.
struct jpeg_state {
  jpeg_decompress_struct cinfo{};
  jpeg_errors err{};
  jpeg_progress_mgr progress{};
  bool created = false;
  std::vector<JSAMPROW> rows;
  jpeg_state() = default;
  jpeg_state(const jpeg_state&) = delete;
  jpeg_state& operator=(const jpeg_state&) = delete;
  ~jpeg_state() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

inline int jpeg_phase_create(jpeg_state* s) {
  s->cinfo.err = jpeg_std_error(&s->err.pub);
  s->err.pub.error_exit = &jpeg_on_error;
  s->err.pub.emit_message = &jpeg_on_message;
  if (setjmp(s->err.jump)) return 1;
  jpeg_create_decompress(&s->cinfo);
  return 0;
}

inline int jpeg_phase_header(jpeg_state* s, const std::uint8_t* data, std::size_t size, int* status) {
  if (setjmp(s->err.jump)) return 1;
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
  *status = jpeg_read_header(&s->cinfo, TRUE);
  return 0;
}

inline int jpeg_phase_start(jpeg_state* s, JDIMENSION* xoffset, JDIMENSION* width, int crop) {
  if (setjmp(s->err.jump)) return 1;
  jpeg_start_decompress(&s->cinfo);
  if (crop) jpeg_crop_scanline(&s->cinfo, xoffset, width);
  return 0;
}

inline int jpeg_phase_rows(jpeg_state* s, std::uint8_t* out, std::size_t stride, JDIMENSION y0, JDIMENSION y1, int strict) {
  if (setjmp(s->err.jump)) return 1;
  if (y0 > 0) jpeg_skip_scanlines(&s->cinfo, y0);
  JSAMPROW* rows = s->rows.data();
  while (s->cinfo.output_scanline < y1) {
    if (strict && s->err.warnings) return 3;  // corrupt data: stop at once (the caller reports it)
    const JDIMENSION first = s->cinfo.output_scanline;
    const JDIMENSION n = y1 - first < 8 ? y1 - first : 8;
    for (JDIMENSION k = 0; k < n; ++k) rows[k] = out + static_cast<std::size_t>(first - y0 + k) * stride;
    if (jpeg_read_scanlines(&s->cinfo, rows, n) == 0) return 2;  // no progress (suspended source)
  }
  return 0;
}

/// Resets the decompressor for the next image (never fails).
inline void jpeg_reset(jpeg_state* s) noexcept { jpeg_abort_decompress(&s->cinfo); }

}  // namespace detail

/// True when the bytes start with a JPEG SOI marker.
inline bool is_jpeg(const std::uint8_t* data, std::size_t size) noexcept {
  return size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff;
}

/// A thread's reusable JPEG decoder.
class jpeg_decoder {
public:
  jpeg_decoder() = default;

  /// Decodes the JPEG `data` (named `name` in messages) into `out` as 8-bit interleaved grey or
  /// RGB (`o.channels`): at least the part `plan(height, width)` returns (a callable given the
  /// image's size once the header is read; whole rows are decoded for the rows asked, the columns
  /// rounded out to iMCU boundaries), out.region saying which part it is.
  /// @throws data_error "lockstep::data: <name>: JPEG: byte offset <n>: <libjpeg's message>" for
  ///         a malformed, truncated (when strict), CMYK, 12-bit or oversized file (checked on the
  ///         header, before the pixels are allocated); config_error for bad options.
  template <class Plan>
  void decode(const std::uint8_t* data, std::size_t size, const std::string& name, const image_options& o, Plan&& plan,
              decoded_sample& out) {
    detail::check_image_options(o, "decode_jpeg");
    if (!state_) {
      state_ = std::make_unique<detail::jpeg_state>();
      if (detail::jpeg_phase_create(state_.get()) != 0) {
        const std::string msg = state_->err.message;
        state_.reset();
        detail::image_fail(name, "JPEG", 0, msg);
      }
      state_->created = true;
      state_->progress.progress_monitor = &detail::jpeg_on_progress;
      state_->cinfo.progress = &state_->progress;
      state_->rows.resize(8);
    }
    detail::jpeg_state* s = state_.get();
    s->err.warnings = 0;
    s->err.message[0] = 0;
    s->err.max_scans = o.limits.max_jpeg_scans;
    s->cinfo.mem->max_memory_to_use = static_cast<long>(o.limits.max_decoder_bytes);
    struct reset_on_exit {
      detail::jpeg_state* s;
      ~reset_on_exit() { detail::jpeg_reset(s); }
    } reset{s};
    // Where libjpeg stands in the data (it reads ahead; at the end it reads a fake EOI of its own).
    const auto where = [&]() -> std::size_t {
      if (!s->cinfo.src || !s->cinfo.src->next_input_byte) return 0;
      const auto p = reinterpret_cast<std::uintptr_t>(s->cinfo.src->next_input_byte), b = reinterpret_cast<std::uintptr_t>(data);
      return p >= b && p <= b + size ? static_cast<std::size_t>(p - b) : size;
    };
    int status = 0;
    if (detail::jpeg_phase_header(s, data, size, &status) != 0) detail::image_fail(name, "JPEG", where(), s->err.message);
    if (status != JPEG_HEADER_OK) detail::image_fail(name, "JPEG", where(), "no image in the stream (tables only)");
    jpeg_decompress_struct& c = s->cinfo;
    detail::check_image_size(name, "JPEG", where(), c.image_width, c.image_height, o.limits);
    if (c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK)
      detail::image_fail(name, "JPEG", where(),
                         "a CMYK (or YCCK) JPEG is not supported; convert it to RGB first (for example "
                         "`convert in.jpg -colorspace sRGB out.jpg` with ImageMagick)");
    if (c.jpeg_color_space != JCS_GRAYSCALE && c.jpeg_color_space != JCS_YCbCr && c.jpeg_color_space != JCS_RGB)
      detail::image_fail(name, "JPEG", where(),
                         "colour space " + std::to_string(static_cast<int>(c.jpeg_color_space)) + " with " +
                             std::to_string(c.num_components) + " components is not supported");
    if (s->err.warnings && o.strict) detail::image_fail(name, "JPEG", where(), s->err.warning);
    c.out_color_space = o.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
    c.dct_method = JDCT_ISLOW;
    c.do_fancy_upsampling = TRUE;
    c.scale_num = 1;
    c.scale_denom = 1;
    const std::uint32_t w = c.image_width, h = c.image_height;
    const pixel_rect want = plan(h, w);
    out.channels = o.channels;
    out.height = h;
    out.width = w;
    if (want.width == 0 || want.height == 0) {  // nothing to decode (the stages read padding only)
      out.region = {0, 0, 0, 0};
      out.pixels.clear();
      return;
    }
    JDIMENSION xoff = want.x, cw = want.width;
    const bool crop = want.x != 0 || want.width != w;
    if (detail::jpeg_phase_start(s, &xoff, &cw, crop ? 1 : 0) != 0) detail::image_fail(name, "JPEG", where(), s->err.message);
    if (!crop) {
      xoff = 0;
      cw = c.output_width;
    }
    if (c.output_components != static_cast<int>(o.channels) || cw != c.output_width || xoff > want.x ||
        xoff + cw < want.x + want.width)
      detail::image_fail(name, "JPEG", where(), "libjpeg produced an unexpected output layout");
    const std::size_t stride = std::size_t{cw} * o.channels;
    out.pixels.resize(stride * want.height);
    const int rc = detail::jpeg_phase_rows(s, out.pixels.data(), stride, want.y, want.y + want.height, o.strict ? 1 : 0);
    if (rc == 1) detail::image_fail(name, "JPEG", where(), s->err.message);
    if (rc == 2) detail::image_fail(name, "JPEG", where(), "the decoder made no progress");
    if (s->err.warnings && o.strict)
      detail::image_fail(name, "JPEG", where(),
                         std::string(s->err.warning) + " (corrupt data; image_options::strict = false accepts it)");
    out.region = {xoff, want.y, cw, want.height};
  }

private:
  std::unique_ptr<detail::jpeg_state> state_;
};

/// Options of encode_jpeg.
struct jpeg_encode_options {
  int quality = 90;          ///< 1 .. 100
  bool progressive = false;  ///< a progressive JPEG instead of a baseline one
  bool subsample = true;     ///< 4:2:0 chroma (RGB input); 4:4:4 when false
};

namespace detail {

inline int jpeg_phase_compress(jpeg_compress_struct* c, jpeg_errors* err, const std::uint8_t* pixels, std::uint32_t w,
                               std::uint32_t h, std::uint32_t channels, const jpeg_encode_options* o,
                               unsigned char** out, unsigned long* size) {
  if (setjmp(err->jump)) return 1;
  jpeg_create_compress(c);
  jpeg_mem_dest(c, out, size);
  c->image_width = w;
  c->image_height = h;
  c->input_components = static_cast<int>(channels);
  c->in_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(c);
  jpeg_set_quality(c, o->quality, TRUE);
  c->dct_method = JDCT_ISLOW;
  if (channels == 3 && !o->subsample)
    for (int k = 0; k < 3; ++k) c->comp_info[k].h_samp_factor = c->comp_info[k].v_samp_factor = 1;
  if (o->progressive) jpeg_simple_progression(c);
  jpeg_start_compress(c, TRUE);
  while (c->next_scanline < h) {
    JSAMPROW row = const_cast<JSAMPROW>(pixels + std::size_t{c->next_scanline} * w * channels);
    jpeg_write_scanlines(c, &row, 1);
  }
  jpeg_finish_compress(c);
  return 0;
}

}  // namespace detail

/// Encodes 8-bit grey (channels 1) or RGB (channels 3) pixels, interleaved row by row, as a JPEG
/// with libjpeg-turbo (accurate integer DCT).
/// @throws config_error for bad arguments; data_error when libjpeg fails.
inline std::vector<std::uint8_t> encode_jpeg(const std::uint8_t* pixels, std::uint32_t width, std::uint32_t height,
                                             std::uint32_t channels, const jpeg_encode_options& o = {}) {
  if ((channels != 1 && channels != 3) || width == 0 || height == 0 || o.quality < 1 || o.quality > 100)
    throw config_error("lockstep::data::encode_jpeg: need 1 or 3 channels, a non-empty image and quality 1-100");
  jpeg_compress_struct c{};
  detail::jpeg_errors err{};
  c.err = jpeg_std_error(&err.pub);
  err.pub.error_exit = &detail::jpeg_on_error;
  err.pub.emit_message = &detail::jpeg_on_message;
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int rc = detail::jpeg_phase_compress(&c, &err, pixels, width, height, channels, &o, &buf, &size);
  jpeg_destroy_compress(&c);
  std::vector<std::uint8_t> out;
  if (rc == 0 && buf) out.assign(buf, buf + size);
  std::free(buf);
  if (rc != 0) throw data_error(std::string("lockstep::data::encode_jpeg: ") + err.message);
  return out;
}

}  // namespace lockstep::data
