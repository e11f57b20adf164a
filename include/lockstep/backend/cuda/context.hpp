#pragma once
/// @file context.hpp
/// `cuda_context`: the execution context of a GPU replica — its device ordinal, a compute stream,
/// a communication stream (collectives), a copy stream (input staging), a cuBLAS handle and a
/// cuBLASLt handle with its prepared matmuls, the events that order them, reduction scratch and
/// the double-buffered pinned input staging area.
/// Also registers the CUDA kind: `backend_traits<gpus>` and `device_memory<gpus>`. Host code only: this
/// header compiles with g++ (the kernels are in ops.cuh).

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/backend/context.hpp>
#include <lockstep/backend/cuda/device.hpp>
#include <lockstep/backend/cuda/error.hpp>
#include <lockstep/backend/epilogue.hpp>
#include <lockstep/backend/readback.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/precision.hpp>
#include <lockstep/core/trace.hpp>
#include <lockstep/memory/resource.hpp>

namespace lockstep {

namespace backend {

/// Options of a cuda_context.
struct cuda_options {
  /// Let cuBLAS use TF32 tensor cores for every FP32 GEMM (faster, about 10 mantissa bits; off by
  /// default). The tf32 policy (`precision`) does the same for the layers that opt in only.
  bool tf32 = false;
  /// The precision policy of the replica (replicate<Net, P>): what the float GEMMs of the layers
  /// that opt in (`mixed_precision`) compute in: fp32, tf32, or bf16 or fp16 operands with fp32
  /// accumulation and fp32 results.
  compute_precision precision = compute_precision::fp32;
};

/// Bytes of the fixed workspace each context gives its cuBLAS handle (cublasSetWorkspace): cuBLAS
/// then allocates nothing while it runs, which a captured CUDA graph requires; 32 MiB is what
/// cuBLAS recommends for Hopper.
inline constexpr std::size_t cublas_workspace_bytes = std::size_t{32} << 20;

/// Device pointers of one staged shard (null where the shard had no such part).
struct staged_shard {
  const float* features = nullptr;        ///< rows x width features on the device
  const std::int32_t* labels = nullptr;   ///< labels on the device
  const float* targets = nullptr;         ///< regression targets on the device
};

namespace detail {

/// Owned device memory of the current device, in bytes (move-only).
class device_bytes {
public:
  device_bytes() noexcept = default;
  /// Allocates n bytes on the current device.
  explicit device_bytes(std::size_t n) : size_(n) {
    if (n > 0) LOCKSTEP_CUDA_CHECK(cudaMalloc(&p_, n));
  }
  device_bytes(const device_bytes&) = delete;
  device_bytes& operator=(const device_bytes&) = delete;
  device_bytes(device_bytes&& o) noexcept : p_(std::exchange(o.p_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  device_bytes& operator=(device_bytes&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~device_bytes() { reset(); }
  /// The memory.
  [[nodiscard]] void* get() const noexcept { return p_; }
  /// Its size in bytes.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

private:
  void reset() noexcept {
    if (p_) (void)cudaFree(p_);
    p_ = nullptr;
    size_ = 0;
  }
  void* p_ = nullptr;
  std::size_t size_ = 0;
};

/// One half of the double-buffered input staging area.
struct staging_slot {
  pinned_buffer<unsigned char> host;  ///< page-locked source of the copy
  device_bytes device;                ///< where the shard lands
  cuda_event copied;                  ///< recorded on the copy stream after the copy
  cuda_event released;                ///< recorded on the compute stream when the next shard is staged
  bool copied_recorded = false;       ///< `copied` holds a record
  bool released_recorded = false;     ///< `released` holds a record
};

/// Rounds n up to a multiple of 256 bytes (the alignment of cudaMalloc).
constexpr std::size_t align256(std::size_t n) noexcept { return (n + 255) / 256 * 256; }

/// Why replicas on `devices` (replica r on CUDA device devices[r]) needing `bytes` each do not fit,
/// or "" when they do: `memory(device)` gives {free, total} bytes (cudaMemGetInfo), asked once per
/// device. Replicas sharing a device add up; the first replica past the free memory is named.
template <class MemInfo>
std::string replica_memory_shortfall(const std::vector<int>& devices, std::size_t bytes, const MemInfo& memory) {
  std::vector<std::pair<int, std::pair<std::size_t, std::size_t>>> known;  // device -> {free, total}
  std::vector<std::pair<int, std::size_t>> used;                           // device -> bytes so far
  for (std::size_t r = 0; r < devices.size(); ++r) {
    const int dev = devices[r];
    auto k = std::find_if(known.begin(), known.end(), [&](const auto& e) { return e.first == dev; });
    if (k == known.end()) {
      known.emplace_back(dev, memory(dev));
      used.emplace_back(dev, 0);
      k = known.end() - 1;
    }
    auto& u = std::find_if(used.begin(), used.end(), [&](const auto& e) { return e.first == dev; })->second;
    const std::size_t before = u;
    u = bytes > SIZE_MAX - before ? SIZE_MAX : before + bytes;
    if (u > k->second.first) {
      const std::size_t sharing = before / (bytes ? bytes : 1);
      return "lockstep: replica " + std::to_string(r) + " needs " + std::to_string(bytes) +
             " bytes on CUDA device " + std::to_string(dev) + " (its parameters, gradients and reducer workspace" +
             (sharing ? ", after " + std::to_string(sharing) + " earlier replica(s) on that device took " +
                            std::to_string(before) + " bytes"
                      : std::string()) +
             "), but the device has " + std::to_string(k->second.first) + " bytes free of " +
             std::to_string(k->second.second) + " (a smaller model, fewer replicas per GPU, or more GPUs)";
    }
  }
  return {};
}

/// The device spans of a trace (core/trace.hpp's work_span) on a context's compute stream: two
/// timing events per span, made while a trace records and reused by later steps, and the base
/// event that ties the stream's clock to the recorder's at the start of each traced step.
struct device_trace {
  /// What a span shows (static strings, as trace_event's).
  struct span {
    const char* name;
    const char* category;
    const char* arg_name;
    std::int64_t arg;
    bool closed = false;  // its end event recorded (trace_close)
  };
  std::vector<cuda_event> events;  // start and end of span i at 2i and 2i + 1
  std::vector<span> spans;         // the step's spans so far
  std::optional<cuda_event> base;  // marks base_ns on the compute stream
  std::int64_t base_ns = 0;        // the recorder's time of the base event
};

/// One step's deferred readback (backend/readback.hpp): page-locked copies of the step's loss
/// totals and epilogue decision, and the event that marks them copied.
struct readback_page {
  pinned_buffer<double> totals;             // (loss sum, hits) pairs in evaluation order
  std::size_t pairs = 0;                    // pairs queued into `totals`
  pinned_buffer<update_decision> decision;  // the step's epilogue decision
  bool has_decision = false;                // a copy of the decision was queued
  cuda_event done;                          // recorded on the compute stream when sealed
  bool sealed = false;                      // the step's work is queued and `done` recorded

  // Empties the page (copies still queued into it land harmlessly).
  void clear() noexcept {
    pairs = 0;
    has_decision = false;
    sealed = false;
  }
};

/// A cuBLASLt matmul prepared for one shape, precision and set of operand alignments
/// (backend::gemm_bias_relu): its descriptors and the algorithm cuBLASLt's heuristic chose, made
/// at the first call of that shape and kept, so that a steady step only sets the bias pointer and
/// calls cublasLtMatmul (no heuristic, nothing allocated). `usable` false records that cuBLASLt
/// offered no algorithm (the caller then runs the GEMM and the bias pass apart).
struct lt_matmul_plan {
  std::array<std::size_t, 12> key{};         ///< what the plan was made for (gemm_bias_relu's key)
  cublasLtMatmulDesc_t op = nullptr;         ///< compute type, epilogue, bias type
  cublasLtMatrixLayout_t a = nullptr;        ///< A, B and D as cuBLASLt sees them (column-major)
  cublasLtMatrixLayout_t b = nullptr;        ///< (see a)
  cublasLtMatrixLayout_t d = nullptr;        ///< (see a; C is D)
  cublasLtMatmulAlgo_t algo{};               ///< the heuristic's first choice
  bool usable = false;                       ///< cuBLASLt offered an algorithm

  lt_matmul_plan() = default;
  lt_matmul_plan(const lt_matmul_plan&) = delete;
  lt_matmul_plan& operator=(const lt_matmul_plan&) = delete;
  ~lt_matmul_plan() {
    if (d) (void)cublasLtMatrixLayoutDestroy(d);
    if (b) (void)cublasLtMatrixLayoutDestroy(b);
    if (a) (void)cublasLtMatrixLayoutDestroy(a);
    if (op) (void)cublasLtMatmulDescDestroy(op);
  }
};

/// Everything a cuda_context owns; created with its device current, destroyed the same way.
struct cuda_context_state {
  int ordinal;
  cuda_options options;
  cuda_stream compute;
  cuda_stream comm;
  cuda_stream copy;
  cuda_event compute_mark;
  cuda_event comm_mark;
  cuda_event update_mark;
  cublasHandle_t blas = nullptr;
  device_bytes blas_workspace{cublas_workspace_bytes};  // also the workspace of the cuBLASLt matmuls (same stream)
  cublasLtHandle_t lt = nullptr;
  std::vector<std::unique_ptr<lt_matmul_plan>> lt_plans;  // gemm_bias_relu's plans, by key
  device_bytes scratch;
  device_bytes operands;
  pinned_buffer<std::byte> host_scratch;
  pinned_buffer<double> result{2};
  staging_slot slots[2];
  int next_slot = 0;
  device_trace trace;
  std::uint64_t launches = 0;  // device operations queued through this context
  std::uint64_t host_syncs = 0;  // host waits for work of the current step
  std::uint64_t weight_copy_reads = 0;  // GEMM operands read from a model's bf16 weight copy
  bool weight_copy = true;       // set_bf16_weight_copy's choice
  readback_page pages[2];        // deferred readback: the current step's page and the one before
  int page = 0;                  // the current step's page
  bool defer = false;            // losses defer their readback (set_defer_readback)

  cuda_context_state(int dev, cuda_options opts) : ordinal(dev), options(opts) {
    LOCKSTEP_CUBLAS_CHECK(cublasCreate(&blas));
    try {
      LOCKSTEP_CUBLAS_CHECK(cublasSetStream(blas, compute.get()));
      LOCKSTEP_CUBLAS_CHECK(cublasSetWorkspace(blas, blas_workspace.get(), blas_workspace.size()));
      LOCKSTEP_CUBLAS_CHECK(
          cublasSetMathMode(blas, opts.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
      LOCKSTEP_CUBLAS_CHECK(cublasLtCreate(&lt));
    } catch (...) {
      (void)cublasDestroy(blas);
      throw;
    }
  }
  cuda_context_state(const cuda_context_state&) = delete;
  cuda_context_state& operator=(const cuda_context_state&) = delete;
  ~cuda_context_state() {
    (void)cudaStreamSynchronize(compute.get());
    (void)cudaStreamSynchronize(comm.get());
    (void)cudaStreamSynchronize(copy.get());
    lt_plans.clear();
    (void)cublasLtDestroy(lt);
    (void)cublasDestroy(blas);
  }
};

/// Destroys a context state with its device current.
struct cuda_context_deleter {
  void operator()(cuda_context_state* s) const noexcept {
    int previous = -1;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != s->ordinal &&
                          cudaSetDevice(s->ordinal) == cudaSuccess;
    delete s;
    if (switched) (void)cudaSetDevice(previous);
  }
};

}  // namespace detail

/// Execution context of a GPU replica: device `ordinal()`, its streams, cuBLAS handle and events.
/// Copies share the same streams and handle (a replica stores its context by value). Every kernel
/// of the replica is queued on `compute_stream()`; collectives run on `comm_stream()` and input
/// copies on `copy_stream()`, ordered against the compute stream with events. Constructing a
/// context makes its device current on the calling thread, so buffers allocated next land on it.
class cuda_context {
public:
  using kind_type = gpus;  ///< the kind of device this context runs on
  /// A context on CUDA device `ordinal` (throws device_error when the device is not usable).
  explicit cuda_context(int ordinal = 0, cuda_options options = {}) {
    const int n = cuda_device_count();
    if (n == 0)
      throw device_error("lockstep: no CUDA device: cuda_context cannot use CUDA device " + std::to_string(ordinal) + " (" +
                         cuda_unavailable_reason() + ")");
    if (ordinal < 0 || ordinal >= n)
      throw device_error("lockstep: cuda_context: CUDA device " + std::to_string(ordinal) + " does not exist (" +
                         std::to_string(n) + " device(s) visible)");
    LOCKSTEP_CUDA_CHECK(cudaSetDevice(ordinal));
    state_ = std::shared_ptr<detail::cuda_context_state>(new detail::cuda_context_state(ordinal, options),
                                                         detail::cuda_context_deleter{});
  }

  /// The CUDA device ordinal.
  [[nodiscard]] int ordinal() const noexcept { return state_->ordinal; }
  /// The options the context was made with.
  [[nodiscard]] const cuda_options& options() const noexcept { return state_->options; }
  /// The replica's precision policy: the options' `precision`, or tf32 when the options turn TF32
  /// on for every GEMM.
  [[nodiscard]] compute_precision policy() const noexcept {
    const cuda_options& o = state_->options;
    return o.precision == compute_precision::fp32 && o.tf32 ? compute_precision::tf32 : o.precision;
  }
  /// What the next float GEMM computes in: the policy inside a layer that opts in
  /// (`mixed_precision`), fp32 elsewhere (set by the model around each layer's call). Per copy of
  /// the context: each replica's thread sets its own.
  [[nodiscard]] compute_precision gemm_precision() const noexcept { return active_; }
  /// Sets what the next float GEMMs compute in (fp32, tf32, bf16 or fp16).
  void set_gemm_precision(compute_precision p) noexcept { active_ = p; }

  /// True (the default) when a float model under `mixed<bf16>` keeps a bf16 copy of its weights
  /// on this device for its GEMMs to read (see basic_model), rewritten by one kernel at the first
  /// pass after the parameters change; false packs each weight operand at every GEMM.
  [[nodiscard]] bool bf16_weight_copy() const noexcept { return state_->weight_copy; }
  /// Sets bf16_weight_copy() (a model then starts or drops its copy at its next pass).
  void set_bf16_weight_copy(bool on) noexcept { state_->weight_copy = on; }
  /// The weight copy the running pass's GEMMs may read (set by the model around its passes; per
  /// copy of the context, like gemm_precision()).
  [[nodiscard]] const bf16_weight_copy_view& weight_copy() const noexcept { return weight_copy_; }
  /// Sets weight_copy() (an empty view: none).
  void set_weight_copy(const bf16_weight_copy_view& v) noexcept { weight_copy_ = v; }
  /// GEMM operands this context's bf16 GEMMs have read from a weight copy instead of packing them.
  [[nodiscard]] std::uint64_t weight_copy_reads() const noexcept { return state_->weight_copy_reads; }
  /// The bf16 encodings (device memory) of the rows x cols operand at `p` (leading dimension ld)
  /// from the weight copy, counted in weight_copy_reads(), or null when it is not a dense run of
  /// the copy.
  [[nodiscard]] const std::uint16_t* weight_copy_of(const float* p, std::size_t rows, std::size_t cols,
                                                     std::size_t ld) const noexcept {
    const std::uint16_t* bits = weight_copy_.find_operand(p, rows, cols, ld);
    if (bits) ++state_->weight_copy_reads;
    return bits;
  }
  /// The stream every kernel of this replica runs on.
  [[nodiscard]] cudaStream_t compute_stream() const noexcept { return state_->compute.get(); }
  /// The stream collectives run on.
  [[nodiscard]] cudaStream_t comm_stream() const noexcept { return state_->comm.get(); }
  /// The stream input shards are copied on.
  [[nodiscard]] cudaStream_t copy_stream() const noexcept { return state_->copy.get(); }
  /// The cuBLAS handle (bound to the compute stream).
  [[nodiscard]] cublasHandle_t blas_handle() const noexcept { return state_->blas; }
  /// The cuBLASLt handle (its matmuls are queued on the compute stream and use the cuBLAS
  /// handle's fixed workspace, blas_workspace()).
  [[nodiscard]] cublasLtHandle_t lt_handle() const noexcept { return state_->lt; }
  /// The fixed workspace of the context's cuBLAS handle (cublas_workspace_bytes of device memory),
  /// which the cuBLASLt matmuls queued on the same stream share.
  [[nodiscard]] void* blas_workspace() const noexcept { return state_->blas_workspace.get(); }
  /// The prepared cuBLASLt matmul for `key` (gemm_bias_relu), made by `make(plan)` at the first
  /// call with that key and kept for the context's life.
  template <class Make>
  [[nodiscard]] const detail::lt_matmul_plan& lt_plan(const std::array<std::size_t, 12>& key, Make&& make) const {
    for (const auto& p : state_->lt_plans)
      if (p->key == key) return *p;
    auto plan = std::make_unique<detail::lt_matmul_plan>();
    plan->key = key;
    std::forward<Make>(make)(*plan);
    state_->lt_plans.push_back(std::move(plan));
    return *state_->lt_plans.back();
  }

  /// Keeps the calling thread's current CUDA device as it was when made, and makes it current
  /// again when it goes (backend::caller_scope_t): what a strategy holds while replica 0's work
  /// and the placement of replicas' memory (activate, place_memory) run on its caller's thread.
  class caller_scope {
  public:
    /// Records the current device (none when CUDA cannot say).
    caller_scope() noexcept {
      if (cudaGetDevice(&device_) != cudaSuccess) device_ = -1;
    }
    caller_scope(const caller_scope&) = delete;
    caller_scope& operator=(const caller_scope&) = delete;
    /// Makes it current again.
    ~caller_scope() {
      if (device_ >= 0) (void)cudaSetDevice(device_);
    }

  private:
    int device_ = -1;
  };

  /// Makes this context's device current on the calling thread (replica threads call it once).
  void activate() const { LOCKSTEP_CUDA_CHECK(cudaSetDevice(ordinal())); }
  /// Makes the calling thread's allocations land on this context's device (its current device).
  void place_memory() const { LOCKSTEP_CUDA_CHECK(cudaSetDevice(ordinal())); }

  /// Blocks the host until the compute, communication and copy streams are idle (one host sync).
  void synchronize() const {
    device_guard g(ordinal());
    ++state_->host_syncs;
    state_->compute.synchronize();
    state_->comm.synchronize();
    state_->copy.synchronize();
  }

  /// Blocks the host until stream `s` (one of this context's) is idle; counted in host_syncs().
  void wait_stream(cudaStream_t s) const {
    device_guard g(ordinal());
    ++state_->host_syncs;
    LOCKSTEP_CUDA_CHECK(cudaStreamSynchronize(s));
  }

  /// Host waits for work queued in the current step, so far (every synchronize, wait_stream,
  /// copy to or from the host, reduction read back, and growth of scratch; through this context
  /// and its copies): what a steady step costs in host syncs is the difference across it, zero
  /// under strategy_options::defer_readback. A wait for work of an earlier step (a staging
  /// slot's previous copy, the deferred readback of the step before) is not counted.
  [[nodiscard]] std::uint64_t host_syncs() const noexcept { return state_->host_syncs; }

  /// Makes the communication stream wait for everything queued on the compute stream so far.
  void fork_to_comm() const {
    device_guard g(ordinal());
    state_->compute_mark.record(compute_stream());
    state_->compute_mark.wait_on(comm_stream());
  }

  /// Makes the compute stream wait for everything queued on the communication stream so far.
  void join_from_comm() const {
    device_guard g(ordinal());
    state_->comm_mark.record(comm_stream());
    state_->comm_mark.wait_on(compute_stream());
  }

  /// Device operations (kernels, cuBLAS calls, copies, fills) queued through this context and
  /// its copies so far: what a step costs in launches is the difference across it.
  [[nodiscard]] std::uint64_t launches() const noexcept { return state_->launches; }
  /// Counts `n` device operations queued (every operation of the CUDA backend calls it).
  void count_launches(std::uint64_t n = 1) const noexcept { state_->launches += n; }

  /// Marks the end of this replica's slice of a sharded optimiser update on its compute stream
  /// (sharded_update: the other replicas' copies of the slice wait for the mark).
  void mark_update() const {
    device_guard g(ordinal());
    state_->update_mark.record(compute_stream());
  }
  /// Makes this context's compute stream wait for the last mark_update() of `other` (recorded
  /// before this call on the host).
  void wait_for_update_of(const cuda_context& other) const {
    device_guard g(ordinal());
    other.state_->update_mark.wait_on(compute_stream());
  }

  /// Device scratch of at least `bytes` bytes, reused across calls (grows, never shrinks; only
  /// valid for work queued on the compute stream before the next call that grows it).
  [[nodiscard]] void* scratch(std::size_t bytes) const {
    if (bytes > state_->scratch.size()) {
      wait_stream(compute_stream());  // work in flight may still read the old scratch
      device_guard g(ordinal());
      state_->scratch = detail::device_bytes(std::max<std::size_t>(bytes, 4096));
    }
    return state_->scratch.get();
  }

  /// Device memory of at least `bytes` bytes where the bf16 and fp16 GEMMs pack their operands,
  /// reused across calls like scratch() (grows, never shrinks; a growth first waits for the
  /// compute stream, whose queued GEMMs may still read the old operands).
  [[nodiscard]] void* gemm_operands(std::size_t bytes) const {
    if (bytes > state_->operands.size()) {
      wait_stream(compute_stream());
      device_guard g(ordinal());
      state_->operands = detail::device_bytes(std::max<std::size_t>(bytes, 4096));
    }
    return state_->operands.get();
  }

  /// Bytes of device memory gemm_operands() holds.
  [[nodiscard]] std::size_t gemm_operand_bytes() const noexcept { return state_->operands.size(); }

  /// Page-locked host memory of at least `bytes` bytes, reused across calls (grows, never
  /// shrinks): where layers stage device rows for a host-side exchange (batch_norm's statistics
  /// across replicas). Valid until the next call that grows it; copies through it must have
  /// completed before then (copy_to_host and copy_from_host wait).
  [[nodiscard]] void* host_scratch(std::size_t bytes) const {
    if (bytes > state_->host_scratch.size()) {
      device_guard g(ordinal());
      state_->host_scratch = pinned_buffer<std::byte>(std::max<std::size_t>(bytes, 4096));
    }
    return state_->host_scratch.data();
  }

  /// Starts the device spans of a traced step (core/trace.hpp's begin_device_spans): waits for the
  /// compute stream, then marks it with a timing event taken as the recorder's present time. A
  /// host wait, only while a trace records.
  void trace_begin(const trace_recorder& rec) const {
    device_guard g(ordinal());
    auto& t = state_->trace;
    if (!t.base) t.base.emplace(true);
    wait_stream(compute_stream());
    t.base->record(compute_stream());
    t.base->synchronize();
    t.base_ns = rec.now();
    t.spans.clear();
  }
  /// Opens a device span of the work queued next on the compute stream (core/trace.hpp's
  /// work_span); returns its index for trace_close. Makes its events the first time only.
  std::size_t trace_open(const char* name, const char* category, const char* arg_name, std::int64_t arg) const {
    device_guard g(ordinal());
    auto& t = state_->trace;
    const std::size_t i = t.spans.size();
    while (t.events.size() < 2 * (i + 1)) t.events.emplace_back(true);
    t.spans.push_back({name, category, arg_name, arg, false});
    t.events[2 * i].record(compute_stream());
    return i;
  }
  /// Closes span `i` after the work queued so far (errors are left to the next checked call).
  void trace_close(std::size_t i) const noexcept {
    auto& t = state_->trace;
    if (i < t.spans.size() && 2 * i + 1 < t.events.size()) {
      (void)cudaEventRecord(t.events[2 * i + 1].get(), compute_stream());
      t.spans[i].closed = true;
    }
  }
  /// Waits for the step's work and records its device spans into `rec` as thread `thread`, on
  /// the recorder's clock (the base event's time plus each event's time after it). A span that
  /// was opened and never closed (trace_open failed after taking it, or a caller that never
  /// closed it) is left out: its end event holds no record of this step.
  void trace_flush(trace_recorder& rec, std::size_t thread) const {
    device_guard g(ordinal());
    auto& t = state_->trace;
    if (!t.base) return;
    wait_stream(compute_stream());
    const auto at = [&](const cuda_event& e) {
      float ms = 0;
      LOCKSTEP_CUDA_CHECK(cudaEventElapsedTime(&ms, t.base->get(), e.get()));
      return t.base_ns + static_cast<std::int64_t>(static_cast<double>(ms) * 1e6);
    };
    for (std::size_t i = 0; i < t.spans.size(); ++i) {
      const auto& s = t.spans[i];
      if (!s.closed) continue;
      rec.record(thread, s.name, s.category, at(t.events[2 * i]), at(t.events[2 * i + 1]), s.arg_name, s.arg);
    }
    t.spans.clear();
  }

  /// Turns deferred readback on or off for the losses evaluated next (backend/readback.hpp; the
  /// strategy turns it on around a training step under strategy_options::defer_readback).
  void set_defer_readback(bool on) const noexcept { state_->defer = on; }
  /// True while losses defer their readback.
  [[nodiscard]] bool defers_readback() const noexcept { return state_->defer; }
  /// Queues a copy of the two device doubles at `totals` (a loss's sum and hits) into the current
  /// step's page, after the work queued so far; no host wait (but the first growth of a page
  /// past 32 evaluations in one step, which waits for the copies already queued into it).
  void defer_totals(const double* totals) const {
    device_guard g(ordinal());
    auto& p = state_->pages[state_->page];
    if (2 * (p.pairs + 1) > p.totals.size()) {
      pinned_buffer<double> bigger(std::max<std::size_t>(64, 2 * p.totals.size()));
      if (p.pairs > 0) {
        wait_stream(compute_stream());  // copies queued into the old page land first
        std::memcpy(bigger.data(), p.totals.data(), 2 * p.pairs * sizeof(double));
      }
      p.totals = std::move(bigger);
    }
    count_launches();
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(p.totals.data() + 2 * p.pairs, totals, 2 * sizeof(double),
                                        cudaMemcpyDeviceToHost, compute_stream()));
    ++p.pairs;
  }
  /// Queues a copy of the device decision `d` (the epilogue's) into the current step's page.
  void defer_decision(const update_decision* d) const {
    device_guard g(ordinal());
    auto& p = state_->pages[state_->page];
    if (p.decision.size() == 0) p.decision = pinned_buffer<update_decision>(1);
    count_launches();
    LOCKSTEP_CUDA_CHECK(
        cudaMemcpyAsync(p.decision.data(), d, sizeof(update_decision), cudaMemcpyDeviceToHost, compute_stream()));
    p.has_decision = true;
  }
  /// Closes the current step's page after the work queued so far, and makes the other page current.
  void readback_seal() const {
    device_guard g(ordinal());
    auto& p = state_->pages[state_->page];
    p.done.record(compute_stream());
    p.sealed = true;
    state_->page ^= 1;
  }
  /// Waits for the sealed page of the step before the current one (work of an earlier step: not
  /// a host sync) and returns its totals in evaluation order; the page is free again. Nothing
  /// sealed: evaluations 0.
  [[nodiscard]] readback_totals readback_collect() const {
    auto& p = state_->pages[state_->page ^ 1];
    readback_totals t;
    if (!p.sealed) return t;
    {
      device_guard g(ordinal());
      p.done.synchronize();
    }
    for (std::size_t i = 0; i < p.pairs; ++i) t.add(p.totals.data()[2 * i], p.totals.data()[2 * i + 1]);
    if (p.has_decision) {
      t.has_decision = true;
      t.decision = *p.decision.data();
    }
    p.clear();
    return t;
  }
  /// Drops what the current step's page holds (copies still queued into it land harmlessly).
  void readback_discard() const noexcept { state_->pages[state_->page].clear(); }
  /// Drops both pages (after a failed step; the streams' errors reach the next checked call).
  void readback_reset() const noexcept {
    for (auto& p : state_->pages) p.clear();
    state_->page = 0;
    state_->defer = false;
  }

  /// Two page-locked doubles, where a reduction's results are copied for the host.
  [[nodiscard]] double* host_result() const noexcept { return state_->result.data(); }

  /// Copies one shard's features, labels and targets (any may be empty) to the device through
  /// the next of two pinned staging slots: a host copy into pinned memory, then an asynchronous
  /// copy on the copy stream that the compute stream waits for. The copy of this shard overlaps
  /// whatever the compute stream still runs from the previous one.
  /// The returned pointers may be read by work queued on the compute stream before the NEXT
  /// stage_shard call: the call after that reuses this slot, and its copy waits (on the device)
  /// for exactly that work, no later work. (A replica queues all the work of a shard before it
  /// stages the next one.) The host waits only when a slot's previous copy is still running, or
  /// when a slot grows.
  staged_shard stage_shard(const float* features, std::size_t feature_count, const std::int32_t* labels,
                           std::size_t label_count, const float* targets, std::size_t target_count) const {
    const std::size_t fb = features ? feature_count * sizeof(float) : 0;
    const std::size_t lb = labels ? label_count * sizeof(std::int32_t) : 0;
    const std::size_t tb = targets ? target_count * sizeof(float) : 0;
    const std::size_t l_off = detail::align256(fb), t_off = l_off + detail::align256(lb);
    const std::size_t total = t_off + tb;
    if (total == 0) return {};

    device_guard g(ordinal());
    auto& st = *state_;
    const int k = st.next_slot;
    detail::staging_slot& slot = st.slots[k];
    detail::staging_slot& other = st.slots[1 - k];
    st.next_slot = 1 - k;
    // Everything reading the other slot has been queued: mark when the device is done with it.
    other.released.record(compute_stream());
    other.released_recorded = true;
    // This slot's pinned memory is free once its previous copy finished.
    if (slot.copied_recorded) slot.copied.synchronize();
    if (slot.device.size() < total) {
      if (slot.released_recorded) slot.released.synchronize();
      slot.host = pinned_buffer<unsigned char>();
      slot.device = detail::device_bytes();
      slot.host = pinned_buffer<unsigned char>(total);
      slot.device = detail::device_bytes(total);
      slot.released_recorded = false;
    }
    unsigned char* h = slot.host.data();
    if (fb) std::memcpy(h, features, fb);
    if (lb) std::memcpy(h + l_off, labels, lb);
    if (tb) std::memcpy(h + t_off, targets, tb);
    // The device copy may not overwrite data the compute stream still reads from this slot.
    if (slot.released_recorded) slot.released.wait_on(copy_stream());
    LOCKSTEP_CUDA_CHECK(cudaMemcpyAsync(slot.device.get(), h, total, cudaMemcpyHostToDevice, copy_stream()));
    slot.copied.record(copy_stream());
    slot.copied_recorded = true;
    slot.copied.wait_on(compute_stream());

    auto* d = static_cast<unsigned char*>(slot.device.get());
    return {fb ? reinterpret_cast<const float*>(d) : nullptr,
            lb ? reinterpret_cast<const std::int32_t*>(d + l_off) : nullptr,
            tb ? reinterpret_cast<const float*>(d + t_off) : nullptr};
  }

private:
  std::shared_ptr<detail::cuda_context_state> state_;
  compute_precision active_ = compute_precision::fp32;
  bf16_weight_copy_view weight_copy_{};
};

}  // namespace backend

using backend::cuda_context;
using backend::cuda_options;

/// The CUDA kind: gpu<I> replicas run with a cuda_context whose ordinal is a value, so every
/// replica of every GPU strategy shares one type.
template <>
struct backend_traits<gpus> {
  static constexpr bool registered = true;     ///< a backend exists
  using context_type = backend::cuda_context;  ///< a replica's execution context
  static constexpr const char* name = "gpu";   ///< the kind's name in messages and options
  /// A GPU ordinal must name a visible CUDA device.
  static constexpr bool ordinals_bounded = true;
  /// A GPU replica's worker drives its device: it is not pinned to a core.
  static constexpr bool replica_owns_core = false;
  /// The number of visible CUDA devices (0 without a driver or a device).
  static std::size_t device_count() { return static_cast<std::size_t>(backend::cuda_device_count()); }
  /// Why no device is visible, for messages: "no CUDA device: <CUDA's reason>".
  static std::string why_none() { return "no CUDA device: " + backend::cuda_unavailable_reason(); }
  /// The context of the replica on CUDA device `ordinal`, under the settings' precision policy
  /// (TF32 for every GEMM when the settings' tf32 switch asks).
  static context_type make_context(std::size_t ordinal, const replica_settings& s) {
    return context_type(static_cast<int>(ordinal), backend::cuda_options{.tf32 = s.tf32, .precision = s.precision});
  }
  /// Throws device_error naming the first replica whose device has too little free memory
  /// (cudaMemGetInfo) for `bytes` per replica (replicas sharing a device add up).
  static void check_memory(const std::vector<context_type>& contexts, std::size_t bytes) {
    std::vector<int> devices;
    for (const auto& c : contexts) devices.push_back(c.ordinal());
    const std::string why = backend::detail::replica_memory_shortfall(devices, bytes, [](int dev) {
      backend::device_guard g(dev);
      std::size_t free_bytes = 0, total = 0;
      LOCKSTEP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
      return std::pair<std::size_t, std::size_t>{free_bytes, total};
    });
    if (!why.empty()) throw device_error(why);
  }
};

/// Device memory: cudaMalloc on the calling thread's current device (a cuda_context makes its
/// device current when constructed and when activated), cudaFree on the device that owns the pointer.
template <>
struct device_memory<gpus> {
  static constexpr bool host_accessible = false;  ///< device memory: copy through the context
  /// Allocates `bytes` bytes of device memory (nullptr for 0 bytes); throws device_error.
  static void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t s = cudaMalloc(&p, bytes);
    if (s != cudaSuccess) {
      (void)cudaGetLastError();
      int dev = -1;
      (void)cudaGetDevice(&dev);
      throw device_error("lockstep: cudaMalloc of " + std::to_string(bytes) + " bytes on CUDA device " +
                         std::to_string(dev) + " failed: " + cudaGetErrorName(s) + ": " + cudaGetErrorString(s));
    }
    return p;
  }
  /// Frees memory from allocate, on its own device.
  static void deallocate(void* p, std::size_t) noexcept {
    if (!p) return;
    cudaPointerAttributes a{};
    int previous = -1;
    bool switched = false;
    if (cudaPointerGetAttributes(&a, p) == cudaSuccess && cudaGetDevice(&previous) == cudaSuccess &&
        a.device != previous)
      switched = cudaSetDevice(a.device) == cudaSuccess;
    (void)cudaFree(p);
    if (switched) (void)cudaSetDevice(previous);
  }
};

}  // namespace lockstep
