#pragma once
/// @file buckets.hpp
/// Gradient buckets: the flat gradient buffer cut, in reverse layer order, into contiguous runs of
/// whole top-level layers of at least `bucket_bytes` each. A bucket is complete when the backward
/// pass finishes its first (lowest) layer, so its all-reduce can start while the layers below it
/// still compute. Layer boundaries come from the bound network's constexpr `param_offsets` and
/// `params`; `plan_buckets` is constexpr too.

#include <array>
#include <cstddef>
#include <utility>

namespace lockstep {

/// One bucket: top-level layers [first_layer, last_layer] and their gradients [offset, offset + count).
struct gradient_bucket {
  std::size_t first_layer = 0;  ///< lowest layer in the bucket (its backward completes the bucket)
  std::size_t last_layer = 0;   ///< highest layer in the bucket
  std::size_t offset = 0;       ///< first gradient element
  std::size_t count = 0;        ///< gradient elements
};

namespace detail {

/// Top-level layer table of a bound network: a sequential's layers, or the network as one layer.
template <class Bound>
struct layer_table {
  static constexpr std::size_t count = 1;
  static constexpr std::array<std::size_t, 1> offsets{0};
  static constexpr std::array<std::size_t, 1> params{Bound::param_count};
};
template <class Bound>
  requires requires { Bound::layer_count; Bound::param_offsets; Bound::params; }
struct layer_table<Bound> {
  static constexpr std::size_t count = Bound::layer_count;
  static constexpr auto offsets = Bound::param_offsets;
  static constexpr auto params = Bound::params;
};

}  // namespace detail

/// The buckets of a network with L top-level layers.
template <std::size_t L>
struct bucket_layout {
  std::array<gradient_bucket, L> buckets{};  ///< buckets in the order they complete (reverse layers)
  std::size_t size = 0;                      ///< number of buckets used
  std::array<std::size_t, L> completes{};    ///< per layer: 1 + the bucket its backward completes, or 0

  /// Number of top-level layers.
  static constexpr std::size_t layers = L;
};

/// Buckets of bound network Bound with elements of type T: walking layers from last to first, a
/// bucket closes once it holds at least `bucket_bytes` (0: every layer with parameters is its own
/// bucket), and at layer 0. Layers without parameters join the bucket below them.
template <class Bound, class T = float>
constexpr bucket_layout<detail::layer_table<Bound>::count> plan_buckets(std::size_t bucket_bytes) noexcept {
  using table = detail::layer_table<Bound>;
  bucket_layout<table::count> out{};
  std::size_t count = 0, last = table::count - 1;
  for (std::size_t k = table::count; k-- > 0;) {
    count += table::params[k];
    if (count > 0 && (count * sizeof(T) >= bucket_bytes || k == 0)) {
      out.buckets[out.size] = gradient_bucket{k, last, table::offsets[k], count};
      out.completes[k] = ++out.size;
      count = 0;
      last = k - (k > 0 ? 1 : 0);
    }
  }
  return out;
}

/// The part [first, second) of the gradient run [offset, offset + count) (a bucket) that lies in
/// `slice` (a replica's slice of the parameters): empty (first == second) when they do not meet.
/// A reducer that reduces each bucket onto the slices (reduces_to_slices_v) sums each part into
/// its slice's replica; the parts over a partition of the parameters partition the bucket.
[[nodiscard]] constexpr std::pair<std::size_t, std::size_t> bucket_part(
    std::size_t offset, std::size_t count, std::pair<std::size_t, std::size_t> slice) noexcept {
  const std::size_t lo = offset > slice.first ? offset : slice.first;
  const std::size_t end = offset + count;
  const std::size_t hi = end < slice.second ? end : slice.second;
  return lo < hi ? std::pair<std::size_t, std::size_t>{lo, hi} : std::pair<std::size_t, std::size_t>{lo, lo};
}

}  // namespace lockstep
