#pragma once
/// @file allocations.hpp
/// Opt-in counting of heap allocations for the conformance suites. In exactly ONE file of a test
/// binary, write
///
///     #define LOCKSTEP_TESTING_COUNT_ALLOCATIONS
///     #include <lockstep/testing/layer.hpp>
///
/// That file replaces the global operator new and delete with counting versions (so no other file
/// of the binary may replace them), and the layer suite instantiated in it also checks that a
/// second forward and backward of the same batch size allocate nothing. Without the macro this
/// header declares nothing.
///
/// In the LOCKSTEP_HOST_GEMM=onednn build, oneDNN itself allocates a few small blocks inside
/// every primitive execution (oneDNN 2.x builds a map of the arguments per call). Those
/// allocations, recognised by the calling code's address lying in the oneDNN library, are counted
/// apart (allocation_window::onednn_count), so that count() still says whether lockstep (or the
/// code under test) allocated.

#if defined(LOCKSTEP_TESTING_COUNT_ALLOCATIONS)

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
#include <lockstep/backend/host/onednn_gemm.hpp>
#endif

namespace lockstep::testing {

/// The number of operator new calls made by the calling thread, other than oneDNN's own
/// (test-only state).
inline thread_local std::size_t thread_allocations = 0;
/// The number of operator new calls made by oneDNN's code on the calling thread (always 0 unless
/// LOCKSTEP_HOST_GEMM=onednn; test-only state).
inline thread_local std::size_t thread_onednn_allocations = 0;

/// Counts the heap allocations of the calling thread during its lifetime.
class allocation_window {
public:
  /// Starts counting at zero.
  allocation_window() noexcept : start_(thread_allocations), onednn_start_(thread_onednn_allocations) {}
  /// Allocations made by this thread since the window opened (other than oneDNN's own).
  [[nodiscard]] std::size_t count() const noexcept { return thread_allocations - start_; }
  /// Allocations oneDNN's code made on this thread since the window opened.
  [[nodiscard]] std::size_t onednn_count() const noexcept { return thread_onednn_allocations - onednn_start_; }

private:
  std::size_t start_;
  std::size_t onednn_start_;
};

namespace detail {
/// Counts one allocation requested by the code at `caller`, then allocates.
inline void* counted_allocate(std::size_t n, std::size_t align, [[maybe_unused]] const void* caller) {
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  if (lockstep::backend::detail::onednn_owns_code(caller))
    ++thread_onednn_allocations;
  else
#endif
    ++thread_allocations;
  void* p = nullptr;
  if (align <= alignof(std::max_align_t)) {
    p = std::malloc(n ? n : 1);
  } else {
    const std::size_t rounded = (n + align - 1) / align * align;
    p = std::aligned_alloc(align, rounded ? rounded : align);
  }
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace detail
}  // namespace lockstep::testing

// The replacements (one definition per program: only in the file that defines the macro). Kept out
// of line so that g++ does not pair an inlined free() with the caller's operator new and warn.
[[gnu::noinline]] void* operator new(std::size_t n) {
  return lockstep::testing::detail::counted_allocate(n, alignof(std::max_align_t), __builtin_return_address(0));
}
[[gnu::noinline]] void* operator new[](std::size_t n) {
  return lockstep::testing::detail::counted_allocate(n, alignof(std::max_align_t), __builtin_return_address(0));
}
[[gnu::noinline]] void* operator new(std::size_t n, std::align_val_t a) {
  return lockstep::testing::detail::counted_allocate(n, static_cast<std::size_t>(a), __builtin_return_address(0));
}
[[gnu::noinline]] void* operator new[](std::size_t n, std::align_val_t a) {
  return lockstep::testing::detail::counted_allocate(n, static_cast<std::size_t>(a), __builtin_return_address(0));
}
[[gnu::noinline]] void operator delete(void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
[[gnu::noinline]] void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

#endif
