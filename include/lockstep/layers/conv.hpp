#pragma once
/// @file conv.hpp
/// Layers on images `shape<C, H, W>` (NCHW rows): `conv2d`, `max_pool2d`, `avg_pool2d`,
/// `global_avg_pool`, and the shape layers `reshape<Dims...>` and `flatten`. Each is written with
/// the backend's primitives (gemm, for_each_index, fill, copy), so one definition runs on the host
/// and on GPUs; on the host, convolutions may run through oneDNN's primitives and 2 x 2 poolings
/// through AVX2 loops (backend/host/pool_2x2.hpp), with the bits of the host's own loops for the
/// poolings. Every gradient is computed in gather form (each output element sums its own
/// contributions in a fixed order): no atomics, bitwise deterministic on every device.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>

#include <lockstep/backend/host/pool_2x2.hpp>
#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/layers/activations.hpp>
#include <lockstep/layers/init.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/core/index_divider.hpp>
#include <lockstep/core/shape.hpp>

namespace lockstep {

namespace detail {

/// Geometry of a 2-d window (kernel, stride, padding) over a C x H x W image. A structural type:
/// the convolution's kernels take it as a template argument, so that every size is a constant.
struct window2d {
  std::size_t c, h, w;            ///< input channels, height, width
  std::size_t k, stride, pad;     ///< square window, its step and the zero padding on each side
  std::size_t oh, ow;             ///< output height and width
  /// Input row of output row `o` at window row `kr`, or -1 when it falls in the padding.
  [[nodiscard]] LOCKSTEP_HD long in_row(std::size_t o, std::size_t kr) const {
    return static_cast<long>(o * stride + kr) - static_cast<long>(pad);
  }
  /// Input column of output column `o` at window column `kc`, or -1 when it falls in the padding.
  [[nodiscard]] LOCKSTEP_HD long in_col(std::size_t o, std::size_t kc) const {
    return static_cast<long>(o * stride + kc) - static_cast<long>(pad);
  }
  /// Output positions whose window covers input position i along an axis of `out` outputs:
  /// [first, last) (empty when last <= first).
  LOCKSTEP_HD void covering(std::size_t i, std::size_t out, std::size_t& first, std::size_t& last) const {
    const std::size_t ip = i + pad;  // position in the padded input
    first = ip + 1 > k ? (ip + 1 - k + stride - 1) / stride : 0;
    last = ip / stride + 1;
    if (last > out) last = out;
  }
};

/// Zero-padded copy of one image: xp is C x (H + 2 pad) x (W + 2 pad), the image in the middle,
/// zeros around it. One call writes one padded row (c, py).
template <class T, window2d G, class In = T>
struct pad_image_op {
  const In* x;  ///< C x H x W, in T or (In = std::uint16_t) as bf16 encodings, widened here
  T* xp;        ///< C x (H + 2 pad) x (W + 2 pad)
  /// Writes padded row i = (c, py).
  LOCKSTEP_HD void operator()(std::size_t i) const {
    constexpr std::size_t ph = G.h + 2 * G.pad, pw = G.w + 2 * G.pad;
    const std::size_t y = i % ph - G.pad, c = i / ph;  // y wraps past H in the top padding
    T* out = xp + i * pw;
    if (y >= G.h) {
      for (std::size_t j = 0; j < pw; ++j) out[j] = T(0);
      return;
    }
    // Each element written once: g++ 12 at -O3 with AVX2 loses the copied elements when the row
    // is zeroed first and then overwritten in the middle.
    const In* in = x + (c * G.h + y) * G.w;
    if constexpr (G.pad > 0)
      for (std::size_t j = 0; j < G.pad; ++j) out[j] = T(0);
    if constexpr (std::is_same_v<In, std::uint16_t>)
      for (std::size_t j = 0; j < G.w; ++j) out[G.pad + j] = from_bf16_bits(in[j]);
    else
      for (std::size_t j = 0; j < G.w; ++j) out[G.pad + j] = in[j];
    if constexpr (G.pad > 0)
      for (std::size_t j = 0; j < G.pad; ++j) out[G.pad + G.w + j] = T(0);
  }
};

/// im2col of one image from its padded copy: cols is (C K K) x (OH OW), row (c, kr, kc), column
/// (oy, ox), cols[(c, kr, kc)][(oy, ox)] = xp[c][oy stride + kr][ox stride + kc]. One call fills
/// the OH OW elements of one row (c, kr, kc): with the padding already in xp and the geometry G a
/// constant, that is a copy without a branch, and for stride 1 a run of contiguous row copies.
template <class T, window2d G>
struct im2col_op {
  const T* xp;   ///< C x (H + 2 pad) x (W + 2 pad), from pad_image_op
  T* cols;       ///< (C K K) x (OH OW)
  /// Fills row i = (c, kr, kc) of cols.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    constexpr std::size_t ph = G.h + 2 * G.pad, pw = G.w + 2 * G.pad;
    const std::size_t kc = i % G.k, kr = (i / G.k) % G.k, c = i / (G.k * G.k);
    const T* in = xp + (c * ph + kr) * pw + kc;
    T* out = cols + i * (G.oh * G.ow);
    for (std::size_t oy = 0; oy < G.oh; ++oy)
      for (std::size_t ox = 0; ox < G.ow; ++ox) out[oy * G.ow + ox] = in[oy * G.stride * pw + ox * G.stride];
  }
};

/// col2im of one image: dx (C x H x W) = the sum of the column entries that read each input
/// element, each element's terms added in a fixed order (output row oy ascending, then output
/// column ox ascending). One call does one channel c and owns it: it zeroes a padded plane acc
/// ((H + 2 pad) x (W + 2 pad), so that no bound is checked in the inner loop), adds the OH x OW
/// block of every column row (c, kr, kc) into it at offset (kr, kc), reading dcols in order, then
/// copies the middle H x W to dx. (kr, kc) both descending is (oy, ox) ascending for every element.
template <class T, window2d G>
struct col2im_op {
  const T* dcols;  ///< (C K K) x (OH OW) of one image
  T* dx;           ///< C x H x W of the same image
  T* acc;          ///< C x (H + 2 pad) x (W + 2 pad) (scratch)
  /// Writes channel c of dx.
  LOCKSTEP_HD void operator()(std::size_t c) const {
    constexpr std::size_t ph = G.h + 2 * G.pad, pw = G.w + 2 * G.pad;  // (OH - 1) stride + K <= ph, same for pw
    T* a = acc + c * ph * pw;
    for (std::size_t j = 0; j < ph * pw; ++j) a[j] = T(0);
    for (std::size_t kr = G.k; kr-- > 0;)
      for (std::size_t kc = G.k; kc-- > 0;) {
        const T* src = dcols + ((c * G.k + kr) * G.k + kc) * (G.oh * G.ow);
        for (std::size_t oy = 0; oy < G.oh; ++oy) {
          T* row = a + (oy * G.stride + kr) * pw + kc;
          for (std::size_t ox = 0; ox < G.ow; ++ox) row[ox * G.stride] += src[oy * G.ow + ox];
        }
      }
    T* out = dx + c * G.h * G.w;
    for (std::size_t y = 0; y < G.h; ++y)
      for (std::size_t xx = 0; xx < G.w; ++xx) out[y * G.w + xx] = a[(y + G.pad) * pw + G.pad + xx];
  }
};

/// The filters with their biases as one F x (Q + 1) matrix: row f is filter f's Q weights, then
/// its bias (which meets the row of ones under the columns). One call per element.
template <class T, std::size_t F, std::size_t Q>
struct append_bias_op {
  const T* params;  ///< F x Q filters, then F biases
  T* wb;            ///< F x (Q + 1)
  /// Writes element i of wb.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const std::size_t f = i / (Q + 1), j = i % (Q + 1);
    wb[i] = j < Q ? params[f * Q + j] : params[F * Q + f];
  }
};

/// The parameter gradient from its transpose: g is (Q + 1) x F (row j < Q: weight j of every
/// filter; row Q: the biases), dparams is F x Q filters then F biases. One call per element.
template <class T, std::size_t F, std::size_t Q>
struct gradient_from_transpose_op {
  const T* g;    ///< (Q + 1) x F
  T* dparams;    ///< F Q + F
  bool add;      ///< add to dparams (gradient accumulation) instead of writing it
  /// Writes (or adds to) element i of dparams.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const T v = i < F * Q ? g[(i % Q) * F + i / Q] : g[F * Q + (i - F * Q)];
    dparams[i] = add ? dparams[i] + v : v;
  }
};

/// im2col over a whole shard, the columns of every image side by side: cols is (Q + 1) x n with
/// Q = C K K and n = batch OH OW; row q = (c, kr, kc), column (b, oy, ox); zero where the window
/// reads padding; row Q all ones (it meets the biases). Call i: element i (the GPU's form: one
/// kernel for the whole shard).
template <class T, window2d G>
struct im2col_batched_op {
  const T* x;          ///< batch x C x H x W
  T* cols;             ///< (Q + 1) x n
  std::size_t n;       ///< batch OH OW
  index_divider by_n;  ///< division by n for 32-bit indices (a GPU has no integer divider)
  /// Columns of the images at x into cols, n columns per row.
  im2col_batched_op(const T* x_, T* cols_, std::size_t n_)
      : x(x_), cols(cols_), n(n_), by_n(n_ <= 0xffffffffu ? static_cast<std::uint32_t>(n_) : 1u) {}
  /// Writes element i of cols: with 32-bit index arithmetic when i and n fit (a GPU runs it at
  /// several times the speed of 64-bit divisions), else with 64-bit.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    if (i <= 0xffffffffu && n <= 0xffffffffu) element<std::uint32_t>(static_cast<std::uint32_t>(i));
    else element<std::size_t>(i);
  }
  /// Writes element i of cols with index type I (std::uint32_t: i and n below 2^32).
  template <class I>
  LOCKSTEP_HD void element(I i) const {
    constexpr I P = static_cast<I>(G.oh * G.ow), Q = static_cast<I>(G.c * G.k * G.k), K = static_cast<I>(G.k);
    constexpr I OW = static_cast<I>(G.ow);
    I q, col;
    if constexpr (std::is_same_v<I, std::uint32_t>) {
      by_n.divmod(i, q, col);
    } else {
      q = i / n;
      col = i % n;
    }
    if (q == Q) {
      cols[i] = T(1);
      return;
    }
    const I b = col / P, p = col % P;
    const I kc = q % K, kr = (q / K) % K, c = q / (K * K);
    const long iy = G.in_row(p / OW, kr), ix = G.in_col(p % OW, kc);
    cols[i] = iy >= 0 && iy < static_cast<long>(G.h) && ix >= 0 && ix < static_cast<long>(G.w)
                  ? x[((static_cast<std::size_t>(b) * G.c + c) * G.h + static_cast<std::size_t>(iy)) * G.w +
                      static_cast<std::size_t>(ix)]
                  : T(0);
  }
};

/// col2im over a whole shard in gather form: dx (batch x C x H x W) from dcols (Q x n, the
/// layout of im2col_batched_op), each input element the sum of the column entries that read it,
/// added in the order of col2im_op (output row oy ascending, then output column ox ascending,
/// starting from zero): the same bits. Call i: element i of dx.
template <class T, window2d G>
struct col2im_batched_op {
  const T* dcols;  ///< Q x n
  T* dx;           ///< batch x C x H x W
  std::size_t n;   ///< batch OH OW
  /// Writes element i of dx.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    constexpr std::size_t P = G.oh * G.ow;
    const std::size_t xx = i % G.w, y = (i / G.w) % G.h, c = (i / (G.w * G.h)) % G.c, b = i / (G.w * G.h * G.c);
    std::size_t oy0, oy1, ox0, ox1;
    G.covering(y, G.oh, oy0, oy1);
    G.covering(xx, G.ow, ox0, ox1);
    T s = T(0);
    for (std::size_t oy = oy0; oy < oy1; ++oy) {
      const std::size_t kr = y + G.pad - oy * G.stride;
      for (std::size_t ox = ox0; ox < ox1; ++ox) {
        const std::size_t kc = xx + G.pad - ox * G.stride;
        s += dcols[((c * G.k + kr) * G.k + kc) * n + b * P + oy * G.ow + ox];
      }
    }
    dx[i] = s;
  }
};

/// Between a shard's images (batch x F x P) and the same values channel-major (F x (batch P),
/// the layout of the batched GEMMs): `to_images` copies channel-major into images, otherwise the
/// reverse. Call i: element i of the images.
template <class T, std::size_t F, std::size_t P>
struct channel_major_op {
  const T* src;        ///< the source layout
  T* dst;              ///< the other layout
  std::size_t batch;   ///< images
  bool to_images;      ///< direction
  /// Moves image element i.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const std::size_t p = i % P, f = (i / P) % F, b = i / (F * P);
    const std::size_t j = f * (batch * P) + b * P + p;
    if (to_images)
      dst[i] = src[j];
    else
      dst[j] = src[i];
  }
};

/// The parameter gradient from the F x (Q + 1) gradient of the filters with their biases (the
/// layout of append_bias_op): dparams is F x Q filters then F biases. Call i: element i of dparams.
template <class T, std::size_t F, std::size_t Q>
struct gradient_from_filters_op {
  const T* g;    ///< F x (Q + 1)
  T* dparams;    ///< F Q + F
  bool add;      ///< add to dparams (gradient accumulation) instead of writing it
  /// Writes (or adds to) element i of dparams.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const T v = i < F * Q ? g[(i / Q) * (Q + 1) + i % Q] : g[(i - F * Q) * (Q + 1) + Q];
    dparams[i] = add ? dparams[i] + v : v;
  }
};

/// True when window (K, Stride, Pad) fits image shape S (rank 3, at least one output each way).
template <class S, std::size_t K, std::size_t Stride, std::size_t Pad>
constexpr bool window_fits() {
  if constexpr (image_shape<S>)
    return K > 0 && Stride > 0 && Pad < K && window_output(S::dims[1], K, Stride, Pad) > 0 &&
           window_output(S::dims[2], K, Stride, Pad) > 0;
  else
    return false;
}

}  // namespace detail

/// The fewest input channels for which conv2d runs through oneDNN's primitives (where it can):
/// with fewer, im2col + GEMM is faster (one input channel: 3.7 times faster than oneDNN's blocked
/// convolution on an AVX-512 CPU; 32 channels: oneDNN 1.8 times faster; docs/benchmarks.md).
inline constexpr std::size_t onednn_conv_min_channels = 8;

/// 2-d convolution with `Filters` output channels, a square `Kernel` x `Kernel` window, `Stride`
/// and zero `Padding` on every side (`Padding = Kernel / 2` with stride 1 keeps H and W for odd
/// kernels: TensorFlow's "same"). Input rows `shape<C, H, W>`, output rows `shape<Filters, OH, OW>`
/// with OH = (H + 2 Padding - Kernel) / Stride + 1. Parameters: the filters (Filters x C x Kernel x
/// Kernel, in that order) then one bias per filter. Computed on GPUs over the whole shard at once
/// (forward_batched, backward_batched: one GEMM per pass); on the host as im2col + GEMM per image, or, for
/// float on host replicas of the LOCKSTEP_HOST_GEMM=onednn build under the fp32 policy with at
/// least onednn_conv_min_channels input channels, by oneDNN's convolution primitives in their own
/// layouts (reordered at the layer's boundary).
/// @tparam Init weight initialiser (fan-in C Kernel^2; biases start at zero)
template <std::size_t Filters, std::size_t Kernel, std::size_t Stride = 1, std::size_t Padding = 0,
          class Init = he_uniform>
struct conv2d {
  static_assert(Filters > 0 && Kernel > 0 && Stride > 0, "lockstep::conv2d: Filters, Kernel and Stride must be positive");
  static_assert(Padding < Kernel, "lockstep::conv2d: Padding must be smaller than Kernel");
  using layer_concept = layer_tag;                  ///< opts in to the layer concept
  static constexpr std::size_t expected_input = 0;  ///< the width comes with the image shape

  /// True when the window fits image shape S.
  template <class S>
  static constexpr bool accepts_shape = detail::window_fits<S, Kernel, Stride, Padding>();

  /// The convolution bound to input images of shape S.
  template <class S>
  struct bind_shape {
    static_assert(detail::window_fits<S, Kernel, Stride, Padding>(),
                  "lockstep::conv2d: the input must be an image shape<C, H, W> at least as large as the window");
    static constexpr std::size_t C = S::dims[0], H = S::dims[1], W = S::dims[2];  ///< input image
    static constexpr std::size_t OH = window_output(H, Kernel, Stride, Padding);  ///< output height
    static constexpr std::size_t OW = window_output(W, Kernel, Stride, Padding);  ///< output width
    static constexpr std::size_t patch = C * Kernel * Kernel;                      ///< one filter's weights
    using input_shape = S;                                                         ///< input image
    using output_shape = shape<Filters, OH, OW>;                                   ///< output image
    static constexpr std::size_t input_size = S::size;                             ///< features in
    static constexpr std::size_t output_size = Filters * OH * OW;                  ///< features out
    static constexpr std::size_t param_count = Filters * patch + Filters;          ///< filters then biases
    static constexpr std::size_t padded = C * (H + 2 * Padding) * (W + 2 * Padding);  ///< one padded image
    static constexpr std::size_t workspace_per_sample = 0;  ///< nothing is kept per image: backward recomputes
    static constexpr bool mixed_precision = true;  ///< its GEMMs compute in the model's precision policy
    static constexpr bool accumulates_gradients = true;      ///< adds into dparams under pass_info::accumulate
    using fuses_activation = bind_shape;  ///< applies a following activation in its forward (forward_activated)
    static constexpr bool bf16_activations = true;  ///< reads and writes activations kept in bf16 (forward_stored, backward_stored)
    static constexpr bool backward_reads_output = false;  ///< backward reads x, never y (output_unread_v)
    /// One image's columns and a row of ones (the columns are reused for their gradient), one
    /// padded image (reused for col2im's sums) and the filters with their biases (reused for the
    /// transposed parameter gradient).
    static constexpr std::size_t workspace_fixed = (patch + 1) * OH * OW + padded + (patch + 1) * Filters;

    /// Initialises the filters with Init (fan-in C K K, fan-out Filters K K) and the biases with zeros.
    template <class T>
    static void init(T* params, const counter_rng& rng) {
      Init::fill(params, Filters * patch, patch, Filters * Kernel * Kernel, rng);
      for (std::size_t f = 0; f < Filters; ++f) params[Filters * patch + f] = T(0);
    }

    /// True when the convolution of T on Ctx may run through oneDNN's primitives (see conv2d); it
    /// does when the context's GEMM precision is fp32, or bf16 where the CPU has bf16 instructions
    /// (onednn_conv_cache::available).
    template <class T, class Ctx>
    static constexpr bool onednn_capable =
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
        std::is_same_v<T, float> && detail::host_context_v<Ctx> &&
        C >= onednn_conv_min_channels;
#else
        false;
#endif

    /// y[b] = [W bias] [cols(x[b]); 1...1]: one GEMM per image, right after the image's columns
    /// (still in cache), with the bias as one more column of the filters over a row of ones; or
    /// oneDNN's forward convolution over the whole batch; on GPUs forward_batched.
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const forward_args<T, Ctx, S, output_shape>& a) {
      forward_then<void>(ctx, a, nullptr, nullptr);
    }

    /// forward, then the activation Fn of the layer that follows (fuses_activation_v) applied to
    /// y in place: each image's output right after its GEMM on the host's im2col path (still in
    /// cache), the whole output after oneDNN's or the GPU's convolution. The same bits as the two
    /// layers apart; backward never reads y.
    template <class Fn, class T, class Ctx>
    static void forward_activated(Ctx& ctx, const forward_args<T, Ctx, S, output_shape>& a) {
      forward_then<Fn>(ctx, a, nullptr, nullptr);
    }

    /// forward (Fn void) or forward_activated<Fn>, in a pass on a host context that keeps
    /// activations in bf16 (bf16_activations_v): the images read from their bf16 encodings x16
    /// when x16 is not null (a.x unused; widened into the padded image on the im2col path, read
    /// by oneDNN's reorder otherwise), and Fn's results written to a.y in fp32 and, when y16 is not
    /// null, as their bf16 encodings to y16 (each image's right after its GEMM on the im2col path,
    /// still in cache). The same bits as on the widened values: the GEMMs round them to the same
    /// bf16 values.
    template <class Fn, class T, class Ctx>
    static void forward_stored(Ctx& ctx, const forward_args<T, Ctx, S, output_shape>& a, const std::uint16_t* x16,
                               std::uint16_t* y16) {
      forward_then<Fn>(ctx, a, x16, y16);
    }

  private:
    // Fn applied in place to the n values at y (nothing for Fn = void), then, when y16 is not
    // null, their bf16 encodings written to y16 (host contexts).
    template <class Fn, class T, class Ctx>
    static void activate(Ctx& ctx, T* y, std::size_t n, std::uint16_t* y16) {
      if constexpr (!std::is_void_v<Fn>) for_each_index(ctx, n, detail::activation_forward_op<Fn, T>{y, y});
      backend::encode_output16(ctx, y, n, y16);
    }

    // forward (the images from x16 when not null), then activate<Fn> over the output (and its
    // encodings to y16).
    template <class Fn, class T, class Ctx>
    static void forward_then(Ctx& ctx, const forward_args<T, Ctx, S, output_shape>& a,
                             [[maybe_unused]] const std::uint16_t* x16, std::uint16_t* y16) {
      using backend::trans;
      constexpr std::size_t P = OH * OW;
      const std::size_t batch = a.batch();
      if (batch == 0) return;
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
      if constexpr (onednn_capable<T, Ctx>) {
        if (const auto g = onednn_geometry(ctx, batch, x16 != nullptr);
            g && ctx.conv_cache().available(ctx.blas_threads(), *g)) {
          ctx.conv_cache().forward(ctx.blas_threads(), *g, images_of(a, x16), a.params,
                                   a.params + Filters * patch, a.y.data());
          activate<Fn>(ctx, a.y.data(), a.y.size(), y16);
          return;
        }
      }
#endif
      if constexpr (!detail::host_context_v<Ctx>) {  // GPUs: the whole shard in a few launches
        over_chunks<T>(ctx, batch, [&](std::size_t first, std::size_t images, T* work) {
          forward_batched(ctx, a, first, images, work);
        });
        activate<Fn>(ctx, a.y.data(), a.y.size(), nullptr);
        return;
      }
      const T* params = a.params;
      const scratch<T> s(a.workspace);
      for_each_index(ctx, Filters * (patch + 1), detail::append_bias_op<T, Filters, patch>{params, s.wb});
      fill(ctx, s.cols + patch * P, P, T(1));
      for (std::size_t b = 0; b < batch; ++b) {
        columns_of(ctx, a, x16, b, s);
        gemm(ctx, trans::no, trans::no, Filters, P, patch + 1, T(1), s.wb, patch + 1, s.cols, P, T(0), a.y.row(b), P);
        activate<Fn>(ctx, a.y.row(b), Filters * P, y16 ? y16 + b * output_size : nullptr);
      }
    }

  public:
    /// [dW dbias]^T = the sum over images (in order) of [cols(x[b]); 1...1] dy[b]^T, with the
    /// columns computed again and the biases' gradient given by the row of ones (the transposed
    /// product is the faster GEMM shape; one transposition at the end), and, when dx is not empty,
    /// dx[b] = col2im(W^T dy[b]). On GPUs backward_batched.
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const backward_args<T, Ctx, S, output_shape>& a) {
      backward_stored(ctx, a, nullptr);
    }

    /// backward, with the images read from their bf16 encodings x16 when x16 is not null (a.x
    /// unused; a host context, see forward_stored): the same bits as backward on the widened values.
    template <class T, class Ctx>
    static void backward_stored(Ctx& ctx, const backward_args<T, Ctx, S, output_shape>& a,
                                [[maybe_unused]] const std::uint16_t* x16) {
      using backend::trans;
      constexpr std::size_t P = OH * OW;
      const std::size_t batch = a.batch();
      if (batch == 0) {
        if (!a.info.accumulate) fill(ctx, a.dparams, param_count, T(0));
        return;
      }
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
      if constexpr (onednn_capable<T, Ctx>) {
        if (const auto g = onednn_geometry(ctx, batch, x16 != nullptr);
            g && ctx.conv_cache().available(ctx.blas_threads(), *g)) {
          ctx.conv_cache().backward(ctx.blas_threads(), *g, images_of(a, x16), a.params,
                                    a.dy.data(), a.dparams,
                                    a.dparams + Filters * patch, a.info.accumulate, a.dx ? a.dx.data() : nullptr);
          return;
        }
      }
#endif
      if constexpr (!detail::host_context_v<Ctx>) {  // GPUs: the whole shard in a few launches
        over_chunks<T>(ctx, batch, [&](std::size_t first, std::size_t images, T* work) {
          backward_batched(ctx, a, first, images, work);
        });
        return;
      }
      const scratch<T> s(a.workspace);
      T* gt = s.wb;  // (patch + 1) x Filters
      fill(ctx, s.cols + patch * P, P, T(1));
      for (std::size_t b = 0; b < batch; ++b) {
        const T* dyb = a.dy.row(b);
        columns_of(ctx, a, x16, b, s);
        gemm(ctx, trans::no, trans::yes, patch + 1, Filters, P, T(1), s.cols, P, dyb, P, b == 0 ? T(0) : T(1), gt,
             Filters);
        if (!a.dx) continue;
        gemm(ctx, trans::yes, trans::no, patch, P, Filters, T(1), a.params, patch, dyb, P, T(0), s.cols, P);
        for_each_index(ctx, C, detail::col2im_op<T, geometry>{s.cols, a.dx.row(b), s.xp});
      }
      for_each_index(ctx, param_count,
                     detail::gradient_from_transpose_op<T, Filters, patch>{gt, a.dparams, a.info.accumulate});
    }

    /// Scratch elements the batched form needs for `images` images: their columns over a row of
    /// ones ((patch + 1) x images OH OW, reused for the columns' gradient) and their outputs or
    /// output gradients channel-major (Filters x images OH OW).
    static constexpr std::size_t batched_scratch(std::size_t images) noexcept {
      return (patch + 1 + Filters) * images * OH * OW;
    }

    /// Images per call of the batched form for a shard of `batch`: all of them unless their
    /// scratch would pass 512 MiB of floats (then as many as fit, at least one).
    static constexpr std::size_t batched_images(std::size_t batch) noexcept {
      constexpr std::size_t cap = (std::size_t{512} << 20) / sizeof(float) / (patch + 1 + Filters) / (OH * OW);
      return batch < cap ? (batch > 0 ? batch : 1) : (cap > 0 ? cap : 1);
    }

    /// The batched forward (GPUs; public so that tests run it on the host too): images
    /// [first, first + images) of the shard in four calls whatever their number: their columns
    /// side by side (im2col_batched_op), the filters with their biases (once per shard, at
    /// first = 0, kept in the workspace), ONE GEMM [W bias] [cols; 1...1] for all of them
    /// (channel-major), and its copy into the images' rows. `work` holds batched_scratch(images)
    /// elements of the context's memory.
    template <class T, class Ctx>
    static void forward_batched(Ctx& ctx, const forward_args<T, Ctx, S, output_shape>& a, std::size_t first,
                                std::size_t images, T* work) {
      using backend::trans;
      constexpr std::size_t P = OH * OW;
      const std::size_t n = images * P;
      if (n == 0) return;
      T* cols = work;                    // (patch + 1) x n
      T* yt = work + (patch + 1) * n;    // Filters x n
      T* wb = scratch<T>(a.workspace).wb;
      for_each_index(ctx, (patch + 1) * n, detail::im2col_batched_op<T, geometry>{a.x.row(first), cols, n});
      if (first == 0) for_each_index(ctx, Filters * (patch + 1), detail::append_bias_op<T, Filters, patch>{a.params, wb});
      gemm(ctx, trans::no, trans::no, Filters, n, patch + 1, T(1), wb, patch + 1, cols, n, T(0), yt, n);
      for_each_index(ctx, Filters * n, detail::channel_major_op<T, Filters, P>{yt, a.y.row(first), images, true});
    }

    /// The batched backward (GPUs; public so that tests run it on the host too) of images
    /// [first, first + images): their columns and their dy channel-major, ONE GEMM for the
    /// filters' and biases' gradient over all of them (added to the previous images' when
    /// first > 0), and, when dx is wanted, ONE GEMM for the columns' gradient and a gather col2im
    /// (col2im_batched_op). No atomics; each sum in a fixed order.
    template <class T, class Ctx>
    static void backward_batched(Ctx& ctx, const backward_args<T, Ctx, S, output_shape>& a, std::size_t first,
                                 std::size_t images, T* work) {
      using backend::trans;
      const std::size_t n = images * OH * OW;
      T* cols = work;                    // (patch + 1) x n, then the columns' gradient (patch x n)
      T* dyt = work + (patch + 1) * n;   // Filters x n
      T* g = scratch<T>(a.workspace).wb;  // Filters x (patch + 1)
      const bool last = first + images == a.batch();
      if (n > 0) {
        for_each_index(ctx, (patch + 1) * n, detail::im2col_batched_op<T, geometry>{a.x.row(first), cols, n});
        for_each_index(ctx, Filters * n, detail::channel_major_op<T, Filters, OH * OW>{a.dy.row(first), dyt, images, false});
        gemm(ctx, trans::no, trans::yes, Filters, patch + 1, n, T(1), dyt, n, cols, n, first == 0 ? T(0) : T(1), g,
             patch + 1);
      }
      if (last)
        for_each_index(ctx, param_count, detail::gradient_from_filters_op<T, Filters, patch>{g, a.dparams, a.info.accumulate});
      if (!a.dx || n == 0) return;
      gemm(ctx, trans::yes, trans::no, patch, n, Filters, T(1), a.params, patch, dyt, n, T(0), cols, n);
      for_each_index(ctx, images * C * H * W, detail::col2im_batched_op<T, geometry>{cols, a.dx.row(first), n});
    }

  private:
    static constexpr detail::window2d geometry{C, H, W, Kernel, Stride, Padding, OH, OW};  ///< as a constant

    /// Runs pass(first, images, work) over a GPU shard of `batch` images in the chunks that
    /// batched_images allows, all with one device scratch of the context as `work`.
    template <class T, class Ctx, class Pass>
    static void over_chunks(Ctx& ctx, std::size_t batch, const Pass& pass) {
      const std::size_t per = batched_images(batch);
      T* work = static_cast<T*>(ctx.scratch(batched_scratch(std::min(per, batch)) * sizeof(T)));
      for (std::size_t first = 0; first < batch; first += per) pass(first, std::min(per, batch - first), work);
    }

#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
    /// The call shape of `batch` images for oneDNN under the context's GEMM precision (fp32 or bf16
    /// operands), or nothing under a precision oneDNN's path does not take (fp16: im2col) or when
    /// the context keeps convolutions on im2col (host_context::onednn_convolutions).
    template <class Ctx>
    static std::optional<backend::detail::conv_geometry> onednn_geometry(const Ctx& ctx, std::size_t batch,
                                                                          bool src16) noexcept {
      const compute_precision p = ctx.gemm_precision();
      if (!ctx.onednn_convolutions() || (p != compute_precision::fp32 && p != compute_precision::bf16))
        return std::nullopt;
      return backend::detail::conv_geometry{batch, C, H, W, Filters, Kernel, Stride, Padding, OH, OW,
                                            p == compute_precision::bf16, src16};
    }
#endif

    /// The parts of the workspace.
    template <class T>
    struct scratch {
      T* cols;  ///< (patch + 1) x OH OW: one image's columns over a row of ones, or their gradient
      T* xp;    ///< one padded image, or col2im's padded planes
      T* wb;    ///< Filters x (patch + 1) filters with biases, or their gradient (transposed per image; as is batched)
      /// Splits ws.
      explicit scratch(T* ws) : cols(ws), xp(ws + (patch + 1) * OH * OW), wb(xp + padded) {}
    };

    /// The first `patch` rows of s.cols = im2col of one image (T, or In = std::uint16_t: bf16
    /// encodings, widened), through its padded copy in s.xp.
    template <class T, class Ctx, class In>
    static void columns(Ctx& ctx, const In* x, const scratch<T>& s) {
      for_each_index(ctx, C * (H + 2 * Padding), detail::pad_image_op<T, geometry, In>{x, s.xp});
      for_each_index(ctx, patch, detail::im2col_op<T, geometry>{s.xp, s.cols});
    }
    /// The images of a pass as oneDNN reads them: their bf16 encodings x16 when not null, else a.x.
    template <class Args>
    static const void* images_of(const Args& a, const std::uint16_t* x16) noexcept {
      return x16 ? static_cast<const void*>(x16) : static_cast<const void*>(a.x.data());
    }
    /// columns of image b of a pass: from its bf16 encodings in x16 when not null, else from a.x.
    template <class Args, class T, class Ctx>
    static void columns_of(Ctx& ctx, const Args& a, [[maybe_unused]] const std::uint16_t* x16, std::size_t b,
                           const scratch<T>& s) {
      if constexpr (std::is_same_v<T, float> && detail::host_context_v<Ctx>) {
        if (x16) {
          columns(ctx, x16 + b * input_size, s);
          return;
        }
      }
      columns(ctx, a.x.row(b), s);
    }
  };
};

namespace detail {

/// Where max pooling's maximum lies in its K x K window, kept for backward: the cell's row-major
/// index, one byte for windows of up to 16 x 16 cells, two above.
template <std::size_t K>
using pool_cell_t = std::conditional_t<(K * K <= 256), std::uint8_t, std::uint16_t>;

/// Whether max pooling's window takes cell value v over the best so far: v is greater, or v is
/// a NaN and the best is not (a window holding a NaN gives NaN, as PyTorch's does, its first NaN
/// taking the gradient, so a NaN never vanishes in pooling). Ties keep the earlier cell.
/// Branch-free (bitwise on bools).
template <class T>
LOCKSTEP_HD inline bool pool_takes(T v, T best) {
  return (v > best) | ((v != v) & (best == best));
}

/// Max pooling forward: y = the window's maximum, argmax = its cell in the window (row-major,
/// the first maximum in that order; the first NaN where the window holds one). One call per
/// output element.
template <class T, class A = std::uint8_t>
struct max_pool_op {
  const T* x;      ///< batch x C x H x W
  T* y;            ///< batch x C x OH x OW
  A* argmax;       ///< batch x C x OH x OW (pool_cell_t)
  window2d g;      ///< geometry
  /// Output element i.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const std::size_t ox = i % g.ow, oy = (i / g.ow) % g.oh, bc = i / (g.ow * g.oh);
    const T* in = x + bc * g.h * g.w;
    bool any = false;
    T best = T(0);
    std::size_t at = 0;
    for (std::size_t kr = 0; kr < g.k; ++kr) {
      const long yy = g.in_row(oy, kr);
      if (yy < 0 || yy >= static_cast<long>(g.h)) continue;
      for (std::size_t kc = 0; kc < g.k; ++kc) {
        const long xx = g.in_col(ox, kc);
        if (xx < 0 || xx >= static_cast<long>(g.w)) continue;
        const std::size_t idx = static_cast<std::size_t>(yy) * g.w + static_cast<std::size_t>(xx);
        if (!any || pool_takes(in[idx], best)) {
          best = in[idx];
          at = kr * g.k + kc;
          any = true;
        }
      }
    }
    y[i] = best;
    argmax[i] = static_cast<A>(at);
  }
};

/// The sum of dy (d, rows of g.ow windows) over the windows [oy0, oy1) x [ox0, ox1), which cover
/// input element (yy, xx), whose argmax (a, cells) is that element, in window order from 0: max
/// pooling's gradient at the element. The geometry by value: a GPU kernel passes its constant
/// template argument, which device code may copy but not refer to.
template <class T, class A>
LOCKSTEP_HD T max_pool_grad_sum(const T* d, const A* a, window2d g, std::size_t oy0, std::size_t oy1,
                                std::size_t ox0, std::size_t ox1, std::size_t yy, std::size_t xx) {
  T s = T(0);
  for (std::size_t oy = oy0; oy < oy1; ++oy) {
    const std::size_t row = (yy + g.pad - oy * g.stride) * g.k;  // the element's cell row in window oy
    for (std::size_t ox = ox0; ox < ox1; ++ox)
      if (static_cast<std::size_t>(a[oy * g.ow + ox]) == row + xx + g.pad - ox * g.stride) s += d[oy * g.ow + ox];
  }
  return s;
}

/// Max pooling backward in gather form: dx at each input element is the sum of dy over the
/// windows that picked it. One call per input row (b, c, y).
template <class T, class A = std::uint8_t>
struct max_pool_grad_op {
  const T* dy;      ///< batch x C x OH x OW
  const A* argmax;  ///< from forward
  T* dx;            ///< batch x C x H x W
  window2d g;       ///< geometry
  /// Input row i.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const std::size_t yy = i % g.h, bc = i / g.h;
    const T* d = dy + bc * g.oh * g.ow;
    const A* a = argmax + bc * g.oh * g.ow;
    std::size_t oy0, oy1;
    g.covering(yy, g.oh, oy0, oy1);
    for (std::size_t xx = 0; xx < g.w; ++xx) {
      std::size_t ox0, ox1;
      g.covering(xx, g.ow, ox0, ox1);
      dx[(bc * g.h + yy) * g.w + xx] = max_pool_grad_sum(d, a, g, oy0, oy1, ox0, ox1, yy, xx);
    }
  }
};

/// Max pooling backward in gather form, one call per input element (the GPU's form: threads
/// side by side write dx side by side), with the geometry G a constant: element i of dx, the sum
/// max_pool_grad_op forms for it, in the same order.
template <class T, window2d G, class A = std::uint8_t>
struct max_pool_grad_element_op {
  const T* dy;      ///< batch x C x OH x OW
  const A* argmax;  ///< from forward
  T* dx;            ///< batch x C x H x W
  /// Input element i = (b, c, yy, xx).
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const std::size_t xx = i % G.w, yy = (i / G.w) % G.h, bc = i / (G.w * G.h);
    const T* d = dy + bc * G.oh * G.ow;
    const A* a = argmax + bc * G.oh * G.ow;
    std::size_t oy0, oy1, ox0, ox1;
    G.covering(yy, G.oh, oy0, oy1);
    G.covering(xx, G.ow, ox0, ox1);
    dx[i] = max_pool_grad_sum(d, a, G, oy0, oy1, ox0, ox1, yy, xx);
  }
};

/// `c ? a : b` through the bits, so that the compiler emits a select and never a branch (the
/// pooling loops' conditions are data, unpredictable). T is float or double.
template <class T>
inline T select_bits(bool c, T a, T b) noexcept {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  static_assert(sizeof(U) == sizeof(T), "select_bits: float or double");
  const U mask = U(0) - static_cast<U>(c);
  return std::bit_cast<T>((std::bit_cast<U>(a) & mask) | (std::bit_cast<U>(b) & ~mask));
}

/// One input row i = (b, c, yy) of a pooling gradient dx on the host, for windows that do not
/// overlap (stride >= kernel) and no padding, where each input element lies in at most one
/// window: `value(window, cell)` for an element of window `window` (its flat output index
/// (b, c, oy, ox)) at cell `cell` of the window (row-major, 32 bits), `none` for an element no
/// window reads. Each element written once.
template <class T, window2d G, class Value>
inline void pool_grad_row(std::size_t i, T* dx, T none, const Value& value) {
  static_assert(G.pad == 0 && G.stride >= G.k, "pool_grad_row: windows that do not overlap, no padding");
  const std::size_t yy = i % G.h, bc = i / G.h, oy = yy / G.stride;
  T* out = dx + i * G.w;
  if (yy % G.stride >= G.k || oy >= G.oh) {  // a row no window reads
    for (std::size_t xx = 0; xx < G.w; ++xx) out[xx] = none;
    return;
  }
  const std::size_t window = (bc * G.oh + oy) * G.ow;
  const auto row = static_cast<std::int32_t>(yy % G.stride * G.k);  // the row's first cell in its window
  for (std::size_t ox = 0; ox + 1 < G.ow; ++ox)  // each window but the last, and the gap after it
    for (std::size_t kc = 0; kc < G.stride; ++kc)
      out[ox * G.stride + kc] = kc < G.k ? value(window + ox, row + static_cast<std::int32_t>(kc)) : none;
  // The last window, then the columns no window reads up to the row's end (the last gap can be
  // shorter than the stride's).
  constexpr std::size_t last = (G.ow - 1) * G.stride;
  for (std::size_t kc = 0; kc < G.k; ++kc)
    out[last + kc] = value(window + G.ow - 1, row + static_cast<std::int32_t>(kc));
  for (std::size_t xx = last + G.k; xx < G.w; ++xx) out[xx] = none;
}

/// Max pooling forward on the host, one call per output row (b, c, oy), with the geometry G a
/// constant: the same maximum and the same argmax (the first maximum in row-major window order;
/// the first NaN where the window holds one) as max_pool_op, without its per-element index
/// arithmetic, and for a window inside the image without bound checks or branches.
template <class T, window2d G, class A = std::uint8_t>
struct max_pool_rows_op {
  const T* x;      ///< batch x C x H x W
  T* y;            ///< batch x C x OH x OW
  A* argmax;       ///< batch x C x OH x OW (pool_cell_t)
  /// Output row i = (b, c, oy).
  void operator()(std::size_t i) const {
    const std::size_t oy = i % G.oh, bc = i / G.oh;
    const T* in = x + bc * G.h * G.w;
    T* yr = y + i * G.ow;
    A* ar = argmax + i * G.ow;
    if constexpr (G.pad == 0) {
      // (OH - 1) stride + K <= H and the same for W: every window lies inside the image. Each
      // window's cells are visited in row-major order, the maximum taken by selects (random data
      // would mispredict branches half the time), the cells kept as T (the selects' type) until
      // they are stored.
      constexpr auto w = static_cast<std::int32_t>(G.w), stride = static_cast<std::int32_t>(G.stride);
      const auto r0 = static_cast<std::int32_t>(oy) * stride * w;
#if defined(__clang__)
      // clang vectorises this form (each window cell over the whole output row, branch-free)...
      T best[G.ow], at[G.ow];
      for (std::size_t ox = 0; ox < G.ow; ++ox) {
        const std::int32_t idx = r0 + static_cast<std::int32_t>(ox) * stride;
        best[ox] = in[idx];
        at[ox] = T(0);
      }
      for (std::size_t cell = 1; cell < G.k * G.k; ++cell) {
        const std::int32_t off = r0 + static_cast<std::int32_t>(cell / G.k) * w + static_cast<std::int32_t>(cell % G.k);
        for (std::size_t ox = 0; ox < G.ow; ++ox) {
          const std::int32_t idx = off + static_cast<std::int32_t>(ox) * stride;
          const T v = in[idx];
          const bool gt = pool_takes(v, best[ox]);
          best[ox] = gt ? v : best[ox];
          at[ox] = gt ? static_cast<T>(cell) : at[ox];
        }
      }
      for (std::size_t ox = 0; ox < G.ow; ++ox) {
        yr[ox] = best[ox];
        ar[ox] = static_cast<A>(at[ox]);
      }
#else
      // ...g++ does not, and makes branches of the selects unless they go through the bits.
      for (std::size_t ox = 0; ox < G.ow; ++ox) {
        const std::int32_t first = r0 + static_cast<std::int32_t>(ox) * stride;
        T best = in[first];
        T at = T(0);
        for (std::size_t cell = 1; cell < G.k * G.k; ++cell) {
          const std::int32_t idx = first + static_cast<std::int32_t>(cell / G.k) * w + static_cast<std::int32_t>(cell % G.k);
          const T v = in[idx];
          const bool gt = pool_takes(v, best);
          at = select_bits(gt, static_cast<T>(cell), at);
          best = select_bits(gt, v, best);
        }
        yr[ox] = best;
        ar[ox] = static_cast<A>(at);
      }
#endif
    } else {
      const max_pool_op<T, A> generic{x, y, argmax, G};
      for (std::size_t ox = 0; ox < G.ow; ++ox) generic(i * G.ow + ox);
    }
  }
};

/// Max pooling backward on the host, one call per input row (b, c, yy), with the geometry G a
/// constant. For windows that do not overlap (stride >= kernel) and no padding: dx is 0 + the
/// window's dy where the element is the window's argmax (0 + -0 is +0, as in a sum) and 0
/// elsewhere, the bits of max_pool_grad_op's sums over the covering windows, each element written
/// once, the choice a select. Otherwise max_pool_grad_op itself.
template <class T, window2d G, class A = std::uint8_t>
struct max_pool_grad_rows_op {
  const T* dy;      ///< batch x C x OH x OW
  const A* argmax;  ///< from forward
  T* dx;            ///< batch x C x H x W
  /// Input row i = (b, c, yy).
  void operator()(std::size_t i) const {
    if constexpr (G.pad == 0 && G.stride >= G.k) {
      pool_grad_row<T, G>(i, dx, T(0), [this](std::size_t window, std::int32_t cell) {
        return select_bits(static_cast<std::int32_t>(argmax[window]) == cell, T(0) + dy[window], T(0));
      });
    } else {
      max_pool_grad_op<T, A>{dy, argmax, dx, G}(i);
    }
  }
};

/// Average pooling forward: the window's sum over K K (padding counts as zeros). One call per
/// output element.
template <class T>
struct avg_pool_op {
  const T* x;   ///< batch x C x H x W
  T* y;         ///< batch x C x OH x OW
  window2d g;   ///< geometry
  /// Output element i.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const std::size_t ox = i % g.ow, oy = (i / g.ow) % g.oh, bc = i / (g.ow * g.oh);
    const T* in = x + bc * g.h * g.w;
    T s = T(0);
    for (std::size_t kr = 0; kr < g.k; ++kr) {
      const long yy = g.in_row(oy, kr);
      if (yy < 0 || yy >= static_cast<long>(g.h)) continue;
      for (std::size_t kc = 0; kc < g.k; ++kc) {
        const long xx = g.in_col(ox, kc);
        if (xx >= 0 && xx < static_cast<long>(g.w)) s += in[static_cast<std::size_t>(yy) * g.w + static_cast<std::size_t>(xx)];
      }
    }
    y[i] = s / static_cast<T>(g.k * g.k);
  }
};

/// Average pooling backward in gather form. One call per input row (b, c, y).
template <class T>
struct avg_pool_grad_op {
  const T* dy;  ///< batch x C x OH x OW
  T* dx;        ///< batch x C x H x W
  window2d g;   ///< geometry
  /// Input row i.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const std::size_t yy = i % g.h, bc = i / g.h;
    const T* d = dy + bc * g.oh * g.ow;
    std::size_t oy0, oy1;
    g.covering(yy, g.oh, oy0, oy1);
    for (std::size_t xx = 0; xx < g.w; ++xx) {
      std::size_t ox0, ox1;
      g.covering(xx, g.ow, ox0, ox1);
      T s = T(0);
      for (std::size_t oy = oy0; oy < oy1; ++oy)
        for (std::size_t ox = ox0; ox < ox1; ++ox) s += d[oy * g.ow + ox];
      dx[(bc * g.h + yy) * g.w + xx] = s / static_cast<T>(g.k * g.k);
    }
  }
};

/// Average pooling forward on the host, one call per output row (b, c, oy), with the geometry G a
/// constant: avg_pool_op's sums in its order (the window's cells row by row, from 0), so the same
/// bits, without bound checks where every window lies inside the image (no padding).
template <class T, window2d G>
struct avg_pool_rows_op {
  const T* x;   ///< batch x C x H x W
  T* y;         ///< batch x C x OH x OW
  /// Output row i = (b, c, oy).
  void operator()(std::size_t i) const {
    if constexpr (G.pad == 0) {
      const std::size_t oy = i % G.oh, bc = i / G.oh;
      const T* in = x + bc * G.h * G.w + oy * G.stride * G.w;
      T* yr = y + i * G.ow;
      for (std::size_t ox = 0; ox < G.ow; ++ox) {
        T s = T(0);
        for (std::size_t kr = 0; kr < G.k; ++kr)
          for (std::size_t kc = 0; kc < G.k; ++kc) s += in[kr * G.w + ox * G.stride + kc];
        yr[ox] = s / static_cast<T>(G.k * G.k);
      }
    } else {
      const avg_pool_op<T> generic{x, y, G};
      for (std::size_t ox = 0; ox < G.ow; ++ox) generic(i * G.ow + ox);
    }
  }
};

/// Average pooling backward on the host, one call per input row (b, c, yy), with the geometry G a
/// constant. For windows that do not overlap (stride >= kernel) and no padding, each input
/// element lies in at most one window: dx = (0 + that window's dy) / K^2, or 0 / K^2, the bits of
/// avg_pool_grad_op's sum over the covering windows, each element written once. Otherwise
/// avg_pool_grad_op itself.
template <class T, window2d G>
struct avg_pool_grad_rows_op {
  const T* dy;  ///< batch x C x OH x OW
  T* dx;        ///< batch x C x H x W
  /// Input row i = (b, c, yy).
  void operator()(std::size_t i) const {
    if constexpr (G.pad == 0 && G.stride >= G.k) {
      constexpr T kk = static_cast<T>(G.k * G.k);
      pool_grad_row<T, G>(i, dx, T(0) / kk, [this](std::size_t window, std::int32_t) { return (T(0) + dy[window]) / kk; });
    } else {
      avg_pool_grad_op<T>{dy, dx, G}(i);
    }
  }
};

/// Global average pooling: y[b][c] = mean over H W of x[b][c]. One call per (b, c).
template <class T>
struct global_avg_op {
  const T* x;       ///< batch x C x P
  T* y;             ///< batch x C
  std::size_t p;    ///< positions per channel
  /// Output element i.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    T s = T(0);
    for (std::size_t j = 0; j < p; ++j) s += x[i * p + j];
    y[i] = s / static_cast<T>(p);
  }
};

/// Its gradient: dx[b][c][j] = dy[b][c] / P. One call per input element.
template <class T>
struct global_avg_grad_op {
  const T* dy;      ///< batch x C
  T* dx;            ///< batch x C x P
  std::size_t p;    ///< positions per channel
  /// Input element i.
  LOCKSTEP_HD void operator()(std::size_t i) const { dx[i] = dy[i / p] / static_cast<T>(p); }
};

}  // namespace detail

namespace detail {
/// True when a float pooling layer of these window parameters tries the host loops of
/// backend/host/pool_2x2.hpp first (2 x 2 windows moved by 2, no padding; eight windows per AVX2
/// vector, where the CPU has AVX2: they return false elsewhere, and the row loops run).
template <class T, std::size_t Kernel, std::size_t Stride, std::size_t Padding>
inline constexpr bool pool_2x2_avx2 = std::is_same_v<T, float> && Kernel == 2 && Stride == 2 && Padding == 0;

/// What max and average pooling bound to image shape S share: the output image of the window
/// (Kernel, Stride, Padding), no parameters, and the window's geometry for the kernels.
template <class S, std::size_t Kernel, std::size_t Stride, std::size_t Padding>
struct bound_pool {
  static_assert(window_fits<S, Kernel, Stride, Padding>(),
                "lockstep: a pooling layer's input must be an image shape<C, H, W> at least as large as its window");
  static constexpr std::size_t C = S::dims[0], H = S::dims[1], W = S::dims[2];  ///< input image
  static constexpr std::size_t OH = window_output(H, Kernel, Stride, Padding);  ///< output height
  static constexpr std::size_t OW = window_output(W, Kernel, Stride, Padding);  ///< output width
  using input_shape = S;                                                         ///< input image
  using output_shape = shape<C, OH, OW>;                                         ///< output image
  static constexpr std::size_t input_size = S::size;                             ///< features in
  static constexpr std::size_t output_size = C * OH * OW;                        ///< features out
  static constexpr std::size_t param_count = 0;                                  ///< no parameters

  /// Nothing to initialise.
  template <class T>
  static void init(T*, const counter_rng&) {}

  /// The window over this image, for the pooling kernels.
  static constexpr window2d geometry() { return {C, H, W, Kernel, Stride, Padding, OH, OW}; }
};
}  // namespace detail

/// Max pooling over `Kernel` x `Kernel` windows moved by `Stride` (default: Kernel, windows that
/// do not overlap) with `Padding` ignored cells on every side; rows that do not fill a last
/// window are dropped (floor), as in TensorFlow's "valid" and PyTorch's default. Input
/// `shape<C, H, W>`, output `shape<C, OH, OW>`. The gradient goes to the first maximum of each window
/// (a window holding a NaN gives NaN, and its gradient goes to the first NaN).
template <std::size_t Kernel, std::size_t Stride = Kernel, std::size_t Padding = 0>
struct max_pool2d {
  static_assert(Kernel > 0 && Stride > 0, "lockstep::max_pool2d: Kernel and Stride must be positive");
  static_assert(Padding < Kernel, "lockstep::max_pool2d: Padding must be smaller than Kernel");
  static_assert(Kernel <= 256, "lockstep::max_pool2d: windows of at most 256 x 256 cells");
  using layer_concept = layer_tag;                  ///< opts in to the layer concept
  static constexpr std::size_t expected_input = 0;  ///< the width comes with the image shape

  /// True when the window fits image shape S.
  template <class S>
  static constexpr bool accepts_shape = detail::window_fits<S, Kernel, Stride, Padding>();

  /// Max pooling bound to input images of shape S.
  template <class S>
  struct bind_shape : detail::bound_pool<S, Kernel, Stride, Padding> {
    using pool = detail::bound_pool<S, Kernel, Stride, Padding>;  ///< the shared shape and geometry
    using pool::C, pool::H, pool::output_size, pool::geometry;
    using cell = detail::pool_cell_t<Kernel>;  ///< where each maximum was in its window
    /// Where each maximum was: a cell per output (in elements of 4 bytes, rounded up).
    static constexpr std::size_t workspace_per_sample = (output_size * sizeof(cell) + 3) / 4;
    static constexpr bool mixed_precision = true;  ///< runs under any precision policy (its own arithmetic stays fp32)
    static constexpr bool backward_reads_input = false;   ///< backward reads where each maximum was, never x
    static constexpr bool backward_reads_output = false;  ///< nor y (output_unread_v)

    /// y = the maximum of each window (its position kept for backward).
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const forward_args<T, Ctx, S, typename pool::output_shape>& a) {
      auto* at = reinterpret_cast<cell*>(a.workspace);
      if constexpr (detail::host_context_v<Ctx>) {
        if constexpr (detail::pool_2x2_avx2<T, Kernel, Stride, Padding>)
          if (backend::pool_2x2_forward<true, H, pool::W>(a.x.data(), a.y.data(), at, a.batch() * C)) return;
        for_each_index(ctx, a.batch() * C * pool::OH,
                       detail::max_pool_rows_op<T, geometry(), cell>{a.x.data(), a.y.data(), at});
      } else
        for_each_index(ctx, a.y.size(), detail::max_pool_op<T, cell>{a.x.data(), a.y.data(), at, geometry()});
    }

    /// dx = dy routed to each window's maximum (sums where windows overlap).
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const backward_args<T, Ctx, S, typename pool::output_shape>& a) {
      if (!a.dx) return;
      const auto* at = reinterpret_cast<const cell*>(a.workspace);
      if constexpr (detail::host_context_v<Ctx>) {
        if constexpr (detail::pool_2x2_avx2<T, Kernel, Stride, Padding>)
          if (backend::pool_2x2_backward<true, H, pool::W>(a.dy.data(), at, a.dx.data(), a.batch() * C)) return;
        for_each_index(ctx, a.batch() * C * H,
                       detail::max_pool_grad_rows_op<T, geometry(), cell>{a.dy.data(), at, a.dx.data()});
      } else
        for_each_index(ctx, a.dx.size(),
                       detail::max_pool_grad_element_op<T, geometry(), cell>{a.dy.data(), at, a.dx.data()});
    }
  };
};

/// Average pooling over `Kernel` x `Kernel` windows moved by `Stride` (default: Kernel) with
/// `Padding` zero cells on every side, each window divided by Kernel^2 (padding counts, as
/// PyTorch's default). Input `shape<C, H, W>`, output `shape<C, OH, OW>`.
template <std::size_t Kernel, std::size_t Stride = Kernel, std::size_t Padding = 0>
struct avg_pool2d {
  static_assert(Kernel > 0 && Stride > 0, "lockstep::avg_pool2d: Kernel and Stride must be positive");
  static_assert(Padding < Kernel, "lockstep::avg_pool2d: Padding must be smaller than Kernel");
  using layer_concept = layer_tag;                  ///< opts in to the layer concept
  static constexpr std::size_t expected_input = 0;  ///< the width comes with the image shape

  /// True when the window fits image shape S.
  template <class S>
  static constexpr bool accepts_shape = detail::window_fits<S, Kernel, Stride, Padding>();

  /// Average pooling bound to input images of shape S.
  template <class S>
  struct bind_shape : detail::bound_pool<S, Kernel, Stride, Padding> {
    using pool = detail::bound_pool<S, Kernel, Stride, Padding>;  ///< the shared shape and geometry
    using pool::C, pool::H, pool::output_size, pool::geometry;
    static constexpr std::size_t workspace_per_sample = 0;  ///< no scratch
    static constexpr bool mixed_precision = true;  ///< runs under any precision policy (its own arithmetic stays fp32)
    static constexpr bool backward_reads_input = false;   ///< backward reads dy only, never x (input_unread_v)
    static constexpr bool backward_reads_output = false;  ///< nor y (output_unread_v)

    /// y = the mean of each window.
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const forward_args<T, Ctx, S, typename pool::output_shape>& a) {
      if constexpr (detail::host_context_v<Ctx>) {
        if constexpr (detail::pool_2x2_avx2<T, Kernel, Stride, Padding>)
          if (backend::pool_2x2_forward<false, H, pool::W>(a.x.data(), a.y.data(), nullptr, a.batch() * C)) return;
        for_each_index(ctx, a.batch() * C * pool::OH, detail::avg_pool_rows_op<T, geometry()>{a.x.data(), a.y.data()});
      } else
        for_each_index(ctx, a.y.size(), detail::avg_pool_op<T>{a.x.data(), a.y.data(), geometry()});
    }

    /// dx = dy spread evenly over each window.
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const backward_args<T, Ctx, S, typename pool::output_shape>& a) {
      if (!a.dx) return;
      if constexpr (detail::host_context_v<Ctx>) {
        if constexpr (detail::pool_2x2_avx2<T, Kernel, Stride, Padding>)
          if (backend::pool_2x2_backward<false, H, pool::W>(a.dy.data(), nullptr, a.dx.data(), a.batch() * C)) return;
        for_each_index(ctx, a.batch() * C * H, detail::avg_pool_grad_rows_op<T, geometry()>{a.dy.data(), a.dx.data()});
      } else
        for_each_index(ctx, a.batch() * C * H, detail::avg_pool_grad_op<T>{a.dy.data(), a.dx.data(), geometry()});
    }
  };
};

/// Global average pooling: `shape<C, H, W>` to `shape<C>`, each channel's mean.
struct global_avg_pool {
  using layer_concept = layer_tag;                  ///< opts in to the layer concept
  static constexpr std::size_t expected_input = 0;  ///< the width comes with the image shape

  /// True for image shapes.
  template <class S>
  static constexpr bool accepts_shape = image_shape<S>;

  /// Global average pooling bound to input images of shape S.
  template <class S>
  struct bind_shape {
    static_assert(image_shape<S>, "lockstep::global_avg_pool: the input must be an image shape<C, H, W>");
    static constexpr std::size_t C = S::dims[0];             ///< channels
    static constexpr std::size_t P = S::dims[1] * S::dims[2];  ///< positions per channel
    using input_shape = S;                                    ///< input image
    using output_shape = shape<C>;                            ///< one value per channel
    static constexpr std::size_t input_size = S::size;        ///< features in
    static constexpr std::size_t output_size = C;             ///< features out
    static constexpr std::size_t param_count = 0;             ///< no parameters
    static constexpr std::size_t workspace_per_sample = 0;    ///< no scratch
    static constexpr bool mixed_precision = true;  ///< runs under any precision policy (its own arithmetic stays fp32)
    static constexpr bool backward_reads_input = false;   ///< backward reads dy only, never x (input_unread_v)
    static constexpr bool backward_reads_output = false;  ///< nor y (output_unread_v)

    /// Nothing to initialise.
    template <class T>
    static void init(T*, const counter_rng&) {}

    /// y[b][c] = mean of x[b][c].
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const forward_args<T, Ctx, S, output_shape>& a) {
      for_each_index(ctx, a.y.size(), detail::global_avg_op<T>{a.x.data(), a.y.data(), P});
    }

    /// dx[b][c][j] = dy[b][c] / P.
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const backward_args<T, Ctx, S, output_shape>& a) {
      if (a.dx) for_each_index(ctx, a.dx.size(), detail::global_avg_grad_op<T>{a.dy.data(), a.dx.data(), P});
    }
  };
};

namespace detail {
/// A layer that copies its rows unchanged and gives them shape Out (reshape, flatten).
template <class In, class Out>
struct bound_relabel {
  using input_shape = In;                                 ///< the old shape
  using output_shape = Out;                                ///< the new shape
  static constexpr std::size_t input_size = In::size;      ///< features in
  static constexpr std::size_t output_size = Out::size;    ///< the same features out
  static constexpr std::size_t param_count = 0;            ///< no parameters
  static constexpr std::size_t workspace_per_sample = 0;   ///< no scratch
  static constexpr bool mixed_precision = true;  ///< runs under any precision policy (its own arithmetic stays fp32)
  static constexpr bool backward_reads_input = false;   ///< backward copies dy, never reads x (input_unread_v)
  static constexpr bool backward_reads_output = false;  ///< nor y (output_unread_v)

  /// Nothing to initialise.
  template <class T>
  static void init(T*, const counter_rng&) {}

  /// y = x.
  template <class T, class Ctx>
  static void forward(Ctx& ctx, const forward_args<T, Ctx, In, Out>& a) {
    copy(ctx, a.y.data(), a.x.data(), a.x.size());
  }

  /// dx = dy.
  template <class T, class Ctx>
  static void backward(Ctx& ctx, const backward_args<T, Ctx, In, Out>& a) {
    if (a.dx) copy(ctx, a.dx.data(), a.dy.data(), a.dx.size());
  }
};
}  // namespace detail

/// Gives rows of `shape<Dims...>::size` features the shape `shape<Dims...>`: a network on 28 x 28
/// grey images stored as flat rows of 784 starts with `reshape<1, 28, 28>`.
template <std::size_t... Dims>
struct reshape {
  using layer_concept = layer_tag;                                     ///< opts in to the layer concept
  static constexpr std::size_t expected_input = shape<Dims...>::size;  ///< the same number of features

  /// True when S has as many elements as the target shape.
  template <class S>
  static constexpr bool accepts_shape = S::size == shape<Dims...>::size;

  /// The reshape bound to input rows of shape S.
  template <class S>
  using bind_shape = detail::bound_relabel<S, shape<Dims...>>;
};

/// Flattens rows of any shape to `shape<N>` (N features), e.g. between convolutions and a dense
/// layer. The data do not move: an NCHW row already is its flattened self.
struct flatten {
  using layer_concept = layer_tag;                  ///< opts in to the layer concept
  static constexpr std::size_t expected_input = 0;  ///< any shape

  /// Every shape.
  template <class S>
  static constexpr bool accepts_shape = true;

  /// Flatten bound to input rows of shape S.
  template <class S>
  using bind_shape = detail::bound_relabel<S, shape<S::size>>;
};

}  // namespace lockstep
