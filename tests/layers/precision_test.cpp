// Precision policies on host replicas: bf16 rounding (nearest, ties to even, NaN and infinities
// kept) over a sweep of bit patterns; bf16 GEMMs that accumulate the exact products of the
// rounded operands in fp32, over shapes, transpositions, leading dimensions and beta; the
// opt-in rule: a layer that declares nothing about precision computes in fp32 under mixed<bf16>,
// bit for bit, and the same layer with `mixed_precision` computes on rounded operands; and the
// GPU's 16-bit operands (backend/pack16.hpp: the fp16 encodings, pack16_op and the packed
// layout) run on the host against the host's GEMMs under the same policy.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <lockstep/backend/pack16.hpp>
#include <lockstep/layers.hpp>

namespace ls = lockstep;

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

/// The bf16 value nearest to x (ties to the even significand), by comparing the two bf16
/// neighbours of |x| in double; a neighbour past the largest finite value counts as 2^128, where
/// IEEE rounding to infinity starts.
float nearest_bf16_reference(float x) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const std::uint32_t u = bits_of(x);
  const std::uint32_t sign = u & 0x80000000u, mag = u & 0x7fffffffu;
  const std::uint32_t lo = mag & 0xffff0000u, hi = lo + 0x10000u;
  const double v = std::fabs(static_cast<double>(x));
  const double lo_v = static_cast<double>(from_bits(lo));
  const double hi_v = hi >= 0x7f800000u ? std::ldexp(1.0, 128) : static_cast<double>(from_bits(hi));
  std::uint32_t pick;
  if (v - lo_v < hi_v - v) pick = lo;
  else if (v - lo_v > hi_v - v) pick = hi;
  else pick = ((lo >> 16) & 1u) == 0 ? lo : hi;
  return from_bits(sign | pick);
}

}  // namespace

TEST_CASE("round_to_bf16 rounds to the nearest bf16 value with ties to even, keeps NaN, infinities and signed zero") {
  std::size_t checked = 0, mismatches = 0, not_bf16 = 0, encoding_mismatches = 0;
  std::uint32_t first_bad = 0;
  // Every 7919th bit pattern (a prime step reaches every exponent and low-bit residue), then the
  // patterns around each rounding boundary of a few exponents (ties, one ulp either side).
  std::vector<std::uint32_t> patterns;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 7919) patterns.push_back(static_cast<std::uint32_t>(u));
  for (const std::uint32_t base : {0x3f800000u, 0x00010000u, 0x7f7f0000u, 0xbf800000u, 0x00000000u})
    for (std::uint32_t low = 0x7ffdu; low <= 0x8003u; ++low)
      for (const std::uint32_t step : {0u, 0x10000u, 0x20000u}) patterns.push_back(base + step + low);
  for (const std::uint32_t u : patterns) {
    const float x = from_bits(u);
    const float r = ls::round_to_bf16(x);
    ++checked;
    const float want = nearest_bf16_reference(x);
    const bool ok = std::isnan(x) ? std::isnan(r) && (bits_of(r) & 0xffffu) == 0 && ((bits_of(r) ^ u) >> 31) == 0
                                  : bits_of(r) == bits_of(want);
    if (!ok && mismatches++ == 0) first_bad = u;
    if ((bits_of(r) & 0xffffu) != 0) ++not_bf16;
    if (bits_of(ls::from_bf16_bits(ls::to_bf16_bits(x))) != bits_of(r)) ++encoding_mismatches;
  }
  CHECK(not_bf16 == 0);              // every result is a bf16 value
  CHECK(encoding_mismatches == 0);   // the 16-bit encoding holds it exactly
  CAPTURE(first_bad);
  CHECK(checked > 500'000);
  CHECK(mismatches == 0);
  CHECK(ls::round_to_bf16(std::numeric_limits<float>::infinity()) == std::numeric_limits<float>::infinity());
  CHECK(ls::round_to_bf16(-std::numeric_limits<float>::infinity()) == -std::numeric_limits<float>::infinity());
  CHECK(std::signbit(ls::round_to_bf16(-0.0f)));
  CHECK(std::isnan(ls::round_to_bf16(from_bits(0x7f800001u))));  // a signalling NaN whose payload is all low bits
  CHECK(ls::round_to_bf16(1.0f + 0x1p-8f) == 1.0f);               // a tie to the even neighbour below
  CHECK(ls::round_to_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f);  // a tie to the even neighbour above
  CHECK(ls::round_to_bf16(from_bits(0x7f7f7fffu)) == from_bits(0x7f7f0000u));  // below the midpoint: the largest bf16
  CHECK(ls::round_to_bf16(from_bits(0x7f7f8000u)) == std::numeric_limits<float>::infinity());  // the midpoint: to infinity
}

namespace {

/// A matrix of rows x cols stored with leading dimension ld, filled irregularly in [-2, 2].
std::vector<float> matrix(std::size_t rows, std::size_t cols, std::size_t ld, std::uint64_t key) {
  std::vector<float> v(rows * ld + 1, 1e30f);  // padding that must never be read into the result
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c)
      v[r * ld + c] = static_cast<float>(2.0 * std::sin(0.37 * static_cast<double>(r * 131 + c * 17 + key)));
  return v;
}

}  // namespace

TEST_CASE("bf16 GEMMs accumulate the exact products of bf16-rounded operands in fp32 (shapes, transpositions, beta)") {
  using ls::backend::trans;
  ls::host_context bf(1, true, ls::compute_precision::bf16), fp(1, true, ls::compute_precision::bf16);
  bf.set_gemm_precision(ls::compute_precision::bf16);
  fp.set_gemm_precision(ls::compute_precision::fp32);  // the same policy outside an opted-in layer
  std::size_t cases = 0, bound_failures = 0, emulation_mismatches = 0, differs_from_fp32 = 0;
  for (const std::size_t m : {1, 2, 7, 64})
    for (const std::size_t n : {1, 13, 32})
      for (const std::size_t k : {0, 1, 5, 61})
        for (const trans ta : {trans::no, trans::yes})
          for (const trans tb : {trans::no, trans::yes})
            for (const float beta : {0.0f, 1.0f}) {
              const std::size_t a_rows = ta == trans::yes ? k : m, a_cols = ta == trans::yes ? m : k;
              const std::size_t b_rows = tb == trans::yes ? n : k, b_cols = tb == trans::yes ? k : n;
              const std::size_t lda = a_cols + 3, ldb = b_cols + 1, ldc = n + 2;
              const auto a = matrix(a_rows, a_cols, lda, 1 + m), b = matrix(b_rows, b_cols, ldb, 7 + n);
              const auto c0 = matrix(m, n, ldc, 3 + k);
              auto c = c0, c_fp = c0, c_rounded = c0;
              gemm(bf, ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
              gemm(fp, ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, beta, c_fp.data(), ldc);
              auto ra = a, rb = b;
              for (float& v : ra) v = ls::round_to_bf16(v);
              for (float& v : rb) v = ls::round_to_bf16(v);
              {  // the fp32 kernels on dense rounded copies, as the emulation calls them
                std::vector<float> da(a_rows * a_cols + 1), db(b_rows * b_cols + 1);
                for (std::size_t r = 0; r < a_rows; ++r)
                  for (std::size_t q = 0; q < a_cols; ++q) da[r * a_cols + q] = ra[r * lda + q];
                for (std::size_t r = 0; r < b_rows; ++r)
                  for (std::size_t q = 0; q < b_cols; ++q) db[r * b_cols + q] = rb[r * ldb + q];
                gemm(fp, ta, tb, m, n, k, 1.0f, da.data(), a_cols, db.data(), b_cols, beta, c_rounded.data(), ldc);
              }
              for (std::size_t i = 0; i < m; ++i)
                for (std::size_t j = 0; j < n; ++j) {
                  double exact = beta * static_cast<double>(c0[i * ldc + j]), magnitude = std::fabs(exact);
                  for (std::size_t p = 0; p < k; ++p) {
                    const double x = ra[ta == trans::yes ? p * lda + i : i * lda + p];
                    const double y = rb[tb == trans::yes ? j * ldb + p : p * ldb + j];
                    exact += x * y;  // products of bf16 values are exact in double (and in fp32)
                    magnitude += std::fabs(x * y);
                  }
                  const double got = c[i * ldc + j];
                  // fp32 accumulation of k + 1 exact terms: at most (k + 2) units of 2^-24 of the magnitude.
                  if (std::fabs(got - exact) > static_cast<double>(k + 2) * 0x1p-24 * magnitude) ++bound_failures;
                  if (bits_of(c[i * ldc + j]) != bits_of(c_rounded[i * ldc + j])) ++emulation_mismatches;
                  if (c[i * ldc + j] != c_fp[i * ldc + j]) ++differs_from_fp32;
                }
              for (std::size_t i = 0; i < m; ++i)  // the padding of C is left alone
                for (std::size_t j = n; j < ldc && i * ldc + j < c.size(); ++j) CHECK(c[i * ldc + j] == c0[i * ldc + j]);
              ++cases;
            }
  CHECK(cases == 4 * 3 * 4 * 8);
  CHECK(bound_failures == 0);
  CHECK(differs_from_fp32 > 0);  // the policy changed what was computed
  if (!ls::host_bf16_native()) CHECK(emulation_mismatches == 0);  // emulation: the fp32 kernels on rounded copies
}

TEST_CASE("host_precision_description names the policy and whether its GEMMs are native or emulated") {
  CHECK(ls::host_precision_description(ls::compute_precision::fp32) == "fp32");
  const std::string bf16 = ls::host_precision_description(ls::compute_precision::bf16);
  CHECK(bf16.starts_with("mixed<bf16> ("));
  CHECK((bf16.find(ls::host_bf16_native() ? "native" : "emulated") != std::string::npos));
  CHECK_THROWS_AS(ls::host_context(1, true, ls::compute_precision::tf32), ls::config_error);
}

// ---- a user layer: y = x W, written against the layer concept with no word on precision -------

namespace user {
template <std::size_t In, std::size_t Out, bool OptIn>
struct linear {
  using layer_concept = ls::layer_tag;
  static constexpr std::size_t expected_input = In;
  template <std::size_t I>
  struct bind {
    static constexpr std::size_t input_size = In, output_size = Out, param_count = In * Out, workspace_per_sample = 0;
    template <class T>
    static void init(T* p, const ls::counter_rng& rng) {
      ls::he_uniform::fill(p, In * Out, In, Out, rng);
    }
    template <class T, class Ctx>
    static void forward(Ctx& ctx, const ls::forward_args<T, Ctx, ls::shape<In>, ls::shape<Out>>& a) {
      gemm(ctx, ls::backend::trans::no, ls::backend::trans::no, a.batch(), Out, In, T(1), a.x.data(), In, a.params, Out,
           T(0), a.y.data(), Out);
    }
    template <class T, class Ctx>
    static void backward(Ctx& ctx, const ls::backward_args<T, Ctx, ls::shape<In>, ls::shape<Out>>& a) {
      using ls::backend::trans;
      gemm(ctx, trans::yes, trans::no, In, Out, a.batch(), T(1), a.x.data(), In, a.dy.data(), Out, T(0), a.dparams, Out);
      if (a.dx) gemm(ctx, trans::no, trans::yes, a.batch(), In, Out, T(1), a.dy.data(), Out, a.params, Out, T(0), a.dx.data(), In);
    }
  };
};
template <std::size_t In, std::size_t Out>
struct opted_in_linear : linear<In, Out, true> {
  template <std::size_t I>
  struct bind : linear<In, Out, true>::template bind<I> {
    // example-begin precision-opt-in
    static constexpr bool mixed_precision = true;  // the one optional member
    // example-end precision-opt-in
  };
};
}  // namespace user

namespace {
/// Output and parameter gradient of model<Net> on a fixed batch under policy p.
template <class Net>
std::pair<std::vector<float>, std::vector<float>> run_model(ls::compute_precision p, std::size_t rows) {
  ls::host_context ctx(1, true, p);
  ls::model<Net> m(ctx, ls::seed{5});
  constexpr std::size_t in = ls::model<Net>::input_size, out = ls::model<Net>::output_size;
  std::vector<float> x(rows * in), dy(rows * out);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.77 * static_cast<double>(i)));
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(std::cos(0.41 * static_cast<double>(i)));
  const float* y = m.forward(ctx, x.data(), rows, ls::pass_info{});
  std::vector<float> out_y(y, y + rows * out);
  m.backward(ctx, dy.data());
  const float* g = m.gradients().data();
  return {out_y, std::vector<float>(g, g + ls::model<Net>::param_count)};
}
}  // namespace

TEST_CASE("under mixed<bf16> a layer that declares no precision computes in fp32, bit for bit, and one that opts in does not") {
  for (const std::size_t rows : {1, 7, 33}) {
    CAPTURE(rows);
    using plain = ls::sequential<user::linear<29, 11, false>, ls::relu, user::linear<11, 5, false>>;
    const auto fp = run_model<plain>(ls::compute_precision::fp32, rows);
    const auto bf = run_model<plain>(ls::compute_precision::bf16, rows);
    CHECK(fp.first == bf.first);
    CHECK(fp.second == bf.second);

    using opted = ls::sequential<user::opted_in_linear<29, 11>, ls::relu, user::opted_in_linear<11, 5>>;
    const auto fp_in = run_model<opted>(ls::compute_precision::fp32, rows);
    const auto bf_in = run_model<opted>(ls::compute_precision::bf16, rows);
    CHECK(fp_in.first == fp.first);  // the member changes nothing under fp32
    CHECK(fp_in.first != bf_in.first);
    CHECK(fp_in.second != bf_in.second);
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < fp_in.first.size(); ++i) {
      diff += std::pow(double(bf_in.first[i]) - double(fp_in.first[i]), 2);
      norm += std::pow(double(fp_in.first[i]), 2);
    }
    CHECK(std::sqrt(diff) <= 4 * 0x1p-8 * std::sqrt(norm));  // within a few bf16 roundings
  }
  // Built-in layers opt in; a container is transparent (its layers decide).
  static_assert(ls::mixed_precision_v<ls::bind_t<ls::dense<3, 2>, 3>>);
  static_assert(ls::mixed_precision_v<ls::bind_t<ls::sequential<ls::dense<3, 2>>, 3>>);
  static_assert(!ls::mixed_precision_v<ls::bind_t<user::linear<3, 2, false>, 3>>);
}

TEST_CASE("layers_in_fp32 lists the layers that declare no precision, through nested sequentials and residual blocks") {
  using plain = ls::sequential<user::linear<29, 11, false>, ls::relu, user::linear<11, 5, false>>;
  CHECK(ls::layers_in_fp32<plain>() == std::vector<std::string>{"0", "2"});
  using opted = ls::sequential<user::opted_in_linear<29, 11>, ls::relu, ls::dense<11, 5>>;
  CHECK(ls::layers_in_fp32<opted>().empty());
  using nested = ls::sequential<ls::dense<6, 8>, ls::sequential<ls::relu, user::linear<8, 8, false>>,
                                ls::residual<user::linear<8, 8, false>, ls::relu>, ls::dense<8, 2>>;
  CHECK(ls::layers_in_fp32<nested>() == std::vector<std::string>{"1.1", "2.0"});
  CHECK(ls::layers_in_fp32<user::linear<3, 2, false>>() == std::vector<std::string>{""});  // the net itself
}

TEST_CASE("host_precision_warning: an emulated mixed<bf16> says so and names the fix, native kernels and fp32 say nothing") {
  CHECK(ls::host_precision_warning(ls::compute_precision::fp32).empty());
  const std::string warning = ls::host_precision_warning(ls::compute_precision::bf16);
  if (ls::host_bf16_native()) {
    CHECK(warning.empty());
  } else {
    CHECK(warning.find("mixed<bf16> is emulated") != std::string::npos);
    CHECK((warning.find("oneDNN") != std::string::npos));
#if defined(LOCKSTEP_HOST_GEMM_ONEDNN)
    // bf16 instructions that run no faster than fp32 (Intel without AMX): the warning says fp32 is faster
    if (ls::backend::detail::onednn_bf16_isa())
      CHECK(warning.find("fp32 (the default policy) trains faster here") != std::string::npos);
#endif
  }
}

namespace {
/// Every finite non-negative fp16 value, increasing, with its encoding's lowest significand bit.
struct fp16_table {
  std::vector<double> values;
  std::vector<bool> odd;
  fp16_table() {
    for (std::uint32_t e = 0; e < 31; ++e)
      for (std::uint32_t f = 0; f < 1024; ++f) {
        values.push_back(e == 0 ? std::ldexp(double(f), -24) : std::ldexp(1.0 + double(f) / 1024.0, int(e) - 15));
        odd.push_back((f & 1u) != 0);
      }
  }
  /// The fp16 value nearest to x (ties to even), infinity from the midpoint past the largest.
  [[nodiscard]] double nearest(double x) const {
    const double a = std::fabs(x);
    if (a >= 65520.0) return std::copysign(std::numeric_limits<double>::infinity(), x);
    const auto hi = std::lower_bound(values.begin(), values.end(), a);
    if (hi == values.end()) return std::copysign(values.back(), x);  // between 65504 and the midpoint
    if (*hi == a) return std::copysign(a, x);
    const auto i = static_cast<std::size_t>(hi - values.begin());
    const double up = values[i], down = values[i - 1];
    const double pick = a - down < up - a ? down : a - down > up - a ? up : (odd[i - 1] ? up : down);
    return std::copysign(pick, x);
  }
};
}  // namespace

TEST_CASE("round_to_fp16 rounds to the nearest fp16 value with ties to even, subnormals and overflow to infinity") {
  const fp16_table table;
  std::size_t checked = 0, mismatches = 0;
  std::uint32_t first_bad = 0;
  std::vector<std::uint32_t> patterns;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 7919) patterns.push_back(static_cast<std::uint32_t>(u));
  // Around the boundaries: 1, the smallest normal 2^-14, the subnormal step 2^-24, 65504 and 65520.
  for (const float base : {1.0f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 65504.0f, 65520.0f, 3.0f * 0x1p-25f})
    for (int d = -40; d <= 40; ++d) {
      const std::uint32_t u = bits_of(base) + static_cast<std::uint32_t>(d);
      patterns.push_back(u);
      patterns.push_back(u | 0x80000000u);
    }
  for (const std::uint32_t u : patterns) {
    const float x = from_bits(u);
    if (std::isnan(x)) continue;
    if (std::fabs(x) < 0x1p-126f) continue;  // fp32 subnormals: the threads' DAZ mode reads them as zero
    const float r = ls::round_to_fp16(x);
    ++checked;
    if (static_cast<double>(r) != table.nearest(x) && mismatches++ == 0) first_bad = u;
  }
  CAPTURE(first_bad);
  CHECK(checked > 500'000);
  CHECK(mismatches == 0);
  CHECK(std::isnan(ls::round_to_fp16(std::numeric_limits<float>::quiet_NaN())));
  CHECK(ls::round_to_fp16(65519.0f) == 65504.0f);
  CHECK(ls::round_to_fp16(65520.0f) == std::numeric_limits<float>::infinity());
  CHECK(ls::round_to_fp16(-1e6f) == -std::numeric_limits<float>::infinity());
  CHECK(ls::round_to_fp16(0x1p-25f) == 0.0f);            // a tie between 0 and 2^-24: to 0 (even)
  CHECK(ls::round_to_fp16(3 * 0x1p-25f) == 0x1p-23f);    // a tie between 2^-24 and 2^-23: to the even 2^-23
}

TEST_CASE("fp16 GEMMs are the fp32 kernels on fp16-rounded operands, bit for bit") {
  using ls::backend::trans;
  ls::host_context h(1, true, ls::compute_precision::fp16), fp(1);
  h.set_gemm_precision(ls::compute_precision::fp16);
  for (const auto& [m, n, k] : {std::tuple<std::size_t, std::size_t, std::size_t>{7, 13, 61}, {64, 32, 5}, {1, 1, 1}})
    for (const trans ta : {trans::no, trans::yes}) {
      const std::size_t a_rows = ta == trans::yes ? k : m, a_cols = ta == trans::yes ? m : k;
      auto a = matrix(a_rows, a_cols, a_cols, 3), b = matrix(k, n, n, 4);
      for (float& v : a) v *= 3e4f;  // some products overflow fp16's range, none fp32's
      std::vector<float> c(m * n, 0.0f), want(m * n, 0.0f);
      gemm(h, ta, trans::no, m, n, k, 1.0f, a.data(), a_cols, b.data(), n, 0.0f, c.data(), n);
      for (float& v : a) v = ls::round_to_fp16(v);
      for (float& v : b) v = ls::round_to_fp16(v);
      gemm(fp, ta, trans::no, m, n, k, 1.0f, a.data(), a_cols, b.data(), n, 0.0f, want.data(), n);
      CHECK(std::equal(c.begin(), c.end(), want.begin(), [](float x, float y) { return bits_of(x) == bits_of(y); }));
    }
}

TEST_CASE("to_fp16_bits and from_fp16_bits: every encoding round-trips, and x's encoding is round_to_fp16(x)'s") {
  std::size_t mismatches = 0;
  for (std::uint32_t e = 0; e <= 0xffffu; ++e) {
    const auto bits = static_cast<std::uint16_t>(e);
    const float v = ls::backend::from_fp16_bits(bits);
    const bool nan_encoding = (e & 0x7c00u) == 0x7c00u && (e & 0x3ffu) != 0;
    if (nan_encoding) {
      mismatches += !std::isnan(v);
      const std::uint16_t again = ls::backend::to_fp16_bits(v);
      mismatches += !((again & 0x7c00u) == 0x7c00u && (again & 0x200u) != 0);  // a quiet NaN
      continue;
    }
    mismatches += ls::round_to_fp16(v) != v || ls::backend::to_fp16_bits(v) != bits;
  }
  CHECK(mismatches == 0);
  std::size_t checked = 0;
  for (std::uint64_t u = 0; u <= 0xffffffffull; u += 7919) {
    const float x = from_bits(static_cast<std::uint32_t>(u));
    if (std::isnan(x) || std::fabs(x) < 0x1p-126f) continue;  // fp32 subnormals: read as zero under DAZ
    ++checked;
    mismatches += bits_of(ls::backend::from_fp16_bits(ls::backend::to_fp16_bits(x))) != bits_of(ls::round_to_fp16(x));
  }
  CHECK(checked > 500'000);
  CHECK(mismatches == 0);
  CHECK(ls::backend::to_fp16_bits(1.0f) == 0x3c00u);
  CHECK(ls::backend::to_fp16_bits(-2.0f) == 0xc000u);
  CHECK(ls::backend::to_fp16_bits(65504.0f) == 0x7bffu);
  CHECK(ls::backend::to_fp16_bits(1e6f) == 0x7c00u);
  CHECK(ls::backend::to_fp16_bits(0x1p-24f) == 0x0001u);
  CHECK(ls::backend::to_fp16_bits(-0.0f) == 0x8000u);
}

namespace {
// The GPU's packed GEMM run on the host: A and B packed by pack16_op into packed_layout_of's
// places (the per-element body and the layout of backend/cuda/ops.cuh's gemm_packed16), then
// the fp32 GEMM on the unpacked values.
template <ls::compute_precision P>
std::vector<float> packed_gemm_on_host(ls::backend::trans ta, ls::backend::trans tb, std::size_t m, std::size_t n,
                                       std::size_t k, const std::vector<float>& a, std::size_t lda,
                                       const std::vector<float>& b, std::size_t ldb) {
  const ls::backend::packed_layout l = ls::backend::packed_layout_of(ta, tb, m, n, k);
  std::vector<std::uint16_t> packed(l.total(), 0xffffu);
  ls::host_context fp(1);
  for_each_index(fp, l.a_count, ls::backend::pack16_op<P>{a.data(), l.a_cols, lda, packed.data()});
  for_each_index(fp, l.b_count, ls::backend::pack16_op<P>{b.data(), l.b_cols, ldb, packed.data() + l.b_offset});
  std::vector<float> ua(l.a_count), ub(l.b_count), c(m * n, 0.0f);
  for (std::size_t i = 0; i < l.a_count; ++i) ua[i] = ls::backend::from_bits16<P>(packed[i]);
  for (std::size_t i = 0; i < l.b_count; ++i) ub[i] = ls::backend::from_bits16<P>(packed[l.b_offset + i]);
  gemm(fp, ta, tb, m, n, k, 1.0f, ua.data(), l.a_cols, ub.data(), l.b_cols, 0.0f, c.data(), n);
  return c;
}

template <ls::compute_precision P>
void check_packed_gemm() {
  using ls::backend::trans;
  CAPTURE(ls::precision_name(P));
  ls::host_context h(1, true, P);
  h.set_gemm_precision(P);
  for (const auto& shape : {std::tuple<std::size_t, std::size_t, std::size_t>{7, 13, 61}, {1, 1, 1}, {3, 129, 2},
                            {17, 5, 130}})
    for (const trans ta : {trans::no, trans::yes})
      for (const trans tb : {trans::no, trans::yes}) {
        const std::size_t m = std::get<0>(shape), n = std::get<1>(shape), k = std::get<2>(shape);
        CAPTURE(m);
        CAPTURE(n);
        CAPTURE(k);
        CAPTURE(static_cast<int>(ta));
        CAPTURE(static_cast<int>(tb));
        const std::size_t a_cols = ta == trans::no ? k : m, a_rows = m * k / a_cols;
        const std::size_t b_cols = tb == trans::no ? n : k, b_rows = k * n / b_cols;
        const std::size_t lda = a_cols + 3, ldb = b_cols + 1;
        auto a = matrix(a_rows, a_cols, lda, 5), b = matrix(b_rows, b_cols, ldb, 6);
        for (std::size_t r = 0; r < a_rows; ++r)  // the padding is never read
          for (std::size_t c = a_cols; c < lda; ++c) a[r * lda + c] = std::numeric_limits<float>::quiet_NaN();
        const auto got = packed_gemm_on_host<P>(ta, tb, m, n, k, a, lda, b, ldb);
        std::vector<float> want(m * n, 0.0f), size(m * n, 0.0f), abs_a(a.size()), abs_b(b.size());
        gemm(h, ta, tb, m, n, k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, want.data(), n);
        const auto rounded = [](float v) {
          return P == ls::compute_precision::bf16 ? ls::round_to_bf16(v) : ls::round_to_fp16(v);
        };
        for (std::size_t i = 0; i < a.size(); ++i) abs_a[i] = std::fabs(rounded(a[i]));
        for (std::size_t i = 0; i < b.size(); ++i) abs_b[i] = std::fabs(rounded(b[i]));
        ls::host_context fp(1);
        gemm(fp, ta, tb, m, n, k, 1.0f, abs_a.data(), lda, abs_b.data(), ldb, 0.0f, size.data(), n);
        // Both are the exact products of the same rounded operands, summed in fp32 in some order.
        const double u = 2.0 * static_cast<double>(k + 1) * std::ldexp(1.0, -24);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < got.size(); ++i)
          bad += !(std::fabs(static_cast<double>(got[i]) - want[i]) <= u * size[i]);
        CHECK(bad == 0);
      }
}
}  // namespace

TEST_CASE("pack16_op packs strided matrices element by element as their bf16 or fp16 encodings, padding unread") {
  for (const std::size_t rows : {0u, 1u, 3u, 17u})
    for (const std::size_t cols : {1u, 2u, 7u, 64u})
      for (const std::size_t pad : {0u, 3u}) {
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(pad);
        const std::size_t ld = cols + pad;
        auto src = matrix(rows, ld, ld, 9);
        for (float& v : src) v *= 1e5f;  // some beyond fp16's range: infinities
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t c = cols; c < ld; ++c) src[r * ld + c] = std::numeric_limits<float>::quiet_NaN();
        std::vector<std::uint16_t> b(rows * cols + 1, 0xabcdu), f(rows * cols + 1, 0xabcdu);
        ls::host_context ctx(1);
        for_each_index(ctx, rows * cols, ls::backend::pack16_op<ls::compute_precision::bf16>{src.data(), cols, ld, b.data()});
        for_each_index(ctx, rows * cols, ls::backend::pack16_op<ls::compute_precision::fp16>{src.data(), cols, ld, f.data()});
        std::size_t bad = 0;
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t c = 0; c < cols; ++c) {
            const float x = src[r * ld + c];
            bad += bits_of(ls::backend::from_bits16<ls::compute_precision::bf16>(b[r * cols + c])) != bits_of(ls::round_to_bf16(x));
            bad += bits_of(ls::backend::from_bits16<ls::compute_precision::fp16>(f[r * cols + c])) != bits_of(ls::round_to_fp16(x));
          }
        CHECK(bad == 0);
        CHECK(b.back() == 0xabcdu);  // nothing written past rows x cols
        CHECK(f.back() == 0xabcdu);
      }
}

TEST_CASE("bf16_encode_op writes over a flat run the encodings pack16_op packs, so a GPU weight copy holds the packed GEMM's operands") {
  const float specials[] = {0.0f, -0.0f, 1.0f, -1.5f, 1.00390625f, 1.01171875f,  // ties to even, both ways
                            std::numeric_limits<float>::denorm_min(), -1e-39f, std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::max(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  for (const std::size_t n : {0u, 1u, 2u, 13u, 31u, 64u, 1031u}) {
    CAPTURE(n);
    auto src = matrix(1, n, n, 21);
    for (std::size_t i = 0; i < n; ++i)
      if (i % 3 == 0) src[i] = specials[(i / 3) % std::size(specials)];
    std::vector<std::uint16_t> copy(n + 1, 0xabcdu), packed(n + 1, 0xabcdu), sliced(n + 1, 0xabcdu);
    ls::host_context ctx(1);
    for_each_index(ctx, n, ls::backend::bf16_encode_op{src.data(), copy.data()});
    for_each_index(ctx, n, ls::backend::pack16_op<ls::compute_precision::bf16>{src.data(), std::max<std::size_t>(n, 1), n, packed.data()});
    // Written slice by slice (an update's slices), the same encodings.
    for (std::size_t lo = 0; lo < n; lo += 7) {
      const std::size_t hi = std::min(n, lo + 7);
      for_each_index(ctx, hi - lo, ls::backend::bf16_encode_op{src.data() + lo, sliced.data() + lo});
    }
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += copy[i] != ls::to_bf16_bits(src[i]);
    CHECK(bad == 0);
    CHECK(copy == packed);
    CHECK(copy == sliced);
    CHECK(copy.back() == 0xabcdu);  // nothing written past n
  }
}

TEST_CASE("the GPU's packed bf16 and fp16 GEMM, run on the host, is the host's GEMM under the policy within fp32's sums") {
  check_packed_gemm<ls::compute_precision::bf16>();
  check_packed_gemm<ls::compute_precision::fp16>();
}
