#pragma once
/// @file batch_norm.hpp
/// `batch_norm<>`: batch normalisation whose training statistics are those of the GLOBAL batch,
/// bitwise the same whatever the number of replicas and however the batch is split.
///
/// Each row contributes its own per-channel mean and sum of squared deviations; the rows of every
/// replica are gathered through `pass_info::exchange` and combined in global row order (Chan's
/// pairwise update, in double), so every replica, and one device holding the whole batch, compute
/// the same bits. Backward does the same with each row's sums of dy and dy * x̂. The parameter
/// gradients are global sums too: replica 0 of the exchange writes them and the others write
/// zeros, so the strategy's sum over replicas returns them exactly. Running mean and variance are
/// non-trainable state (identical on every replica, saved in checkpoints).
///
/// Every pass is a few kernels over index spaces (each row's sums per channel, over 32 lanes of
/// its positions when a channel has 64 or more, each channel's combination in row order, each
/// element's normalisation or input gradient), written once as LOCKSTEP_HD functors: GPUs run
/// them as kernels, the host as loops (a row-channel's lanes, or its elements, in one call, with
/// the bits of the one-lane and one-element calls). A GPU replica among others stages its rows' sums
/// through page-locked host memory for the exchange (one wait per pass); a lone replica keeps
/// everything on its device.
///
/// Inside a sequential it applies a following relu as it writes each value (fuses_activation_v),
/// and its backward reads its input, never its output; on a host replica that keeps activations
/// in bf16 it reads its input from their bf16 encodings (bf16_activations_v), in both passes.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <lockstep/backend/host/context.hpp>
#include <lockstep/backend/host/ops.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/precision.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/core/shape.hpp>

namespace lockstep {

namespace detail {

/// batch_norm's kernels. C channels of P positions each; a row of the batch is C P values, channel
/// c of row b the P values from (b C + c) P. Sums are in double, each in one fixed order.

/// Writes a parameter gradient, or adds it to the running sum under gradient accumulation.
template <class T>
LOCKSTEP_HD void bn_put(T& out, double v, bool add) {
  out = add ? static_cast<T>(static_cast<double>(out) + v) : static_cast<T>(v);
}

/// 1/σ = 1 / sqrt(variance + ε), in double.
LOCKSTEP_HD inline double bn_inv_sigma(double var, double epsilon) { return 1.0 / std::sqrt(var + epsilon); }

/// An input value in double: a T, or (X = std::uint16_t) the bf16 encoding of one, which a host
/// pass that keeps activations in bf16 reads (bf16_activations_v).
template <class X>
LOCKSTEP_HD double bn_value(X v) {
  if constexpr (std::is_same_v<X, std::uint16_t>) return static_cast<double>(from_bf16_bits(v));
  else return static_cast<double>(v);
}

/// (v - mean) / σ in double.
template <class X, class T>
LOCKSTEP_HD double bn_xhat(X v, T mean, T inv) {
  return (bn_value(v) - static_cast<double>(mean)) * static_cast<double>(inv);
}

/// Each row's mean and sum of squared deviations per channel (two passes over its P values), into
/// ws row b: C means then C sums. Call i = (b, c), b = i / C.
template <class T, std::size_t C, std::size_t P, class X = T>
struct bn_row_stats_op {
  const X* x;  ///< batch x C x P (bn_value)
  T* ws;       ///< batch x 2C
  /// Channel i % C of row i / C.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const std::size_t b = i / C, c = i % C;
    const X* v = x + i * P;
    double s = 0;
    for (std::size_t j = 0; j < P; ++j) s += bn_value(v[j]);
    const double m = s / static_cast<double>(P);
    double q = 0;
    for (std::size_t j = 0; j < P; ++j) q += (bn_value(v[j]) - m) * (bn_value(v[j]) - m);
    ws[b * 2 * C + c] = static_cast<T>(m);
    ws[b * 2 * C + C + c] = static_cast<T>(q);
  }
};

/// Lanes a row-channel's P positions are summed in when P is large: lane l adds positions l,
/// l + L, l + 2L, ... in order, in double, and the lanes' sums are added in lane order. A GPU runs
/// one thread per lane (reads that neighbouring threads make side by side), the host the same
/// calls in a loop: the same bits. Small P (flat rows: P = 1) keeps one sum per row-channel.
template <std::size_t P>
inline constexpr std::size_t bn_lanes = P >= 64 ? 32 : 1;

/// The sum, in lane order, of the L lane sums of one row-channel.
template <class T, std::size_t L>
LOCKSTEP_HD double bn_lane_total(const T* lanes) {
  double s = 0;
  for (std::size_t l = 0; l < L; ++l) s += static_cast<double>(lanes[l]);
  return s;
}

/// Lane sums of x: call i = (r, l), r = i / L the row-channel; into sums[i].
template <class T, std::size_t P, std::size_t L>
struct bn_lane_sum_op {
  const T* x;  ///< batch x C x P
  T* sums;     ///< batch x C x L
  /// Lane i % L of row-channel i / L.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const T* v = x + (i / L) * P;
    double s = 0;
    for (std::size_t j = i % L; j < P; j += L) s += static_cast<double>(v[j]);
    sums[i] = static_cast<T>(s);
  }
};

/// Lane sums of squared deviations from the row-channel's mean (its lane sums over P): call i =
/// (r, l); into devs[i].
template <class T, std::size_t P, std::size_t L>
struct bn_lane_deviation_op {
  const T* x;     ///< batch x C x P
  const T* sums;  ///< batch x C x L, from bn_lane_sum_op
  T* devs;        ///< batch x C x L
  /// Lane i % L of row-channel i / L.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const std::size_t r = i / L;
    const T* v = x + r * P;
    const double m = bn_lane_total<T, L>(sums + r * L) / static_cast<double>(P);
    double q = 0;
    for (std::size_t j = i % L; j < P; j += L) q += (static_cast<double>(v[j]) - m) * (static_cast<double>(v[j]) - m);
    devs[i] = static_cast<T>(q);
  }
};

/// Row-channel r's two lane-summed totals into ws row b (the first divided by P: the mean, as
/// bn_row_stats_op writes it; or not: bn_row_grad's sums). Call r = (b, c).
template <class T, std::size_t C, std::size_t P, std::size_t L>
struct bn_lane_combine_op {
  const T* first;   ///< batch x C x L
  const T* second;  ///< batch x C x L
  T* ws;            ///< batch x 2C
  bool mean;        ///< divide the first total by P
  /// Row-channel r.
  LOCKSTEP_HD void operator()(std::size_t r) const {
    const std::size_t b = r / C, c = r % C;
    const double a = bn_lane_total<T, L>(first + r * L);
    ws[b * 2 * C + c] = static_cast<T>(mean ? a / static_cast<double>(P) : a);
    ws[b * 2 * C + C + c] = static_cast<T>(bn_lane_total<T, L>(second + r * L));
  }
};

/// Lane sums of dy and of dy x̂: call i = (r, l); into dys[i] and dyxs[i].
template <class T, std::size_t C, std::size_t P, std::size_t L>
struct bn_lane_grad_op {
  const T* x;     ///< batch x C x P
  const T* dy;    ///< batch x C x P
  const T* mean;  ///< C
  const T* inv;   ///< C
  T* dys;         ///< batch x C x L
  T* dyxs;        ///< batch x C x L
  /// Lane i % L of row-channel i / L.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const std::size_t r = i / L, c = r % C;
    double a = 0, q = 0;
    for (std::size_t j = i % L; j < P; j += L) {
      const double g = static_cast<double>(dy[r * P + j]);
      a += g;
      q += g * bn_xhat(x[r * P + j], mean[c], inv[c]);
    }
    dys[i] = static_cast<T>(a);
    dyxs[i] = static_cast<T>(q);
  }
};

/// The host's form of the lane sums, one call per row-channel r = (b, c): all L lanes at once
/// (the inner loop runs over neighbouring positions, which the compiler vectorises), each lane
/// added in its own order and rounded to T as the lane kernels do, so ws gets the bits of
/// bn_lane_sum_op and bn_lane_deviation_op then bn_lane_combine_op (with mean), or of
/// bn_lane_grad_op then bn_lane_combine_op (with `grad`).
template <class T, std::size_t C, std::size_t P, std::size_t L, class X = T>
struct bn_lane_rows_op {
  const X* x;     ///< batch x C x P (bn_value)
  const T* dy;    ///< batch x C x P (grad only)
  const T* mean;  ///< C (grad only)
  const T* inv;   ///< C (grad only)
  T* ws;          ///< batch x 2C
  bool grad;      ///< Σ dy and Σ dy x̂ instead of the mean and Σ (x - mean)²
  /// Row-channel r.
  void operator()(std::size_t r) const {
    const std::size_t b = r / C, c = r % C;
    const X* v = x + r * P;
    double a[L] = {}, q[L] = {};
    if (grad) {
      const T* g = dy + r * P;
      for (std::size_t j0 = 0; j0 < P; j0 += L)
        for (std::size_t l = 0; l < L && j0 + l < P; ++l) {
          const double d = static_cast<double>(g[j0 + l]);
          a[l] += d;
          q[l] += d * bn_xhat(v[j0 + l], mean[c], inv[c]);
        }
      ws[b * 2 * C + c] = static_cast<T>(rounded_total(a));
      ws[b * 2 * C + C + c] = static_cast<T>(rounded_total(q));
      return;
    }
    for (std::size_t j0 = 0; j0 < P; j0 += L)
      for (std::size_t l = 0; l < L && j0 + l < P; ++l) a[l] += bn_value(v[j0 + l]);
    const double m = rounded_total(a) / static_cast<double>(P);
    for (std::size_t j0 = 0; j0 < P; j0 += L)
      for (std::size_t l = 0; l < L && j0 + l < P; ++l)
        q[l] += (bn_value(v[j0 + l]) - m) * (bn_value(v[j0 + l]) - m);
    ws[b * 2 * C + c] = static_cast<T>(m);
    ws[b * 2 * C + C + c] = static_cast<T>(rounded_total(q));
  }
  /// The lanes' sums rounded to T, then added in lane order (bn_lane_total of the stored lanes).
  static double rounded_total(const double (&lanes)[L]) {
    double s = 0;
    for (std::size_t l = 0; l < L; ++l) s += static_cast<double>(static_cast<T>(lanes[l]));
    return s;
  }
};

/// Rows of the row-channel table `all` (total x 2C) read ahead of their use: a per-channel loop
/// over rows in row order issues the loads of this many rows at once (a GPU thread would
/// otherwise wait for each row's load in turn). The arithmetic order is unchanged.
inline constexpr std::size_t bn_rows_ahead = 8;

/// Channel c's two values (columns c and C + c of `all`) of rows r0 .. r0 + bn_rows_ahead - 1,
/// zeros past `total` rows: the loads of one block of a per-channel loop, issued together.
template <class T, std::size_t C>
LOCKSTEP_HD void bn_load_rows(const T* all, std::size_t total, std::size_t r0, std::size_t c, T (&first)[bn_rows_ahead],
                              T (&second)[bn_rows_ahead]) {
  for (std::size_t k = 0; k < bn_rows_ahead; ++k) {
    const bool in = r0 + k < total;
    first[k] = in ? all[(r0 + k) * 2 * C + c] : T(0);
    second[k] = in ? all[(r0 + k) * 2 * C + C + c] : T(0);
  }
}

/// The global batch's mean and 1/σ of channel c from every row's (mean, sum of squared
/// deviations), combined in row order (Chan's pairwise update), and the running statistics moved
/// toward them. Call c.
template <class T, std::size_t C, std::size_t P>
struct bn_combine_op {
  const T* all;        ///< total x 2C, from bn_row_stats_op over the global batch
  std::size_t total;   ///< rows of the global batch (> 0)
  T* mean;             ///< C: the batch's means
  T* inv;              ///< C: the batch's 1/σ
  T* run_mean;         ///< C: running means
  T* run_var;          ///< C: running variances
  double momentum;     ///< running-statistics momentum
  double epsilon;      ///< added to the variance
  /// Channel c.
  LOCKSTEP_HD void operator()(std::size_t c) const {
    double n_mean = 0, m2 = 0;
    for (std::size_t r0 = 0; r0 < total; r0 += bn_rows_ahead) {
      T means[bn_rows_ahead], devs[bn_rows_ahead];
      bn_load_rows<T, C>(all, total, r0, c, means, devs);
      for (std::size_t k = 0; k < bn_rows_ahead && r0 + k < total; ++k) {
        const double na = static_cast<double>((r0 + k) * P), nb = static_cast<double>(P), n = na + nb;
        const double delta = static_cast<double>(means[k]) - n_mean;
        n_mean += delta * nb / n;
        m2 += static_cast<double>(devs[k]) + delta * delta * na * nb / n;
      }
    }
    const double count = static_cast<double>(total * P);
    const double var = m2 / count;
    mean[c] = static_cast<T>(n_mean);
    inv[c] = static_cast<T>(bn_inv_sigma(var, epsilon));
    run_mean[c] = static_cast<T>((1 - momentum) * static_cast<double>(run_mean[c]) + momentum * n_mean);
    // One value says nothing of the spread (its unbiased variance is 0 / 0): the running variance
    // is left as it is, not pulled towards 0.
    if (count > 1) run_var[c] = static_cast<T>((1 - momentum) * static_cast<double>(run_var[c]) + momentum * m2 / (count - 1));
  }
};

/// 1/σ from the running variance. Call c.
template <class T>
struct bn_running_inv_op {
  const T* run_var;  ///< C
  T* inv;            ///< C
  double epsilon;    ///< added to the variance
  /// Channel c.
  LOCKSTEP_HD void operator()(std::size_t c) const {
    inv[c] = static_cast<T>(bn_inv_sigma(static_cast<double>(run_var[c]), epsilon));
  }
};

/// The elementwise passes (bn_normalise_op, bn_eval_input_grad_op) say what they need of a
/// channel (`channel(c)`, in double) and what they write of an element (`element(i, k)` with k =
/// channel(c)); bn_elements_op and bn_rows_op run them over the two index spaces.

/// y = γ (x - mean) / σ + β, then (Fn not void) Fn::f of it: the activation of the layer that
/// follows (fuses_activation_v), with the bits of the two layers apart.
template <class T, class Fn = void, class X = T>
struct bn_normalise_op {
  /// Channel c's mean, 1/σ, γ and β.
  struct constants {
    double mean, inv, gamma, beta;
  };
  const X* x;      ///< batch x C x P (bn_value)
  T* y;            ///< batch x C x P
  const T* mean;   ///< C
  const T* inv;    ///< C
  const T* gamma;  ///< C
  const T* beta;   ///< C
  /// What element i of channel c needs.
  LOCKSTEP_HD constants channel(std::size_t c) const {
    return {static_cast<double>(mean[c]), static_cast<double>(inv[c]), static_cast<double>(gamma[c]),
            static_cast<double>(beta[c])};
  }
  /// Element i.
  LOCKSTEP_HD void element(std::size_t i, const constants& k) const {
    const T v = static_cast<T>(k.gamma * ((bn_value(x[i]) - k.mean) * k.inv) + k.beta);
    if constexpr (std::is_void_v<Fn>) y[i] = v;
    else y[i] = Fn::f(v);
  }
};

/// Each row's sum of dy and of dy x̂ per channel, into ws row b (C and C). Call i = (b, c).
template <class T, std::size_t C, std::size_t P, class X = T>
struct bn_row_grad_op {
  const X* x;     ///< batch x C x P (bn_value)
  const T* dy;    ///< batch x C x P
  const T* mean;  ///< C
  const T* inv;   ///< C
  T* ws;          ///< batch x 2C
  /// Channel i % C of row i / C.
  LOCKSTEP_HD void operator()(std::size_t i) const {
    const std::size_t b = i / C, c = i % C;
    double a = 0, q = 0;
    for (std::size_t j = 0; j < P; ++j) {
      const double g = static_cast<double>(dy[i * P + j]);
      a += g;
      q += g * bn_xhat(x[i * P + j], mean[c], inv[c]);
    }
    ws[b * 2 * C + c] = static_cast<T>(a);
    ws[b * 2 * C + C + c] = static_cast<T>(q);
  }
};

/// Channel c's global sums Σ dy and Σ dy x̂ over the rows' sums, in row order.
template <class T, std::size_t C>
LOCKSTEP_HD void bn_channel_sums(const T* all, std::size_t total, std::size_t c, double& s1, double& s2) {
  s1 = 0;
  s2 = 0;
  for (std::size_t r0 = 0; r0 < total; r0 += bn_rows_ahead) {
    T a[bn_rows_ahead], q[bn_rows_ahead];
    bn_load_rows<T, C>(all, total, r0, c, a, q);
    for (std::size_t k = 0; k < bn_rows_ahead && r0 + k < total; ++k) {
      s1 += static_cast<double>(a[k]);
      s2 += static_cast<double>(q[k]);
    }
  }
}

/// dγ = Σ dy x̂ and dβ = Σ dy over the global batch (zeros unless `writes`), and what every
/// element of channel c needs for its input gradient: γ/σ, mean(dy) and mean(dy x̂) over the
/// global batch's values of the channel (into grad_k). Call c.
template <class T, std::size_t C, std::size_t P>
struct bn_param_grad_op {
  const T* all;       ///< total x 2C, from the rows' sums over the global batch
  std::size_t total;  ///< rows of the global batch
  T* dparams;         ///< dγ (C) then dβ (C)
  bool writes;        ///< this replica contributes the sums (the others zeros)
  bool accumulate;    ///< add to dparams
  const T* gamma;     ///< C
  const T* inv;       ///< C
  T* grad_k;          ///< 3C: γ/σ, mean(dy), mean(dy x̂)
  /// Channel c.
  LOCKSTEP_HD void operator()(std::size_t c) const {
    double s1, s2;
    bn_channel_sums<T, C>(all, total, c, s1, s2);
    bn_put(dparams[c], writes ? s2 : 0.0, accumulate);
    bn_put(dparams[C + c], writes ? s1 : 0.0, accumulate);
    const double count = static_cast<double>(total * P);
    grad_k[c] = static_cast<T>(static_cast<double>(gamma[c]) * static_cast<double>(inv[c]));
    grad_k[C + c] = static_cast<T>(s1 / count);
    grad_k[2 * C + c] = static_cast<T>(s2 / count);
  }
};

/// dx = γ/σ (dy - mean(dy) - x̂ mean(dy x̂)) with channel c's constants from bn_param_grad_op.
template <class T, std::size_t C, class X = T>
struct bn_input_grad_op {
  /// Channel c's γ/σ, mean(dy), mean(dy x̂), mean and 1/σ.
  struct constants {
    double k, m1, m2;
    T mean, inv;
  };
  const X* x;       ///< batch x C x P (bn_value)
  const T* dy;      ///< batch x C x P
  T* dx;            ///< batch x C x P
  const T* grad_k;  ///< 3C, from bn_param_grad_op
  const T* mean;    ///< C
  const T* inv;     ///< C
  /// What element i of channel c needs.
  LOCKSTEP_HD constants channel(std::size_t c) const {
    return {static_cast<double>(grad_k[c]), static_cast<double>(grad_k[C + c]), static_cast<double>(grad_k[2 * C + c]),
            mean[c], inv[c]};
  }
  /// Element i.
  LOCKSTEP_HD void element(std::size_t i, const constants& k) const {
    dx[i] = static_cast<T>(k.k * (static_cast<double>(dy[i]) - k.m1 - bn_xhat(x[i], k.mean, k.inv) * k.m2));
  }
};

/// Evaluation mode: dγ = Σ dy x̂ and dβ = Σ dy over this call's rows with the running
/// statistics, in (row, position) order. Call c.
template <class T, std::size_t C, std::size_t P, class X = T>
struct bn_eval_param_grad_op {
  const X* x;          ///< batch x C x P (bn_value)
  const T* dy;         ///< batch x C x P
  const T* run_mean;   ///< C
  const T* run_var;    ///< C
  T* dparams;          ///< dγ (C) then dβ (C)
  std::size_t batch;   ///< rows
  bool accumulate;     ///< add to dparams
  double epsilon;      ///< added to the variance
  /// Channel c.
  LOCKSTEP_HD void operator()(std::size_t c) const {
    const double inv = bn_inv_sigma(static_cast<double>(run_var[c]), epsilon);
    double s1 = 0, s2 = 0;
    for (std::size_t b = 0; b < batch; ++b) {
      const std::size_t o = (b * C + c) * P;
      for (std::size_t j = 0; j < P; ++j) {
        const double g = static_cast<double>(dy[o + j]);
        s1 += g;
        s2 += g * (bn_value(x[o + j]) - static_cast<double>(run_mean[c])) * inv;
      }
    }
    bn_put(dparams[c], s2, accumulate);
    bn_put(dparams[C + c], s1, accumulate);
  }
};

/// Evaluation mode: dx = dy γ / σ with the running variance.
template <class T>
struct bn_eval_input_grad_op {
  /// Channel c's γ and 1/σ.
  struct constants {
    double gamma, inv;
  };
  const T* dy;       ///< batch x C x P
  T* dx;             ///< batch x C x P
  const T* run_var;  ///< C
  const T* gamma;    ///< C
  double epsilon;    ///< added to the variance
  /// What element i of channel c needs.
  LOCKSTEP_HD constants channel(std::size_t c) const {
    return {static_cast<double>(gamma[c]), bn_inv_sigma(static_cast<double>(run_var[c]), epsilon)};
  }
  /// Element i.
  LOCKSTEP_HD void element(std::size_t i, const constants& k) const {
    dx[i] = static_cast<T>(static_cast<double>(dy[i]) * k.gamma * k.inv);
  }
};

/// An elementwise pass Op over elements of C channels of P positions, one call per element (the
/// GPU's form): call i is element i of channel (i / P) % C.
template <class Op, std::size_t C, std::size_t P>
struct bn_elements_op {
  Op op;  ///< the elementwise pass
  /// Element i.
  LOCKSTEP_HD void operator()(std::size_t i) const { op.element(i, op.channel((i / P) % C)); }
};

/// The same pass, one call per row-channel (the host's form: the channel's constants once, then
/// a loop over its P elements): call r is row-channel r = (b, c), c = r % C.
template <class Op, std::size_t C, std::size_t P>
struct bn_rows_op {
  Op op;  ///< the elementwise pass
  /// The P elements of row-channel r.
  LOCKSTEP_HD void operator()(std::size_t r) const {
    const auto k = op.channel(r % C);
    for (std::size_t j = 0; j < P; ++j) op.element(r * P + j, k);
  }
};

/// Each row's mean and sum of squared deviations per channel into ws (batch x 2C): one call per
/// row-channel when P is small, else lane sums (bn_lanes): on the host one call per row-channel
/// for all its lanes, elsewhere one call per lane through `lanes` (2 batch C L values).
template <class T, std::size_t C, std::size_t P, class Ctx, class X>
void bn_row_statistics(Ctx& ctx, const X* x, std::size_t batch, T* ws, T* lanes) {
  constexpr std::size_t L = bn_lanes<P>;
  if constexpr (L == 1) {
    (void)lanes;
    for_each_index(ctx, batch * C, bn_row_stats_op<T, C, P, X>{x, ws});
  } else if constexpr (host_context_v<Ctx>) {
    (void)lanes;
    for_each_index(ctx, batch * C, bn_lane_rows_op<T, C, P, L, X>{x, nullptr, nullptr, nullptr, ws, false});
  } else {
    static_assert(std::is_same_v<X, T>, "lockstep::batch_norm: bf16 inputs are read on host contexts only");
    T* const sums = lanes;
    T* const devs = lanes + batch * C * L;
    for_each_index(ctx, batch * C * L, bn_lane_sum_op<T, P, L>{x, sums});
    for_each_index(ctx, batch * C * L, bn_lane_deviation_op<T, P, L>{x, sums, devs});
    for_each_index(ctx, batch * C, bn_lane_combine_op<T, C, P, L>{sums, devs, ws, true});
  }
}

/// Each row's sums of dy and of dy x̂ per channel into ws (batch x 2C), as bn_row_statistics.
template <class T, std::size_t C, std::size_t P, class Ctx, class X>
void bn_row_gradients(Ctx& ctx, const X* x, const T* dy, const T* mean, const T* inv, std::size_t batch, T* ws,
                      T* lanes) {
  constexpr std::size_t L = bn_lanes<P>;
  if constexpr (L == 1) {
    (void)lanes;
    for_each_index(ctx, batch * C, bn_row_grad_op<T, C, P, X>{x, dy, mean, inv, ws});
  } else if constexpr (host_context_v<Ctx>) {
    (void)lanes;
    for_each_index(ctx, batch * C, bn_lane_rows_op<T, C, P, L, X>{x, dy, mean, inv, ws, true});
  } else {
    static_assert(std::is_same_v<X, T>, "lockstep::batch_norm: bf16 inputs are read on host contexts only");
    T* const dys = lanes;
    T* const dyxs = lanes + batch * C * L;
    for_each_index(ctx, batch * C * L, bn_lane_grad_op<T, C, P, L>{x, dy, mean, inv, dys, dyxs});
    for_each_index(ctx, batch * C, bn_lane_combine_op<T, C, P, L>{dys, dyxs, ws, false});
  }
}

/// Runs elementwise pass `op` over `rows` row-channels of P elements each: bn_rows_op on the
/// host, bn_elements_op elsewhere.
template <std::size_t C, std::size_t P, class Ctx, class Op>
void bn_for_each_element(Ctx& ctx, std::size_t rows, const Op& op) {
  if constexpr (host_context_v<Ctx>)
    for_each_index(ctx, rows, bn_rows_op<Op, C, P>{op});
  else
    for_each_index(ctx, rows * P, bn_elements_op<Op, C, P>{op});
}

}  // namespace detail

/// Batch normalisation per channel (`shape<C, H, W>` rows: over the batch and H W; flat rows
/// `shape<N>`: per feature over the batch) with learned scale γ and shift β:
/// y = γ (x - mean) / sqrt(var + ε) + β, ε = 1e-5. Training uses the global batch's mean and
/// biased variance and updates the running statistics with momentum MomentumNum / MomentumDen
/// (running = (1 - m) running + m batch; the running variance uses the unbiased batch variance,
/// as PyTorch); evaluation uses the running statistics. Parameters: γ (C, starting at 1) then β
/// (C, at 0). Runs on host and GPU contexts.
template <std::intmax_t MomentumNum = 1, std::intmax_t MomentumDen = 10>
struct batch_norm {
  static_assert(MomentumDen > 0 && MomentumNum >= 0 && MomentumNum <= MomentumDen,
                "lockstep::batch_norm<Num, Den>: the momentum Num / Den must be in [0, 1]");
  using layer_concept = layer_tag;                  ///< opts in to the layer concept
  static constexpr std::size_t expected_input = 0;  ///< any shape
  static constexpr double momentum = static_cast<double>(MomentumNum) / static_cast<double>(MomentumDen);  ///< running-statistics momentum
  static constexpr double epsilon = 1e-5;           ///< added to the variance

  /// Every shape (rank 1: features; rank >= 2: channels first).
  template <class S>
  static constexpr bool accepts_shape = true;

  /// Batch normalisation bound to input rows of shape S.
  template <class S>
  struct bind_shape {
    static constexpr std::size_t C = S::dims[0];           ///< channels (features of a flat row)
    static constexpr std::size_t P = S::size / C;          ///< positions per channel
    using input_shape = S;                                  ///< an input row
    using output_shape = S;                                 ///< the shape is kept
    static constexpr std::size_t input_size = S::size;     ///< features in
    static constexpr std::size_t output_size = S::size;    ///< features out
    static constexpr std::size_t param_count = 2 * C;      ///< γ then β
    static constexpr bool accumulates_gradients = true;    ///< adds into dparams under pass_info::accumulate
    static constexpr std::size_t state_count = 2 * C;      ///< running mean, running var
    static constexpr std::size_t lanes = detail::bn_lanes<P>;  ///< lanes of a row-channel's sums (detail::bn_lanes)
    /// Each row's two sums per channel, and their lane sums when there are lanes.
    static constexpr std::size_t workspace_per_sample = 2 * C + (lanes > 1 ? 2 * C * lanes : 0);
    static constexpr bool mixed_precision = true;  ///< runs under any precision policy (its own arithmetic stays fp32)
    using fuses_activation = bind_shape;  ///< applies a following activation in its forward (forward_activated)
    static constexpr bool bf16_activations = true;  ///< reads and writes activations kept in bf16 (forward_stored, backward_stored)
    static constexpr bool backward_reads_output = false;  ///< backward reads x, never y (output_unread_v)
    /// The batch's mean and 1/σ, kept for backward; the input gradient's three constants per channel.
    static constexpr std::size_t workspace_fixed = 5 * C;
    static constexpr bool couples_rows = true;              ///< training statistics span the global batch

    /// γ = 1, β = 0.
    template <class T>
    static void init(T* params, const counter_rng&) {
      for (std::size_t c = 0; c < C; ++c) {
        params[c] = T(1);
        params[C + c] = T(0);
      }
    }

    /// Running mean 0 and variance 1.
    template <class T>
    static void init_state(T* state) {
      for (std::size_t c = 0; c < 2 * C; ++c) state[c] = c >= C ? T(1) : T(0);
    }

    /// Normalises with the global batch's statistics (training) or the running ones (evaluation).
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const forward_args<T, Ctx, S, S>& a) {
      normalise<void>(ctx, a, a.x.data());
    }

    /// forward, then the activation Fn of the layer that follows (fuses_activation_v) applied to
    /// each value as it is written: the same bits as the two layers apart; backward never reads y.
    template <class Fn, class T, class Ctx>
    static void forward_activated(Ctx& ctx, const forward_args<T, Ctx, S, S>& a) {
      normalise<Fn>(ctx, a, a.x.data());
    }

    /// forward (Fn void) or forward_activated<Fn>, in a pass on a host context that keeps
    /// activations in bf16 (bf16_activations_v): the input read from its bf16 encodings x16 when
    /// x16 is not null (a.x unused), statistics included, and the results written to a.y in fp32
    /// and, when y16 is not null, as their bf16 encodings to y16. The same bits as forward on the
    /// widened values.
    template <class Fn, class T, class Ctx>
    static void forward_stored(Ctx& ctx, const forward_args<T, Ctx, S, S>& a, const std::uint16_t* x16,
                               std::uint16_t* y16) {
      if (x16) normalise<Fn>(ctx, a, x16);
      else normalise<Fn>(ctx, a, a.x.data());
      backend::encode_output16(ctx, a.y.data(), a.y.size(), y16);
    }

    /// Training: dx = γ/σ (dy - mean(dy) - x̂ mean(dy x̂)) with the means over the global batch,
    /// dγ = Σ dy x̂, dβ = Σ dy (global sums, written by replica 0 of the exchange). Evaluation:
    /// the gradient of the affine map with the running statistics (local sums).
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const backward_args<T, Ctx, S, S>& args) {
      backward_from(ctx, args, args.x.data());
    }

    /// backward, with the input read from its bf16 encodings x16 when x16 is not null (a.x
    /// unused; a host context, see forward_stored): the same bits as backward on the widened values.
    template <class T, class Ctx>
    static void backward_stored(Ctx& ctx, const backward_args<T, Ctx, S, S>& args, const std::uint16_t* x16) {
      if (x16) backward_from(ctx, args, x16);
      else backward_from(ctx, args, args.x.data());
    }

  private:
    // forward_activated<Fn> (forward for Fn = void) with the input x: a.x's values, or their bf16
    // encodings.
    template <class Fn, class T, class Ctx, class X>
    static void normalise(Ctx& ctx, const forward_args<T, Ctx, S, S>& a, const X* x) {
      const T* params = a.params;
      const std::size_t batch = a.batch();
      const pass_info& info = a.info;
      T* state = layer_state(params, info);
      T* const run_mean = state;
      T* const run_var = state + C;
      T* const mean = a.workspace + batch * workspace_per_sample;
      T* const inv = mean + C;
      const T* gamma = params;
      const T* beta = params + C;
      if (!info.training) {
        for_each_index(ctx, C, detail::bn_running_inv_op<T>{run_var, inv, epsilon});
        detail::bn_for_each_element<C, P>(ctx, batch * C,
                                       detail::bn_normalise_op<T, Fn, X>{x, a.y.data(), run_mean, inv, gamma, beta});
        return;
      }
      const std::size_t total = rows_of(info, batch);
      if (total == 0) return;
      detail::bn_row_statistics<T, C, P>(ctx, x, batch, a.workspace, a.workspace + batch * 2 * C);
      const T* all = gather(ctx, a.workspace, batch, total, info);
      for_each_index(ctx, C, detail::bn_combine_op<T, C, P>{all, total, mean, inv, run_mean, run_var, momentum, epsilon});
      detail::bn_for_each_element<C, P>(ctx, batch * C,
                                     detail::bn_normalise_op<T, Fn, X>{x, a.y.data(), mean, inv, gamma, beta});
    }
    // backward with the input x: args.x's values, or their bf16 encodings.
    template <class T, class Ctx, class X>
    static void backward_from(Ctx& ctx, const backward_args<T, Ctx, S, S>& args, const X* x) {
      const T* params = args.params;
      const T* dy = args.dy.data();
      T* dx = args.dx.data();  // null when not wanted
      T* dparams = args.dparams;
      T* ws = args.workspace;
      const std::size_t batch = args.batch();
      const pass_info& info = args.info;
      const T* state = layer_state(params, info);
      const T* gamma = params;
      if (!info.training) {
        for_each_index(ctx, C,
                       detail::bn_eval_param_grad_op<T, C, P, X>{x, dy, state, state + C, dparams, batch, info.accumulate, epsilon});
        if (dx) detail::bn_for_each_element<C, P>(ctx, batch * C, detail::bn_eval_input_grad_op<T>{dy, dx, state + C, gamma, epsilon});
        return;
      }
      const T* mean = ws + batch * workspace_per_sample;  // from forward
      const T* inv = mean + C;
      const std::size_t total = rows_of(info, batch);
      if (total == 0) {
        if (!info.accumulate) fill(ctx, dparams, 2 * C, T(0));
        return;
      }
      T* const grad_k = ws + batch * workspace_per_sample + 2 * C;
      detail::bn_row_gradients<T, C, P>(ctx, x, dy, mean, inv, batch, ws, ws + batch * 2 * C);
      const T* all = gather(ctx, ws, batch, total, info);
      const bool writes_sums = info.exchange == nullptr || info.exchange->leads(info.rank);
      for_each_index(ctx, C,
                     detail::bn_param_grad_op<T, C, P>{all, total, dparams, writes_sums, info.accumulate, gamma, inv, grad_k});
      if (dx)
        detail::bn_for_each_element<C, P>(ctx, batch * C, detail::bn_input_grad_op<T, C, X>{x, dy, dx, grad_k, mean, inv});
    }

    /// The exchange to use: none when this call holds the whole batch or is the only replica.
    static bool exchanges(const pass_info& info) noexcept { return info.exchange && !info.exchange->single(); }
    static std::size_t rows_of(const pass_info& info, std::size_t batch) {
      const std::size_t total = global_rows_of(info, batch);
      if (!exchanges(info) && total != batch)
        throw config_error("lockstep::batch_norm: the batch holds " + std::to_string(batch) +
                           " rows of a global batch of " + std::to_string(total) +
                           " but no row exchange was given (pass_info::exchange): the statistics would be wrong");
      return total;
    }
    /// Every replica's rows of sums (total x 2C) in the context's memory: this call's own rows
    /// without an exchange; through the exchange's host table otherwise (a GPU replica copies its
    /// rows to page-locked memory and the table back to its device scratch, waiting for both).
    template <class T, class Ctx>
    static const T* gather(Ctx& ctx, const T* ws, std::size_t batch, std::size_t total, const pass_info& info) {
      if (!exchanges(info)) return ws;
      const auto first = static_cast<std::size_t>(info.sample_offset);
      if constexpr (detail::host_context_v<Ctx>) {
        (void)ctx;
        return info.exchange->all_gather(info.rank, ws, first, batch, 2 * C, total);
      } else {
        static_assert(requires { ctx.host_scratch(std::size_t{1}); },
                      "lockstep::batch_norm: replicas of this device kind exchange rows through host memory: its "
                      "context needs host_scratch(bytes), page-locked staging (as cuda_context has)");
        T* mine = static_cast<T*>(ctx.host_scratch(batch * 2 * C * sizeof(T)));
        copy_to_host(ctx, mine, ws, batch * 2 * C);
        const T* table = info.exchange->all_gather(info.rank, mine, first, batch, 2 * C, total);
        T* device_table = static_cast<T*>(ctx.scratch(total * 2 * C * sizeof(T)));
        copy_from_host(ctx, device_table, table, total * 2 * C);
        return device_table;
      }
    }
  };
};

}  // namespace lockstep
