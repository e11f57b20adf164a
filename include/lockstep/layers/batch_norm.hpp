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

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <lockstep/backend/host/context.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/core/shape.hpp>

namespace lockstep {

/// Batch normalisation per channel (`shape<C, H, W>` rows: over the batch and H W; flat rows
/// `shape<N>`: per feature over the batch) with learned scale γ and shift β:
/// y = γ (x - mean) / sqrt(var + ε) + β, ε = 1e-5. Training uses the global batch's mean and
/// biased variance and updates the running statistics with momentum MomentumNum / MomentumDen
/// (running = (1 - m) running + m batch; the running variance uses the unbiased batch variance,
/// as PyTorch); evaluation uses the running statistics. Parameters: γ (C, starting at 1) then β
/// (C, at 0). Runs on host contexts.
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
    static constexpr std::size_t workspace_per_sample = 2 * C;  ///< each row's two sums per channel
    static constexpr bool mixed_precision = true;  ///< runs under any precision policy (its own arithmetic stays fp32)
    static constexpr std::size_t workspace_fixed = 2 * C;       ///< the batch's mean and 1/σ, kept for backward
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
    static void forward(Ctx&, const forward_args<T, Ctx, S, S>& a) {
      static_assert(std::is_same_v<Ctx, backend::host_context>, "lockstep::batch_norm runs on host contexts");
      const T* params = a.params;
      const T* x = a.x.data();
      T* y = a.y.data();
      T* ws = a.workspace;
      const std::size_t batch = a.batch();
      const pass_info& info = a.info;
      T* state = layer_state(params, info);
      T* const run_mean = state;
      T* const run_var = state + C;
      T* const mean = ws + batch * workspace_per_sample;
      T* const inv = mean + C;
      const T* gamma = params;
      const T* beta = params + C;
      if (!info.training) {
        std::array<T, C> run_inv;
        for (std::size_t c = 0; c < C; ++c)
          run_inv[c] = static_cast<T>(1.0 / std::sqrt(static_cast<double>(run_var[c]) + epsilon));
        normalise(x, y, batch, run_mean, run_inv.data(), gamma, beta);
        return;
      }
      const std::size_t total = rows_of(info, batch);
      if (total == 0) return;
      // Each row's mean and sum of squared deviations per channel (two passes over the row).
      for (std::size_t b = 0; b < batch; ++b) {
        for (std::size_t c = 0; c < C; ++c) {
          const T* v = x + b * input_size + c * P;
          double s = 0;
          for (std::size_t j = 0; j < P; ++j) s += static_cast<double>(v[j]);
          const double m = s / static_cast<double>(P);
          double q = 0;
          for (std::size_t j = 0; j < P; ++j) q += (static_cast<double>(v[j]) - m) * (static_cast<double>(v[j]) - m);
          ws[b * 2 * C + c] = static_cast<T>(m);
          ws[b * 2 * C + C + c] = static_cast<T>(q);
        }
      }
      const T* all = gather(ws, batch, total, info);
      // Chan's combination in global row order.
      std::array<double, C> n_mean{}, m2{};
      for (std::size_t r = 0; r < total; ++r) {
        const double na = static_cast<double>(r * P), nb = static_cast<double>(P), n = na + nb;
        for (std::size_t c = 0; c < C; ++c) {
          const double delta = static_cast<double>(all[r * 2 * C + c]) - n_mean[c];
          n_mean[c] += delta * nb / n;
          m2[c] += static_cast<double>(all[r * 2 * C + C + c]) + delta * delta * na * nb / n;
        }
      }
      const double count = static_cast<double>(total * P);
      for (std::size_t c = 0; c < C; ++c) {
        const double var = m2[c] / count;
        mean[c] = static_cast<T>(n_mean[c]);
        inv[c] = static_cast<T>(1.0 / std::sqrt(var + epsilon));
        const double unbiased = count > 1 ? m2[c] / (count - 1) : var;
        run_mean[c] = static_cast<T>((1 - momentum) * static_cast<double>(run_mean[c]) + momentum * n_mean[c]);
        run_var[c] = static_cast<T>((1 - momentum) * static_cast<double>(run_var[c]) + momentum * unbiased);
      }
      normalise(x, y, batch, mean, inv, gamma, beta);
    }

    /// Training: dx = γ/σ (dy - mean(dy) - x̂ mean(dy x̂)) with the means over the global batch,
    /// dγ = Σ dy x̂, dβ = Σ dy (global sums, written by replica 0 of the exchange). Evaluation:
    /// the gradient of the affine map with the running statistics (local sums).
    template <class T, class Ctx>
    static void backward(Ctx&, const backward_args<T, Ctx, S, S>& args) {
      static_assert(std::is_same_v<Ctx, backend::host_context>, "lockstep::batch_norm runs on host contexts");
      const T* params = args.params;
      const T* x = args.x.data();
      const T* dy = args.dy.data();
      T* dx = args.dx.data();  // null when not wanted
      T* dparams = args.dparams;
      T* ws = args.workspace;
      const std::size_t batch = args.batch();
      const pass_info& info = args.info;
      const T* state = layer_state(params, info);
      const T* gamma = params;
      std::array<double, C> s1{}, s2{};
      if (!info.training) {
        const T* run_mean = state;
        const T* run_var = state + C;
        for (std::size_t c = 0; c < C; ++c) {
          const double inv = 1.0 / std::sqrt(static_cast<double>(run_var[c]) + epsilon);
          for (std::size_t b = 0; b < batch; ++b) {
            const std::size_t o = b * input_size + c * P;
            for (std::size_t j = 0; j < P; ++j) {
              const double g = static_cast<double>(dy[o + j]);
              s1[c] += g;
              s2[c] += g * (static_cast<double>(x[o + j]) - static_cast<double>(run_mean[c])) * inv;
              if (dx) dx[o + j] = static_cast<T>(g * static_cast<double>(gamma[c]) * inv);
            }
          }
          put(dparams[c], s2[c], info.accumulate);
          put(dparams[C + c], s1[c], info.accumulate);
        }
        return;
      }
      const T* mean = ws + batch * workspace_per_sample;  // from forward
      const T* inv = mean + C;
      const std::size_t total = rows_of(info, batch);
      if (total == 0) {
        if (!info.accumulate)
          for (std::size_t c = 0; c < 2 * C; ++c) dparams[c] = T(0);
        return;
      }
      for (std::size_t b = 0; b < batch; ++b) {
        for (std::size_t c = 0; c < C; ++c) {
          const std::size_t o = b * input_size + c * P;
          double a = 0, q = 0;
          for (std::size_t j = 0; j < P; ++j) {
            const double g = static_cast<double>(dy[o + j]);
            a += g;
            q += g * xhat(x[o + j], mean[c], inv[c]);
          }
          ws[b * 2 * C + c] = static_cast<T>(a);
          ws[b * 2 * C + C + c] = static_cast<T>(q);
        }
      }
      const T* all = gather(ws, batch, total, info);
      for (std::size_t r = 0; r < total; ++r)
        for (std::size_t c = 0; c < C; ++c) {
          s1[c] += static_cast<double>(all[r * 2 * C + c]);
          s2[c] += static_cast<double>(all[r * 2 * C + C + c]);
        }
      const bool writes_sums = info.exchange == nullptr || info.exchange->leads(info.rank);
      for (std::size_t c = 0; c < C; ++c) {
        put(dparams[c], writes_sums ? s2[c] : 0.0, info.accumulate);
        put(dparams[C + c], writes_sums ? s1[c] : 0.0, info.accumulate);
      }
      if (!dx) return;
      const double count = static_cast<double>(total * P);
      for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t c = 0; c < C; ++c) {
          const std::size_t o = b * input_size + c * P;
          const double k = static_cast<double>(gamma[c]) * static_cast<double>(inv[c]);
          const double m1 = s1[c] / count, m2 = s2[c] / count;
          for (std::size_t j = 0; j < P; ++j)
            dx[o + j] = static_cast<T>(k * (static_cast<double>(dy[o + j]) - m1 - xhat(x[o + j], mean[c], inv[c]) * m2));
        }
    }

  private:
    // Writes a parameter gradient, or adds it to the running sum under gradient accumulation.
    template <class T>
    static void put(T& out, double v, bool add) {
      out = add ? static_cast<T>(static_cast<double>(out) + v) : static_cast<T>(v);
    }
    template <class T>
    static double xhat(T v, T mean, T inv) {
      return (static_cast<double>(v) - static_cast<double>(mean)) * static_cast<double>(inv);
    }
    template <class T>
    static void normalise(const T* x, T* y, std::size_t batch, const T* mean, const T* inv, const T* gamma, const T* beta) {
      for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t c = 0; c < C; ++c) {
          const std::size_t o = b * input_size + c * P;
          for (std::size_t j = 0; j < P; ++j)
            y[o + j] = static_cast<T>(static_cast<double>(gamma[c]) * xhat(x[o + j], mean[c], inv[c]) +
                                      static_cast<double>(beta[c]));
        }
    }
    static std::size_t rows_of(const pass_info& info, std::size_t batch) {
      const std::size_t total = global_rows_of(info, batch);
      if (!info.exchange && total != batch)
        throw config_error("lockstep::batch_norm: the batch holds " + std::to_string(batch) +
                           " rows of a global batch of " + std::to_string(total) +
                           " but no row exchange was given (pass_info::exchange): the statistics would be wrong");
      return total;
    }
    template <class T>
    static const T* gather(const T* ws, std::size_t batch, std::size_t total, const pass_info& info) {
      if (!info.exchange) return ws;
      return info.exchange->all_gather(info.rank, ws, static_cast<std::size_t>(info.sample_offset), batch, 2 * C, total);
    }
  };
};

}  // namespace lockstep
