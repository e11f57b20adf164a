#pragma once
/// @file generator.hpp
/// `generator<T>`: a lazy, move-only, synchronous C++20 coroutine that models
/// `std::ranges::input_range`. It is `std::generator<T>` where the standard library has it.
///
/// Rationale (cppcoro, P2502): the body starts on the first `begin()`, every `co_yield` hands one
/// value to the consumer, which may move it out (`*it` is an lvalue reference to the yielded
/// object, valid until the next increment); an exception escaping the body is rethrown from
/// `begin()` or `++it`; destroying the generator half-way destroys the frame and so every local
/// of the body. `co_await` is not allowed inside a generator (await_transform is deleted) and the
/// iterator has no copying post-increment. Write `for (auto&& x : gen)`, which works both with
/// this type and with `std::generator`.

#include <version>

#if defined(__cpp_lib_generator) && __cpp_lib_generator >= 202207L
#include <generator>

namespace lockstep::data {
/// A lazy coroutine range of T (the standard one where available).
template <class T>
using generator = std::generator<T>;
}  // namespace lockstep::data

#else

#include <coroutine>
#include <cstddef>
#include <exception>
#include <iterator>
#include <memory>
#include <ranges>
#include <type_traits>
#include <utility>

namespace lockstep::data {

/// A lazy, move-only coroutine range of T; `*it` is `T&` (for a non-reference T) that the
/// consumer may move from.
/// @tparam T the yielded value type, or a reference type to yield references.
template <class T>
class [[nodiscard]] generator {
public:
  /// The element type (what `std::ranges::range_value_t` reports).
  using value_type = std::remove_cvref_t<T>;
  /// What dereferencing the iterator gives.
  using reference = std::conditional_t<std::is_reference_v<T>, T, T&>;

  /// The coroutine promise: keeps a pointer to the current yielded object and any exception.
  class promise_type {
  public:
    /// Creates the owning generator object for a new coroutine frame.
    generator get_return_object() noexcept {
      return generator{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    /// Lazy start: the body runs on the first `begin()`.
    std::suspend_always initial_suspend() const noexcept { return {}; }
    /// Stays suspended at the end so the iterator can see `done()`.
    std::suspend_always final_suspend() const noexcept { return {}; }

    /// Yields an rvalue (or lvalue, for reference T): the object lives in the coroutine frame
    /// until the consumer increments, so no copy is made.
    std::suspend_always yield_value(std::remove_reference_t<reference>&& value) noexcept
      requires(!std::is_reference_v<T>)
    {
      current_ = std::addressof(value);
      return {};
    }
    /// Yields a reference for a reference-typed generator.
    std::suspend_always yield_value(reference value) noexcept
      requires std::is_reference_v<T>
    {
      current_ = std::addressof(value);
      return {};
    }

    /// Holds a copy of an lvalue yielded from a value generator for as long as it is current.
    struct copy_awaiter {
      value_type value;         ///< the copy the consumer sees
      promise_type* promise;    ///< the promise to point at the copy
      /// Never ready: always suspends to hand the copy over.
      bool await_ready() const noexcept { return false; }
      /// Publishes the copy's address before suspending.
      void await_suspend(std::coroutine_handle<>) noexcept { promise->current_ = std::addressof(value); }
      /// Nothing to return on resumption.
      void await_resume() const noexcept {}
    };
    /// Yields a const lvalue of a value generator by copying it into the frame.
    copy_awaiter yield_value(const value_type& value) noexcept(std::is_nothrow_copy_constructible_v<value_type>)
      requires(!std::is_reference_v<T> && std::is_copy_constructible_v<value_type>)
    {
      return copy_awaiter{value, this};
    }

    /// A synchronous generator cannot await anything.
    template <class U>
    std::suspend_never await_transform(U&&) = delete;

    /// Nothing to do: the end of the body ends the range.
    void return_void() const noexcept {}
    /// Keeps the exception to rethrow it at the consumer.
    void unhandled_exception() noexcept { exception_ = std::current_exception(); }

    /// Rethrows a stored exception (once).
    void rethrow_if_failed() {
      if (exception_) std::rethrow_exception(std::exchange(exception_, nullptr));
    }
    /// The current value.
    [[nodiscard]] reference value() const noexcept { return static_cast<reference>(*current_); }

  private:
    std::add_pointer_t<reference> current_ = nullptr;
    std::exception_ptr exception_;
  };

  /// Input iterator over the values; compare with `std::default_sentinel`.
  class iterator {
  public:
    /// Iterator category tag (input only).
    using iterator_concept = std::input_iterator_tag;
    /// Distance type (required by `weakly_incrementable`).
    using difference_type = std::ptrdiff_t;
    /// The element type.
    using value_type = generator::value_type;

    /// A singular iterator.
    iterator() noexcept = default;
    /// Move-only, like the generator.
    iterator(iterator&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
    /// Move assignment.
    iterator& operator=(iterator&& other) noexcept {
      handle_ = std::exchange(other.handle_, nullptr);
      return *this;
    }

    /// The current value; valid until the next increment.
    [[nodiscard]] reference operator*() const noexcept { return handle_.promise().value(); }
    /// Resumes the body to produce the next value; rethrows what the body threw.
    iterator& operator++() {
      handle_.resume();
      if (handle_.done()) handle_.promise().rethrow_if_failed();
      return *this;
    }
    /// Post-increment advances but returns nothing (an input iterator cannot be copied).
    void operator++(int) { ++*this; }
    /// True when the body has finished.
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept {
      return !it.handle_ || it.handle_.done();
    }

  private:
    friend class generator;
    explicit iterator(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
    std::coroutine_handle<promise_type> handle_ = nullptr;
  };

  /// An empty generator (already finished).
  generator() noexcept = default;
  /// Takes over the frame.
  generator(generator&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  /// Destroys the current frame and takes over another.
  generator& operator=(generator&& other) noexcept {
    if (this != &other) {
      if (handle_) destroy_frame(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  generator(const generator&) = delete;
  generator& operator=(const generator&) = delete;
  /// Destroys the coroutine frame (and so every live local of the body).
  ~generator() {
    if (handle_) destroy_frame(handle_);
  }

  /// Starts the body and returns an iterator to the first value. Call once.
  iterator begin() {
    if (handle_) {
      handle_.resume();
      if (handle_.done()) handle_.promise().rethrow_if_failed();
    }
    return iterator{handle_};
  }
  /// The end sentinel.
  std::default_sentinel_t end() const noexcept { return {}; }

private:
  explicit generator(std::coroutine_handle<promise_type> h) noexcept : handle_(h) {}
  // Out of line on purpose: when clang 14 (-O2) sees the destroy, it elides the frame's heap
  // allocation and miscompiles a generator that was moved before being destroyed (the
  // promise's destructor runs on the wrong address). Keeping the destroy opaque keeps the frame
  // on the heap, as a moved generator requires.
  [[gnu::noinline]] static void destroy_frame(std::coroutine_handle<promise_type> h) noexcept { h.destroy(); }
  std::coroutine_handle<promise_type> handle_ = nullptr;
};

}  // namespace lockstep::data

#endif
