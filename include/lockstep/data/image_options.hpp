#pragma once
/// @file image_options.hpp
/// What the image decoders (PNG, JPEG) are told: the channels wanted and the limits every
/// declared image is checked against before anything is allocated for it.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include <lockstep/core/error.hpp>

namespace lockstep::data {

/// Limits of an untrusted image, checked on its header before its pixels are allocated.
struct image_limits {
  std::uint32_t max_width = 16384;                          ///< columns
  std::uint32_t max_height = 16384;                         ///< rows
  std::uint64_t max_pixels = std::uint64_t{1} << 26;        ///< width × height (64 Mpixel: 192 MiB of RGB)
  std::uint64_t max_file_bytes = std::uint64_t{1} << 28;    ///< bytes of one encoded image (256 MiB)
  std::uint64_t max_decoder_bytes = std::uint64_t{1} << 30; ///< memory a decoder may use besides the pixels (JPEG coefficients); 1 to LONG_MAX
  std::uint32_t max_jpeg_scans = 500;                       ///< scans of a progressive JPEG
};

/// Options of the image decoders.
struct image_options {
  std::uint32_t channels = 3;  ///< 3: RGB, 1: grey (see docs/data.md for every conversion)
  image_limits limits{};       ///< the limits above
  bool strict = true;          ///< refuse a JPEG that libjpeg-turbo warns is corrupt (truncated data, bad markers)
};

namespace detail {

/// @throws config_error naming the option when `o` cannot be used (`who` names the caller).
inline void check_image_options(const image_options& o, const char* who) {
  if (o.channels != 1 && o.channels != 3)
    throw config_error(std::string("lockstep::data::") + who + ": channels must be 1 (grey) or 3 (RGB), got " +
                       std::to_string(o.channels));
  // libjpeg reads its limit as a long, and 0 (or a negative value) as no limit at all.
  constexpr auto most = static_cast<std::uint64_t>(std::numeric_limits<long>::max());
  if (o.limits.max_decoder_bytes == 0 || o.limits.max_decoder_bytes > most)
    throw config_error(std::string("lockstep::data::") + who + ": image_limits::max_decoder_bytes must be 1 to " +
                       std::to_string(most) + " (a limit libjpeg can hold; 0 is not 'no limit'), got " +
                       std::to_string(o.limits.max_decoder_bytes));
}

/// data_error "lockstep::data: <name>: <format>: byte offset <at>: <what>".
[[noreturn]] inline void image_fail(const std::string& name, const char* format, std::size_t at, const std::string& what) {
  throw data_error("lockstep::data: " + name + ": " + format + ": byte offset " + std::to_string(at) + ": " + what);
}

/// Checks a declared image size against the limits (before anything is allocated for it).
inline void check_image_size(const std::string& name, const char* format, std::size_t at, std::uint64_t w,
                             std::uint64_t h, const image_limits& l) {
  if (w == 0 || h == 0) image_fail(name, format, at, "the image is empty (" + std::to_string(w) + "x" + std::to_string(h) + ")");
  if (w > l.max_width || h > l.max_height || w * h > l.max_pixels)
    image_fail(name, format, at,
               "the header declares a " + std::to_string(w) + "x" + std::to_string(h) +
                   " image, beyond the limits (image_limits: " + std::to_string(l.max_width) + "x" +
                   std::to_string(l.max_height) + ", " + std::to_string(l.max_pixels) + " pixels)");
}

}  // namespace detail
}  // namespace lockstep::data
