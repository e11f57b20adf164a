// The AVX2 copy of the host's elementwise loop (for_each_index) against the baseline loop: every
// built-in functor that declares `avx2_copy` gives the same bits under both, on inputs with
// infinities, NaNs, signed zeros and subnormals, at lengths 0, 1, primes and uneven multiples of
// the vector width; functors with loops inside do not declare it.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <lockstep/backend/host.hpp>
#include <lockstep/backend/softmax_xent.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/layers/activations.hpp>
#include <lockstep/layers/dense.hpp>
#include <lockstep/layers/dropout.hpp>
#include <lockstep/optimizers/adam.hpp>
#include <lockstep/optimizers/sgd.hpp>

#include "support/random.hpp"

namespace ls = lockstep;

namespace {
const std::size_t lengths[] = {0, 1, 2, 7, 8, 13, 31, 257, 1031};

/// n values: random normals at several scales, with specials sprinkled in.
std::vector<float> awkward(std::size_t n, std::uint64_t seed) {
  std::vector<float> x = test_support::random_vector<float>(n, seed);
  const float specials[] = {0.0f, -0.0f, std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::denorm_min(), -1e-40f, 3e38f, -88.5f, 1e-20f};
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 11 == 3) x[i] = specials[(i / 11) % std::size(specials)];
    else if (i % 5 == 1) x[i] *= 40.0f;
  }
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

/// Runs `make(buffers)` over two copies of the same buffers, one with each loop, and checks that
/// every buffer ends with the same bits. `make` returns the op and its index count.
template <class Make>
void check_same_bits(const std::string& what, const std::vector<std::vector<float>>& start, const Make& make) {
  CAPTURE(what);
  std::vector<std::vector<float>> base = start, avx2 = start;
  const auto [op_base, n] = make(base);
  const auto [op_avx2, n2] = make(avx2);
  REQUIRE(n == n2);
  ls::backend::detail::index_loop(n, op_base);
  ls::backend::detail::index_loop_avx2(n, op_avx2);
  for (std::size_t b = 0; b < start.size(); ++b) {
    CAPTURE(b);
    CHECK(same_bits(base[b], avx2[b]));
  }
}

template <class Fn>
void check_activation(const char* what, std::size_t n) {
  const std::vector<std::vector<float>> start{awkward(n, 1), std::vector<float>(n), awkward(n, 2),
                                              std::vector<float>(n)};
  check_same_bits(what, start, [n](std::vector<std::vector<float>>& b) {
    // forward into b[1], then backward into b[3]; the forward runs here with the baseline loop in
    // both copies, so the backward check sees the same y.
    ls::backend::detail::index_loop(n, ls::detail::activation_forward_op<Fn, float>{b[0].data(), b[1].data()});
    return std::pair{ls::detail::activation_backward_op<Fn, float>{b[0].data(), b[1].data(), b[2].data(), b[3].data()},
                     n};
  });
  check_same_bits(what, start, [n](std::vector<std::vector<float>>& b) {
    return std::pair{ls::detail::activation_forward_op<Fn, float>{b[0].data(), b[1].data()}, n};
  });
}
}  // namespace

// The functors that run through the AVX2 copy, and some with loops inside that must not.
static_assert(ls::backend::detail::avx2_copy_v<ls::detail::adam_op<float>> &&
              ls::backend::detail::avx2_copy_v<ls::detail::adam_op<float, true>> &&
              ls::backend::detail::avx2_copy_v<ls::detail::sgd_op<float>> &&
              ls::backend::detail::avx2_copy_v<ls::detail::activation_forward_op<ls::relu_fn, float>> &&
              ls::backend::detail::avx2_copy_v<ls::detail::activation_backward_op<ls::gelu_fn, float>> &&
              ls::backend::detail::avx2_copy_v<ls::detail::dropout_mask_op<double>>);
static_assert(!ls::backend::detail::avx2_copy_v<ls::detail::column_sums_add_op<float>> &&
              !ls::backend::detail::avx2_copy_v<ls::backend::detail::softmax_xent_row_op<float>> &&
              !ls::backend::detail::avx2_copy_v<
                  ls::detail::pad_image_op<float, ls::detail::window2d{1, 3, 3, 7, 1, 3, 3, 3}>>);

TEST_CASE("for_each_index's AVX2 copy gives bitwise the baseline loop's results for every functor that declares avx2_copy") {
#if !LOCKSTEP_HOST_AVX2_LOOPS
  MESSAGE("skipped: this translation unit's loops carry no AVX2 copy (", ls::host_loops_name(), ")");
#else
  if (!__builtin_cpu_supports("avx2")) {
    MESSAGE("skipped: this CPU has no AVX2, so the AVX2 copy never runs (", ls::host_loops_name(), ")");
    return;
  }
  CHECK(ls::host_loops_name() == "avx2 (chosen at run time)");
  for (const std::size_t n : lengths) {
    CAPTURE(n);
    check_activation<ls::relu_fn>("relu", n);
    check_activation<ls::leaky_relu_fn<1, 10>>("leaky_relu", n);
    check_activation<ls::gelu_fn>("gelu", n);
    check_activation<ls::tanh_fn>("tanh", n);
    check_activation<ls::sigmoid_fn>("sigmoid", n);

    // Adam and AdamW, plain and with clipping and an EMA (update_extras).
    const std::vector<std::vector<float>> opt_start{awkward(n, 3), awkward(n, 4), awkward(n, 5),
                                                    [&] {
                                                      std::vector<float> v = awkward(n, 6);
                                                      for (float& e : v) e = std::abs(e);
                                                      return v;
                                                    }(),
                                                    awkward(n, 7)};
    for (const float decoupled : {0.0f, 0.01f}) {
      check_same_bits("adam", opt_start, [&](std::vector<std::vector<float>>& b) {
        return std::pair{ls::detail::adam_op<float>{b[0].data(), b[1].data(), b[2].data(), b[3].data(), 1e-3f, 0.9f,
                                                    0.999f, 1e-8f, 0.0f, decoupled, 1.0f / 96, 0.37f, 1.7f},
                         n};
      });
      check_same_bits("adam with clipping and an EMA", opt_start, [&](std::vector<std::vector<float>>& b) {
        ls::update_info u;
        u.clip_value = 0.05f;
        u.ema = b[4].data();
        u.ema_decay = 0.999;
        return std::pair{ls::detail::adam_op<float, true>{b[0].data(), b[1].data(), b[2].data(), b[3].data(), 1e-3f,
                                                          0.9f, 0.999f, 1e-8f, 1e-4f, decoupled, 1.0f / 96, 0.37f,
                                                          1.7f, ls::detail::update_extras<float>::of(u)},
                         n};
      });
    }
    for (const bool nesterov : {false, true})
      check_same_bits("sgd with momentum", opt_start, [&](std::vector<std::vector<float>>& b) {
        return std::pair{ls::detail::sgd_op<float>{b[0].data(), b[1].data(), b[2].data(), 0.1f, 0.9f, 1e-4f,
                                                   1.0f / 96, nesterov},
                         n};
      });

    // Dropout's backward mask.
    std::vector<std::uint8_t> keep(n);
    for (std::size_t i = 0; i < n; ++i) keep[i] = (i * 7) % 3 == 0 ? 0 : 1;
    check_same_bits("dropout mask", {awkward(n, 8), std::vector<float>(n)},
                    [n, &keep](std::vector<std::vector<float>>& b) {
                      return std::pair{ls::detail::dropout_mask_op<float>{b[0].data(), keep.data(), b[1].data(), 1.25f},
                                       n};
                    });
  }
#endif
}
