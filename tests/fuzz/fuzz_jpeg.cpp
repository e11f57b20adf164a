// libFuzzer harness: lockstep::data::jpeg_decoder (libjpeg-turbo with a returning error manager)
// on the input after its first five bytes: byte 0 picks grey or RGB output and strictness, bytes
// 1-4 the part of the image to decode (left, top, width, height in 1/255 of the image), so the
// cropped (jpeg_crop_scanline) and row-skipping (jpeg_skip_scanlines) paths are fuzzed too. One
// decoder serves every input, as one load thread's does, so reuse after an error is fuzzed.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include <lockstep/core/error.hpp>
#include <lockstep/data/jpeg.hpp>

#include "common.hpp"

namespace lf = lockstep::fuzz;
namespace ld = lockstep::data;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 5) return 0;
  static ld::jpeg_decoder decoder;
  static ld::decoded_sample out;
  ld::image_options o;
  o.channels = (data[0] & 1) ? 3 : 1;
  o.strict = (data[0] & 2) == 0;
  o.limits.max_width = o.limits.max_height = lf::image_limits::side;
  o.limits.max_pixels = lf::image_limits::pixels;
  o.limits.max_decoder_bytes = lf::image_limits::decoder;
  o.limits.max_jpeg_scans = lf::image_limits::scans;
  const std::uint8_t fx = data[1], fy = data[2], fw = data[3], fh = data[4];
  const auto plan = [&](std::uint32_t h, std::uint32_t w) {
    const auto part = [](std::uint32_t n, std::uint8_t f) { return static_cast<std::uint32_t>(std::uint64_t{n} * f / 255); };
    const std::uint32_t x = std::min(part(w, fx), w - 1), y = std::min(part(h, fy), h - 1);
    const std::uint32_t cw = std::clamp<std::uint32_t>(part(w, fw), 1, w - x), ch = std::clamp<std::uint32_t>(part(h, fh), 1, h - y);
    return ld::pixel_rect{x, y, cw, ch};
  };
  try {
    decoder.decode(data + 5, size - 5, "fuzz.jpg", o, plan, out);
    unsigned sum = 0;
    for (std::uint8_t v : out.pixels) sum += v;
    static volatile unsigned sink;
    sink = sum;
  } catch (const lockstep::error&) {
  }
  return 0;
}
