#pragma once
/// @file device.hpp
/// RAII for CUDA devices, streams, events and pinned host memory: `device_guard` restores the
/// calling thread's current device, `cuda_stream` and `cuda_event` own their handles, and
/// `pinned_buffer<T>` owns page-locked host memory for asynchronous copies.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include <lockstep/backend/cuda/error.hpp>
#include <lockstep/core/error.hpp>

namespace lockstep::backend {

/// Number of CUDA devices usable by this process (0 when there is no driver or no device; never throws).
inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the error so later calls are not poisoned
    return 0;
  }
  return n;
}

/// Why no CUDA device is usable ("" when at least one is): CUDA's own message, for skip notes.
inline std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t s = cudaGetDeviceCount(&n);
  if (s != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string(cudaGetErrorName(s)) + ": " + cudaGetErrorString(s);
  }
  return n > 0 ? std::string() : std::string("the CUDA runtime reports 0 devices");
}

/// Makes `ordinal` the calling thread's current device for its lifetime, then restores the previous one.
class device_guard {
public:
  /// Switches to device `ordinal` when it is not current already.
  explicit device_guard(int ordinal) {
    LOCKSTEP_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != ordinal) LOCKSTEP_CUDA_CHECK(cudaSetDevice(ordinal));
    switched_ = previous_ != ordinal;
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  /// Restores the device that was current at construction.
  ~device_guard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }

private:
  int previous_ = 0;
  bool switched_ = false;
};

/// An owned non-blocking CUDA stream on the device current at construction (move-only).
class cuda_stream {
public:
  /// Creates the stream on the current device.
  cuda_stream() { LOCKSTEP_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  /// Takes the other's stream.
  cuda_stream(cuda_stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  /// Destroys this stream and takes the other's.
  cuda_stream& operator=(cuda_stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  ~cuda_stream() { reset(); }
  /// The raw handle.
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }
  /// Blocks the host until the stream's queued work is done.
  void synchronize() const { LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s_)); }

private:
  void reset() noexcept {
    if (s_) (void)cudaStreamDestroy(s_);
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

/// An owned CUDA event without timing (for ordering streams), or with timing when asked (move-only).
class cuda_event {
public:
  /// Creates the event on the current device; `timing` enables cudaEventElapsedTime.
  explicit cuda_event(bool timing = false) {
    LOCKSTEP_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  /// Takes the other's event.
  cuda_event(cuda_event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  /// Destroys this event and takes the other's.
  cuda_event& operator=(cuda_event&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
    }
    return *this;
  }
  ~cuda_event() { reset(); }
  /// The raw handle.
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }
  /// Records the event at the current end of stream s.
  void record(cudaStream_t s) const { LOCKSTEP_CUDA_CHECK(cudaEventRecord(e_, s)); }
  /// Makes stream s wait (on the device) for the last record of this event.
  void wait_on(cudaStream_t s) const { LOCKSTEP_CUDA_CHECK(cudaStreamWaitEvent(s, e_, 0)); }
  /// Blocks the host until the last record of this event has completed.
  void synchronize() const { LOCKSTEP_CUDA_CHECK(cudaEventSynchronize(e_)); }

private:
  void reset() noexcept {
    if (e_) (void)cudaEventDestroy(e_);
    e_ = nullptr;
  }
  cudaEvent_t e_ = nullptr;
};

/// Page-locked host memory for `size()` elements of T, the source of asynchronous host-to-device
/// copies (move-only; never value-initialised).
template <class T>
class pinned_buffer {
public:
  /// An empty buffer.
  pinned_buffer() noexcept = default;
  /// A buffer of n elements.
  explicit pinned_buffer(std::size_t n) : size_(n) {
    if (n > 0) {
      void* p = nullptr;
      LOCKSTEP_CUDA_CHECK(cudaMallocHost(&p, n * sizeof(T)));
      data_ = static_cast<T*>(p);
    }
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  /// Takes the other's memory.
  pinned_buffer(pinned_buffer&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  /// Frees this memory and takes the other's.
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~pinned_buffer() { reset(); }
  /// First element.
  [[nodiscard]] T* data() noexcept { return data_; }
  /// First element.
  [[nodiscard]] const T* data() const noexcept { return data_; }
  /// Element count.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

private:
  void reset() noexcept {
    if (data_) (void)cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Queues a copy of `bytes` bytes from `src` on device `src_dev` to `dst` on device `dst_dev` on
/// stream `s`: a device-to-device copy on one GPU, a peer copy between GPUs (CUDA routes it
/// through the host when peer access is not enabled).
inline void copy_device_bytes(void* dst, int dst_dev, const void* src, int src_dev, std::size_t bytes, cudaStream_t s) {
  if (bytes == 0) return;
  if (dst_dev == src_dev)
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
  else
    LOCKSTEP_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, bytes, s));
}

}  // namespace lockstep::backend
