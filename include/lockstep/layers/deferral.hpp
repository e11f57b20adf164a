#pragma once
/// @file deferral.hpp
/// Deferred weight gradients under gradient accumulation. A dense layer's weight gradient is the
/// GEMM xᵀ·dy over the batch's rows. Adding it into the running sum batch by batch (the GEMM's
/// beta = 1) reads and writes the whole in × out gradient once per batch, and with the short
/// batches of an accumulated update that traffic, not the arithmetic, sets the GEMM's speed
/// (measured on a Zen 4 core: 146 GFLOP/s for 4096 × 4096 over 128 rows with beta = 1, 224 with
/// beta = 0). Instead, a host replica's model keeps each such layer's inputs and output gradients
/// of the update's batches in a gradient_deferral and forms the product once, over all the kept
/// rows, when the update's last batch arrives (or when the deferral's byte budget would be
/// exceeded: then the rows kept so far are added in and the keeping starts again). The step
/// policy of determinism::run_to_run turns it on (strategy_options::deferred_gradient_bytes);
/// the replica_count_invariant policy, whose micro-shards already add in a fixed order, does not.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include <lockstep/backend/host/ops.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/layers/layer.hpp>

namespace lockstep {

/// One replica's kept rows for deferred weight gradients (see the file comment): a stash per
/// layer, found by the address of the layer's parameters, grown in the first accumulated update
/// and reused after it (a steady-state update allocates nothing). Not thread-safe: it belongs to
/// one model, used by one replica thread at a time. A copy starts empty.
class gradient_deferral {
public:
  /// Rows of one layer kept for its weight gradient: `rows` rows of `in` inputs and of `out`
  /// output gradients (values of `value_bytes` bytes), in two dense row-major blocks.
  struct stash {
    const void* key = nullptr;        ///< the layer's parameters
    std::size_t in = 0;               ///< inputs per row
    std::size_t out = 0;              ///< output gradients per row
    std::size_t value_bytes = 0;      ///< bytes per value (sizeof(T))
    std::size_t rows = 0;             ///< rows kept now
    std::size_t capacity = 0;         ///< rows the storage holds
    bool written = false;             ///< this update already wrote the layer's weight gradient
    std::unique_ptr<std::byte[]> x;   ///< capacity * in values
    std::unique_ptr<std::byte[]> dy;  ///< capacity * out values
  };

  /// An empty deferral (no budget: nothing is kept until set_budget).
  gradient_deferral() = default;
  /// A copy starts empty, with the same budget and threshold.
  gradient_deferral(const gradient_deferral& other)
      : budget_(other.budget_), min_gradient_bytes_(other.min_gradient_bytes_) {}
  /// Assignment from a copy empties this deferral and takes the other's budget and threshold.
  gradient_deferral& operator=(const gradient_deferral& other) {
    if (this != &other) {
      stashes_.clear();
      reserved_bytes_ = 0;
      budget_ = other.budget_;
      min_gradient_bytes_ = other.min_gradient_bytes_;
    }
    return *this;
  }
  /// Moves the stashes.
  gradient_deferral(gradient_deferral&&) noexcept = default;
  /// Moves the stashes.
  gradient_deferral& operator=(gradient_deferral&&) noexcept = default;
  ~gradient_deferral() = default;

  /// The smallest weight gradient, in bytes, whose layer keeps its rows: a smaller one stays in
  /// the caches between batches, where adding into it costs little and keeping the rows costs
  /// more (config M's 784 × 512 and 512 × 512 ran 7 % slower deferred on a Zen 4 core, config L's
  /// 4096 × 4096 10 % faster).
  static constexpr std::size_t default_min_gradient_bytes = 4u << 20;

  /// Sets the smallest weight gradient, in bytes, whose layer keeps its rows.
  void set_min_gradient_bytes(std::size_t bytes) noexcept { min_gradient_bytes_ = bytes; }
  /// The smallest weight gradient, in bytes, whose layer keeps its rows.
  [[nodiscard]] std::size_t min_gradient_bytes() const noexcept { return min_gradient_bytes_; }

  /// Sets the most bytes every stash together may hold (storage already grown beyond it stays).
  void set_budget(std::size_t bytes) noexcept { budget_ = bytes; }
  /// The most bytes every stash together may hold.
  [[nodiscard]] std::size_t budget() const noexcept { return budget_; }
  /// Bytes of storage the stashes hold now (grown, never shrunk).
  [[nodiscard]] std::size_t reserved_bytes() const noexcept { return reserved_bytes_; }
  /// Number of layers with a stash.
  [[nodiscard]] std::size_t layers() const noexcept { return stashes_.size(); }

  /// The stash of the layer whose parameters are at `key` (created on its first use, sized
  /// later); throws lockstep::error when the same key comes back with another row shape.
  stash& find(const void* key, std::size_t in, std::size_t out, std::size_t value_bytes) {
    for (auto& s : stashes_)
      if (s.key == key) {
        if (s.in != in || s.out != out || s.value_bytes != value_bytes)
          throw error("lockstep::gradient_deferral: a layer's stash was asked for with another row shape");
        return s;
      }
    stash& s = stashes_.emplace_back();
    s.key = key;
    s.in = in;
    s.out = out;
    s.value_bytes = value_bytes;
    return s;
  }

  /// Makes room in `s` for `rows` rows in all (keeping those it has) and returns true, or returns
  /// false when that would take the stashes past the budget.
  bool make_room(stash& s, std::size_t rows) {
    if (rows <= s.capacity) return true;
    const std::size_t row_bytes = (s.in + s.out) * s.value_bytes;
    const std::size_t grow = (rows - s.capacity) * row_bytes;
    if (row_bytes == 0 || reserved_bytes_ + grow > budget_ || grow / row_bytes != rows - s.capacity) return false;
    auto x = std::unique_ptr<std::byte[]>(new std::byte[rows * s.in * s.value_bytes]);
    auto dy = std::unique_ptr<std::byte[]>(new std::byte[rows * s.out * s.value_bytes]);
    if (s.rows) {
      std::memcpy(x.get(), s.x.get(), s.rows * s.in * s.value_bytes);
      std::memcpy(dy.get(), s.dy.get(), s.rows * s.out * s.value_bytes);
    }
    s.x = std::move(x);
    s.dy = std::move(dy);
    reserved_bytes_ += grow;
    s.capacity = rows;
    return true;
  }

private:
  std::vector<stash> stashes_;
  std::size_t reserved_bytes_ = 0;
  std::size_t budget_ = 0;
  std::size_t min_gradient_bytes_ = default_min_gradient_bytes;
};

namespace detail {

// dw (in x out, leading dimension out) = x^T dy over the stash's rows, added when the update has
// already written it; the stash is emptied.
template <class T>
void flush_stash(const host_context& ctx, gradient_deferral::stash& s, T* dw) {
  if (s.rows == 0) return;
  gemm(ctx, backend::trans::yes, backend::trans::no, s.in, s.out, s.rows, T(1),
       reinterpret_cast<const T*>(s.x.get()), s.in, reinterpret_cast<const T*>(s.dy.get()), s.out,
       s.written ? T(1) : T(0), dw, s.out);
  s.written = true;
  s.rows = 0;
}

/// A layer's input rows given as their bf16 encodings (an activation kept in bf16).
struct bf16_rows {
  const std::uint16_t* bits;  ///< rows x in encodings, dense
};
// Keeps n input values at dst: copied, or widened from bf16 (exact).
template <class T>
void keep_inputs(T* dst, const T* x, std::size_t n) {
  std::memcpy(dst, x, n * sizeof(T));
}
inline void keep_inputs(float* dst, bf16_rows x, std::size_t n) { backend::detail::widen_bf16(x.bits, n, dst); }
// dw = x^T dy + beta dw over `rows` rows.
template <class Ctx, class T>
void input_product(Ctx& ctx, const T* x, const T* dy, std::size_t rows, std::size_t in, std::size_t out, T beta,
                   T* dw) {
  gemm(ctx, backend::trans::yes, backend::trans::no, in, out, rows, T(1), x, in, dy, out, beta, dw, out);
}
template <class Ctx, class T>
void input_product(Ctx& ctx, bf16_rows x, const T* dy, std::size_t rows, std::size_t in, std::size_t out, T beta,
                   T* dw) {
  gemm_bf16_input(ctx, backend::trans::yes, backend::trans::no, in, out, rows, T(1), x.bits, dy, out, beta, dw, out);
}

// weight_gradient with the inputs X: values (const T*) or bf16 encodings (bf16_rows).
template <class X, class T, class Ctx>
void weight_gradient_of(Ctx& ctx, const pass_info& info, const void* key, X x, const T* dy, std::size_t rows,
                        std::size_t in, std::size_t out, T* dw) {
  if constexpr (std::is_same_v<std::remove_cvref_t<Ctx>, host_context>) {
    if (info.deferral != nullptr && (info.accumulate || !info.last_of_update) &&
        in * out * sizeof(T) >= info.deferral->min_gradient_bytes()) {
      gradient_deferral& d = *info.deferral;
      gradient_deferral::stash& s = d.find(key, in, out, sizeof(T));
      if (!info.accumulate) {  // the update's first batch: nothing kept or written yet
        s.rows = 0;
        s.written = false;
      }
      if (!d.make_room(s, s.rows + rows)) {
        flush_stash(ctx, s, dw);      // the budget is reached: add in what is kept
        if (!d.make_room(s, rows)) {  // this batch alone is too big to keep: add it now
          input_product(ctx, x, dy, rows, in, out, s.written ? T(1) : T(0), dw);
          s.written = true;
          rows = 0;
        }
      }
      if (rows) {
        keep_inputs(reinterpret_cast<T*>(s.x.get()) + s.rows * in, x, rows * in);
        std::memcpy(s.dy.get() + s.rows * out * sizeof(T), dy, rows * out * sizeof(T));
        s.rows += rows;
      }
      if (info.last_of_update) {
        flush_stash(ctx, s, dw);
        if (!s.written) fill(ctx, dw, in * out, T(0));  // an update with no rows at all
      }
      return;
    }
  }
  input_product(ctx, x, dy, rows, in, out, info.accumulate ? T(1) : T(0), dw);
}
}  // namespace detail

/// The weight gradient of a layer whose parameters start at `key`: dw (in x out, leading
/// dimension out) = x^T dy over this batch's `rows` rows (x: rows x in, dy: rows x out), written,
/// or added under info.accumulate. Where info.deferral is set (a host replica in an accumulated
/// update of the run_to_run policy) and the gradient has at least its min_gradient_bytes(), the
/// rows are kept instead and the product is formed over all the update's kept rows at its last
/// batch (info.last_of_update), so that dw holds the sum when that batch's backward returns, as
/// without deferral; in between dw is not final.
template <class T, class Ctx>
void weight_gradient(Ctx& ctx, const pass_info& info, const void* key, const T* x, const T* dy, std::size_t rows,
                     std::size_t in, std::size_t out, T* dw) {
  detail::weight_gradient_of(ctx, info, key, x, dy, rows, in, out, dw);
}

/// weight_gradient on a host context with x given as its bf16 encodings x16 (an activation kept
/// in bf16, pass_info::bf16_activations): the same bits as on the widened values. Kept rows are
/// widened to fp32, which the GEMM rounds back to the same encodings.
inline void weight_gradient_bf16_input(const host_context& ctx, const pass_info& info, const void* key,
                                       const std::uint16_t* x16, const float* dy, std::size_t rows, std::size_t in,
                                       std::size_t out, float* dw) {
  detail::weight_gradient_of(ctx, info, key, detail::bf16_rows{x16}, dy, rows, in, out, dw);
}

}  // namespace lockstep
