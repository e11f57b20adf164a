#pragma once
/// @file buffer.hpp
/// `buffer<T, Device>` (`basic_buffer<T, Kind>`): an owning, aligned, move-only array on a device, and the trivially
/// copyable views that kernels and reducers take.

#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <utility>

#include <lockstep/core/device.hpp>
#include <lockstep/memory/resource.hpp>

namespace lockstep {

/// An owning array of `size()` trivially copyable T on device kind Kind: aligned, move-only,
/// never value-initialised (first touch is the caller's job: fill or copy into it). A buffer made
/// by borrowed() views memory that something else owns and never frees it.
template <class T, class Kind>
class basic_buffer {
  static_assert(std::is_trivially_copyable_v<T>, "lockstep::buffer holds trivially copyable elements");

public:
  using value_type = T;   ///< element type
  using device_type = Kind;  ///< the device kind the elements live on

  /// An empty buffer.
  basic_buffer() noexcept = default;
  /// A buffer of n uninitialised elements.
  explicit basic_buffer(std::size_t n) : data_(static_cast<T*>(device_memory<Kind>::allocate(n * sizeof(T)))), size_(n) {}
  basic_buffer(const basic_buffer&) = delete;
  basic_buffer& operator=(const basic_buffer&) = delete;
  /// Takes the other buffer's memory; the other becomes empty.
  basic_buffer(basic_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), owns_(std::exchange(o.owns_, true)) {}
  /// Frees this buffer's memory and takes the other's.
  basic_buffer& operator=(basic_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      owns_ = std::exchange(o.owns_, true);
    }
    return *this;
  }
  /// A buffer over `n` elements at `data` (memory of kind Kind) that another owner keeps alive
  /// for the buffer's lifetime; the buffer never frees it (a shared-memory window's, for example).
  [[nodiscard]] static basic_buffer borrowed(T* data, std::size_t n) noexcept {
    basic_buffer b;
    b.data_ = data;
    b.size_ = n;
    b.owns_ = false;
    return b;
  }
  /// True unless the buffer was made by borrowed().
  [[nodiscard]] bool owns_memory() const noexcept { return owns_; }
  ~basic_buffer() { release(); }

  /// Pointer to the first element (nullptr when empty).
  [[nodiscard]] T* data() noexcept { return data_; }
  /// Pointer to the first element (nullptr when empty).
  [[nodiscard]] const T* data() const noexcept { return data_; }
  /// Element count.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  /// True when the buffer holds no elements.
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }

  /// The elements as a span (host buffers only).
  [[nodiscard]] std::span<T> span() noexcept requires device_memory<Kind>::host_accessible { return {data_, size_}; }
  /// The elements as a read-only span (host buffers only).
  [[nodiscard]] std::span<const T> span() const noexcept requires device_memory<Kind>::host_accessible { return {data_, size_}; }
  /// Element i (host buffers only; no bounds check).
  [[nodiscard]] T& operator[](std::size_t i) noexcept requires device_memory<Kind>::host_accessible { return data_[i]; }
  /// Element i (host buffers only; no bounds check).
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept requires device_memory<Kind>::host_accessible { return data_[i]; }

  /// Makes room for at least n elements, discarding the contents when it must grow; never shrinks,
  /// so a steady state that asks for the same size allocates nothing.
  void reserve_discard(std::size_t n) {
    if (n > size_) *this = basic_buffer(n);
  }

private:
  void release() noexcept {
    if (owns_) device_memory<Kind>::deallocate(data_, size_ * sizeof(T));
    data_ = nullptr;
    size_ = 0;
    owns_ = true;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  bool owns_ = true;  // false: borrowed(), someone else frees the memory
};

/// An owning array of T on device D (a tag such as cpu<I>, or a kind): one type per kind, so
/// `buffer<float, cpu<0>>` and `buffer<float, cpu<5>>` are the same type.
template <class T, class D>
using buffer = basic_buffer<T, kind_of_t<D>>;

}  // namespace lockstep
