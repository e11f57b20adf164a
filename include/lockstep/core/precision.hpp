#pragma once
/// @file precision.hpp
/// Precision policies: the types that say in which number format a model computes, chosen where
/// the model is made (`strategy.replicate<Net, lockstep::mixed<lockstep::bf16>>(seed)`), and the
/// bf16 rounding every kernel of the policy shares.
///
/// Under every policy the master weights, gradients, reduced gradients and optimiser state are
/// fp32: a policy changes what the GEMMs of the layers that opt in (`mixed_precision`, see
/// layers/layer.hpp) read, never what is stored, reduced or checkpointed. So a model's type does
/// not depend on its policy, and a checkpoint moves between policies.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#include <lockstep/config.hpp>

namespace lockstep {

/// The bfloat16 format (8 exponent bits as fp32, 8 significant bits): the compute type of
/// `mixed<bf16>`.
struct bf16 {
  static constexpr std::string_view name = "bf16";  ///< the format's name in messages
  static constexpr int significant_bits = 8;        ///< precision p (unit roundoff 2^-p)
};

/// The IEEE binary16 format (5 exponent bits, 11 significant bits): the compute type of
/// `mixed<fp16>`, which needs loss scaling.
struct fp16 {
  static constexpr std::string_view name = "fp16";  ///< the format's name in messages
  static constexpr int significant_bits = 11;       ///< precision p (unit roundoff 2^-p)
};

/// The default policy: every number is fp32 (`replicate<Net>` and `replicate<Net, float>`).
struct fp32 {
  static constexpr std::string_view name = "fp32";  ///< the policy's name
};

/// Mixed precision: layers that opt in compute their GEMMs on `Compute` inputs (activations and
/// a `Compute` copy of the weights) with fp32 accumulation and fp32 outputs; everything else, and
/// everything stored, stays fp32.
template <class Compute>
struct mixed {
  static_assert(std::is_same_v<Compute, bf16> || std::is_same_v<Compute, fp16>,
                "lockstep::mixed<C>: C is lockstep::bf16 or lockstep::fp16");
  using compute_type = Compute;  ///< the format GEMM inputs are rounded to
};

/// GPU replicas only: fp32 storage and fp32 GEMMs on TF32 tensor cores (inputs rounded to 11
/// significant bits inside cuBLAS).
struct tf32 {
  static constexpr std::string_view name = "tf32";  ///< the policy's name
};

/// What a replica's GEMMs compute in at run time (the value a policy type resolves to).
enum class compute_precision : std::uint8_t {
  fp32,  ///< fp32 inputs (the default, and every layer that does not opt in)
  bf16,  ///< bf16-rounded inputs, fp32 accumulation and output
  tf32,  ///< GPU fp32 GEMMs on TF32 tensor cores
  fp16,  ///< fp16-rounded inputs, fp32 accumulation and output, the loss scaled (loss_scaler)
};

/// The name of a run-time precision: "fp32", "mixed<bf16>", "mixed<fp16>" or "tf32".
constexpr std::string_view precision_name(compute_precision p) noexcept {
  switch (p) {
    case compute_precision::bf16: return "mixed<bf16>";
    case compute_precision::tf32: return "tf32";
    case compute_precision::fp16: return "mixed<fp16>";
    case compute_precision::fp32: break;
  }
  return "fp32";
}

/// What `replicate<Net, P>` makes of its second argument P: the element type of the model's
/// buffers (`value_type`) and the precision its GEMMs compute in. A parameter type (float,
/// double) keeps meaning "every number in that type".
template <class P>
struct precision_traits {
  using value_type = std::conditional_t<std::is_floating_point_v<P>, P, float>;  ///< the buffers' element type
  static constexpr compute_precision precision = compute_precision::fp32;         ///< computes in value_type
  /// False for a P that is neither a parameter type nor a policy (a format such as bf16 alone):
  /// replicate refuses it in its body, so the one error names the fix.
  static constexpr bool known = std::is_floating_point_v<P>;
};

/// The traits of a policy type: fp32 buffers, GEMMs computing in `Precision`.
template <compute_precision Precision>
struct policy_traits {
  using value_type = float;                                  ///< fp32 masters
  static constexpr compute_precision precision = Precision;  ///< what the GEMMs of opted-in layers compute in
  static constexpr bool known = true;                        ///< a policy
};
/// fp32: the default policy.
template <>
struct precision_traits<fp32> : policy_traits<compute_precision::fp32> {};
/// mixed<bf16> and mixed<fp16>: GEMM inputs in the compute type, fp32 everything else;
/// mixed<fp16> scales the loss (loss_scaler).
template <class C>
struct precision_traits<mixed<C>>
    : policy_traits<std::is_same_v<C, bf16> ? compute_precision::bf16 : compute_precision::fp16> {};
/// tf32: fp32 buffers, TF32 tensor-core GEMMs on GPU replicas.
template <>
struct precision_traits<tf32> : policy_traits<compute_precision::tf32> {};

/// The element type of a model made with `replicate<Net, P>`: float for every policy, P for a
/// parameter type.
template <class P>
using precision_value_t = typename precision_traits<P>::value_type;

/// Rounds `x` to the nearest bf16 value (ties to even), returned as the fp32 with the same value
/// (its low 16 bits zero). A NaN stays a NaN (made quiet), infinities stay, values beyond bf16's
/// largest finite number round to infinity as IEEE rounding does. Branch-free, so loops over it
/// vectorise.
LOCKSTEP_HD inline float round_to_bf16(float x) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::int32_t magnitude = static_cast<std::int32_t>(u & 0x7fffffffu);
  const std::uint32_t nan = static_cast<std::uint32_t>(-static_cast<std::int32_t>(magnitude > 0x7f800000));
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  const std::uint32_t quiet = (u | 0x00400000u) & 0xffff0000u;
  const std::uint32_t r = (rounded & ~nan) | (quiet & nan);
  float out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}

/// The 16-bit bf16 encoding of round_to_bf16(x).
LOCKSTEP_HD inline std::uint16_t to_bf16_bits(float x) noexcept {
  const float r = round_to_bf16(x);
  std::uint32_t u;
  std::memcpy(&u, &r, sizeof u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// to_bf16_bits(x), except that with `daz` a subnormal x reads as a zero of its sign, as the
/// CPU's AVX512-BF16 conversion reads it (what the host's native bf16 conversion gives for every
/// element, backend::to_bf16_weights).
LOCKSTEP_HD inline std::uint16_t to_bf16_bits_daz(float x, bool daz) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const bool subnormal = (u & 0x7f800000u) == 0;
  const std::uint32_t v = daz && subnormal ? (u & 0x80000000u) : u;
  float y;
  std::memcpy(&y, &v, sizeof y);
  return to_bf16_bits(y);
}

/// The fp32 value of bf16 encoding `bits` (exact).
LOCKSTEP_HD inline float from_bf16_bits(std::uint16_t bits) noexcept {
  const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &u, sizeof out);
  return out;
}

/// Rounds `x` to the nearest IEEE binary16 value (ties to even), returned as the fp32 with that
/// value: 11 significant bits for |x| >= 2^-14, multiples of 2^-24 below (fp16's subnormals),
/// infinity from 65520 on (the midpoint past 65504, fp16's largest finite value). NaN stays NaN.
LOCKSTEP_HD inline float round_to_fp16(float x) noexcept {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  const std::uint32_t sign = u & 0x80000000u, magnitude = u & 0x7fffffffu;
  std::uint32_t r;
  if (magnitude > 0x7f800000u) {
    r = u | 0x00400000u;  // NaN, made quiet
  } else if (magnitude >= 0x477ff000u) {  // 65520 and above (infinity too)
    r = sign | 0x7f800000u;
  } else if (magnitude >= 0x38800000u) {  // 2^-14 and above: keep 11 significant bits
    r = sign | ((magnitude + 0xfffu + ((magnitude >> 13) & 1u)) & ~0x1fffu);
  } else {  // below 2^-14: a multiple of 2^-24 (0.5f's ulp), rounded by one fp32 addition
    float a;
    std::memcpy(&a, &magnitude, sizeof a);
    const float rounded = (a + 0.5f) - 0.5f;  // exact but for the rounding of the addition
    std::memcpy(&r, &rounded, sizeof r);
    r |= sign;
  }
  float out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}

/// The dynamic loss scale of mixed<fp16> (PyTorch's GradScaler, Keras's LossScaleOptimizer): the
/// loss's gradient is multiplied by scale() so that small gradients survive fp16, and the
/// reduced gradient is divided by it again (update_info::grad_scale). After an update whose
/// reduced gradient was not finite (an overflow: the update is skipped) the scale halves; after
/// `growth_interval` finite updates in a row it doubles; it stays a power of two in
/// [min_scale, max_scale]. Every replica and worker decides from the same reduced gradient, so
/// they all hold the same scale.
class loss_scaler {
public:
  static constexpr double initial_scale = 65536.0;               ///< 2^16
  static constexpr std::uint64_t growth_interval = 2000;        ///< finite updates before the scale doubles
  static constexpr double min_scale = 1.0;                       ///< the smallest scale
  static constexpr double max_scale = 16777216.0;                ///< 2^24
  static constexpr std::uint64_t max_overflows_at_minimum = 50;  ///< then the run stops (numerics_error)

  /// The scale the loss's gradient is multiplied by.
  [[nodiscard]] double scale() const noexcept { return scale_; }
  /// Finite updates since the scale last changed (or since an overflow).
  [[nodiscard]] std::uint64_t good_updates() const noexcept { return good_; }
  /// Overflows in a row at the minimum scale.
  [[nodiscard]] std::uint64_t overflows_at_minimum() const noexcept { return at_minimum_; }

  /// Takes in the outcome of one update: `overflow` when its reduced gradient was not finite.
  /// Returns false when the scale cannot go lower and max_overflows_at_minimum overflows came in
  /// a row (the caller stops the run).
  bool update(bool overflow) noexcept {
    if (overflow) {
      good_ = 0;
      if (scale_ <= min_scale) return ++at_minimum_ < max_overflows_at_minimum;
      scale_ = scale_ / 2 < min_scale ? min_scale : scale_ / 2;
      at_minimum_ = 0;
      return true;
    }
    at_minimum_ = 0;
    if (++good_ >= growth_interval) {
      good_ = 0;
      if (scale_ < max_scale) scale_ *= 2;
    }
    return true;
  }

  /// Restores a state (from a checkpoint); false when it is not one this scaler can hold.
  bool restore(double scale, std::uint64_t good, std::uint64_t at_minimum) noexcept {
    int exponent = 0;
    const bool power_of_two = scale >= min_scale && scale <= max_scale && std::frexp(scale, &exponent) == 0.5;
    if (!power_of_two || good >= growth_interval || at_minimum >= max_overflows_at_minimum) return false;
    scale_ = scale;
    good_ = good;
    at_minimum_ = at_minimum;
    return true;
  }

private:
  double scale_ = initial_scale;
  std::uint64_t good_ = 0;
  std::uint64_t at_minimum_ = 0;
};

}  // namespace lockstep
