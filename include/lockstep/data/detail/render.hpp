#pragma once
/// @file render.hpp
/// Internal: the geometry of the image stages and the one pass that applies it. The stages (crop,
/// resize, flip) only compose an axis-aligned map from output pixels to source pixels; `render`
/// then reads the decoded pixels once, bilinearly where the map scales, and writes the sample's
/// channels-first row.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <lockstep/core/error.hpp>

namespace lockstep::data {

/// A rectangle of pixels: columns [x, x + width) and rows [y, y + height).
struct pixel_rect {
  std::uint32_t x = 0;       ///< first column
  std::uint32_t y = 0;       ///< first row
  std::uint32_t width = 0;   ///< columns
  std::uint32_t height = 0;  ///< rows
};

/// What a source produced for one sample, before the image stages: interleaved (height × width ×
/// channels) uint8 pixels of a region of the image, or a row of float values.
struct decoded_sample {
  std::vector<std::uint8_t> pixels;  ///< region.height × region.width × channels, row-major, interleaved
  std::vector<float> values;         ///< the row of a float source (pixels is then unused)
  std::uint32_t channels = 0;        ///< channels per pixel
  std::uint32_t height = 0;          ///< rows of the whole image
  std::uint32_t width = 0;           ///< columns of the whole image
  pixel_rect region;                 ///< the part of the image that `pixels` holds
  std::int32_t label = -1;           ///< a label stored with the data (a tar member), or -1

  /// Marks the sample empty (keeping the buffers' capacity).
  void clear() noexcept {
    pixels.clear();
    values.clear();
    channels = height = width = 0;
    region = {};
    label = -1;
  }
};

namespace detail {

/// One axis of the map from output to source: source = offset + step × output, in continuous
/// coordinates (pixel i covers [i, i + 1), its centre is i + 0.5).
struct axis_map {
  double offset = 0;  ///< source coordinate of output coordinate 0
  double step = 1;    ///< source units per output unit (negative: mirrored)
};

/// The geometry of one sample after the image stages applied so far.
struct image_view {
  std::uint32_t height = 0;         ///< rows of the current (output) image
  std::uint32_t width = 0;          ///< columns of the current (output) image
  axis_map y;                       ///< output row -> source row
  axis_map x;                       ///< output column -> source column
  std::uint32_t source_height = 0;  ///< rows of the decoded image
  std::uint32_t source_width = 0;   ///< columns of the decoded image

  /// The identity view of an image of the given size.
  static image_view of(std::uint32_t h, std::uint32_t w) noexcept { return {h, w, {0, 1}, {0, 1}, h, w}; }
  /// Applies a stage whose output coordinates map to the current ones by current = ny/nx(new);
  /// the new output size is h × w.
  void then(axis_map ny, axis_map nx, std::uint32_t h, std::uint32_t w) noexcept {
    y = {y.offset + y.step * ny.offset, y.step * ny.step};
    x = {x.offset + x.step * nx.offset, x.step * nx.step};
    height = h;
    width = w;
  }
};

/// Where output position o of an axis reads: the two source pixels and the weight of the second
/// (in 1/2048), or pad (outside the source: the pixel is 0).
struct tap {
  std::int32_t i0 = 0;  ///< first source pixel, or -1 for padding
  std::int32_t i1 = 0;  ///< second source pixel
  std::int32_t w = 0;   ///< weight of i1 in 1/2048 (0: i0 alone)
};

inline constexpr int weight_bits = 11;
inline constexpr std::int32_t weight_one = 1 << weight_bits;

/// The taps of the n output positions of one axis over a source of `size` pixels. A pixel whose
/// centre falls outside [0, size) is padding; inside, the value is interpolated between the two
/// nearest pixel centres (clamped at the borders), exactly the source pixel when the centre hits one.
inline void axis_taps(const axis_map& m, std::uint32_t n, std::uint32_t size, std::vector<tap>& out) {
  out.resize(n);
  for (std::uint32_t o = 0; o < n; ++o) {
    const double c = m.offset + m.step * (static_cast<double>(o) + 0.5);
    tap& t = out[o];
    if (!(c >= 0.0) || c >= static_cast<double>(size)) {
      t = {-1, -1, 0};
      continue;
    }
    const double s = c - 0.5;
    double f0 = std::floor(s);
    std::int64_t i0 = static_cast<std::int64_t>(f0);
    double f = s - f0;
    if (i0 < 0) {
      i0 = 0;
      f = 0;
    }
    if (i0 >= static_cast<std::int64_t>(size) - 1) {
      i0 = static_cast<std::int64_t>(size) - 1;
      f = 0;
    }
    auto w = static_cast<std::int32_t>(std::lround(f * weight_one));
    if (w >= weight_one) {  // rounds to the next pixel
      ++i0;
      w = 0;
    }
    t.i0 = static_cast<std::int32_t>(i0);
    t.i1 = w ? t.i0 + 1 : t.i0;
    t.w = w;
  }
}

/// The source pixels the taps of one axis read, as [lo, hi) (empty when all are padding).
inline std::pair<std::uint32_t, std::uint32_t> taps_span(const std::vector<tap>& taps) noexcept {
  std::int32_t lo = -1, hi = -1;
  for (const tap& t : taps) {
    if (t.i0 < 0) continue;
    lo = lo < 0 ? t.i0 : std::min(lo, t.i0);
    hi = std::max(hi, t.i1 + 1);
  }
  if (lo < 0) return {0, 0};
  return {static_cast<std::uint32_t>(lo), static_cast<std::uint32_t>(hi)};
}

/// Reusable buffers of render (one per loading thread).
struct render_scratch {
  std::vector<tap> ytaps;           ///< taps of the output rows
  std::vector<tap> xtaps;           ///< taps of the output columns
  std::vector<std::int32_t> row0;   ///< a horizontally interpolated source row (×2048)
  std::vector<std::int32_t> row1;   ///< the next one
};

/// The part of the source image that rendering `v` reads (empty when the view is all padding).
inline pixel_rect needed_region(const image_view& v, render_scratch& s) {
  axis_taps(v.y, v.height, v.source_height, s.ytaps);
  axis_taps(v.x, v.width, v.source_width, s.xtaps);
  const auto [y0, y1] = taps_span(s.ytaps);
  const auto [x0, x1] = taps_span(s.xtaps);
  if (y1 <= y0 || x1 <= x0) return {};
  return {x0, y0, x1 - x0, y1 - y0};
}

/// True when view v reads the source unchanged (the whole image, no scaling or mirroring).
inline bool is_identity(const image_view& v) noexcept {
  return v.height == v.source_height && v.width == v.source_width && v.y.offset == 0 && v.y.step == 1 &&
         v.x.offset == 0 && v.x.step == 1;
}

/// Horizontally interpolates source row `sy` (relative to the region) into `out` (×2048), one
/// value per output column and channel, interleaved. C: the channels (0: img.channels at run time).
template <std::uint32_t C>
void interpolate_row(const decoded_sample& img, std::uint32_t sy, const std::vector<tap>& xt, std::vector<std::int32_t>& out) {
  const std::uint32_t c = C ? C : img.channels, rw = img.region.width, rx = img.region.x;
  const std::uint8_t* row = img.pixels.data() + static_cast<std::size_t>(sy) * rw * c;
  out.resize(xt.size() * c);
  std::int32_t* o = out.data();
  const tap* t = xt.data();
  for (std::size_t x = 0, n = xt.size(); x < n; ++x, o += c) {
    if (t[x].i0 < 0) {
      for (std::uint32_t k = 0; k < c; ++k) o[k] = 0;
      continue;
    }
    const std::uint8_t* p0 = row + static_cast<std::size_t>(static_cast<std::uint32_t>(t[x].i0) - rx) * c;
    const std::uint8_t* p1 = row + static_cast<std::size_t>(static_cast<std::uint32_t>(t[x].i1) - rx) * c;
    const std::int32_t w1 = t[x].w, w0 = weight_one - w1;
    for (std::uint32_t k = 0; k < c; ++k) o[k] = p0[k] * w0 + p1[k] * w1;
  }
}

/// The rows of render for C channels (0: any number, read at run time).
template <std::uint32_t C>
void render_rows(const decoded_sample& img, const image_view& v, std::uint8_t* dst, render_scratch& s) {
  const std::uint32_t c = C ? C : img.channels, h = v.height, w = v.width;
  const std::size_t plane = static_cast<std::size_t>(h) * w;
  std::int32_t have0 = -1, have1 = -1;  // source rows held in s.row0 / s.row1
  constexpr int round_one = 1 << (2 * weight_bits - 1), round_row = 1 << (weight_bits - 1);
  for (std::uint32_t y = 0; y < h; ++y) {
    const tap& t = s.ytaps[y];
    std::uint8_t* out = dst + static_cast<std::size_t>(y) * w;
    if (t.i0 < 0) {
      for (std::uint32_t k = 0; k < c; ++k) std::fill_n(out + k * plane, w, std::uint8_t{0});
      continue;
    }
    // Keep the two interpolated rows this output row needs (consecutive outputs share them).
    if (have0 != t.i0) {
      if (have1 == t.i0) {
        std::swap(s.row0, s.row1);
        std::swap(have0, have1);
      } else {
        interpolate_row<C>(img, static_cast<std::uint32_t>(t.i0) - img.region.y, s.xtaps, s.row0);
        have0 = t.i0;
      }
    }
    const std::int32_t* r0 = s.row0.data();
    if (t.w == 0) {
      for (std::uint32_t k = 0; k < c; ++k) {
        std::uint8_t* o = out + k * plane;
        for (std::uint32_t x = 0; x < w; ++x) o[x] = static_cast<std::uint8_t>((r0[x * c + k] + round_row) >> weight_bits);
      }
      continue;
    }
    if (have1 != t.i1) {
      interpolate_row<C>(img, static_cast<std::uint32_t>(t.i1) - img.region.y, s.xtaps, s.row1);
      have1 = t.i1;
    }
    const std::int32_t* r1 = s.row1.data();
    const std::int32_t w1 = t.w, w0 = weight_one - t.w;
    for (std::uint32_t k = 0; k < c; ++k) {
      std::uint8_t* o = out + k * plane;
      for (std::uint32_t x = 0; x < w; ++x)
        o[x] = static_cast<std::uint8_t>((r0[x * c + k] * w0 + r1[x * c + k] * w1 + round_one) >> (2 * weight_bits));
    }
  }
}

/// Renders view `v` of `img` into dst as channels × v.height × v.width uint8 (channels-first).
/// Requires the taps in `s` to be those of needed_region(v, s) and img.region to cover what they read.
inline void render(const decoded_sample& img, const image_view& v, std::uint8_t* dst, render_scratch& s) {
  const std::uint32_t c = img.channels, h = v.height, w = v.width;
  const std::size_t plane = static_cast<std::size_t>(h) * w;
  if (is_identity(v)) {  // the whole image is read: the taps are not made
    if (img.region.x != 0 || img.region.y != 0 || img.region.width != w || img.region.height != h)
      throw data_error("lockstep::data: a decoder returned pixels " + std::to_string(img.region.x) + "," +
                       std::to_string(img.region.y) + "+" + std::to_string(img.region.width) + "x" +
                       std::to_string(img.region.height) + " where the image stages read the whole image");
    const std::uint8_t* src = img.pixels.data();
    if (c == 1) {
      std::copy_n(src, plane, dst);
    } else {
      for (std::uint32_t k = 0; k < c; ++k)
        for (std::size_t i = 0; i < plane; ++i) dst[k * plane + i] = src[i * c + k];
    }
    return;
  }
  // Checks the region covers what the taps read (an internal guarantee of the decoders).
  const auto [ys0, ys1] = taps_span(s.ytaps);
  const auto [xs0, xs1] = taps_span(s.xtaps);
  if (ys1 > ys0 && xs1 > xs0 &&
      (ys0 < img.region.y || ys1 > img.region.y + img.region.height || xs0 < img.region.x ||
       xs1 > img.region.x + img.region.width))
    throw data_error("lockstep::data: a decoder returned pixels " + std::to_string(img.region.x) + "," +
                     std::to_string(img.region.y) + "+" + std::to_string(img.region.width) + "x" +
                     std::to_string(img.region.height) + " that do not cover the region the image stages read");
  if (c == 3)
    render_rows<3>(img, v, dst, s);
  else if (c == 1)
    render_rows<1>(img, v, dst, s);
  else
    render_rows<0>(img, v, dst, s);
}

}  // namespace detail
}  // namespace lockstep::data
