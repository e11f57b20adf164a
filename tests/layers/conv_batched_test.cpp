// conv2d's batched form, the one GPUs run (the whole shard's columns side by side, one GEMM per
// pass, col2im in gather form), run here on the host: its kernels give the bits of the per-image
// kernels over the same index space, and the layer's outputs and gradients through it match the
// per-image path over geometries with padding, strides larger than 1, windows that skip input
// rows, 1 x 1 kernels, uneven batches, gradient accumulation and the shard cut into chunks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include <lockstep/layers/conv.hpp>
#include <lockstep/lockstep.hpp>
#include <lockstep/testing/drive.hpp>
#include <lockstep/testing/report.hpp>

#include "../support/random.hpp"

namespace ls = lockstep;
using test_support::random_vector;

namespace {

// |got - want| <= rel (1 + |want|) for every element.
void check_near(const std::vector<double>& got, const std::vector<double>& want, double rel, const char* what) {
  REQUIRE(got.size() == want.size());
  ls::testing::element_report report(std::string(what) + ": batched form vs per-image path", "batched", "per-image");
  for (std::size_t i = 0; i < got.size(); ++i) report.close(i, got[i], want[i], rel * (1.0 + std::abs(want[i])));
  CHECK_MESSAGE(report.ok(), report.text());
}

// The kernels of conv2d<F, K, Stride, Pad> on images shape<C, H, W>, bit for bit: im2col of the
// whole shard against the per-image padded copy and im2col_op, and the gather col2im against
// col2im_op, on `rows` images of values drawn with signed zeros among them.
template <std::size_t F, std::size_t K, std::size_t Stride, std::size_t Pad, std::size_t C, std::size_t H, std::size_t W>
void check_kernels(std::size_t rows) {
  using B = ls::bind_shape_t<ls::conv2d<F, K, Stride, Pad>, ls::shape<C, H, W>>;
  constexpr std::size_t OH = B::OH, OW = B::OW, P = OH * OW, Q = B::patch;
  constexpr ls::detail::window2d g{C, H, W, K, Stride, Pad, OH, OW};
  constexpr std::size_t ph = H + 2 * Pad, pw = W + 2 * Pad;
  CAPTURE(rows);
  const std::size_t n = rows * P;
  auto x = random_vector<float>(rows * C * H * W, 71, -2.0f, 2.0f);
  for (std::size_t i = 0; i < x.size(); i += 5) x[i] = i % 10 == 0 ? 0.0f : -0.0f;
  std::vector<float> cols((Q + 1) * n, 7.0f);
  ls::host_context hc;
  for (std::size_t i = 0; i < cols.size(); ++i) ls::detail::im2col_batched_op<float, g>{x.data(), cols.data(), n}(i);
  // The 64-bit index form (taken past 2^32 elements) writes the bits of the 32-bit one.
  std::vector<float> cols64((Q + 1) * n, 9.0f);
  const ls::detail::im2col_batched_op<float, g> wide{x.data(), cols64.data(), n};
  for (std::size_t i = 0; i < cols64.size(); ++i) wide.template element<std::size_t>(i);
  CHECK(std::memcmp(cols.data(), cols64.data(), cols.size() * sizeof(float)) == 0);
  std::vector<float> xp(C * ph * pw), one(Q * P);
  std::size_t mismatched = 0;
  for (std::size_t b = 0; b < rows; ++b) {
    for (std::size_t i = 0; i < C * ph; ++i) ls::detail::pad_image_op<float, g>{x.data() + b * C * H * W, xp.data()}(i);
    for (std::size_t q = 0; q < Q; ++q) ls::detail::im2col_op<float, g>{xp.data(), one.data()}(q);
    for (std::size_t q = 0; q < Q; ++q)
      mismatched += std::memcmp(one.data() + q * P, cols.data() + q * n + b * P, P * sizeof(float)) != 0;
  }
  CHECK(mismatched == 0);
  std::size_t ones = 0;
  for (std::size_t j = 0; j < n; ++j) ones += cols[Q * n + j] == 1.0f;
  CHECK(ones == n);
  // col2im: the same gradient of the columns in both layouts.
  auto dcols = random_vector<float>(Q * n, 72, -3.0f, 3.0f);
  for (std::size_t i = 0; i < dcols.size(); i += 7) dcols[i] = -0.0f;
  std::vector<float> dx(rows * C * H * W, 9.0f), want(C * H * W), acc(C * ph * pw), dimg(Q * P);
  for (std::size_t i = 0; i < dx.size(); ++i) ls::detail::col2im_batched_op<float, g>{dcols.data(), dx.data(), n}(i);
  mismatched = 0;
  for (std::size_t b = 0; b < rows; ++b) {
    for (std::size_t q = 0; q < Q; ++q) std::memcpy(dimg.data() + q * P, dcols.data() + q * n + b * P, P * sizeof(float));
    for (std::size_t c = 0; c < C; ++c) ls::detail::col2im_op<float, g>{dimg.data(), want.data(), acc.data()}(c);
    mismatched += std::memcmp(want.data(), dx.data() + b * C * H * W, want.size() * sizeof(float)) != 0;
  }
  CHECK(mismatched == 0);
}

// Forward and backward of conv2d<F, K, Stride, Pad> on shape<C, H, W> in double through the
// batched form (in chunks of `chunk` images, the way a GPU cuts a shard whose scratch would be too
// large) against the per-image path, training and accumulating into non-zero gradients.
template <std::size_t F, std::size_t K, std::size_t Stride, std::size_t Pad, std::size_t C, std::size_t H, std::size_t W>
void check_layer(std::size_t rows, std::size_t chunk, bool accumulate, bool with_dx) {
  using B = ls::bind_shape_t<ls::conv2d<F, K, Stride, Pad>, ls::shape<C, H, W>>;
  constexpr std::size_t in = B::input_size, out = B::output_size, np = B::param_count;
  CAPTURE(rows);
  CAPTURE(chunk);
  CAPTURE(accumulate);
  CAPTURE(with_dx);
  std::vector<double> params(np);
  B::init(params.data(), ls::counter_rng(5, 1));
  for (std::size_t f = 0; f < F; ++f) params[F * B::patch + f] = 0.1 * static_cast<double>(f + 1);  // non-zero biases
  const auto x = random_vector<double>(rows * in, 81);
  const auto dy = random_vector<double>(rows * out, 82);
  const auto dp0 = random_vector<double>(np, 83);
  ls::pass_info info{.training = true, .seed = 1, .step = 1};
  info.accumulate = accumulate;
  ls::host_context hc;
  std::vector<double> ws(B::workspace_per_sample * rows + ls::workspace_fixed_v<B>);
  std::vector<double> y(rows * out), dx(rows * in), dp = dp0;
  ls::testing::run_forward<B>(hc, params.data(), x.data(), y.data(), ws.data(), rows, info);
  ls::testing::run_backward<B>(hc, params.data(), x.data(), y.data(), dy.data(), with_dx ? dx.data() : nullptr, dp.data(),
                               ws.data(), rows, info);

  using fa = ls::forward_args_for<double, ls::host_context, B>;
  using ba = ls::backward_args_for<double, ls::host_context, B>;
  std::vector<double> scratch(B::batched_scratch(chunk), 5.0), ws2(ws.size(), 6.0);
  std::vector<double> y2(rows * out, 4.0), dx2(rows * in, 3.0), dp2 = dp0;
  const fa f{params.data(), {x.data(), rows}, {y2.data(), rows}, ws2.data(), info};
  for (std::size_t first = 0; first < rows; first += chunk)
    B::forward_batched(hc, f, first, std::min(chunk, rows - first), scratch.data());
  const ba b{params.data(), {x.data(), rows}, {y2.data(), rows}, {dy.data(), rows},
             {with_dx ? dx2.data() : nullptr, rows}, dp2.data(), ws2.data(), info};
  for (std::size_t first = 0; first < rows; first += chunk)
    B::backward_batched(hc, b, first, std::min(chunk, rows - first), scratch.data());
  check_near(y2, y, 1e-12, "output");
  if (with_dx) check_near(dx2, dx, 1e-12, "input gradient");
  check_near(dp2, dp, 1e-12, "parameter gradient");
}

template <std::size_t F, std::size_t K, std::size_t Stride, std::size_t Pad, std::size_t C, std::size_t H, std::size_t W>
void check_geometry() {
  CAPTURE(F);
  CAPTURE(K);
  CAPTURE(Stride);
  CAPTURE(Pad);
  CAPTURE(C);
  CAPTURE(H);
  CAPTURE(W);
  for (std::size_t rows : {1u, 2u, 5u}) check_kernels<F, K, Stride, Pad, C, H, W>(rows);
  for (std::size_t rows : {1u, 3u, 7u})
    for (std::size_t chunk : {rows, std::size_t{2}})
      for (bool accumulate : {false, true}) check_layer<F, K, Stride, Pad, C, H, W>(rows, chunk, accumulate, !accumulate);
}

}  // namespace

TEST_CASE("conv2d's batched form (GPUs) on the host: the per-image kernels' bits, the per-image path's outputs and gradients") {
  check_geometry<4, 3, 1, 1, 3, 9, 7>();  // "same" padding
  check_geometry<5, 3, 2, 0, 3, 9, 7>();  // stride 2, no padding
  check_geometry<2, 5, 1, 2, 3, 9, 7>();  // 5 x 5 with padding 2, as the CNN
  check_geometry<3, 1, 1, 0, 2, 5, 6>();  // 1 x 1
  check_geometry<2, 2, 3, 1, 2, 8, 7>();  // stride above the window: input rows no window reads
  check_geometry<6, 4, 2, 3, 1, 5, 5>();  // padding almost the window, one channel
}

TEST_CASE("conv2d's batched form cuts a shard into chunks only beyond its scratch bound") {
  using small = ls::bind_shape_t<ls::conv2d<4, 3, 1, 1>, ls::shape<3, 9, 7>>;
  CHECK(small::batched_images(0) == 1);
  CHECK(small::batched_images(1) == 1);
  CHECK(small::batched_images(4096) == 4096);
  using cnn2 = ls::bind_shape_t<ls::conv2d<64, 5, 1, 2>, ls::shape<32, 14, 14>>;
  // (801 + 64) x 196 floats per image: 512 MiB hold 791 images.
  CHECK(cnn2::batched_images(512) == 512);
  CHECK(cnn2::batched_images(10000) == (std::size_t{512} << 20) / 4 / 865 / 196);
  CHECK(cnn2::batched_scratch(cnn2::batched_images(10000)) * sizeof(float) <= (std::size_t{512} << 20));
}
