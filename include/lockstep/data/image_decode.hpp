#pragma once
/// @file image_decode.hpp
/// Decoding an encoded image of either format (PNG or JPEG, told apart by their signatures) for
/// the image sources, with one reusable set of decoders per loading thread. Part of the optional
/// image component (CMake target lockstep::images).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <lockstep/core/error.hpp>
#include <lockstep/data/image_options.hpp>
#include <lockstep/data/indexed.hpp>
#include <lockstep/data/jpeg.hpp>
#include <lockstep/data/png.hpp>

namespace lockstep::data {

/// The decoder libraries of the image component, for reports ("libjpeg-turbo 2.1.5, libpng 1.6.39").
inline std::string image_library_versions() { return jpeg_library_version() + ", " + png_library_version(); }

/// A loading thread's decoders (what the image sources keep in load_scratch::codec).
struct image_decoders {
  jpeg_decoder jpeg;               ///< the thread's libjpeg decompressor
  std::vector<png_bytep> png_rows; ///< row pointers for libpng
};

/// The decoders kept in `s` (made on first use).
inline image_decoders& decoders_of(load_scratch& s) {
  if (!s.codec) s.codec = std::make_shared<image_decoders>();
  return *static_cast<image_decoders*>(s.codec.get());
}

/// Decodes the PNG or JPEG `data` (named `name` in messages) into `out`: the whole image for PNG,
/// the part `regions` asks for (rounded out) for JPEG. Adds the time to counters.decode_ns.
/// @throws data_error naming the file, the format and the byte offset; for bytes that are neither
///         format, the first bytes found.
inline void decode_image(const std::uint8_t* data, std::size_t size, const std::string& name, const image_options& o,
                         const region_planner& regions, decoded_sample& out, load_scratch& s, pipeline_counters& counters) {
  const auto t0 = std::chrono::steady_clock::now();
  image_decoders& d = decoders_of(s);
  if (is_jpeg(data, size)) {
    d.jpeg.decode(data, size, name, o, [&](std::uint32_t h, std::uint32_t w) { return regions.plan(h, w); }, out);
  } else if (is_png(data, size)) {
    decode_png(data, size, name, o, out, d.png_rows);
    (void)regions.plan(out.height, out.width);
  } else {
    char head[64] = "";
    for (std::size_t i = 0; i < size && i < 4; ++i) std::snprintf(head + 3 * i, sizeof head - 3 * i, "%02x ", data[i]);
    throw data_error("lockstep::data: " + name + ": byte offset 0: neither a PNG nor a JPEG file (" +
                     std::to_string(size) + " bytes" + (size ? std::string(", starting ") + head : std::string()) + ")");
  }
  counters.decode_ns += detail::ns_since(t0);
}

}  // namespace lockstep::data
