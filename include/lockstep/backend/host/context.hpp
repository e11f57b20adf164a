#pragma once
/// @file context.hpp
/// The execution context of a host replica: its BLAS thread budget, its precision policy (and, in
/// the LOCKSTEP_HOST_GEMM=onednn build, the replica's cached oneDNN GEMM and convolution primitives). One exists
/// per replica and is passed to every kernel the replica runs (the CUDA context carries a stream
/// and handles).

#include <cblas.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#endif

#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/precision.hpp>

#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
#include <lockstep/backend/host/onednn_conv.hpp>
#include <lockstep/backend/host/onednn_gemm.hpp>
#endif

namespace lockstep {

namespace backend {

/// Number of hardware threads (at least 1).
inline int hardware_threads() noexcept {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

/// The CPUs this process may run on (its affinity mask), in increasing order; empty where the
/// platform cannot tell.
inline std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
#endif
  return cpus;
}

/// Pins the calling thread to CPU `cpu` (best effort: where the system refuses or cannot pin, the
/// thread stays where it may run); returns whether it did.
inline bool pin_this_thread([[maybe_unused]] int cpu) noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
#else
  return false;
#endif
}

/// Keeps the calling thread's floating-point mode (the SSE control register on x86: FTZ and DAZ)
/// and, in the oneDNN build, its OpenMP thread count as they were when it was made, restoring
/// them when it goes: a replica that runs on the caller's thread (host_context::activate and the
/// GEMMs set both) leaves the caller's thread as it found it. Work on the caller's thread that
/// only allocates a replica's memory needs none: it calls backend::place_memory, which leaves
/// the mode alone.
class caller_thread_state {
public:
  /// Records the calling thread's mode and thread count.
  caller_thread_state() noexcept {
#if defined(__x86_64__) || defined(__SSE2__)
    csr_ = _mm_getcsr();
#endif
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN) && DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    omp_threads_ = omp_get_max_threads();
#endif
  }
  caller_thread_state(const caller_thread_state&) = delete;
  caller_thread_state& operator=(const caller_thread_state&) = delete;
  /// Restores them (on the thread that made it); the register's exception flags (bits 0-5) stay
  /// as the work left them.
  ~caller_thread_state() {
#if defined(__x86_64__) || defined(__SSE2__)
    _mm_setcsr((csr_ & ~0x3Fu) | (_mm_getcsr() & 0x3Fu));
#endif
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN) && DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    detail::onednn_set_threads(omp_threads_);
#endif
  }

private:
  [[maybe_unused]] unsigned csr_ = 0;
  [[maybe_unused]] int omp_threads_ = 0;
};

/// Pins the calling thread to CPU `cpu` while it lives, and gives the thread its CPU mask back
/// when it goes (best effort: where the system refuses or cannot pin, nothing changes; a negative
/// `cpu` does nothing). For work that runs for a while on a thread the program owns.
class pin_scope {
public:
  /// Pins the calling thread to `cpu` (none when negative).
  explicit pin_scope([[maybe_unused]] int cpu) noexcept {
#if defined(__linux__)
    pinned_ = cpu >= 0 && pthread_getaffinity_np(pthread_self(), sizeof saved_, &saved_) == 0 && pin_this_thread(cpu);
#endif
  }
  pin_scope(const pin_scope&) = delete;
  pin_scope& operator=(const pin_scope&) = delete;
  /// Restores the thread's mask (on the thread that made it).
  ~pin_scope() {
#if defined(__linux__)
    if (pinned_) (void)pthread_setaffinity_np(pthread_self(), sizeof saved_, &saved_);
#endif
  }

private:
#if defined(__linux__)
  cpu_set_t saved_{};
#endif
  bool pinned_ = false;
};

/// Number of cores this process may run on (its affinity mask; the hardware threads where the
/// platform cannot tell): the default number of host replicas.
inline int allowed_cpu_count() {
  const auto n = allowed_cpus().size();
  return n ? static_cast<int>(n) : hardware_threads();
}

namespace detail {
/// The grow-only fp32 buffers a host context rounds GEMM operands into when it emulates bf16 or fp16
/// (grown to the largest operand seen, then reused). A copied context starts with its own.
class rounding_scratch {
public:
  /// No buffers yet.
  rounding_scratch() = default;
  /// A copy does not share the buffers: it starts empty.
  rounding_scratch(const rounding_scratch&) noexcept {}
  /// Assignment from a copy keeps this context's own buffers.
  rounding_scratch& operator=(const rounding_scratch&) noexcept { return *this; }
  /// Moves the buffers.
  rounding_scratch(rounding_scratch&&) noexcept = default;
  /// Moves the buffers.
  rounding_scratch& operator=(rounding_scratch&&) noexcept = default;
  ~rounding_scratch() = default;

  /// Buffer `which` (0: operand A, 1: operand B) with room for at least n floats.
  [[nodiscard]] float* get(int which, std::size_t n) const {
    std::vector<float>& v = which == 0 ? a_ : b_;
    if (v.size() < n) v.resize(n);
    return v.data();
  }

  /// Bytes the buffers hold.
  [[nodiscard]] std::size_t bytes() const noexcept { return (a_.capacity() + b_.capacity()) * sizeof(float); }

private:
  mutable std::vector<float> a_, b_;
};
}  // namespace detail

/// Whether this process computes `mixed<bf16>` GEMMs with native bf16 instructions (oneDNN build
/// on a CPU where they outrun fp32: AMX, or AVX512-BF16 on AMD; detail::onednn_native_bf16) rather
/// than by rounding the operands for the fp32 kernels.
inline bool host_bf16_native() noexcept {
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  return detail::onednn_native_bf16();
#else
  return false;
#endif
}

/// The bf16 copy of a model's trainable parameters that the bf16 GEMMs of its layers read in place
/// of converting a weight operand on every call (basic_model keeps it under `mixed<bf16>` and
/// rewrites it after each update); `bits[i]` is `params[i]` rounded to bf16 by the conversion the
/// GEMMs use (backend::to_bf16_weights). Empty (count 0): no copy.
struct bf16_weight_copy_view {
  const float* params = nullptr;        ///< the fp32 parameters the copy follows
  std::size_t count = 0;                ///< how many it holds
  const std::uint16_t* bits = nullptr;  ///< their bf16 encodings

  /// The bf16 encodings of the dense run [p, p + n) of the parameters, or null when the run is
  /// not wholly inside them.
  [[nodiscard]] const std::uint16_t* find(const float* p, std::size_t n) const noexcept {
    if (count == 0 || n == 0) return nullptr;
    const auto base = reinterpret_cast<std::uintptr_t>(params), at = reinterpret_cast<std::uintptr_t>(p);
    if (at < base) return nullptr;
    const std::uintptr_t offset = (at - base) / sizeof(float);
    if ((at - base) % sizeof(float) != 0 || offset > count || n > count - offset) return nullptr;
    return bits + offset;
  }
  /// The bf16 encodings of a GEMM operand, the rows x cols matrix at `p` with leading dimension
  /// ld, or null unless it is a dense run of the parameters (ld == cols, or a single row).
  [[nodiscard]] const std::uint16_t* find_operand(const float* p, std::size_t rows, std::size_t cols,
                                                  std::size_t ld) const noexcept {
    if (ld != cols && rows > 1) return nullptr;
    return find(p, rows * cols);
  }
};

/// Execution context of a host (cpu<I>) replica. Kernels are found by argument-dependent lookup
/// on the context type, so contexts and their kernels share namespace lockstep::backend.
class host_context {
public:
  using kind_type = cpus;  ///< host replicas run on cpu devices
  /// A context whose GEMMs may use `blas_threads` threads (1 when several replicas share the cores),
  /// whose thread computes with subnormal floats flushed to zero when `flush_denormals`, and whose
  /// layers that opt in compute their float GEMMs in `policy` (fp32, bf16 or fp16).
  /// @throws config_error for blas_threads < 1 or the tf32 policy (GPU replicas only).
  explicit host_context(int blas_threads = 1, bool flush_denormals = true,
                        compute_precision policy = compute_precision::fp32)
      : blas_threads_(blas_threads), flush_denormals_(flush_denormals), policy_(policy) {
    if (blas_threads < 1)
      throw config_error("lockstep: host_context blas_threads must be >= 1, got " + std::to_string(blas_threads));
    if (policy == compute_precision::tf32)
      throw config_error("lockstep: the tf32 precision policy is for GPU replicas (TF32 tensor cores); cpu "
                         "replicas compute in fp32, or in bf16 under lockstep::mixed<lockstep::bf16>");
  }

  /// The replica's precision policy: what the GEMMs of layers that opt in compute in.
  [[nodiscard]] compute_precision policy() const noexcept { return policy_; }
  /// What the next float GEMM computes in: the policy inside a layer that opts in
  /// (`mixed_precision`), fp32 elsewhere (set by the model around each layer's call).
  [[nodiscard]] compute_precision gemm_precision() const noexcept { return active_; }
  /// Sets what the next float GEMMs compute in (fp32, bf16 or fp16).
  void set_gemm_precision(compute_precision p) noexcept { active_ = p; }
  /// The buffers emulated bf16 and fp16 GEMMs round their operands into.
  [[nodiscard]] const detail::rounding_scratch& rounding() const noexcept { return rounding_; }
  /// Bytes of the buffers this context converts GEMM operands into under a mixed policy (the
  /// emulation's rounded copies, and the oneDNN build's bf16 operands): grown to the largest
  /// operands seen, then reused.
  [[nodiscard]] std::size_t gemm_operand_bytes() const noexcept {
    std::size_t bytes = rounding_.bytes();
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
    if (const auto* cache = gemm_cache_.peek()) bytes += cache->operand_bytes();
#endif
    return bytes;
  }

  /// True when a float model under `mixed<bf16>` keeps a bf16 copy of its weights, written after
  /// each update, for its GEMMs to read (see basic_model); false converts each weight operand at
  /// every GEMM, with the same bits. By default, where the bf16 GEMMs are native
  /// (host_bf16_native): the emulation widens a weight into an fp32 buffer either way, so a copy
  /// would only add memory there.
  [[nodiscard]] bool bf16_weight_copy() const noexcept {
    return weight_copy_mode_ >= 0 ? weight_copy_mode_ != 0 : host_bf16_native();
  }
  /// Sets bf16_weight_copy() on or off, whatever the GEMMs (a model then starts or drops its copy
  /// at its next pass).
  void set_bf16_weight_copy(bool on) noexcept { weight_copy_mode_ = on ? 1 : 0; }
  /// The weight copy the running pass's GEMMs may read (set by the model around its passes).
  [[nodiscard]] const bf16_weight_copy_view& weight_copy() const noexcept { return weight_copy_; }
  /// Sets weight_copy() (an empty view: none).
  void set_weight_copy(const bf16_weight_copy_view& v) noexcept { weight_copy_ = v; }
  /// GEMM operands this context has read from a weight copy instead of converting them.
  [[nodiscard]] std::uint64_t weight_copy_reads() const noexcept { return weight_copy_reads_; }
  /// The bf16 encodings of the rows x cols operand at `p` (leading dimension ld) from the weight
  /// copy, counted in weight_copy_reads(), or null when it is not a dense run of the copy.
  [[nodiscard]] const std::uint16_t* weight_copy_of(const float* p, std::size_t rows, std::size_t cols,
                                                     std::size_t ld) const noexcept {
    const std::uint16_t* bits = weight_copy_.find_operand(p, rows, cols, ld);
    if (bits) ++weight_copy_reads_;
    return bits;
  }

  /// True when a float model on this context keeps an activation that a dense layer reads (a relu
  /// the dense layer before it applies, a dropout's output; see sequential's stored layouts) as
  /// bf16 encodings, half the bytes (pass_info::bf16_activations): under `mixed<bf16>` with
  /// set_bf16_activations on (the default) and subnormals flushed (flushes_denormals(), the
  /// default), where a relu output is never subnormal, so its bf16 encoding keeps whether it is
  /// positive. The GEMMs read the same bf16 values either way: the results are the same bits.
  [[nodiscard]] bool bf16_activations() const noexcept {
    return policy_ == compute_precision::bf16 && bf16_activations_ && flush_denormals_;
  }
  /// Sets whether bf16_activations() may be true (a model takes it at its next forward).
  void set_bf16_activations(bool on) noexcept { bf16_activations_ = on; }

  /// True (the default) when a convolution that can run through oneDNN's primitives does (the
  /// oneDNN build; see conv2d); false keeps every convolution on im2col + GEMM, to compare the two.
  [[nodiscard]] bool onednn_convolutions() const noexcept { return onednn_convolutions_; }
  /// Sets onednn_convolutions().
  void set_onednn_convolutions(bool on) noexcept { onednn_convolutions_ = on; }

  /// BLAS threads this replica may use.
  [[nodiscard]] int blas_threads() const noexcept { return blas_threads_; }
  /// True when activate() makes the thread flush subnormal floats to zero.
  [[nodiscard]] bool flushes_denormals() const noexcept { return flush_denormals_; }

  /// Makes the calling thread's BLAS calls use this context's thread budget. OpenBLAS keeps
  /// one process-wide setting, so replicas that run concurrently must all ask for 1 thread; the
  /// oneDNN GEMMs of the onednn build use OpenMP, whose thread count is per calling thread.
  /// With flush_denormals (the default), it also sets the calling thread's SSE control register to
  /// flush subnormal results and inputs to zero (FTZ and DAZ, x86): subnormal numbers, which
  /// optimiser moments and small gradients produce late in training, otherwise cost about 100 times
  /// a normal operation. The mode is deterministic, and every replica runs with it.
  void activate() const noexcept {
#if defined(__x86_64__) || defined(__SSE2__)
    if (flush_denormals_) _mm_setcsr(_mm_getcsr() | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6)
#endif
    if (openblas_get_num_threads() != blas_threads_) openblas_set_num_threads(blas_threads_);
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
    detail::onednn_set_threads(blas_threads_);
#endif
  }

  /// Makes the calling thread's allocations land on this replica's device without changing how
  /// the thread computes: nothing to do on the host (activate() is what sets the mode).
  void place_memory() const noexcept {}

  /// Waits for queued work: a no-op on the host, where every call is synchronous.
  void synchronize() const noexcept {}

#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  /// The oneDNN GEMM primitives of this context, created on its first float GEMM (onednn build only).
  [[nodiscard]] detail::onednn_gemm_cache& gemm_cache() const { return gemm_cache_.get(); }
  /// The oneDNN convolution primitives of this context, created on its first float convolution
  /// that runs through oneDNN (onednn build only; see conv2d).
  [[nodiscard]] detail::onednn_conv_cache& conv_cache() const { return conv_cache_.get(); }
#endif

private:
  int blas_threads_;
  bool flush_denormals_;
  compute_precision policy_;
  compute_precision active_ = compute_precision::fp32;
  bool onednn_convolutions_ = true;
  bool bf16_activations_ = true;
  signed char weight_copy_mode_ = -1;  // set_bf16_weight_copy's choice; -1: where bf16 is native
  bf16_weight_copy_view weight_copy_{};
  mutable std::uint64_t weight_copy_reads_ = 0;
  detail::rounding_scratch rounding_;
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  detail::onednn_gemm_slot gemm_cache_;
  detail::onednn_conv_slot conv_cache_;
#endif
};

/// The OpenBLAS kernel set in use (for example "Haswell" or "SkylakeX").
inline std::string blas_core_name() { return openblas_get_corename(); }

/// The kernels of the host float GEMM: "OpenBLAS <kernel set>" or, in the LOCKSTEP_HOST_GEMM=onednn
/// build, "oneDNN <version> (<instruction set>)".
inline std::string host_gemm_name() {
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
  return detail::onednn_name();
#else
  return "OpenBLAS " + blas_core_name();
#endif
}

/// The warning due when OpenBLAS runs kernel set `core` on a CPU with AVX2 (`avx2`) or AVX-512
/// (`avx512`) but the kernels use neither (a generic set such as Prescott, which an OpenBLAS
/// older than the CPU picks): a sentence naming the fix, or empty when the kernels fit the CPU.
inline std::string blas_kernel_warning(std::string_view core, bool avx2, bool avx512) {
  if (!avx2 && !avx512) return {};
  std::string lower(core);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // OpenBLAS's x86-64 kernel sets that use AVX2 or AVX-512.
  for (const std::string_view fast : {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids", "excavator"})
    if (lower == fast) return {};
  const char* isa = avx512 ? "AVX-512" : "AVX2";
  const char* type = avx512 ? "SkylakeX" : "Haswell";
  return "lockstep: warning: OpenBLAS runs its " + std::string(core) + " kernels, which do not use this CPU's " + isa +
         " instructions: the host GEMM runs several times slower than it can. Set OPENBLAS_CORETYPE=" + type +
         " in the environment before the program starts, or build lockstep with -DLOCKSTEP_HOST_GEMM=onednn";
}

/// blas_kernel_warning for this process's host GEMM and CPU: empty in the LOCKSTEP_HOST_GEMM=onednn
/// build, where oneDNN picks its kernels from the CPU itself, and off x86-64. fit shows it on the
/// chief's progress display when a host strategy trains.
inline std::string host_gemm_warning() {
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN) || !defined(__x86_64__)
  return {};
#else
  return blas_kernel_warning(blas_core_name(), __builtin_cpu_supports("avx2") != 0,
                             __builtin_cpu_supports("avx512f") != 0);
#endif
}

}  // namespace backend

using backend::allowed_cpu_count;
using backend::bf16_weight_copy_view;
using backend::allowed_cpus;
using backend::blas_core_name;
using backend::blas_kernel_warning;
using backend::hardware_threads;
using backend::pin_this_thread;
using backend::host_gemm_name;
using backend::host_gemm_warning;
using backend::host_context;

namespace detail {
/// True when Ctx is the host's context (layers with a host-only form take it there).
template <class Ctx>
inline constexpr bool host_context_v = std::is_same_v<std::remove_cv_t<Ctx>, backend::host_context>;
}  // namespace detail

}  // namespace lockstep
