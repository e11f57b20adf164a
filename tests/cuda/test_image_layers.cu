// The image layers (conv2d, max_pool2d, avg_pool2d, global_avg_pool) on gpu<0> against the host:
// forward output, input gradient and parameter gradient, over batches 0, 1, 3 and 37.

#include "gpu_test.hpp"

#include <vector>

#include <lockstep/layers/conv.hpp>

using namespace lockstep_test;

namespace {

// Forward and backward of bound layer B = bind_shape_t<Layer, S> on the host and on gpu<0>.
template <class Layer, class S>
void check_image_layer(const char* name, std::size_t batch) {
  using B = ls::bind_shape_t<Layer, S>;
  constexpr std::size_t in = B::input_size, out = B::output_size, np = B::param_count;
  std::size_t nw = batch * B::workspace_per_sample;
  if constexpr (requires { B::workspace_fixed; }) nw += B::workspace_fixed;
  CAPTURE(name);
  CAPTURE(batch);
  std::vector<float> params(np);
  B::init(params.data(), ls::counter_rng(7, 3));
  const auto shift = random_vector(params.size(), 9);
  for (std::size_t i = 0; i < params.size(); ++i) params[i] += 0.1f * shift[i];  // biases not zero
  const auto x = random_vector(batch * in, 1, -2.0f, 2.0f);
  const auto dy = random_vector(batch * out, 2);
  const ls::pass_info info{.training = true, .seed = 99, .step = 5};

  ls::host_context hc;
  std::vector<float> y(batch * out), ws(nw), dx(batch * in, 0.0f), dp(np, 0.0f);
  B::forward(hc, params.data(), x.data(), y.data(), ws.data(), batch, info);
  B::backward(hc, params.data(), x.data(), y.data(), dy.data(), dx.data(), dp.data(), ws.data(), batch, info);

  ls::cuda_context ctx(0);
  auto d_params = to_device(ctx, params);
  auto d_x = to_device(ctx, x);
  auto d_dy = to_device(ctx, dy);
  auto d_dx = to_device(ctx, std::vector<float>(batch * in, 0.0f));
  auto d_dp = to_device(ctx, std::vector<float>(np, 0.0f));
  ls::buffer<float, ls::gpu<0>> d_y(batch * out), d_ws(nw);
  B::forward(ctx, d_params.data(), d_x.data(), d_y.data(), d_ws.data(), batch, info);
  B::backward(ctx, d_params.data(), d_x.data(), d_y.data(), d_dy.data(), d_dx.data(), d_dp.data(), d_ws.data(), batch,
              info);
  check_close(to_host(ctx, d_y.data(), y.size()), y, 1e-5, "forward output");
  check_close(to_host(ctx, d_dx.data(), dx.size()), dx, 1e-5, "input gradient");
  check_close(to_host(ctx, d_dp.data(), dp.size()), dp, 1e-5, "parameter gradient");
}

template <class Layer, class S>
void check_image_layer_all_batches(const char* name) {
  for (std::size_t batch : {0u, 1u, 3u, 37u}) check_image_layer<Layer, S>(name, batch);
}

}  // namespace

TEST_CASE("cuda: the image layers' forward and backward match the host within 1e-5") {
  LOCKSTEP_REQUIRE_GPUS(1);
  check_image_layer_all_batches<ls::conv2d<32, 5, 1, 2>, ls::shape<1, 28, 28>>("conv2d<32, 5, 1, 2> on 1x28x28");
  check_image_layer_all_batches<ls::conv2d<64, 5, 1, 2>, ls::shape<32, 14, 14>>("conv2d<64, 5, 1, 2> on 32x14x14");
  check_image_layer_all_batches<ls::conv2d<7, 3, 2, 1>, ls::shape<3, 17, 13>>("conv2d<7, 3, 2, 1> on 3x17x13");
  check_image_layer_all_batches<ls::conv2d<5, 4, 3, 3>, ls::shape<2, 11, 16>>("conv2d<5, 4, 3, 3> on 2x11x16");
  check_image_layer_all_batches<ls::conv2d<3, 1>, ls::shape<4, 5, 7>>("conv2d<3, 1> on 4x5x7");
  check_image_layer_all_batches<ls::max_pool2d<2>, ls::shape<3, 9, 8>>("max_pool2d<2> on 3x9x8");
  check_image_layer_all_batches<ls::max_pool2d<3, 2, 1>, ls::shape<2, 7, 6>>("max_pool2d<3, 2, 1> on 2x7x6");
  check_image_layer_all_batches<ls::avg_pool2d<3, 2, 1>, ls::shape<2, 7, 6>>("avg_pool2d<3, 2, 1> on 2x7x6");
  check_image_layer_all_batches<ls::global_avg_pool, ls::shape<4, 5, 3>>("global_avg_pool on 4x5x3");
}
