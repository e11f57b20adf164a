#pragma once
/// @file views.hpp
/// `rows_view<T, Shape, Kind>`: the typed view of a batch that layers and losses receive — its row
/// shape fixed at compile time, its row count at run time, the device kind it lives on in its
/// type. A view owns nothing and is trivially copyable.

#include <cstddef>
#include <type_traits>

#include <lockstep/core/device.hpp>
#include <lockstep/core/shape.hpp>

namespace lockstep {

/// Which memory device kind Kind has (defined in memory/resource.hpp; rows_view asks it only
/// when a host-side element access is instantiated).
template <class Kind>
struct device_memory;

namespace detail {
/// The kind of context Ctx: its `kind_type` (or `device_kind`, the former spelling).
template <class Ctx>
struct kind_of_context {
  using type = typename Ctx::kind_type;  ///< the kind
};
template <class Ctx>
  requires(!requires { typename Ctx::kind_type; } && requires { typename Ctx::device_kind; })
struct kind_of_context<Ctx> {
  using type = typename Ctx::device_kind;  ///< the kind, under the former spelling
};
}  // namespace detail

/// The device kind an execution context runs on (its `kind_type` member: cpus for host_context,
/// gpus for cuda_context).
template <class Ctx>
using kind_of_context_t = typename detail::kind_of_context<std::remove_cvref_t<Ctx>>::type;

/// `rows()` rows of a batch, each one `Shape` of T stored contiguously (row-major; an image row
/// `shape<C, H, W>` is channel-major), on device kind Kind. A view whose data is null is empty:
/// backward receives an empty input-gradient view when nobody needs that gradient.
template <class T, class Shape, class Kind>
class rows_view {
  static_assert(shape_type<Shape>, "lockstep::rows_view: Shape must be a lockstep::shape<...>");

public:
  using element_type = T;    ///< element type (const T for a read-only view)
  using shape_type = Shape;  ///< the shape of one row
  using kind_type = Kind;  ///< where the elements live
  static constexpr std::size_t width = Shape::size;  ///< elements per row

  /// An empty view (no data, no rows).
  constexpr rows_view() noexcept = default;
  /// `rows` rows starting at `data` (device memory of Kind).
  constexpr rows_view(T* data, std::size_t rows) noexcept : data_(data), rows_(rows) {}
  /// A read-only view of a writable one.
  template <class U>
    requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
  constexpr rows_view(const rows_view<U, Shape, Kind>& o) noexcept  // NOLINT: implicit like T* -> const T*
      : data_(o.data()), rows_(o.rows()) {}

  /// The first element (device memory of Kind; null for an empty view).
  [[nodiscard]] constexpr T* data() const noexcept { return data_; }
  /// Rows in the view (the batch, or this replica's shard of it).
  [[nodiscard]] constexpr std::size_t rows() const noexcept { return rows_; }
  /// Elements in the view: rows() * width.
  [[nodiscard]] constexpr std::size_t size() const noexcept { return rows_ * width; }
  /// True when the view has no data (an input gradient nobody asked for).
  [[nodiscard]] constexpr bool empty() const noexcept { return data_ == nullptr; }
  /// True when the view has data.
  constexpr explicit operator bool() const noexcept { return data_ != nullptr; }
  /// The first element of row r.
  [[nodiscard]] constexpr T* row(std::size_t r) const noexcept { return data_ + r * width; }
  /// Rows [first, first + count) of this view.
  [[nodiscard]] constexpr rows_view rows_from(std::size_t first, std::size_t count) const noexcept {
    return {data_ + first * width, count};
  }
  /// The same rows seen with another row shape of the same size (a reshape).
  template <class S>
  [[nodiscard]] constexpr rows_view<T, S, Kind> as() const noexcept {
    static_assert(S::size == Shape::size, "lockstep::rows_view::as: the new row shape must have the same size");
    return {data_, rows_};
  }
  /// Element (r, i...) of a row of shape<D...> with sizeof...(i) == rank (host memory only).
  template <class... I>
    requires(sizeof...(I) == Shape::rank && (std::is_convertible_v<I, std::size_t> && ...))
  [[nodiscard]] constexpr T& operator()(std::size_t r, I... i) const noexcept {
    static_assert(device_memory<Kind>::host_accessible,
                  "lockstep::rows_view: elements of device memory cannot be read on the host; pass data() to a kernel");
    std::size_t offset = 0, d = 0;
    ((offset = offset * Shape::dims[d++] + static_cast<std::size_t>(i)), ...);
    return data_[r * width + offset];
  }

private:
  T* data_ = nullptr;
  std::size_t rows_ = 0;
};

}  // namespace lockstep
