// libFuzzer harness: lockstep::data::decode_png (libpng behind png_jmpbuf) on the input after its
// first byte, which picks grey or RGB output. Any failure but a lockstep::error, a sanitizer
// report, a hang or a large allocation is a finding; declared sizes beyond the limits of
// common.hpp must be refused before their pixels are allocated.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/png.hpp>

#include "common.hpp"

namespace lf = lockstep::fuzz;
namespace ld = lockstep::data;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  static std::vector<png_bytep> rows;
  static ld::decoded_sample out;
  ld::image_options o;
  o.channels = (data[0] & 1) ? 3 : 1;
  o.limits.max_width = o.limits.max_height = lf::image_limits::side;
  o.limits.max_pixels = lf::image_limits::pixels;
  try {
    ld::decode_png(data + 1, size - 1, "fuzz.png", o, out, rows);
    unsigned sum = 0;
    for (std::uint8_t v : out.pixels) sum += v;
    static volatile unsigned sink;
    sink = sum;
  } catch (const lockstep::error&) {
  }
  return 0;
}
