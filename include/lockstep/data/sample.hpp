#pragma once
/// @file sample.hpp
/// The element types of a pipeline before batching: `sample`, a cheap view of one row of a
/// decoded dataset, and `owned_sample`, which owns its values (what a user transform returns when
/// it changes the features). Both satisfy `batchable`, which is what `batch(n)` requires.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace lockstep::data {

/// The label value of an unlabelled sample.
inline constexpr std::int32_t no_label = -1;

/// One sample as a view into a decoded dataset (uint8 or float row), plus a pending scale factor
/// that is applied when the row is copied into a batch (so normalising costs no extra pass).
/// Trivially copyable; valid while the dataset or generator that produced it is alive.
struct sample {
  const std::uint8_t* pixels = nullptr;  ///< the row as uint8 (IDX images), or nullptr
  const float* values = nullptr;         ///< the row as float (CSV, memory), or nullptr
  const float* targets = nullptr;        ///< regression targets, or nullptr
  std::uint32_t width = 0;               ///< features in the row
  std::uint32_t target_width = 0;        ///< regression targets per row
  float scale = 1.0f;                    ///< factor applied to every feature when read
  std::int32_t label = no_label;         ///< class label, or no_label
  std::uint64_t index = 0;               ///< position of the sample in its dataset

  /// Feature j with the scale applied.
  [[nodiscard]] float feature(std::size_t j) const noexcept {
    return (pixels ? static_cast<float>(pixels[j]) : values[j]) * scale;
  }
};

/// A sample that owns its features and targets (for transforms that compute new values).
struct owned_sample {
  std::vector<float> features;    ///< the feature values
  std::vector<float> targets;     ///< regression targets (may be empty)
  std::int32_t label = no_label;  ///< class label, or no_label
  std::uint64_t index = 0;        ///< position of the sample in its dataset

  /// An empty sample.
  owned_sample() = default;
  /// Materialises a view (scale applied).
  explicit owned_sample(const sample& s)
      : features(s.width), targets(s.targets, s.targets + s.target_width), label(s.label), index(s.index) {
    for (std::size_t j = 0; j < s.width; ++j) features[j] = s.feature(j);
  }
};

/// Number of features of a sample.
inline std::size_t feature_width(const sample& s) noexcept { return s.width; }
/// Number of features of an owned sample.
inline std::size_t feature_width(const owned_sample& s) noexcept { return s.features.size(); }
/// Number of regression targets of a sample.
inline std::size_t target_width(const sample& s) noexcept { return s.target_width; }
/// Number of regression targets of an owned sample.
inline std::size_t target_width(const owned_sample& s) noexcept { return s.targets.size(); }

namespace detail {
/// The most bytes of one row prefetch_features asks for (the hardware prefetcher follows longer
/// rows on its own).
inline constexpr std::size_t prefetch_bytes = 4096;

// Blocks of a fixed 16 elements let the compiler vectorise at -O2 (no epilogue needed).
inline void convert_row(const std::uint8_t* __restrict__ src, float* __restrict__ dst, std::size_t n,
                        float scale) noexcept {
  std::size_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (std::size_t k = 0; k < 16; ++k) dst[j + k] = static_cast<float>(src[j + k]) * scale;
  for (; j < n; ++j) dst[j] = static_cast<float>(src[j]) * scale;
}
inline void scale_row(const float* __restrict__ src, float* __restrict__ dst, std::size_t n, float scale) noexcept {
  std::size_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (std::size_t k = 0; k < 16; ++k) dst[j + k] = src[j + k] * scale;
  for (; j < n; ++j) dst[j] = src[j] * scale;
}
}  // namespace detail

/// Writes the (scaled) features of a sample to dst[0 .. feature_width(s)).
inline void copy_features(const sample& s, float* dst) noexcept {
  if (s.pixels) {
    detail::convert_row(s.pixels, dst, s.width, s.scale);
  } else if (s.scale == 1.0f) {
    if (s.width) std::memcpy(dst, s.values, s.width * sizeof(float));
  } else {
    detail::scale_row(s.values, dst, s.width, s.scale);
  }
}
namespace detail {
/// Asks the CPU to load the cache lines of the first min(bytes, prefetch_bytes) bytes at p.
inline void prefetch_row(const void* p, std::size_t bytes) noexcept {
  if (!p || bytes == 0) return;
  const auto first = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t end = first + std::min(bytes, prefetch_bytes);
  for (std::uintptr_t at = first & ~std::uintptr_t{63}; at < end; at += 64) {
    const char* line = reinterpret_cast<const char*>(at);
#if defined(__x86_64__) || defined(__i386__)
    // volatile: a loop of __builtin_prefetch with a run-time count has no effect the compiler must
    // keep, and g++ -O2 deletes it
    asm volatile("prefetcht0 %0" : : "m"(*line));
#else
    __builtin_prefetch(line);
#endif
  }
}
}  // namespace detail

/// Starts loading the first bytes of a sample's feature row into the cache (at most
/// `detail::prefetch_bytes`), for a stage that knows which sample it will hand on next, such as
/// `shuffle`, whose picks jump through the whole data set. A hint only: it changes no value.
inline void prefetch_features(const sample& s) noexcept {
  if (s.pixels)
    detail::prefetch_row(s.pixels, s.width);
  else
    detail::prefetch_row(s.values, s.width * sizeof(float));
}
/// The same for an owned sample's features.
inline void prefetch_features(const owned_sample& s) noexcept {
  detail::prefetch_row(s.features.data(), s.features.size() * sizeof(float));
}
/// Writes the features of an owned sample to dst.
inline void copy_features(const owned_sample& s, float* dst) noexcept {
  std::copy(s.features.begin(), s.features.end(), dst);
}
/// Writes the targets of a sample to dst.
inline void copy_targets(const sample& s, float* dst) noexcept { std::copy_n(s.targets, s.target_width, dst); }
/// Writes the targets of an owned sample to dst.
inline void copy_targets(const owned_sample& s, float* dst) noexcept {
  std::copy(s.targets.begin(), s.targets.end(), dst);
}

/// What `batch(n)` can assemble: a row of features, optional targets, a label and a dataset index.
template <class S>
concept batchable = requires(const S& s, float* dst) {
  { feature_width(s) } -> std::convertible_to<std::size_t>;
  { target_width(s) } -> std::convertible_to<std::size_t>;
  copy_features(s, dst);
  copy_targets(s, dst);
  { s.label } -> std::convertible_to<std::int32_t>;
  { s.index } -> std::convertible_to<std::uint64_t>;
};

class sample_recipe;

/// One element of an index-first pipeline before batching (indexed.hpp): which sample, and how to
/// load it. Nothing is read or decoded until the batch it joins is cut into shards. Trivially
/// copyable; `how` is valid while the dataset that produced the reference lives.
struct sample_ref {
  std::uint64_t index = 0;             ///< dataset index
  std::uint64_t epoch = 0;             ///< the source epoch that produced it (keys the random image stages)
  std::int32_t label = no_label;       ///< the label when the source's index knows it, else no_label
  std::uint32_t group = 0;             ///< the source's group (tar shard, folder), for interleave
  float scale = 1.0f;                  ///< factor applied when the row is converted to float
  const sample_recipe* how = nullptr;  ///< how to load it
};

/// The transform `x -> x * factor` for `map`: on a view sample it only records the factor (applied
/// when the batch is assembled), on owned samples and plain numbers it multiplies.
struct scale_fn {
  float factor = 1.0f;  ///< the multiplier
  /// Records the factor on a view (no pass over the data).
  sample operator()(sample s) const noexcept {
    s.scale *= factor;
    return s;
  }
  /// Records the factor on an index-first sample (applied when its row is converted to float).
  sample_ref operator()(sample_ref s) const noexcept {
    s.scale *= factor;
    return s;
  }
  /// Multiplies the features of an owned sample.
  owned_sample operator()(owned_sample s) const noexcept {
    for (float& v : s.features) v *= factor;
    return s;
  }
  /// Multiplies one number.
  float operator()(float v) const noexcept { return v * factor; }
};

/// Normalising transform for `map`, e.g. `map(scale(1.0f / 255))` turns uint8 pixels into [0, 1].
inline scale_fn scale(float factor) noexcept { return scale_fn{factor}; }

}  // namespace lockstep::data
