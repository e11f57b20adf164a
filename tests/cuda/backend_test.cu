// The CUDA backend against the host backend: GEMM, elementwise ops, reductions, input staging,
// every layer's forward and backward, the losses and the optimisers. Plain TEST_CASEs only
// (doctest's TEST_CASE_TEMPLATE misbehaves under nvcc).

#include "gpu_test.hpp"
#include "../losses/xent_reference.hpp"

#include <lockstep/distribute/detail/row_exchange.hpp>
#include <lockstep/testing/drive.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace lockstep_test;
using ls::backend::trans;

namespace {

// y[i] = 2 x[i] + i: a user-defined functor run by for_each_index.
struct affine_index_op {
  const float* x;
  float* y;
  LOCKSTEP_HD void operator()(std::size_t i) const { y[i] = 2.0f * x[i] + static_cast<float>(i); }
};

// Row-major op(A) op(B) in double, the reference for GEMM.
std::vector<float> reference_gemm(trans ta, trans tb, std::size_t m, std::size_t n, std::size_t k, float alpha,
                                  const std::vector<float>& a, std::size_t lda, const std::vector<float>& b,
                                  std::size_t ldb, float beta, std::vector<float> c, std::size_t ldc) {
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      double acc = 0;
      for (std::size_t p = 0; p < k; ++p) {
        const double av = ta == trans::no ? a[i * lda + p] : a[p * lda + i];
        const double bv = tb == trans::no ? b[p * ldb + j] : b[j * ldb + p];
        acc += av * bv;
      }
      float& e = c[i * ldc + j];
      e = static_cast<float>(alpha * acc + (beta == 0.0f ? 0.0 : static_cast<double>(beta) * e));
    }
  return c;
}

// One GEMM case of the GEMM tests: C = 0.75 op(A) op(B) + beta C with A, B and C stored row-major
// with padded strides.
struct gemm_case {
  std::size_t m, n, k;
  trans ta, tb;
  float beta;
  std::size_t a_rows, b_rows, lda, ldb, ldc;  ///< A and B as stored, and the three row strides
};

// Calls f(gemm_case) for every transpose, beta 0 and 0.5, and empty, tiny, odd and large shapes
// (k = 0 included), the case captured for failure messages.
template <class F>
void for_each_gemm_case(F&& f) {
  struct shape {
    std::size_t m, n, k;
  };
  for (const shape s : {shape{0, 3, 2}, shape{3, 0, 2}, shape{1, 1, 1}, shape{5, 7, 3}, shape{33, 17, 65},
                        shape{4, 6, 0}, shape{64, 128, 257}})
    for (trans ta : {trans::no, trans::yes})
      for (trans tb : {trans::no, trans::yes})
        for (float beta : {0.0f, 0.5f}) {
          CAPTURE(s.m);
          CAPTURE(s.n);
          CAPTURE(s.k);
          CAPTURE(static_cast<int>(ta));
          CAPTURE(static_cast<int>(tb));
          CAPTURE(beta);
          const std::size_t a_cols = ta == trans::no ? s.k : s.m, b_cols = tb == trans::no ? s.n : s.k;
          f(gemm_case{.m = s.m, .n = s.n, .k = s.k, .ta = ta, .tb = tb, .beta = beta,
                      .a_rows = ta == trans::no ? s.m : s.k, .b_rows = tb == trans::no ? s.k : s.n,
                      .lda = a_cols + 3, .ldb = b_cols + 2, .ldc = s.n + 1});
        }
}

// Forward and backward of bound layer B = bind_shape_t<Layer, S> on the host and on gpu<0>.
template <class Layer, class S>
void check_layer(const char* name, std::size_t batch, bool training) {
  using B = ls::bind_shape_t<Layer, S>;
  constexpr std::size_t In = S::size;
  constexpr std::size_t out = B::output_size, np = B::param_count, nw = B::workspace_per_sample;
  constexpr std::size_t nf = ls::workspace_fixed_v<B>;
  const std::string label(name);  // doctest prints a const char* as an address
  CAPTURE(label);
  CAPTURE(batch);
  CAPTURE(training);
  std::vector<float> params(np);
  B::init(params.data(), ls::counter_rng(7, 3));
  const auto x = random_vector(batch * In, 1, -2.0f, 2.0f);
  const auto dy = random_vector(batch * out, 2);
  const ls::pass_info info{.training = training, .seed = 99, .step = 5, .sample_offset = 11, .layer_stream = 3};

  ls::host_context hc;
  std::vector<float> y(batch * out), ws(batch * nw + nf), dx(batch * In, 0.0f), dp(np, 0.0f);
  lockstep::testing::run_forward<B>(hc, params.data(), x.data(), y.data(), ws.data(), batch, info);
  lockstep::testing::run_backward<B>(hc, params.data(), x.data(), y.data(), dy.data(), dx.data(), dp.data(), ws.data(), batch, info);

  ls::cuda_context ctx(0);
  auto d_params = to_device(ctx, params);
  auto d_x = to_device(ctx, x);
  auto d_dy = to_device(ctx, dy);
  auto d_dx = to_device(ctx, std::vector<float>(batch * In, 0.0f));
  auto d_dp = to_device(ctx, std::vector<float>(np, 0.0f));
  ls::buffer<float, ls::gpu<0>> d_y(batch * out), d_ws(batch * nw + nf);
  lockstep::testing::run_forward<B>(ctx, d_params.data(), d_x.data(), d_y.data(), d_ws.data(), batch, info);
  lockstep::testing::run_backward<B>(ctx, d_params.data(), d_x.data(), d_y.data(), d_dy.data(), d_dx.data(), d_dp.data(), d_ws.data(), batch,
              info);
  check_close(to_host(ctx, d_y.data(), y.size()), y, 1e-5, "forward output");
  check_close(to_host(ctx, d_dx.data(), dx.size()), dx, 1e-5, "input gradient");
  check_close(to_host(ctx, d_dp.data(), dp.size()), dp, 1e-5, "parameter gradient");
}

template <class Layer, class S>
void check_layer_all_batches_shaped(const char* name) {
  for (std::size_t batch : {0u, 1u, 3u, 37u})
    for (bool training : {true, false}) check_layer<Layer, S>(name, batch, training);
}
template <class Layer, std::size_t In>
void check_layer_all_batches(const char* name) {
  check_layer_all_batches_shaped<Layer, ls::shape<In>>(name);
}

// batch_norm bound to S: forward and backward in training (`rows` split over `shards` GPU
// replicas on gpu<0> that exchange their rows' sums through a host row exchange, one thread each)
// and in evaluation, against the host layer on the whole batch: outputs, input gradients,
// parameter gradients (the global sums, from the leading replica) and running statistics.
template <class Layer, class S>
void check_batch_norm(std::size_t rows, std::size_t shards, bool training, bool accumulate) {
  using B = ls::bind_shape_t<Layer, S>;
  constexpr std::size_t in = B::input_size, np = B::param_count, ns = B::state_count;
  constexpr std::size_t nw = B::workspace_per_sample, nf = ls::workspace_fixed_v<B>;
  CAPTURE(rows);
  CAPTURE(shards);
  CAPTURE(training);
  CAPTURE(accumulate);
  auto params = random_vector(np + ns, 31, 0.5f, 1.5f);  // γ, β, running mean, running variance (> 0)
  const auto x = random_vector(rows * in, 32, -3.0f, 5.0f);
  const auto dy = random_vector(rows * in, 33);
  const auto dp0 = random_vector(np, 34);  // what an accumulating backward adds to
  ls::pass_info info{.training = training, .seed = 1, .step = 2};
  info.state_offset = static_cast<std::ptrdiff_t>(np);
  info.accumulate = accumulate;
  std::vector<float> host_params = params, y(rows * in), dx(rows * in), dp = dp0, ws(rows * nw + nf);
  ls::host_context hc;
  lockstep::testing::run_forward<B>(hc, host_params.data(), x.data(), y.data(), ws.data(), rows, info);
  lockstep::testing::run_backward<B>(hc, host_params.data(), x.data(), y.data(), dy.data(), dx.data(), dp.data(), ws.data(),
                                     rows, info);
  ls::data::batch whole;  // the rows, cut as a strategy cuts them
  whole.width = in;
  whole.features = x;
  whole.indices.resize(rows);
  const auto split = ls::data::split(whole, shards);
  ls::detail::host_row_exchange exchange(shards, std::chrono::milliseconds(20'000));
  std::vector<std::vector<float>> got_y(shards), got_dx(shards), got_dp(shards), got_state(shards);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < shards; ++r)
    threads.emplace_back([&, r] {
      ls::cuda_context ctx(0);
      const std::size_t first = split[r].offset, n = split[r].size;
      ls::pass_info mine = info;
      mine.sample_offset = first;
      mine.global_rows = rows;
      if (shards > 1) {
        mine.exchange = &exchange;
        mine.rank = r;
      }
      auto d_params = to_device(ctx, params);
      auto d_x = to_device(ctx, std::vector<float>(x.begin() + first * in, x.begin() + (first + n) * in));
      auto d_dy = to_device(ctx, std::vector<float>(dy.begin() + first * in, dy.begin() + (first + n) * in));
      auto d_dp = to_device(ctx, dp0);
      ls::buffer<float, ls::gpu<0>> d_y(n * in), d_dx(n * in), d_ws(n * nw + nf);
      lockstep::testing::run_forward<B>(ctx, d_params.data(), d_x.data(), d_y.data(), d_ws.data(), n, mine);
      lockstep::testing::run_backward<B>(ctx, d_params.data(), d_x.data(), d_y.data(), d_dy.data(), d_dx.data(), d_dp.data(),
                                         d_ws.data(), n, mine);
      got_y[r] = to_host(ctx, d_y.data(), n * in);
      got_dx[r] = to_host(ctx, d_dx.data(), n * in);
      got_dp[r] = to_host(ctx, d_dp.data(), np);
      got_state[r] = to_host(ctx, d_params.data() + np, ns);
    });
  for (auto& t : threads) t.join();
  std::vector<float> all_y, all_dx;
  for (std::size_t r = 0; r < shards; ++r) {
    all_y.insert(all_y.end(), got_y[r].begin(), got_y[r].end());
    all_dx.insert(all_dx.end(), got_dx[r].begin(), got_dx[r].end());
    check_close(got_state[r], std::vector<float>(host_params.begin() + np, host_params.end()), 1e-5, "running statistics");
  }
  check_close(all_y, y, 1e-5, "output");
  check_close(all_dx, dx, 1e-5, "input gradient");
  if (!training || shards == 1) {  // local sums (evaluation) or the whole batch on one replica
    std::vector<float> sum = got_dp[0];
    for (std::size_t r = 1; r < shards; ++r)
      for (std::size_t i = 0; i < np; ++i) sum[i] += got_dp[r][i] - (accumulate ? dp0[i] : 0.0f);
    check_close(sum, dp, 1e-5, "parameter gradient (sum over replicas)");
  } else {  // the leader holds the global sums, the others add zeros
    check_close(got_dp[0], dp, 1e-5, "parameter gradient (leading replica)");
    for (std::size_t r = 1; r < shards; ++r) CHECK(got_dp[r] == (accumulate ? dp0 : std::vector<float>(np, 0.0f)));
  }
}

// Three updates of optimiser `opt` on n parameters, host against device.
template <class Opt>
void check_optimizer(const char* name, const Opt& opt, std::size_t n) {
  const std::string label(name);  // doctest prints a const char* as an address
  CAPTURE(label);
  CAPTURE(n);
  auto p = random_vector(n, 10);
  const auto g = random_vector(n, 11, -5.0f, 5.0f);
  std::vector<float> state(opt.state_size(n), 0.0f);
  ls::cuda_context ctx(0);
  auto d_p = to_device(ctx, p);
  auto d_g = to_device(ctx, g);
  auto d_state = to_device(ctx, state);
  ls::host_context hc;
  for (std::uint64_t step = 1; step <= 3; ++step) {
    const ls::update_info u{.lr = 0.05f, .step = step, .grad_scale = 0.25};
    opt.update(hc, p.data(), g.data(), state.data(), n, u);
    opt.update(ctx, d_p.data(), d_g.data(), d_state.data(), n, u);
  }
  check_close(to_host(ctx, d_p.data(), n), p, 1e-5, "parameters");
  check_close(to_host(ctx, d_state.data(), state.size()), state, 1e-5, "optimiser state");
}

}  // namespace

TEST_CASE("host: a failed CUDA or cuBLAS call is a device_error naming the call, file:line and message") {
  try {
    LOCKSTEP_CUDA_CHECK(cudaErrorInvalidValue);
    FAIL("no exception");
  } catch (const ls::device_error& e) {
    const std::string m = e.what();
    CHECK(m.find("cudaErrorInvalidValue") != std::string::npos);
    CHECK(m.find("backend_test.cu:") != std::string::npos);
    CHECK(m.find("CUDA call") != std::string::npos);
  }
  try {
    LOCKSTEP_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE);
    FAIL("no exception");
  } catch (const ls::device_error& e) {
    const std::string m = e.what();
    CHECK(m.find("CUBLAS_STATUS_INVALID_VALUE") != std::string::npos);
    CHECK(m.find("cuBLAS call") != std::string::npos);
  }
}

TEST_CASE("host: a context on a device that does not exist is a device_error naming the ordinal") {
  const int n = ls::backend::cuda_device_count();
  try {
    ls::cuda_context ctx(n);
    FAIL("no exception");
  } catch (const ls::device_error& e) {
    CHECK(std::string(e.what()).find("CUDA device " + std::to_string(n)) != std::string::npos);
    // Without any device the message says so in the words scripts/gpu-check.sh looks for.
    CHECK((n > 0) != (std::string(e.what()).find("no CUDA device") != std::string::npos));
  }
  CHECK_THROWS_AS(ls::cuda_context(-1), ls::device_error);
}

TEST_CASE("gpu: gemm matches a double reference for every transpose, padded strides and k = 0") {
  LOCKSTEP_REQUIRE_GPUS(1);
  ls::cuda_context ctx(0);
  for_each_gemm_case([&](const gemm_case& g) {
    const auto a = random_vector(g.a_rows * g.lda, 20);
    const auto b = random_vector(g.b_rows * g.ldb, 21);
    const auto c = random_vector(g.m * g.ldc, 22);
    const auto want = reference_gemm(g.ta, g.tb, g.m, g.n, g.k, 0.75f, a, g.lda, b, g.ldb, g.beta, c, g.ldc);
    auto d_a = to_device(ctx, a);
    auto d_b = to_device(ctx, b);
    auto d_c = to_device(ctx, c);
    gemm(ctx, g.ta, g.tb, g.m, g.n, g.k, 0.75f, d_a.data(), g.lda, d_b.data(), g.ldb, g.beta, d_c.data(), g.ldc);
    check_close(to_host(ctx, d_c.data(), c.size()), want, 1e-5, "C");
  });
}

TEST_CASE("gpu: gemm under mixed<bf16>, mixed<fp16> and tf32 is the product of the rounded operands within fp32's sums") {
  LOCKSTEP_REQUIRE_GPUS(1);
  using cp = ls::compute_precision;
  for (const cp p : {cp::bf16, cp::fp16, cp::tf32}) {
    CAPTURE(ls::precision_name(p));
    ls::cuda_context ctx(0, ls::cuda_options{.precision = p});
    ctx.set_gemm_precision(p);
    // The operands the tensor cores read: rounded to the format (TF32's rounding is cuBLAS's, so
    // its bound carries the operands' rounding too: 2 x 2^-10, truncation included).
    const auto round = [p](float v) {
      return p == cp::bf16 ? ls::round_to_bf16(v) : p == cp::fp16 ? ls::round_to_fp16(v) : v;
    };
    for_each_gemm_case([&](const gemm_case& g) {
      const auto a = random_vector(g.a_rows * g.lda, 30, -3.0f, 3.0f);
      const auto b = random_vector(g.b_rows * g.ldb, 31, -3.0f, 3.0f);
      const auto c = random_vector(g.m * g.ldc, 32);
      std::vector<float> ra(a.size()), rb(b.size()), abs_a(a.size()), abs_b(b.size()), abs_c(c.size());
      for (std::size_t i = 0; i < a.size(); ++i) abs_a[i] = std::abs(ra[i] = round(a[i]));
      for (std::size_t i = 0; i < b.size(); ++i) abs_b[i] = std::abs(rb[i] = round(b[i]));
      for (std::size_t i = 0; i < c.size(); ++i) abs_c[i] = std::abs(c[i]);
      const auto want = reference_gemm(g.ta, g.tb, g.m, g.n, g.k, 0.75f, ra, g.lda, rb, g.ldb, g.beta, c, g.ldc);
      const auto size =
          reference_gemm(g.ta, g.tb, g.m, g.n, g.k, 0.75f, abs_a, g.lda, abs_b, g.ldb, g.beta, abs_c, g.ldc);
      auto d_a = to_device(ctx, a);
      auto d_b = to_device(ctx, b);
      auto d_c = to_device(ctx, c);
      gemm(ctx, g.ta, g.tb, g.m, g.n, g.k, 0.75f, d_a.data(), g.lda, d_b.data(), g.ldb, g.beta, d_c.data(), g.ldc);
      const auto got = to_host(ctx, d_c.data(), c.size());
      const double u = (p == cp::tf32 ? 2.0 * std::ldexp(1.0, -10) : 0.0) +
                       static_cast<double>(g.k + 2) * std::ldexp(1.0, -24);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        bad += !(std::abs(static_cast<double>(got[i]) - want[i]) <= u * size[i] + 1e-30);
      CHECK(bad == 0);
    });
  }
}

// What the dense layer's forward_activated<relu_fn> asks of a context (layers/dense.hpp): the
// CUDA backend answers it, so dense -> relu on a GPU takes the fused cuBLASLt matmul.
static_assert(requires(ls::cuda_context& c, float* y, const float* p, std::size_t d) {
  gemm_bias_relu(c, d, d, d, p, d, p, d, p, y, d);
});

TEST_CASE("gpu: gemm_bias_relu, dense's GEMM with the bias and relu in a cuBLASLt epilogue, under every policy: one matmul, the same bits run to run") {
  LOCKSTEP_REQUIRE_GPUS(1);
  using cp = ls::compute_precision;
  struct shape {
    std::size_t m, n, k;
  };
  for (const cp p : {cp::fp32, cp::tf32, cp::bf16, cp::fp16}) {
    CAPTURE(ls::precision_name(p));
    ls::cuda_context ctx(0, ls::cuda_options{.precision = p});
    ctx.set_gemm_precision(p);
    const auto round = [p](float v) {
      return p == cp::bf16 ? ls::round_to_bf16(v) : p == cp::fp16 ? ls::round_to_fp16(v) : v;
    };
    for (const shape s : {shape{1, 1, 1}, shape{5, 7, 3}, shape{33, 17, 129}, shape{64, 10, 784}, shape{256, 512, 784},
                          shape{3, 1024, 1}}) {
      for (const bool padded : {false, true}) {
        CAPTURE(s.m);
        CAPTURE(s.n);
        CAPTURE(s.k);
        CAPTURE(padded);
        const std::size_t ldx = s.k + (padded ? 3 : 0), ldw = s.n + (padded ? 1 : 0), ldy = s.n + (padded ? 2 : 0);
        const auto x = random_vector(s.m * ldx, 40, -2.0f, 2.0f);
        const auto w = random_vector(s.k * ldw, 41, -2.0f, 2.0f);
        const auto b = random_vector(s.n, 42, -2.0f, 2.0f);
        // The double reference on the operands the kernels read, and the size of each sum.
        std::vector<double> want(s.m * ldy, 0.0), size(s.m * ldy, 0.0);
        for (std::size_t i = 0; i < s.m; ++i)
          for (std::size_t j = 0; j < s.n; ++j) {
            double acc = b[j], mag = std::abs(static_cast<double>(b[j]));
            for (std::size_t q = 0; q < s.k; ++q) {
              const double t = static_cast<double>(round(x[i * ldx + q])) * round(w[q * ldw + j]);
              acc += t;
              mag += std::abs(t);
            }
            want[i * ldy + j] = acc > 0 ? acc : 0.0;
            size[i * ldy + j] = mag;
          }
        auto d_x = to_device(ctx, x);
        auto d_w = to_device(ctx, w);
        auto d_b = to_device(ctx, b);
        auto d_y = to_device(ctx, std::vector<float>(s.m * ldy, -7.0f));
        auto d_y2 = to_device(ctx, std::vector<float>(s.m * ldy, -7.0f));
        const std::uint64_t before = ctx.launches();
        const bool fused =
            gemm_bias_relu(ctx, s.m, s.n, s.k, d_x.data(), ldx, d_w.data(), ldw, d_b.data(), d_y.data(), ldy);
        // cuBLASLt may offer no algorithm for an odd layout (k = 1, a leading dimension far above
        // the rows): the function then queues nothing and the layer takes its own path. The
        // shapes of the MLPs it serves must be fused (the 10-wide output layer only for float
        // operands: its 16-bit packed rows of 20 bytes may have no epilogue algorithm).
        const bool served = !padded && ((s.m == 256 && s.n == 512) ||
                                        (s.m == 64 && s.n == 10 && (p == cp::fp32 || p == cp::tf32)));
        if (!fused) {
          MESSAGE("cuBLASLt offers no algorithm for this shape");
          CHECK_FALSE(served);
          CHECK(ctx.launches() == before);
          continue;
        }
        // fp32 and TF32 read the float operands: the matmul is the only launch; bf16 and fp16
        // pack them first (one grid each, as gemm does).
        CHECK(ctx.launches() - before == (p == cp::fp32 || p == cp::tf32 ? 1u : 3u));
        REQUIRE(gemm_bias_relu(ctx, s.m, s.n, s.k, d_x.data(), ldx, d_w.data(), ldw, d_b.data(), d_y2.data(), ldy));
        const auto got = to_host(ctx, d_y.data(), s.m * ldy);
        const auto again = to_host(ctx, d_y2.data(), s.m * ldy);
        const double u = (p == cp::tf32 ? 2.0 * std::ldexp(1.0, -10) : 0.0) +
                         static_cast<double>(s.k + 2) * std::ldexp(1.0, -24);
        std::size_t bad = 0, padding_touched = 0, differs = 0;
        for (std::size_t i = 0; i < s.m; ++i)
          for (std::size_t j = 0; j < ldy; ++j) {
            const std::size_t e = i * ldy + j;
            if (j >= s.n) {  // the padding between rows is not written
              padding_touched += got[e] != -7.0f;
              continue;
            }
            bad += !(got[e] >= 0.0f && std::abs(static_cast<double>(got[e]) - want[e]) <= u * size[e] + 1e-30);
            differs += std::memcmp(&got[e], &again[e], sizeof(float)) != 0;
          }
        CHECK(bad == 0);
        CHECK(padding_touched == 0);
        CHECK(differs == 0);
      }
    }
    // Nothing to multiply: no matmul, the caller runs its own path.
    auto d_b = to_device(ctx, std::vector<float>(4, 1.0f));
    auto d_y = to_device(ctx, std::vector<float>(8, 0.0f));
    const std::uint64_t before = ctx.launches();
    CHECK_FALSE(gemm_bias_relu(ctx, 2, 4, 0, d_b.data(), 0, d_b.data(), 4, d_b.data(), d_y.data(), 4));
    CHECK(ctx.launches() == before);
    // A bias 4 bytes past a 16-byte boundary (a dense<7, 5>'s bias after a dense<13, 7>, 133
    // floats into the model's parameters): no matmul, the caller runs its own path.
    auto d_b5 = to_device(ctx, std::vector<float>(5, 1.0f));
    auto d_x16 = to_device(ctx, std::vector<float>(16, 1.0f));
    auto d_w16 = to_device(ctx, std::vector<float>(16, 1.0f));
    const std::uint64_t copied = ctx.launches();  // after the copies above, which count too
    CHECK_FALSE(gemm_bias_relu(ctx, 2, 4, 4, d_x16.data(), 4, d_w16.data(), 4, d_b5.data() + 1, d_y.data(), 4));
    CHECK(ctx.launches() == copied);
  }
}

TEST_CASE("gpu: elementwise ops, broadcast, column sums and sum match the host") {
  LOCKSTEP_REQUIRE_GPUS(1);
  ls::cuda_context ctx(0);
  ls::host_context hc;
  for (std::size_t n : {0u, 1u, 7u, 256u, 257u, 100003u}) {
    CAPTURE(n);
    const auto x = random_vector(n, 30);
    auto d_x = to_device(ctx, x);
    ls::buffer<float, ls::gpu<0>> d_y(n);

    fill(ctx, d_y.data(), n, 2.5f);
    CHECK(to_host(ctx, d_y.data(), n) == std::vector<float>(n, 2.5f));
    copy(ctx, d_y.data(), d_x.data(), n);
    CHECK(to_host(ctx, d_y.data(), n) == x);
    scale(ctx, d_y.data(), n, -3.0f);
    std::vector<float> scaled = x;
    scale(hc, scaled.data(), n, -3.0f);
    CHECK(to_host(ctx, d_y.data(), n) == scaled);

    for_each_index(ctx, n, affine_index_op{d_x.data(), d_y.data()});
    std::vector<float> affine(n);
    for_each_index(hc, n, affine_index_op{x.data(), affine.data()});
    CHECK(to_host(ctx, d_y.data(), n) == affine);

    double want = 0;
    for (float v : x) want += v;
    const double got = sum(ctx, d_x.data(), n);
    CHECK(std::abs(got - want) <= 1e-9 * (1.0 + std::abs(want)));
  }
  struct shape {
    std::size_t rows, cols;
  };
  for (const shape s : {shape{0, 5}, shape{1, 1}, shape{37, 13}, shape{1000, 3}, shape{3, 4099}, shape{4099, 67},
                        shape{512, 1024}}) {
    CAPTURE(s.rows);
    CAPTURE(s.cols);
    const auto m = random_vector(s.rows * s.cols, 31);
    const auto v = random_vector(s.cols, 32);
    auto d_m = to_device(ctx, m);
    auto d_v = to_device(ctx, v);
    ls::buffer<float, ls::gpu<0>> d_out(s.cols), d_b(s.rows * s.cols);
    std::vector<float> sums(s.cols), b(s.rows * s.cols);
    column_sums(hc, m.data(), s.rows, s.cols, sums.data());
    column_sums(ctx, d_m.data(), s.rows, s.cols, d_out.data());
    const auto got = to_host(ctx, d_out.data(), s.cols);
    // A different order of float additions: each of the host's and the device's sums is within
    // rows * eps * sum_r |x[r][c]| of the exact sum, so they differ by at most twice that.
    for (std::size_t c = 0; c < s.cols; ++c) {
      double abs_sum = 0;
      for (std::size_t r = 0; r < s.rows; ++r) abs_sum += std::abs(static_cast<double>(m[r * s.cols + c]));
      const double bound = 2.0 * static_cast<double>(s.rows) * 0.6e-7 * abs_sum;
      CHECK(std::abs(static_cast<double>(got[c]) - sums[c]) <= bound);
    }
    column_sums(ctx, d_m.data(), s.rows, s.cols, d_out.data());
    CHECK(to_host(ctx, d_out.data(), s.cols) == got);  // the same shape adds in the same order
    broadcast_rows(hc, b.data(), v.data(), s.rows, s.cols);
    broadcast_rows(ctx, d_b.data(), d_v.data(), s.rows, s.cols);
    CHECK(to_host(ctx, d_b.data(), b.size()) == b);
  }
}

TEST_CASE("gpu: staged shards arrive intact and may be read by work queued before the next stage") {
  LOCKSTEP_REQUIRE_GPUS(1);
  ls::cuda_context ctx(0);
  auto make = [](std::size_t rows, std::uint64_t stream) {
    std::vector<std::int32_t> labels(rows);
    for (std::size_t i = 0; i < rows; ++i) labels[i] = static_cast<std::int32_t>((i * 7 + stream) % 10);
    return std::tuple{random_vector(rows * 5, stream), labels, random_vector(rows * 2, stream + 100)};
  };
  const auto [fa, la, ta] = make(9, 1);
  const auto [fb, lb, tb] = make(300, 2);  // larger: the second slot grows
  const auto [fc, lc, tc] = make(4, 3);
  const auto [fe, le, te] = make(500, 5);  // larger still: the first slot grows under pending work
  ls::buffer<float, ls::gpu<0>> out(fe.size());
  const auto a = ctx.stage_shard(fa.data(), fa.size(), la.data(), la.size(), ta.data(), ta.size());
  CHECK(to_host(ctx, a.features, fa.size()) == fa);
  CHECK(to_host(ctx, a.labels, la.size()) == la);
  CHECK(to_host(ctx, a.targets, ta.size()) == ta);
  // Work reading a, queued before the next stage, that runs late: the stage after next reuses a's
  // slot, and its copy must wait for this work.
  spin_then_copy(ctx.compute_stream(), 200, a.features, out.data(), fa.size());
  const auto b = ctx.stage_shard(fb.data(), fb.size(), lb.data(), lb.size(), nullptr, 0);
  CHECK(b.targets == nullptr);
  const auto c = ctx.stage_shard(fc.data(), fc.size(), lc.data(), lc.size(), tc.data(), tc.size());
  CHECK(to_host(ctx, out.data(), fa.size()) == fa);
  CHECK(to_host(ctx, b.features, fb.size()) == fb);
  CHECK(to_host(ctx, b.labels, lb.size()) == lb);
  CHECK(to_host(ctx, c.features, fc.size()) == fc);
  CHECK(to_host(ctx, c.labels, lc.size()) == lc);
  CHECK(to_host(ctx, c.targets, tc.size()) == tc);
  // The same when the reused slot must grow (it is freed only after the work reading it).
  spin_then_copy(ctx.compute_stream(), 200, c.features, out.data(), fc.size());
  const auto d = ctx.stage_shard(fa.data(), fa.size(), nullptr, 0, nullptr, 0);
  const auto e = ctx.stage_shard(fe.data(), fe.size(), le.data(), le.size(), te.data(), te.size());
  CHECK(to_host(ctx, out.data(), fc.size()) == fc);
  CHECK(to_host(ctx, d.features, fa.size()) == fa);
  CHECK(to_host(ctx, e.features, fe.size()) == fe);
  CHECK(to_host(ctx, e.targets, te.size()) == te);
  const auto empty = ctx.stage_shard(nullptr, 0, nullptr, 0, nullptr, 0);
  CHECK(empty.features == nullptr);
  CHECK(empty.labels == nullptr);
}

TEST_CASE("gpu: every layer's forward and backward match the host within 1e-5") {
  LOCKSTEP_REQUIRE_GPUS(1);
  check_layer_all_batches<ls::dense<13, 7>, 13>("dense<13, 7>");
  check_layer_all_batches<ls::dense<1, 1>, 1>("dense<1, 1>");
  check_layer_all_batches<ls::relu, 11>("relu");
  check_layer_all_batches<ls::leaky_relu<1, 10>, 11>("leaky_relu<1, 10>");
  check_layer_all_batches<ls::gelu, 11>("gelu");
  check_layer_all_batches<ls::tanh, 11>("tanh");
  check_layer_all_batches<ls::sigmoid, 11>("sigmoid");
  check_layer_all_batches<ls::dropout<3, 10>, 11>("dropout<3, 10>");
  check_layer_all_batches<ls::dropout<0, 1>, 5>("dropout<0, 1>");
  using block = ls::sequential<ls::dense<13, 16>, ls::gelu, ls::dropout<1, 2>, ls::dense<16, 5>, ls::tanh>;
  check_layer_all_batches<block, 13>("sequential<dense, gelu, dropout, dense, tanh>");
  check_layer_all_batches<ls::sequential<block, ls::sigmoid, ls::dense<5, 3>>, 13>("nested sequential");
  // dense -> relu: the GPU's forward is one cuBLASLt matmul with the bias and relu in its epilogue
  // (the biases start at zero here: the gemm_bias_relu case checks nonzero ones).
  check_layer_all_batches<ls::sequential<ls::dense<13, 16>, ls::relu, ls::dense<16, 5>, ls::relu>, 13>(
      "sequential<dense, relu, dense, relu>");
  // The same with biases that are only 4-byte aligned in the flat parameters (91 and 133 floats
  // in): the GEMM and the layer's own bias-and-relu pass instead of the epilogue.
  check_layer_all_batches<ls::sequential<ls::dense<13, 7>, ls::relu, ls::dense<7, 5>, ls::relu>, 13>(
      "sequential<dense<13, 7>, relu, dense<7, 5>, relu>");
  // Image layers: the same kernels through for_each_index and cuBLAS.
  using img = ls::shape<3, 9, 7>;
  check_layer_all_batches_shaped<ls::conv2d<4, 3, 1, 1>, img>("conv2d<4, 3, 1, 1>");
  check_layer_all_batches_shaped<ls::conv2d<5, 3, 2, 0>, img>("conv2d<5, 3, 2, 0>");
  check_layer_all_batches_shaped<ls::conv2d<2, 5, 1, 2>, img>("conv2d<2, 5, 1, 2>");
  check_layer_all_batches_shaped<ls::max_pool2d<2>, img>("max_pool2d<2>");
  check_layer_all_batches_shaped<ls::max_pool2d<3, 2, 1>, img>("max_pool2d<3, 2, 1>");
  check_layer_all_batches_shaped<ls::avg_pool2d<3, 2, 1>, img>("avg_pool2d<3, 2, 1>");
  check_layer_all_batches_shaped<ls::global_avg_pool, img>("global_avg_pool");
  check_layer_all_batches_shaped<ls::flatten, img>("flatten");
  check_layer_all_batches_shaped<ls::residual<ls::conv2d<3, 3, 1, 1>, ls::relu, ls::conv2d<3, 3, 1, 1>>, img>(
      "residual<conv2d, relu, conv2d>");
  check_layer_all_batches<ls::sequential<ls::reshape<2, 4, 4>, ls::conv2d<3, 3, 1, 1>, ls::relu, ls::max_pool2d<2>,
                                         ls::flatten, ls::dense<12, 5>>,
                          32>("small CNN");
}

TEST_CASE("gpu: [batch_norm] forward and backward on gpu<0> match the host, one replica or several exchanging rows") {
  LOCKSTEP_REQUIRE_GPUS(1);
  for (bool training : {true, false})
    for (bool accumulate : {false, true})
      for (std::size_t rows : {1u, 2u, 7u, 37u})
        for (std::size_t shards : {1u, 2u, 3u}) {  // 1 row over 2 or 3: replicas with no rows take part too
          check_batch_norm<ls::batch_norm<>, ls::shape<3, 5, 7>>(rows, shards, training, accumulate);
          check_batch_norm<ls::batch_norm<1, 3>, ls::shape<11>>(rows, shards, training, accumulate);
        }
}

TEST_CASE("gpu: [batched_conv] convolutions over whole shards match the host: large and uneven batches, the CNN's shapes") {
  LOCKSTEP_REQUIRE_GPUS(1);
  using img = ls::shape<3, 9, 7>;
  for (bool training : {true, false}) {
    check_layer<ls::conv2d<4, 3, 1, 1>, img>("conv2d<4, 3, 1, 1>", 129, training);
    check_layer<ls::conv2d<5, 3, 2, 0>, img>("conv2d<5, 3, 2, 0>", 97, training);
    check_layer<ls::conv2d<3, 2, 3, 1>, img>("conv2d<3, 2, 3, 1> (stride above the window)", 61, training);
    check_layer<ls::conv2d<6, 1, 1, 0>, img>("conv2d<6, 1, 1, 0>", 50, training);
  }
  check_layer<ls::conv2d<32, 5, 1, 2>, ls::shape<1, 28, 28>>("the CNN's conv1", 19, true);
  check_layer<ls::conv2d<64, 5, 1, 2>, ls::shape<32, 14, 14>>("the CNN's conv2", 19, true);
}

TEST_CASE("gpu: losses match the host, and a bad label is a data_error on the device too") {
  LOCKSTEP_REQUIRE_GPUS(1);
  ls::cuda_context ctx(0);
  ls::host_context hc;
  for (std::size_t rows : {0u, 1u, 5u, 129u, 20011u})  // 20011 rows: 1024 blocks, each over several rows
    for (std::size_t cols : {1u, 10u, 37u}) {
      CAPTURE(rows);
      CAPTURE(cols);
      const auto z = random_vector(rows * cols, 40, -4.0f, 4.0f);
      const auto t = random_vector(rows * cols, 41);
      std::vector<std::int32_t> labels(rows);
      for (std::size_t r = 0; r < rows; ++r) labels[r] = static_cast<std::int32_t>((r * 3) % cols);
      auto d_z = to_device(ctx, z);
      auto d_t = to_device(ctx, t);
      auto d_labels = to_device(ctx, labels);
      ls::buffer<float, ls::gpu<0>> d_grad(rows * cols), d_scratch(rows * ls::softmax_cross_entropy::scratch_per_row);
      std::vector<float> grad(rows * cols), scratch(rows * ls::softmax_cross_entropy::scratch_per_row);

      const ls::loss_sum hx = xent_ref::evaluate_cols(ls::softmax_cross_entropy{}, hc, z.data(), rows, cols,
                                                                   ls::targets<float>{labels.data(), nullptr, 0},
                                                                   grad.data(), scratch.data());
      const ls::loss_sum dx = xent_ref::evaluate_cols(ls::softmax_cross_entropy{}, ctx, d_z.data(), rows, cols, ls::targets<float>{d_labels.data(), nullptr, 0}, d_grad.data(), d_scratch.data());
      CHECK(dx.count == hx.count);
      CHECK(dx.correct == hx.correct);
      CHECK(std::abs(dx.sum - hx.sum) <= 1e-5 * (1.0 + std::abs(hx.sum)));
      const ls::loss_sum again = xent_ref::evaluate_cols(ls::softmax_cross_entropy{}, ctx, d_z.data(), rows, cols, ls::targets<float>{d_labels.data(), nullptr, 0}, d_grad.data(), d_scratch.data());
      CHECK(again.sum == dx.sum);  // the totals are added in a fixed order: run-to-run identical
      check_close(to_host(ctx, d_grad.data(), grad.size()), grad, 1e-5, "softmax cross-entropy gradient");

      const ls::loss_sum hm =
          xent_ref::evaluate_cols(ls::mse{}, hc, z.data(), rows, cols, ls::targets<float>{nullptr, t.data(), cols}, grad.data(),
                             scratch.data());
      const ls::loss_sum dm = xent_ref::evaluate_cols(ls::mse{}, ctx, d_z.data(), rows, cols,
                                                 ls::targets<float>{nullptr, d_t.data(), cols}, d_grad.data(),
                                                 d_scratch.data());
      CHECK(dm.count == hm.count);
      CHECK(std::abs(dm.sum - hm.sum) <= 1e-5 * (1.0 + std::abs(hm.sum)));
      check_close(to_host(ctx, d_grad.data(), grad.size()), grad, 1e-5, "mse gradient");
    }
  // Large margins: the loss and gradient come from the shifted logits z - max, so a row that is
  // almost certainly right keeps its small loss log(1 + e^-10 + ...) instead of rounding to 0.
  {
    const std::vector<float> z{1000, 990, 0, 0, 0, 1000, 990, 0, 0, 0, -5, 3, 3, 1, 0};
    const std::vector<std::int32_t> labels{0, 2, 2};
    auto d_z = to_device(ctx, z);
    auto d_labels = to_device(ctx, labels);
    ls::buffer<float, ls::gpu<0>> d_grad(15), d_scratch(3 * ls::softmax_cross_entropy::scratch_per_row);
    const ls::loss_sum got = xent_ref::evaluate_cols(ls::softmax_cross_entropy{}, ctx, d_z.data(), 3, 5, ls::targets<float>{d_labels.data(), nullptr, 0}, d_grad.data(), d_scratch.data());
    const auto grad = to_host(ctx, d_grad.data(), 15);
    double want_sum = 0;
    for (std::size_t r = 0; r < 3; ++r) {
      double m = z[r * 5];
      for (std::size_t c = 1; c < 5; ++c) m = std::max(m, static_cast<double>(z[r * 5 + c]));
      double s = 0;
      for (std::size_t c = 0; c < 5; ++c) s += std::exp(z[r * 5 + c] - m);
      const double loss = std::log(s) - (z[r * 5 + labels[r]] - m);
      want_sum += loss;
      const auto row_loss = to_host(ctx, d_scratch.data() + r, 1)[0];
      CAPTURE(r);
      CHECK(std::abs(row_loss - loss) <= 1e-6 * (std::abs(loss) + 1e-3));  // 4.54e-5 for row 0, not 0
      for (std::size_t c = 0; c < 5; ++c) {
        const double g = std::exp(z[r * 5 + c] - m - std::log(s)) - (static_cast<int>(c) == labels[r] ? 1.0 : 0.0);
        CHECK(std::abs(grad[r * 5 + c] - g) <= 1e-6);
      }
    }
    CHECK(std::abs(got.sum - want_sum) <= 1e-6 * want_sum);
    CHECK(got.correct == 1);  // row 0; row 2's first arg-max is class 1, not 2
  }
  const std::vector<std::int32_t> bad{0, 10, 2};
  auto d_bad = to_device(ctx, bad);
  auto d_z = to_device(ctx, random_vector(30, 42));
  ls::buffer<float, ls::gpu<0>> d_scratch(3 * ls::softmax_cross_entropy::scratch_per_row);
  CHECK_THROWS_AS(xent_ref::evaluate_cols(ls::softmax_cross_entropy{}, ctx, d_z.data(), 3, 10,
                                                        ls::targets<float>{d_bad.data(), nullptr, 0}, static_cast<float*>(nullptr),
                                                        d_scratch.data()),
                  ls::data_error);
}

TEST_CASE("gpu: optimisers match the host within 1e-5") {
  LOCKSTEP_REQUIRE_GPUS(1);
  for (std::size_t n : {1u, 1000u, 70001u}) {
    check_optimizer("sgd", ls::sgd{.lr = 0.1f}, n);
    check_optimizer("sgd momentum", ls::sgd{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f}, n);
    check_optimizer("sgd nesterov", ls::sgd{.lr = 0.1f, .momentum = 0.9f, .nesterov = true}, n);
    check_optimizer("adam", ls::adam{.weight_decay = 0.01f}, n);
    check_optimizer("adamw", ls::adamw{}, n);
  }
}

TEST_CASE("host: the device-memory check names the first replica that does not fit and the bytes") {
  // Fake devices: 0 has 1000 bytes free of 5000, 1 has 250 free of 4000.
  auto memory = [](int dev) {
    return dev == 0 ? std::pair<std::size_t, std::size_t>{1000, 5000} : std::pair<std::size_t, std::size_t>{250, 4000};
  };
  using ls::backend::detail::replica_memory_shortfall;
  CHECK(replica_memory_shortfall({0, 0, 0, 0}, 250, memory).empty());  // 4 x 250 fit in 1000 exactly
  CHECK(replica_memory_shortfall({}, 250, memory).empty());
  const std::string shared = replica_memory_shortfall({0, 0, 0, 0, 0}, 250, memory);
  CAPTURE(shared);
  CHECK(shared.find("replica 4 needs 250 bytes on CUDA device 0") != std::string::npos);
  CHECK(shared.find("4 earlier replica(s) on that device took 1000 bytes") != std::string::npos);
  CHECK(shared.find("1000 bytes free of 5000") != std::string::npos);
  const std::string second = replica_memory_shortfall({0, 1, 1}, 200, memory);
  CAPTURE(second);
  CHECK(second.find("replica 2 needs 200 bytes on CUDA device 1") != std::string::npos);
  CHECK(second.find("250 bytes free of 4000") != std::string::npos);
  int asked = 0;
  (void)replica_memory_shortfall({1, 1, 0, 1}, 1, [&](int dev) {
    ++asked;
    return memory(dev);
  });
  CHECK(asked == 2);  // once per device
}

TEST_CASE("gpu: replicate refuses a model larger than the GPU's free memory, naming the replica and the bytes") {
  LOCKSTEP_REQUIRE_GPUS(1);
  using huge = ls::sequential<ls::dense<200000, 200000>>;  // 4e10 parameters: 320 GB with gradients
  ls::one_device<ls::gpu<0>> s;
  try {
    auto m = s.replicate<huge>(ls::seed{1});
    FAIL("no exception");
  } catch (const ls::device_error& e) {
    const std::string m = e.what();
    CAPTURE(m);
    CHECK(m.find("replica 0 needs " + std::to_string(2 * ls::one_device<ls::gpu<0>>::model_type<huge>::param_count * sizeof(float)) + " bytes") !=
          std::string::npos);
    CHECK(m.find("bytes free of") != std::string::npos);
  }
}

TEST_CASE("gpu: strategy_options::tf32 reaches every replica's cuBLAS handle") {
  LOCKSTEP_REQUIRE_GPUS(1);
  using net = ls::sequential<ls::dense<8, 4>>;
  for (const bool tf32 : {false, true}) {
    CAPTURE(tf32);
    ls::mirrored<ls::gpu<0>, ls::gpu<0>> s{ls::strategy_options{.tf32 = tf32}};
    auto m = s.replicate<net>(ls::seed{1});
    for (std::size_t r = 0; r < 2; ++r) {
      auto& ctx = m.replica(r).context();
      CHECK(ctx.options().tf32 == tf32);
      cublasMath_t mode{};
      LOCKSTEP_CUBLAS_CHECK(cublasGetMathMode(ctx.blas_handle(), &mode));
      CHECK(((mode & CUBLAS_TF32_TENSOR_OP_MATH) != 0) == tf32);
    }
  }
}

namespace {
// The file of the first shared library mapped into this process whose name contains `name`
// ("not loaded" when none is).
std::string loaded_library(const std::string& name) {
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  if (!maps) return "unknown";
  char line[4096];
  std::string found = "not loaded";
  while (std::fgets(line, sizeof line, maps)) {
    const std::string l(line);
    const auto slash = l.find('/');
    if (slash != std::string::npos && l.find(name, slash) != std::string::npos) {
      found = l.substr(slash, l.find_last_not_of("\n") + 1 - slash);
      break;
    }
  }
  std::fclose(maps);
  return found;
}
}  // namespace

TEST_CASE("host: the CUDA driver, runtime, cuBLAS and NCCL this program loaded") {
  // scripts/gpu-check.sh records these lines: the libraries actually loaded, not the headers'.
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);  // 0 without a driver
  (void)cudaGetLastError();
  REQUIRE(cudaRuntimeGetVersion(&runtime) == cudaSuccess);
  CHECK(runtime >= 12000);
  int major = 0, minor = 0, patch = 0;
  REQUIRE(cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS);
  std::printf("lockstep-env: cuda_driver=%d cuda_runtime=%d devices=%d\n", driver, runtime,
              ls::backend::cuda_device_count());
  if (ls::backend::cuda_device_count() == 0)
    std::printf("lockstep-env: no CUDA device: %s\n", ls::backend::cuda_unavailable_reason().c_str());
  std::printf("lockstep-env: cublas=%d.%d.%d cublas_library=%s\n", major, minor, patch,
              loaded_library("libcublas.so").c_str());
#if defined(LOCKSTEP_HAS_NCCL)
  const int nccl = ls::detail::nccl_runtime_version();
  std::printf("lockstep-env: nccl=%d nccl_headers=%d nccl_library=%s nccl_revoke=%s\n", nccl, NCCL_VERSION_CODE,
              loaded_library("libnccl.so").c_str(), ls::detail::nccl_revoke_function(nccl) ? "yes" : "no");
#else
  std::printf("lockstep-env: nccl=none (built without NCCL)\n");
#endif
  for (int d = 0; d < ls::backend::cuda_device_count(); ++d) {
    cudaDeviceProp p{};
    REQUIRE(cudaGetDeviceProperties(&p, d) == cudaSuccess);
    std::string name = p.name;
    for (char& c : name)
      if (c == ' ') c = '_';  // one key=value word
    std::printf("lockstep-env: device=%d name=%s sm=%d%d memory_bytes=%zu\n", d, name.c_str(), p.major, p.minor,
                p.totalGlobalMem);
  }
  std::fflush(stdout);
}
