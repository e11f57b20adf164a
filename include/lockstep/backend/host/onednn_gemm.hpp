#pragma once
/// @file onednn_gemm.hpp
/// Single-precision host GEMM through oneDNN's matmul primitive, the kernels of the
/// LOCKSTEP_HOST_GEMM=onednn build (which defines LOCKSTEP_HOST_GEMM_ONEDNN), and the native bf16
/// GEMM of `mixed<bf16>` on CPUs with bf16 instructions (the operands converted by those
/// instructions, fp32 accumulation and output). A primitive is created on the first GEMM of each
/// shape and kept, with its memory objects, in a cache that its host_context owns; later calls of
/// the shape only re-point the memory objects at the operands. The implementation is oneDNN's
/// first choice, except for the shapes where its gemm-based matmul measured faster than its AVX-512
/// brgemm one (onednn_gemm_cache::prefers_gemm_based); that one packs its operands into blocks it
/// allocates inside each call (oneDNN's own allocations, which the steady-state tests count apart
/// from lockstep's). oneDNN 2.x has no f64 matmul on CPUs, so double GEMMs stay on CBLAS.

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>

#if defined(__linux__) || defined(__APPLE__)
#include <dlfcn.h>
#endif

#if defined(__x86_64__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#elif DNNL_CPU_THREADING_RUNTIME != DNNL_RUNTIME_SEQ
#error "lockstep: the oneDNN GEMM backend needs oneDNN built with OpenMP or sequential CPU threading"
#endif

#include <lockstep/core/error.hpp>
#include <lockstep/core/precision.hpp>

namespace lockstep::backend::detail {

/// Throws device_error naming the oneDNN call, its status and `what` unless the call succeeded.
inline void onednn_check(dnnl_status_t status, const char* call, const std::string& what = {}) {
  if (status == dnnl_success) return;
  std::string message = std::string("lockstep: oneDNN ") + call + " failed with " + dnnl_status2str(status);
  if (!what.empty()) message += " (" + what + ")";
  throw device_error(message);
}

/// Makes the calling thread's oneDNN calls use `threads` threads (an OpenMP per-thread setting).
inline void onednn_set_threads([[maybe_unused]] int threads) noexcept {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
#endif
}

/// "oneDNN <version> (<the widest instruction set it dispatches to here>)".
inline std::string onednn_name() {
  const dnnl_version_t* v = dnnl_version();
  std::string_view isa = dnnl_cpu_isa2str(dnnl_get_effective_cpu_isa());
  if (isa.starts_with("cpu_isa_")) isa.remove_prefix(8);
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " (" + std::string(isa) + ")";
}

/// dst[i] = to_bf16_bits_daz(src[i], true) for n values with the CPU's AVX512-BF16 conversion
/// (round to nearest even; subnormal inputs read as zero, as the thread's DAZ mode reads them
/// anyway); only where the CPU has those instructions (onednn_bf16_isa; lockstep calls it where
/// onednn_native_bf16).
#if defined(__x86_64__) && !defined(__CUDACC__)
__attribute__((target("avx512f,avx512bf16"))) inline void to_bf16_row(const float* src, std::size_t n,
                                                                      std::uint16_t* dst) noexcept {
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    std::memcpy(dst + i, &v, sizeof v);
  }
  // The tail by its count (under 32): g++ -O2 -march=native, inlining this into convert, warned
  // that a loop on i < n might run 2^62 times. Subnormals read as zero there too, as the
  // instruction reads them, so an element's bits do not depend on its position in the row.
  const std::size_t rest = n - i;
  for (std::size_t j = 0; j < rest; ++j) dst[i + j] = to_bf16_bits_daz(src[i + j], true);
}
#else
inline void to_bf16_row(const float* src, std::size_t n, std::uint16_t* dst) noexcept {
  for (std::size_t i = 0; i < n; ++i) dst[i] = to_bf16_bits(src[i]);
}
#endif

/// Whether oneDNN's effective instruction set here (after any ONEDNN_MAX_CPU_ISA cap) includes
/// AVX512-BF16: its bf16 kernels and lockstep's bf16 conversion (to_bf16_row) can run.
inline bool onednn_bf16_isa() noexcept {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
  return (isa & bf16) == bf16;
}

/// Whether lockstep runs bf16 matmuls on oneDNN's bf16 kernels here, where they outrun the fp32
/// ones: with AMX in oneDNN's instruction set (Intel Sapphire Rapids and later, where the system
/// exposes it), or with AVX512-BF16 on AMD (Zen 4 and Zen 5 run its dot products at twice their
/// fp32 FMA rate). Intel's AVX512-BF16 without AMX (Cooper Lake; a Xeon whose AMX is hidden) runs
/// them at its fp32 FMA rate, where oneDNN 2.6.3's bf16 matmul trained config L at 0.56x fp32 and
/// the emulation at 0.91x (docs/precision.md). Elsewhere lockstep emulates bf16 (rounded operands,
/// fp32 kernels) rather than use oneDNN's slow emulation.
inline bool onednn_native_bf16() noexcept {
  if (!onednn_bf16_isa()) return false;
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  const auto amx = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_amx);
  if ((isa & amx) == amx) return true;
#if defined(__x86_64__)
  return __builtin_cpu_is("amd") != 0;
#else
  return false;
#endif
}

/// Whether the code address `pc` lies in the shared oneDNN library (false where it cannot be told
/// apart from the program, for example when oneDNN is linked statically). Used by the tests'
/// allocation counters to tell oneDNN's own allocations from lockstep's.
inline bool onednn_owns_code([[maybe_unused]] const void* pc) noexcept {
#if defined(__linux__) || defined(__APPLE__)
  Dl_info library{}, here{}, at{};
  if (dladdr(dnnl_version(), &library) == 0 || dladdr(reinterpret_cast<const void*>(&onednn_owns_code), &here) == 0 ||
      dladdr(pc, &at) == 0)
    return false;
  return library.dli_fbase != here.dli_fbase && at.dli_fbase == library.dli_fbase;
#else
  return false;
#endif
}

/// Destroys oneDNN handles (for std::unique_ptr).
struct onednn_deleter {
  void operator()(dnnl_engine_t p) const noexcept { dnnl_engine_destroy(p); }
  void operator()(dnnl_stream_t p) const noexcept { dnnl_stream_destroy(p); }
  void operator()(dnnl_primitive_t p) const noexcept { dnnl_primitive_destroy(p); }
  void operator()(dnnl_primitive_desc_t p) const noexcept { dnnl_primitive_desc_destroy(p); }
  void operator()(dnnl_primitive_desc_iterator_t p) const noexcept { dnnl_primitive_desc_iterator_destroy(p); }
  void operator()(dnnl_primitive_attr_t p) const noexcept { dnnl_primitive_attr_destroy(p); }
  void operator()(dnnl_post_ops_t p) const noexcept { dnnl_post_ops_destroy(p); }
  void operator()(dnnl_memory_t p) const noexcept { dnnl_memory_destroy(p); }
};

/// An owning oneDNN handle.
template <class Handle>
using onednn_ptr = std::unique_ptr<std::remove_pointer_t<Handle>, onednn_deleter>;

/// A oneDNN CPU engine and a stream on it: what each of a context's oneDNN caches runs on.
struct onednn_engine_stream {
  onednn_ptr<dnnl_engine_t> engine;  ///< the CPU engine
  onednn_ptr<dnnl_stream_t> stream;  ///< its stream
  /// Creates both.
  onednn_engine_stream() {
    dnnl_engine_t raw_engine = nullptr;
    onednn_check(dnnl_engine_create(&raw_engine, dnnl_cpu, 0), "dnnl_engine_create");
    engine.reset(raw_engine);
    dnnl_stream_t raw_stream = nullptr;
    onednn_check(dnnl_stream_create(&raw_stream, engine.get(), dnnl_stream_default_flags), "dnnl_stream_create");
    stream.reset(raw_stream);
  }
};

/// The oneDNN matmul primitives of one host context: one per GEMM shape (m, n, k, transpositions,
/// leading dimensions, whether alpha is 1 and whether C is read), each with memory objects for A,
/// B, C, the scratchpad and alpha, plus one scratchpad buffer that every primitive of the cache
/// uses (primitives run one at a time on a context). Not safe for concurrent use: like its
/// context, it belongs to one replica thread at a time.
class onednn_gemm_cache {
public:
  /// A cache with a CPU engine and stream and no primitives yet.
  onednn_gemm_cache() = default;

  onednn_gemm_cache(const onednn_gemm_cache&) = delete;
  onednn_gemm_cache& operator=(const onednn_gemm_cache&) = delete;
  ~onednn_gemm_cache() = default;

  /// C = alpha * op(A) * op(B) + beta * C, row-major, with m, n, k > 0 and alpha != 0 (the caller
  /// handles those); `threads` is the context's thread budget. beta = 0 never reads C; another beta
  /// than 0 or 1 scales C first. alpha != 1 is a run-time output scale, for which oneDNN 2.6 picks
  /// its gemm-based matmul (which allocates packing buffers on every call); lockstep's layers
  /// always pass alpha = 1.
  void sgemm(int threads, bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
             std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
    onednn_set_threads(threads);
    scale_c(m, n, beta, c, ldc);
    run(make_key(m, n, k, lda, ldb, ldc, ta, tb, alpha, beta, false), alpha, a, b, c);
  }

  /// The same product with A and B rounded to bf16 (round to nearest even) and multiplied by
  /// oneDNN's bf16 kernels, accumulated and written in fp32; call only where onednn_native_bf16().
  /// The operands are converted into this cache's bf16 buffers (grown, never shrunk), so a
  /// steady-state call allocates nothing; an operand whose dense bf16 encodings are given
  /// (`a_bits`, `b_bits`: a model's weight copy, written by the same conversion) is read from them.
  void bf16gemm(int threads, bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                std::size_t ldc, const std::uint16_t* a_bits = nullptr, const std::uint16_t* b_bits = nullptr) {
    onednn_set_threads(threads);
    scale_c(m, n, beta, c, ldc);
    // Stored shapes: A is m x k (k x m when transposed), B is k x n (n x k); converted densely.
    const std::size_t a_rows = ta ? k : m, a_cols = ta ? m : k;
    const std::size_t b_rows = tb ? n : k, b_cols = tb ? k : n;
    const std::uint16_t* a16 = a_bits;
    const std::uint16_t* b16 = b_bits;
    if (!a16) {
      std::uint16_t* buffer = bf16_buffer(0, a_rows * a_cols);
      convert(a, a_rows, a_cols, lda, buffer);
      a16 = buffer;
    }
    if (!b16) {
      std::uint16_t* buffer = bf16_buffer(1, b_rows * b_cols);
      convert(b, b_rows, b_cols, ldb, buffer);
      b16 = buffer;
    }
    run(make_key(m, n, k, a_cols, b_cols, ldc, ta, tb, alpha, beta, true), alpha, a16, b16, c);
  }

  /// Whether this machine's oneDNN runs bf16 natively (onednn_native_bf16, read once per cache).
  [[nodiscard]] bool native_bf16() const noexcept { return native_bf16_; }
  /// Bytes of the buffers the bf16 GEMMs convert their operands into (grown, never shrunk).
  [[nodiscard]] std::size_t operand_bytes() const noexcept {
    return (bf16_[0].size + bf16_[1].size) * sizeof(std::uint16_t);
  }

  /// Primitives kept (GEMM shapes: a dense layer's three per batch size, for each of a training
  /// epoch's full and last batch, an evaluation's two, micro-shard remainders...). Another shape
  /// evicts the least recently used, so a context that predicts on ever-changing batch sizes keeps
  /// its memory bounded.
  static constexpr std::size_t primitives_kept = 512;
  /// Number of cached primitives (GEMM shapes seen, at most primitives_kept).
  [[nodiscard]] std::size_t primitives() const noexcept { return entries_.size(); }
  /// Size of the shared scratchpad buffer in bytes (the largest any cached primitive asked for).
  [[nodiscard]] std::size_t scratchpad_bytes() const noexcept { return scratchpad_size_; }
  /// The implementation oneDNN chose for the most recently created primitive (for example
  /// "brg:avx512_core"); empty before the first GEMM.
  [[nodiscard]] const std::string& last_implementation() const noexcept { return last_impl_; }

private:
  struct key {
    dnnl_dim_t m, n, k, lda, ldb, ldc;
    bool ta, tb;
    bool scaled;      // alpha != 1: a run-time output scale
    bool accumulate;  // beta != 0: a sum post-op reads C
    bool bf16;        // A and B are bf16 (C stays fp32)
    bool operator==(const key&) const = default;
  };
  struct key_hash {
    std::size_t operator()(const key& k) const noexcept {
      std::uint64_t h = 1469598103934665603ull;
      const auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
      mix(static_cast<std::uint64_t>(k.m));
      mix(static_cast<std::uint64_t>(k.n));
      mix(static_cast<std::uint64_t>(k.k));
      mix(static_cast<std::uint64_t>(k.lda));
      mix(static_cast<std::uint64_t>(k.ldb));
      mix(static_cast<std::uint64_t>(k.ldc));
      mix((k.ta ? 1u : 0u) | (k.tb ? 2u : 0u) | (k.scaled ? 4u : 0u) | (k.accumulate ? 8u : 0u) | (k.bf16 ? 16u : 0u));
      return static_cast<std::size_t>(h);
    }
  };
  struct entry {
    onednn_ptr<dnnl_primitive_t> primitive;
    onednn_ptr<dnnl_memory_t> a, b, c, scratchpad, scale;
    float alpha = 1.0f;  // what `scale` points at
    std::array<dnnl_exec_arg_t, 5> args{};
    int nargs = 0;
    std::uint64_t used = 0;  // when last run (the cache's tick): the least recently used is evicted first
  };
  struct aligned_free {
    void operator()(std::byte* p) const noexcept { ::operator delete[](p, std::align_val_t{page}); }
  };
  static constexpr std::size_t page = 4096;

  static void scale_c(std::size_t m, std::size_t n, float beta, float* c, std::size_t ldc) {
    if (beta != 0.0f && beta != 1.0f) {  // the sum post-op's scale is fixed per primitive: scale C here
      for (std::size_t i = 0; i < m; ++i)
        for (std::size_t j = 0; j < n; ++j) c[i * ldc + j] *= beta;
    }
  }

  static key make_key(std::size_t m, std::size_t n, std::size_t k, std::size_t lda, std::size_t ldb, std::size_t ldc,
                      bool ta, bool tb, float alpha, float beta, bool bf16) {
    return key{static_cast<dnnl_dim_t>(m),   static_cast<dnnl_dim_t>(n),   static_cast<dnnl_dim_t>(k),
               static_cast<dnnl_dim_t>(lda), static_cast<dnnl_dim_t>(ldb), static_cast<dnnl_dim_t>(ldc),
               ta,                           tb,                           alpha != 1.0f,
               beta != 0.0f,                 bf16};
  }

  // Executes the cached primitive of `kk` on A, B (fp32 or bf16, as kk says) and C.
  void run(const key& kk, float alpha, const void* a, const void* b, float* c) {
    entry& e = find_or_create(kk);
    e.alpha = alpha;
    // oneDNN only reads the sources; its memory objects hold non-const pointers.
    onednn_check(dnnl_memory_set_data_handle(e.a.get(), const_cast<void*>(a)), "dnnl_memory_set_data_handle");
    onednn_check(dnnl_memory_set_data_handle(e.b.get(), const_cast<void*>(b)), "dnnl_memory_set_data_handle");
    onednn_check(dnnl_memory_set_data_handle(e.c.get(), c), "dnnl_memory_set_data_handle");
    if (e.scratchpad)
      onednn_check(dnnl_memory_set_data_handle(e.scratchpad.get(), scratchpad_.get()), "dnnl_memory_set_data_handle");
    const dnnl_status_t status = dnnl_primitive_execute(e.primitive.get(), on_.stream.get(), e.nargs, e.args.data());
    if (status != dnnl_success) onednn_check(status, "dnnl_primitive_execute", describe(kk));  // names the shape
    onednn_check(dnnl_stream_wait(on_.stream.get()), "dnnl_stream_wait");
  }

  // Bf16 buffer `which` (0: A, 1: B) with room for n values (grown, never shrunk).
  std::uint16_t* bf16_buffer(int which, std::size_t n) {
    auto& buffer = bf16_[which];
    if (buffer.size < n) {
      buffer.data.reset(new std::uint16_t[n]);
      buffer.size = n;
    }
    return buffer.data.get();
  }

  // Writes the fp32 rows x cols matrix at `src` (leading dimension ld) to `dst` as dense bf16.
  static void convert(const float* src, std::size_t rows, std::size_t cols, std::size_t ld, std::uint16_t* dst) {
    for (std::size_t r = 0; r < rows; ++r) to_bf16_row(src + r * ld, cols, dst + r * cols);
  }

  void make_memory(onednn_ptr<dnnl_memory_t>& out, const dnnl_memory_desc_t* md, const std::string& what,
                   void* handle = DNNL_MEMORY_NONE) {
    dnnl_memory_t raw = nullptr;
    onednn_check(dnnl_memory_create(&raw, md, on_.engine.get(), handle), "dnnl_memory_create", what);
    out.reset(raw);
  }

  // Grows the shared scratchpad to what `pd` asks for and makes `out` its memory object; false
  // when the primitive needs none.
  bool attach_scratchpad(const_dnnl_primitive_desc_t pd, onednn_ptr<dnnl_memory_t>& out, const std::string& what) {
    const dnnl_memory_desc_t* scratch_md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    const std::size_t scratch_bytes = scratch_md ? dnnl_memory_desc_get_size(scratch_md) : 0;
    if (scratch_bytes == 0) return false;
    if (scratch_bytes > scratchpad_size_) {  // grown only for a primitive that needs more
      const std::size_t bytes = (scratch_bytes + page - 1) / page * page;
      scratchpad_.reset(new (std::align_val_t{page}) std::byte[bytes]);
      scratchpad_size_ = bytes;
    }
    make_memory(out, scratch_md, what);
    return true;
  }

  static std::string describe(const key& k) {
    return std::string(k.bf16 ? "bf16 " : "") + "matmul m=" + std::to_string(k.m) + " n=" + std::to_string(k.n) + " k=" + std::to_string(k.k) +
           " lda=" + std::to_string(k.lda) + " ldb=" + std::to_string(k.ldb) + " ldc=" + std::to_string(k.ldc) +
           " transa=" + (k.ta ? "yes" : "no") + " transb=" + (k.tb ? "yes" : "no");
  }

  // True when the GEMM of key k runs oneDNN's gemm-based matmul ("gemm:jit", the kernels of
  // dnnl_sgemm) rather than oneDNN's first choice `first`, where that is its AVX-512 brgemm matmul
  // and the shape is one where the gemm-based one measured faster on one Zen 4 core with oneDNN 2.6
  // (docs/benchmarks.md, "oneDNN's gemm-based matmul ..."): neither operand transposed, at least
  // 64 columns, and in fp32 at least 2^24 multiply-adds (config L's forward GEMMs 1.11-1.12x, the
  // CNN's dense forward 1.22x, the main job's first layer at 64 rows 1.06x), in bf16 a depth of at
  // least 2048 and 2^30 multiply-adds (config L's 512 x 4096 x 4096). Elsewhere the first choice
  // measured as fast or faster (B transposed: up to 5 %; a 10-class layer's GEMM: 10-20 %; config
  // S's 64 x 128 x 784; bf16 at smaller depths), and any other first choice (AMX, the AVX2 kernels)
  // is kept. A rule on the shape and the machine alone, so a shape always runs the same kernels
  // (run to run bitwise).
  static bool prefers_gemm_based(const key& k, std::string_view first) noexcept {
    if (k.ta || k.tb || k.n < 64) return false;
    const dnnl_dim_t products = k.m * k.n * k.k;
    if (k.bf16) return first == "brg:avx512_core_bf16" && k.k >= 2048 && products >= (dnnl_dim_t{1} << 30);
    return first == "brg:avx512_core" && products >= (dnnl_dim_t{1} << 24);
  }

  // The matmul's primitive descriptor: oneDNN's first choice for `matmul`, or the first gemm-based
  // implementation it offers where prefers_gemm_based says so (never its reference implementation).
  onednn_ptr<dnnl_primitive_desc_t> choose_implementation(const dnnl_matmul_desc_t& matmul,
                                                          const_dnnl_primitive_attr_t attr, const key& k,
                                                          const std::string& what) {
    dnnl_primitive_desc_iterator_t raw_it = nullptr;
    onednn_check(dnnl_primitive_desc_iterator_create(&raw_it, &matmul, attr, on_.engine.get(), nullptr),
                 "dnnl_primitive_desc_iterator_create", what);
    const onednn_ptr<dnnl_primitive_desc_iterator_t> it(raw_it);
    onednn_ptr<dnnl_primitive_desc_t> first(dnnl_primitive_desc_iterator_fetch(it.get()));
    if (!first) throw device_error("lockstep: oneDNN offers no implementation of the " + what);
    if (!prefers_gemm_based(k, implementation_of(first.get()))) return first;
    // A few implementations at most come before the reference one; the walk stops there.
    for (int i = 0; i < 16 && dnnl_primitive_desc_iterator_next(it.get()) == dnnl_success; ++i) {
      onednn_ptr<dnnl_primitive_desc_t> next(dnnl_primitive_desc_iterator_fetch(it.get()));
      if (!next) break;
      const std::string_view impl = implementation_of(next.get());
      if (impl.starts_with("gemm:")) return next;
      if (impl.starts_with("ref")) break;
    }
    return first;
  }
  static std::string_view implementation_of(const_dnnl_primitive_desc_t pd) noexcept {
    const char* impl = nullptr;
    if (dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) != dnnl_success || !impl) return {};
    return impl;
  }

  entry& find_or_create(const key& k) {
    entry& e = [&]() -> entry& {
      if (const auto it = entries_.find(k); it != entries_.end()) return *it->second;
      return create(k);
    }();
    e.used = ++tick_;
    return e;
  }

  // Before a new shape's primitive is made: with primitives_kept kept, drops the least recently used.
  void make_room() {
    if (entries_.size() < primitives_kept) return;
    auto oldest = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->second->used < oldest->second->used) oldest = it;
    entries_.erase(oldest);
  }

  entry& create(const key& k) {
    make_room();
    const std::string what = describe(k);
    // Row-major operands; a transposed operand is the same matrix read through swapped strides.
    dnnl_memory_desc_t a_md{}, b_md{}, c_md{};
    const dnnl_dims_t a_dims{k.m, k.k}, b_dims{k.k, k.n}, c_dims{k.m, k.n};
    const dnnl_dims_t a_strides{k.ta ? 1 : k.lda, k.ta ? k.lda : 1};
    const dnnl_dims_t b_strides{k.tb ? 1 : k.ldb, k.tb ? k.ldb : 1};
    const dnnl_dims_t c_strides{k.ldc, 1};
    const char* init = "dnnl_memory_desc_init_by_strides";
    const dnnl_data_type_t source_type = k.bf16 ? dnnl_bf16 : dnnl_f32;
    onednn_check(dnnl_memory_desc_init_by_strides(&a_md, 2, a_dims, source_type, a_strides), init, what + ", A");
    onednn_check(dnnl_memory_desc_init_by_strides(&b_md, 2, b_dims, source_type, b_strides), init, what + ", B");
    onednn_check(dnnl_memory_desc_init_by_strides(&c_md, 2, c_dims, dnnl_f32, c_strides), init, what + ", C");
    dnnl_matmul_desc_t matmul{};
    onednn_check(dnnl_matmul_desc_init(&matmul, &a_md, &b_md, nullptr, &c_md), "dnnl_matmul_desc_init", what);

    dnnl_primitive_attr_t raw_attr = nullptr;
    onednn_check(dnnl_primitive_attr_create(&raw_attr), "dnnl_primitive_attr_create");
    const onednn_ptr<dnnl_primitive_attr_t> attr(raw_attr);
    onednn_check(dnnl_primitive_attr_set_scratchpad_mode(attr.get(), dnnl_scratchpad_mode_user),
                 "dnnl_primitive_attr_set_scratchpad_mode");
    if (k.scaled) {
      const float runtime = DNNL_RUNTIME_F32_VAL;
      onednn_check(dnnl_primitive_attr_set_output_scales(attr.get(), 1, 0, &runtime),
                   "dnnl_primitive_attr_set_output_scales");
    }
    if (k.accumulate) {
      dnnl_post_ops_t raw_ops = nullptr;
      onednn_check(dnnl_post_ops_create(&raw_ops), "dnnl_post_ops_create");
      const onednn_ptr<dnnl_post_ops_t> ops(raw_ops);
      onednn_check(dnnl_post_ops_append_sum(ops.get(), 1.0f), "dnnl_post_ops_append_sum");
      onednn_check(dnnl_primitive_attr_set_post_ops(attr.get(), ops.get()), "dnnl_primitive_attr_set_post_ops");
    }
    const onednn_ptr<dnnl_primitive_desc_t> pd = choose_implementation(matmul, attr.get(), k, what);

    auto e = std::make_unique<entry>();
    dnnl_primitive_t raw_primitive = nullptr;
    onednn_check(dnnl_primitive_create(&raw_primitive, pd.get()), "dnnl_primitive_create", what);
    e->primitive.reset(raw_primitive);
    const char* impl = nullptr;
    if (dnnl_primitive_desc_query(pd.get(), dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl)
      last_impl_ = impl;

    make_memory(e->a, &a_md, what);
    make_memory(e->b, &b_md, what);
    make_memory(e->c, &c_md, what);
    e->args[0] = {DNNL_ARG_SRC, e->a.get()};
    e->args[1] = {DNNL_ARG_WEIGHTS, e->b.get()};
    e->args[2] = {DNNL_ARG_DST, e->c.get()};
    e->nargs = 3;
    if (attach_scratchpad(pd.get(), e->scratchpad, what))
      e->args[static_cast<std::size_t>(e->nargs++)] = {DNNL_ARG_SCRATCHPAD, e->scratchpad.get()};
    if (k.scaled) {
      dnnl_memory_desc_t scale_md{};
      const dnnl_dims_t one{1};
      onednn_check(dnnl_memory_desc_init_by_tag(&scale_md, 1, one, dnnl_f32, dnnl_a), "dnnl_memory_desc_init_by_tag");
      make_memory(e->scale, &scale_md, what, &e->alpha);
      e->args[static_cast<std::size_t>(e->nargs++)] = {DNNL_ARG_ATTR_OUTPUT_SCALES, e->scale.get()};
    }
    entry& result = *e;
    entries_.emplace(k, std::move(e));
    return result;
  }

  // Declared first, destroyed last: the primitives and memory objects go before the engine.
  onednn_engine_stream on_;
  std::unique_ptr<std::byte[], aligned_free> scratchpad_;
  std::size_t scratchpad_size_ = 0;
  std::unordered_map<key, std::unique_ptr<entry>, key_hash> entries_;
  std::uint64_t tick_ = 0;  // GEMMs run (entry::used)
  struct bf16_storage {
    std::unique_ptr<std::uint16_t[]> data;
    std::size_t size = 0;
  };
  std::array<bf16_storage, 2> bf16_{};  // the converted A and B
  bool native_bf16_ = onednn_native_bf16();
  std::string last_impl_;
};

/// Where a host_context keeps one of its oneDNN caches (Cache: onednn_gemm_cache or
/// onednn_conv_cache): created on first use, moved with the context; a copied context starts with
/// an empty cache of its own.
template <class Cache>
class onednn_slot {
public:
  /// An empty slot.
  onednn_slot() = default;
  /// A copy does not share the cache: it starts empty.
  onednn_slot(const onednn_slot&) noexcept {}
  /// Assignment from a copy empties this slot (the primitives of the source are not shared).
  onednn_slot& operator=(const onednn_slot& other) noexcept {
    if (this != &other) cache_.reset();
    return *this;
  }
  /// Moves the cache.
  onednn_slot(onednn_slot&&) noexcept = default;
  /// Moves the cache.
  onednn_slot& operator=(onednn_slot&&) noexcept = default;
  ~onednn_slot() = default;

  /// The cache, created on first use.
  [[nodiscard]] Cache& get() const {
    if (!cache_) cache_ = std::make_unique<Cache>();
    return *cache_;
  }
  /// The cache, or null before its first use.
  [[nodiscard]] const Cache* peek() const noexcept { return cache_.get(); }

private:
  mutable std::unique_ptr<Cache> cache_;
};

/// Where a host_context keeps its oneDNN GEMM cache.
using onednn_gemm_slot = onednn_slot<onednn_gemm_cache>;

}  // namespace lockstep::backend::detail
