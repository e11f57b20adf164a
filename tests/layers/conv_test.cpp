// Image layers: the public layer conformance suite over convolutions, pooling, shape layers,
// batch norm, residual blocks and a whole small CNN, on odd and non-square images; forward values
// against naive loops in double; and the shapes and parameter counts that composition gives.
#define LOCKSTEP_TESTING_COUNT_ALLOCATIONS  // this file counts heap allocations (see allocations.hpp)
#include <lockstep/testing/layer.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <lockstep/layers.hpp>
#include <lockstep/layers/batch_norm.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/layers/residual.hpp>
#include <lockstep/testing/drive.hpp>

namespace ls = lockstep;

namespace {

template <class L, std::size_t... Dims>
using bound = ls::bind_shape_t<L, ls::shape<Dims...>>;

// ---- the layers under the conformance suite ----------------------------------------------------
// Convolutions on a 2 x 7 x 5 image: "same", strided "valid", a large padded kernel, a stride
// larger than the kernel, 1 x 1 kernels (stride 1 and 2), a kernel as large as the image, and a
// 1 x 1 image.
using conv_same = bound<ls::conv2d<3, 3, 1, 1>, 2, 7, 5>;
using conv_strided = bound<ls::conv2d<4, 3, 2, 0>, 2, 7, 5>;
using conv_big_padded = bound<ls::conv2d<2, 5, 1, 2>, 2, 7, 5>;
using conv_gappy = bound<ls::conv2d<3, 2, 3, 1>, 2, 7, 5>;
using conv_pointwise = bound<ls::conv2d<5, 1>, 2, 7, 5>;
using conv_pointwise_strided = bound<ls::conv2d<2, 1, 2>, 3, 5, 4>;
using conv_whole = bound<ls::conv2d<3, 5>, 1, 5, 5>;
using conv_tiny = bound<ls::conv2d<2, 1>, 3, 1, 1>;
// 8 input channels: oneDNN's convolution primitives in a oneDNN build.
using conv_wide = bound<ls::conv2d<3, 3, 1, 1>, 8, 5, 4>;
// Pooling: non-overlapping with a dropped last row / column, overlapping (stride < kernel), padded,
// stride 1, a stride beyond the kernel.
using max_plain = bound<ls::max_pool2d<2>, 2, 7, 5>;
using max_overlap = bound<ls::max_pool2d<3, 2>, 2, 7, 5>;
using max_padded = bound<ls::max_pool2d<3, 2, 1>, 2, 7, 5>;
using max_stride1 = bound<ls::max_pool2d<2, 1>, 1, 5, 6>;
using max_gappy = bound<ls::max_pool2d<2, 3, 1>, 3, 7, 8>;
using avg_plain = bound<ls::avg_pool2d<2>, 2, 7, 5>;
using avg_overlap = bound<ls::avg_pool2d<3, 2>, 2, 7, 5>;
using avg_padded = bound<ls::avg_pool2d<3, 2, 1>, 2, 7, 5>;
using avg_stride1 = bound<ls::avg_pool2d<2, 1>, 1, 5, 6>;
using avg_gappy = bound<ls::avg_pool2d<2, 3, 1>, 3, 7, 8>;
using global_avg = bound<ls::global_avg_pool, 3, 5, 7>;
using reshape_to_image = bound<ls::reshape<3, 5, 2>, 30>;
using reshape_image = bound<ls::reshape<6, 5>, 2, 3, 5>;
using flatten_image = bound<ls::flatten, 2, 7, 5>;
using bn_image = bound<ls::batch_norm<>, 3, 4, 5>;
using bn_flat = bound<ls::batch_norm<1, 3>, 6>;
using bn_lanes = bound<ls::batch_norm<>, 2, 8, 9>;  // 72 positions per channel: lane sums (detail::bn_lanes)
using res_block = bound<ls::residual<ls::conv2d<2, 3, 1, 1>, ls::batch_norm<>, ls::relu, ls::conv2d<2, 3, 1, 1>>, 2, 5, 6>;
using small_cnn_net =
    ls::sequential<ls::reshape<1, 6, 7>, ls::conv2d<3, 3, 1, 1>, ls::relu, ls::max_pool2d<2>, ls::flatten, ls::dense<27, 4>>;
using small_cnn = ls::bind_t<small_cnn_net, 42>;
using bn_cnn_net = ls::sequential<ls::reshape<2, 5, 5>, ls::conv2d<3, 3, 1, 1>, ls::batch_norm<>, ls::relu,
                                  ls::avg_pool2d<2>, ls::global_avg_pool, ls::dense<3, 2>>;
using bn_cnn = ls::bind_t<bn_cnn_net, 50>;

}  // namespace

TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, conv_same, conv_strided, conv_big_padded, conv_gappy,
                          conv_pointwise, conv_pointwise_strided, conv_whole, conv_tiny, conv_wide);
TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, max_plain, max_overlap, max_padded, max_stride1, max_gappy);
TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, avg_plain, avg_overlap, avg_padded, avg_stride1, avg_gappy,
                          global_avg);
TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, reshape_to_image, reshape_image, flatten_image);
TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, bn_image, bn_flat, bn_lanes, res_block, small_cnn, bn_cnn);

// ---- shapes through composition, at compile time ------------------------------------------------
namespace {

// Output geometry: floor((in + 2 pad - k) / stride) + 1.
static_assert(std::is_same_v<conv_same::output_shape, ls::shape<3, 7, 5>>);
static_assert(std::is_same_v<conv_strided::output_shape, ls::shape<4, 3, 2>>);
static_assert(std::is_same_v<conv_big_padded::output_shape, ls::shape<2, 7, 5>>);
static_assert(std::is_same_v<conv_gappy::output_shape, ls::shape<3, 3, 2>>);
static_assert(std::is_same_v<conv_pointwise::output_shape, ls::shape<5, 7, 5>>);
static_assert(std::is_same_v<conv_pointwise_strided::output_shape, ls::shape<2, 3, 2>>);
static_assert(std::is_same_v<conv_whole::output_shape, ls::shape<3, 1, 1>>);
static_assert(std::is_same_v<max_plain::output_shape, ls::shape<2, 3, 2>>);
static_assert(std::is_same_v<max_overlap::output_shape, ls::shape<2, 3, 2>>);
static_assert(std::is_same_v<max_padded::output_shape, ls::shape<2, 4, 3>>);
static_assert(std::is_same_v<max_stride1::output_shape, ls::shape<1, 4, 5>>);
static_assert(std::is_same_v<max_gappy::output_shape, ls::shape<3, 3, 3>>);
static_assert(std::is_same_v<avg_padded::output_shape, ls::shape<2, 4, 3>>);
static_assert(std::is_same_v<global_avg::output_shape, ls::shape<3>>);
static_assert(std::is_same_v<reshape_to_image::output_shape, ls::shape<3, 5, 2>>);
static_assert(std::is_same_v<flatten_image::output_shape, ls::shape<70>>);
static_assert(std::is_same_v<bn_image::output_shape, ls::shape<3, 4, 5>>);
static_assert(std::is_same_v<res_block::output_shape, ls::shape<2, 5, 6>>);
static_assert(conv_same::param_count == 3 * 2 * 9 + 3 && conv_strided::param_count == 4 * 2 * 9 + 4);
static_assert(max_plain::param_count == 0 && avg_plain::param_count == 0 && flatten_image::param_count == 0);
static_assert(bn_image::param_count == 6 && ls::state_count_v<bn_image> == 6 && ls::couples_rows_v<bn_image>);
static_assert(!ls::couples_rows_v<conv_same> && !ls::couples_rows_v<small_cnn> && ls::couples_rows_v<res_block>);
static_assert(res_block::param_count == 2 * (2 * 2 * 9 + 2) + 4 && res_block::state_count == 4);

// The TensorFlow tutorial CNN on 28 x 28 grey images stored as flat rows of 784.
using tf_cnn = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<32, 5, 1, 2>, ls::relu, ls::max_pool2d<2>,
                              ls::conv2d<64, 5, 1, 2>, ls::relu, ls::max_pool2d<2>, ls::flatten,
                              ls::dense<3136, 1024>, ls::relu, ls::dense<1024, 10>>;
using tf_bound = ls::bind_t<tf_cnn, 784>;
static_assert(ls::composable<ls::reshape<1, 28, 28>, ls::conv2d<32, 5, 1, 2>, ls::relu, ls::max_pool2d<2>,
                             ls::conv2d<64, 5, 1, 2>, ls::relu, ls::max_pool2d<2>, ls::flatten, ls::dense<3136, 1024>>);
static_assert(tf_cnn::expected_input == 784);
static_assert(std::is_same_v<tf_bound::layer_type<1>::output_shape, ls::shape<32, 28, 28>>);
static_assert(std::is_same_v<ls::output_shape_t<ls::relu, ls::shape<32, 28, 28>>, ls::shape<32, 28, 28>>);  // relu keeps it
static_assert(std::is_same_v<tf_bound::layer_type<3>::output_shape, ls::shape<32, 14, 14>>);
static_assert(std::is_same_v<tf_bound::layer_type<4>::output_shape, ls::shape<64, 14, 14>>);
static_assert(std::is_same_v<tf_bound::layer_type<6>::output_shape, ls::shape<64, 7, 7>>);
static_assert(std::is_same_v<tf_bound::layer_type<7>::output_shape, ls::shape<3136>>);
static_assert(std::is_same_v<tf_bound::output_shape, ls::shape<10>>);
static_assert(tf_bound::params[1] == 32 * 25 + 32 && tf_bound::params[4] == 64 * 32 * 25 + 64);
static_assert(ls::model<tf_cnn>::param_count == 3274634);
static_assert(ls::model<tf_cnn>::state_count == 0);

// Shape rules: a convolution or pooling needs an image at least as large as its window; flat rows
// need a reshape; reshape needs the same number of elements; a residual body must keep the shape.
static_assert(!ls::composable<ls::reshape<1, 4, 4>, ls::flatten, ls::max_pool2d<2>>);
static_assert(!ls::composable<ls::dense<16, 16>, ls::conv2d<2, 3>>);
static_assert(ls::composable<ls::dense<16, 16>, ls::reshape<1, 4, 4>, ls::conv2d<2, 3>>);
static_assert(!ls::composable<ls::reshape<1, 4, 4>, ls::conv2d<2, 5>>);
static_assert(ls::composable<ls::reshape<1, 4, 4>, ls::conv2d<2, 5, 1, 2>>);  // padding makes it fit
static_assert(!ls::composable<ls::reshape<1, 4, 4>, ls::max_pool2d<5>>);
static_assert(!ls::composable<ls::dense<16, 15>, ls::reshape<1, 4, 4>>);
static_assert(!ls::composable<ls::dense<16, 16>, ls::global_avg_pool>);
static_assert(ls::composable<ls::reshape<2, 4, 4>, ls::residual<ls::conv2d<2, 3, 1, 1>, ls::relu>>);
static_assert(!ls::composable<ls::reshape<2, 4, 4>, ls::residual<ls::conv2d<3, 3, 1, 1>, ls::relu>>);
static_assert(!ls::composable<ls::reshape<2, 4, 4>, ls::residual<ls::conv2d<2, 3>>>);
static_assert(!ls::composable<ls::reshape<2, 4, 4>, ls::sequential<ls::flatten, ls::avg_pool2d<2>>>);

// ---- naive references, in double ------------------------------------------------------------------

/// Runs bound layer B forward on `rows` rows of x with parameters p (evaluation mode).
template <class B>
std::vector<double> forward_of(const std::vector<double>& p, const std::vector<double>& x, std::size_t rows) {
  ls::host_context ctx{1};
  std::vector<double> y(rows * B::output_size), ws(rows * B::workspace_per_sample + ls::workspace_fixed_v<B> + 1);
  lockstep::testing::run_forward<B>(ctx, p.data(), x.data(), y.data(), ws.data(), rows, ls::pass_info{});
  return y;
}

/// Deterministic irregular values in [-1, 1].
std::vector<double> values(std::size_t n, std::uint64_t key) {
  const ls::counter_rng rng(77, key);
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = 2 * rng.uniform_double(i) - 1;
  return v;
}

/// x[c][y][x] of image b, or 0 outside the image.
struct image_view {
  const std::vector<double>& v;
  std::size_t c, h, w;
  [[nodiscard]] double at(std::size_t b, std::size_t ch, long y, long x) const {
    if (y < 0 || x < 0 || y >= static_cast<long>(h) || x >= static_cast<long>(w)) return 0.0;
    return v[((b * c + ch) * h + static_cast<std::size_t>(y)) * w + static_cast<std::size_t>(x)];
  }
  [[nodiscard]] bool inside(long y, long x) const {
    return y >= 0 && x >= 0 && y < static_cast<long>(h) && x < static_cast<long>(w);
  }
};

/// conv2d<F, K, S, P> on shape<C, H, W> against the direct sum over (c, kr, kc).
template <std::size_t F, std::size_t K, std::size_t S, std::size_t P, std::size_t C, std::size_t H, std::size_t W>
void check_conv_direct() {
  using B = bound<ls::conv2d<F, K, S, P>, C, H, W>;
  constexpr std::size_t OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1, rows = 3;
  static_assert(std::is_same_v<typename B::output_shape, ls::shape<F, OH, OW>>);
  CAPTURE(F);
  CAPTURE(K);
  CAPTURE(S);
  CAPTURE(P);
  CAPTURE(H);
  CAPTURE(W);
  std::vector<double> p = values(B::param_count, 1);  // nonzero biases too
  const std::vector<double> x = values(rows * C * H * W, 2);
  const std::vector<double> y = forward_of<B>(p, x, rows);
  REQUIRE(y.size() == rows * F * OH * OW);
  const image_view in{x, C, H, W};
  for (std::size_t b = 0; b < rows; ++b)
    for (std::size_t f = 0; f < F; ++f)
      for (std::size_t oy = 0; oy < OH; ++oy)
        for (std::size_t ox = 0; ox < OW; ++ox) {
          double s = p[F * C * K * K + f];
          for (std::size_t c = 0; c < C; ++c)
            for (std::size_t kr = 0; kr < K; ++kr)
              for (std::size_t kc = 0; kc < K; ++kc)
                s += p[((f * C + c) * K + kr) * K + kc] *
                     in.at(b, c, static_cast<long>(oy * S + kr) - static_cast<long>(P),
                           static_cast<long>(ox * S + kc) - static_cast<long>(P));
          const double got = y[((b * F + f) * OH + oy) * OW + ox];
          CAPTURE(b);
          CAPTURE(f);
          CAPTURE(oy);
          CAPTURE(ox);
          CHECK(std::abs(got - s) <= 1e-12 * std::max(1.0, std::abs(s)));
        }
}

enum class pool { max, avg };

/// max_pool2d / avg_pool2d<K, S, P> on shape<C, H, W> against naive loops: the maximum over the
/// window's cells inside the image, or the sum of the window (padding as zeros) over K K.
template <pool Kind, std::size_t K, std::size_t S, std::size_t P, std::size_t C, std::size_t H, std::size_t W>
void check_pool_direct() {
  using L = std::conditional_t<Kind == pool::max, ls::max_pool2d<K, S, P>, ls::avg_pool2d<K, S, P>>;
  using B = bound<L, C, H, W>;
  constexpr std::size_t OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1, rows = 2;
  static_assert(std::is_same_v<typename B::output_shape, ls::shape<C, OH, OW>>);
  CAPTURE(K);
  CAPTURE(S);
  CAPTURE(P);
  CAPTURE(H);
  CAPTURE(W);
  std::vector<double> x = values(rows * C * H * W, 3);
  for (double& v : x) v -= 2;  // all negative: padding must not act as a zero for max pooling
  const std::vector<double> y = forward_of<B>({}, x, rows);
  REQUIRE(y.size() == rows * C * OH * OW);
  const image_view in{x, C, H, W};
  for (std::size_t b = 0; b < rows; ++b)
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t oy = 0; oy < OH; ++oy)
        for (std::size_t ox = 0; ox < OW; ++ox) {
          double best = -1e300, sum = 0;
          for (std::size_t kr = 0; kr < K; ++kr)
            for (std::size_t kc = 0; kc < K; ++kc) {
              const long yy = static_cast<long>(oy * S + kr) - static_cast<long>(P);
              const long xx = static_cast<long>(ox * S + kc) - static_cast<long>(P);
              if (in.inside(yy, xx)) best = std::max(best, in.at(b, c, yy, xx));
              sum += in.at(b, c, yy, xx);
            }
          const double want = Kind == pool::max ? best : sum / static_cast<double>(K * K);
          const double got = y[((b * C + c) * OH + oy) * OW + ox];
          CAPTURE(b);
          CAPTURE(c);
          CAPTURE(oy);
          CAPTURE(ox);
          if constexpr (Kind == pool::max) {
            CHECK(got == want);
          } else {
            CHECK(std::abs(got - want) <= 1e-12);
          }
        }
}

}  // namespace

TEST_CASE("conv2d: forward equals the direct convolution over strides, paddings and odd images") {
  check_conv_direct<3, 3, 1, 1, 2, 7, 5>();
  check_conv_direct<4, 3, 2, 0, 2, 7, 5>();
  check_conv_direct<2, 3, 2, 1, 3, 8, 9>();
  check_conv_direct<2, 5, 1, 2, 2, 7, 5>();
  check_conv_direct<3, 2, 3, 1, 2, 7, 5>();
  check_conv_direct<2, 4, 2, 3, 1, 5, 3>();  // padding 3 of a kernel of 4: windows mostly in the padding
  check_conv_direct<5, 1, 1, 0, 2, 7, 5>();
  check_conv_direct<2, 1, 2, 0, 3, 5, 4>();
  check_conv_direct<3, 5, 1, 0, 1, 5, 5>();
  check_conv_direct<1, 3, 1, 0, 1, 3, 11>();
}

TEST_CASE("max_pool2d and avg_pool2d: forward equals naive pooling") {
  check_pool_direct<pool::max, 2, 2, 0, 2, 7, 5>();
  check_pool_direct<pool::max, 3, 2, 0, 2, 7, 5>();
  check_pool_direct<pool::max, 3, 2, 1, 2, 7, 5>();
  check_pool_direct<pool::max, 2, 1, 0, 1, 5, 6>();
  check_pool_direct<pool::max, 2, 3, 1, 3, 7, 8>();
  check_pool_direct<pool::max, 3, 1, 2, 1, 4, 3>();
  check_pool_direct<pool::avg, 2, 2, 0, 2, 7, 5>();
  check_pool_direct<pool::avg, 3, 2, 0, 2, 7, 5>();
  check_pool_direct<pool::avg, 3, 2, 1, 2, 7, 5>();
  check_pool_direct<pool::avg, 2, 1, 0, 1, 5, 6>();
  check_pool_direct<pool::avg, 2, 3, 1, 3, 7, 8>();
  check_pool_direct<pool::avg, 3, 1, 2, 1, 4, 3>();
}

TEST_CASE("global_avg_pool, reshape and flatten: forward values") {
  const std::vector<double> x = values(2 * 3 * 5 * 7, 4);
  const auto y = forward_of<global_avg>({}, x, 2);
  REQUIRE(y.size() == 6);
  for (std::size_t bc = 0; bc < 6; ++bc) {
    double s = 0;
    for (std::size_t j = 0; j < 35; ++j) s += x[bc * 35 + j];
    CHECK(std::abs(y[bc] - s / 35) <= 1e-14);
  }
  // reshape and flatten move nothing: an NCHW row already is its flattened self.
  const std::vector<double> z = values(4 * 70, 5);
  CHECK(forward_of<flatten_image>({}, z, 4) == z);
  CHECK(forward_of<bound<ls::reshape<2, 7, 5>, 70>>({}, z, 4) == z);
}

TEST_CASE("max_pool2d: the gradient of a tied window goes to its first maximum") {
  using B = bound<ls::max_pool2d<2, 1>, 1, 3, 3>;  // overlapping 2 x 2 windows, 2 x 2 outputs
  ls::host_context ctx{1};
  const std::vector<double> x(9, 0.5), dy{1.0, 10.0, 100.0, 1000.0};
  std::vector<double> y(4), ws(B::workspace_per_sample), dx(9, -1.0);
  lockstep::testing::run_forward<B>(ctx, static_cast<const double*>(nullptr), x.data(), y.data(), ws.data(), 1, ls::pass_info{});
  lockstep::testing::run_backward<B>(ctx, static_cast<const double*>(nullptr), x.data(), y.data(), dy.data(), dx.data(),
              static_cast<double*>(nullptr), ws.data(), 1, ls::pass_info{});
  CHECK(y == std::vector<double>(4, 0.5));
  // Each window's first cell in row-major order: (0,0), (0,1), (1,0), (1,1).
  CHECK(dx == std::vector<double>{1.0, 10.0, 0.0, 100.0, 1000.0, 0.0, 0.0, 0.0, 0.0});
}

TEST_CASE("batch_norm: one value per channel (a flat batch of one row) moves the running mean, not the variance") {
  using B = bn_flat;
  constexpr std::size_t C = B::param_count / 2;
  ls::host_context ctx{1};
  std::vector<double> p(B::param_count + B::state_count);
  B::init(p.data(), ls::counter_rng(1, 1));
  B::init_state(p.data() + B::param_count);
  for (std::size_t c = 0; c < C; ++c) p[C + c] = 0.25 * static_cast<double>(c) - 0.1;  // β
  const double* state = p.data() + B::param_count;
  for (const std::size_t rows : {std::size_t{1}, std::size_t{2}}) {
    CAPTURE(rows);
    const std::vector<double> before(state, state + 2 * C);
    std::vector<double> x = values(rows * C, 8);
    std::vector<double> y(x.size()), ws(rows * B::workspace_per_sample + ls::workspace_fixed_v<B>);
    ls::pass_info info;
    info.training = true;
    info.state_offset = static_cast<std::ptrdiff_t>(B::param_count);
    lockstep::testing::run_forward<B>(ctx, p.data(), x.data(), y.data(), ws.data(), rows, info);
    for (std::size_t c = 0; c < C; ++c) {
      double mean = 0;
      for (std::size_t r = 0; r < rows; ++r) mean += x[r * C + c];
      mean /= static_cast<double>(rows);
      const double m = 1.0 / 3.0;  // batch_norm<1, 3>
      CHECK(std::abs(state[c] - ((1 - m) * before[c] + m * mean)) <= 1e-12);
      if (rows == 1) {
        CHECK(state[C + c] == before[C + c]);             // one value: no spread to learn from
        CHECK(std::abs(y[c] - p[C + c]) <= 1e-12);        // the value normalises to β
      } else {
        const double d = x[c] - x[C + c];
        CHECK(std::abs(state[C + c] - ((1 - m) * before[C + c] + m * d * d / 2)) <= 1e-12);
      }
    }
  }
}

TEST_CASE("batch_norm: training normalises each channel over the batch and positions, and evaluation uses running statistics") {
  using B = bn_image;  // shape<3, 4, 5>, momentum 1/10
  constexpr std::size_t rows = 5, C = 3, P = 20;
  ls::host_context ctx{1};
  std::vector<double> p(B::param_count + B::state_count);
  B::init(p.data(), ls::counter_rng(1, 1));
  B::init_state(p.data() + B::param_count);
  for (std::size_t c = 0; c < C; ++c) p[c] = 0.5 + static_cast<double>(c), p[C + c] = 0.25 * static_cast<double>(c) - 0.1;
  std::vector<double> x = values(rows * C * P, 6);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = 3 * x[i] + static_cast<double>((i / P) % C);  // per-channel offsets
  std::vector<double> y(x.size()), ws(rows * B::workspace_per_sample + ls::workspace_fixed_v<B>);
  ls::pass_info info;
  info.training = true;
  info.state_offset = static_cast<std::ptrdiff_t>(B::param_count);
  lockstep::testing::run_forward<B>(ctx, p.data(), x.data(), y.data(), ws.data(), rows, info);
  for (std::size_t c = 0; c < C; ++c) {
    double mean = 0, var = 0;
    for (std::size_t b = 0; b < rows; ++b)
      for (std::size_t j = 0; j < P; ++j) mean += x[(b * C + c) * P + j];
    mean /= rows * P;
    for (std::size_t b = 0; b < rows; ++b)
      for (std::size_t j = 0; j < P; ++j) var += (x[(b * C + c) * P + j] - mean) * (x[(b * C + c) * P + j] - mean);
    const double n = rows * P;
    for (std::size_t b = 0; b < rows; ++b)
      for (std::size_t j = 0; j < P; ++j) {
        const std::size_t i = (b * C + c) * P + j;
        const double want = p[c] * (x[i] - mean) / std::sqrt(var / n + 1e-5) + p[C + c];
        CHECK(std::abs(y[i] - want) <= 1e-12);
      }
    const double* state = p.data() + B::param_count;
    CHECK(std::abs(state[c] - 0.1 * mean) <= 1e-12);                         // running mean from 0
    CHECK(std::abs(state[C + c] - (0.9 + 0.1 * var / (n - 1))) <= 1e-12);  // running var (unbiased) from 1
  }
  // Evaluation: the running statistics, not the batch's; each row on its own.
  info.training = false;
  lockstep::testing::run_forward<B>(ctx, p.data(), x.data(), y.data(), ws.data(), rows, info);
  const double* state = p.data() + B::param_count;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const std::size_t c = (i / P) % C;
    const double want = p[c] * (x[i] - state[c]) / std::sqrt(state[C + c] + 1e-5) + p[C + c];
    CHECK(std::abs(y[i] - want) <= 1e-12);
  }
}
