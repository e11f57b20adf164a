#pragma once
/// @file shape.hpp
/// `shape<Dims...>`: the compile-time shape of one row (one sample) of a layer's input or output.
/// A flat row of N features is `shape<N>`; an image is `shape<C, H, W>`, stored channel-major
/// (NCHW: channel, then row, then column, the batch outermost). Rows are always contiguous, so a
/// layer that only needs a width sees `shape<...>::size`.

#include <array>
#include <cstddef>
#include <type_traits>

namespace lockstep {

/// The shape of one sample: Dims... outermost first (`shape<C, H, W>` for an NCHW image).
template <std::size_t... Dims>
struct shape {
  static_assert(sizeof...(Dims) > 0, "lockstep::shape needs at least one dimension");
  static constexpr std::size_t rank = sizeof...(Dims);                  ///< number of dimensions
  static constexpr std::size_t size = (Dims * ...);                     ///< elements per sample
  static constexpr std::array<std::size_t, rank> dims{Dims...};         ///< the dimensions
};

namespace detail {
template <class S>
struct is_shape : std::false_type {};
template <std::size_t... Dims>
struct is_shape<shape<Dims...>> : std::true_type {};
}  // namespace detail

/// True for the `shape<...>` types.
template <class S>
concept shape_type = detail::is_shape<S>::value;

/// True for a rank-3 shape, an image `shape<C, H, W>`.
template <class S>
concept image_shape = shape_type<S> && S::rank == 3;

/// Output size of a convolution or pooling window along one axis: floor((in + 2 pad - k) / stride) + 1,
/// or 0 when the window does not fit.
constexpr std::size_t window_output(std::size_t in, std::size_t kernel, std::size_t stride, std::size_t pad) noexcept {
  return in + 2 * pad < kernel || stride == 0 ? 0 : (in + 2 * pad - kernel) / stride + 1;
}

}  // namespace lockstep
