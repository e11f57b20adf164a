// Activations kept in bf16 under mixed<bf16> (pass_info::bf16_activations): the output of a layer
// read by a dense layer, which reads it as its GEMM operand in bf16 anyway, is kept as bf16
// encodings: a relu's that the dense layer before it applies (relu's backward reads the sign from
// the encodings), or that of a layer whose backward does not read its output (dropout, dense),
// encoded by the sequential. A relu before dropout is kept too: dropout's forward reads the fp32
// values the dense layer left in a gradient buffer, and its backward reads only its mask. The
// GEMMs read the values they would have rounded to bf16 anyway, so training gives the same bits
// as keeping the activations in fp32; checked here on chains of every kind (both relus kept, one
// kept, dropout's output and the relu before it kept, two dense layers in a row, odd widths, a
// nested sequential, a residual block, a relu before dropout at the end), on 1, 2 and 3
// replicas, both determinism policies, accumulated updates with the weight gradients deferred,
// batches of uneven sizes down to one row. Activations that no backward reads (a pooling's output
// before flatten) are kept nowhere, under every policy, with the same bits as keeping them. Also:
// the workspace layout's sizes, the bytes a replica holds, when activations are kept in bf16 at
// all, and the GEMM that reads a bf16 operand against the GEMM on its widened values.

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "distribute/common.hpp"

using namespace dist_test;
namespace ls = lockstep;

namespace {

using act_run_to_run = ls::basic_mirrored<ls::host_allreduce, ls::determinism::run_to_run, ls::cpus>;
using act_invariant = ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus>;

// Both relu outputs kept in bf16 (config L's shape, small).
using chain2 = ls::sequential<ls::dense<784, 40>, ls::relu, ls::dense<40, 24>, ls::relu, ls::dense<24, 10>>;
// Odd widths, a nested sequential, and a relu before dropout that the nested sequential does not
// apply (not kept: its backward reads it in fp32).
using chain_odd = ls::sequential<ls::sequential<ls::dense<784, 13>, ls::relu, ls::dense<13, 7>>, ls::relu,
                                 ls::dropout<1, 4>, ls::dense<7, 11>, ls::relu, ls::dense<11, 10>>;
// A residual block whose body keeps its relu's output (9 wide) in bf16.
using chain_residual = ls::sequential<ls::dense<784, 16>, ls::relu,
                                      ls::residual<ls::dense<16, 9>, ls::relu, ls::dense<9, 16>>, ls::relu,
                                      ls::dense<16, 10>>;
// A convnet: each convolution's relu is kept in bf16 (pooling's forward reads the fp32 values, its
// backward neither its input nor its output), and each convolution's input (reshape's output,
// max pooling's), and flatten's output, read by the dense layer; avg pooling's output, read by
// flatten and by no backward, is kept nowhere under either layout. The second convolution has 8 input channels: oneDNN's convolution where it
// runs bf16 natively, reading bf16 images.
using chain_cnn = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<8, 3, 1, 1>, ls::relu, ls::max_pool2d<2>,
                                 ls::conv2d<8, 3, 1, 1>, ls::relu, ls::avg_pool2d<2>, ls::flatten, ls::dense<392, 10>>;
constexpr std::size_t chain_cnn_kept = 784 / 2 + 8 * 28 * 28 / 2 + 8 * 14 * 14 / 2 + 8 * 14 * 14 / 2 + 392 / 2;
static_assert(chain_cnn::bind<784>::workspace_per_sample_bf16 == chain_cnn::bind<784>::workspace_per_sample - chain_cnn_kept);
// The fashion_mnist example's CNN and MLP (docs/precision.md quotes these figures): per image,
// 102 656 floats of workspace under fp32, 77 720 keeping activations in bf16; per row of the MLP,
// 2 752 and 1 984.
using example_cnn = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<32, 5, 1, 2>, ls::relu, ls::max_pool2d<2>,
                                   ls::conv2d<64, 5, 1, 2>, ls::relu, ls::max_pool2d<2>, ls::flatten,
                                   ls::dense<3136, 1024>, ls::relu, ls::dropout<2, 5>, ls::dense<1024, 10>>;
static_assert(example_cnn::bind<784>::workspace_per_sample == 102656 &&
              example_cnn::bind<784>::workspace_per_sample_bf16 == 77720);
// Its CNN with batch norm after each convolution (`--model cnn_bn`): 146 624 and 102 872 per image.
using example_cnn_bn = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<32, 5, 1, 2>, ls::batch_norm<>, ls::relu,
                                      ls::max_pool2d<2>, ls::conv2d<64, 5, 1, 2>, ls::batch_norm<>, ls::relu,
                                      ls::max_pool2d<2>, ls::flatten, ls::dense<3136, 1024>, ls::relu,
                                      ls::dropout<2, 5>, ls::dense<1024, 10>>;
static_assert(example_cnn_bn::bind<784>::workspace_per_sample == 146624 &&
              example_cnn_bn::bind<784>::workspace_per_sample_bf16 == 102872);
using example_mlp = ls::sequential<ls::dense<784, 512>, ls::relu, ls::dropout<1, 5>, ls::dense<512, 256>, ls::relu,
                                   ls::dropout<1, 5>, ls::dense<256, 10>>;
static_assert(example_mlp::bind<784>::workspace_per_sample == 2752 &&
              example_mlp::bind<784>::workspace_per_sample_bf16 == 1984);
// Layer L with its output declared read by its backward: a sequential keeps it as it would for
// any layer that says nothing (the reference for activations that are kept nowhere).
template <class L>
struct output_read {
  using layer_concept = ls::layer_tag;                          // opts in to the layer concept
  static constexpr std::size_t expected_input = L::expected_input;  // as L
  static constexpr bool preserves_shape = ls::detail::preserves_shape<L>();  // as L
  template <class S>
  static constexpr bool accepts_shape = ls::accepts_shape_v<L, S>();  // as L
  template <class S>
  struct bind_shape : ls::bind_shape_t<L, S> {
    static constexpr bool backward_reads_output = true;  // hides L's claim
  };
};
// Activations that no backward reads are kept nowhere (transient): max pooling's output, read by
// flatten, flatten's, read by dropout, and a dense layer's, read by dropout, each live in a
// gradient buffer during forward, the two in a row in alternate buffers (and, keeping activations
// in bf16, after the convolution's fp32 relu in the first and before dropout's fp32 output in the
// second).
using chain_transient = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<4, 3, 1, 1>, ls::relu, ls::max_pool2d<2>,
                                       ls::flatten, ls::dropout<1, 4>, ls::dense<784, 12>, ls::dropout<1, 5>,
                                       ls::dense<12, 10>>;
using chain_transient_kept =
    ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<4, 3, 1, 1>, ls::relu, output_read<ls::max_pool2d<2>>,
                   output_read<ls::flatten>, ls::dropout<1, 4>, output_read<ls::dense<784, 12>>, ls::dropout<1, 5>,
                   ls::dense<12, 10>>;
constexpr std::size_t transient_per_row = 784 + 784 + 12;
static_assert(chain_transient::bind<784>::workspace_per_sample ==
              chain_transient_kept::bind<784>::workspace_per_sample - transient_per_row);
static_assert(chain_transient::bind<784>::workspace_per_sample_bf16 ==
              chain_transient_kept::bind<784>::workspace_per_sample_bf16 - transient_per_row);
static_assert(!ls::output_unread_v<output_read<ls::flatten>::bind_shape<ls::shape<4, 2, 2>>> &&
              ls::output_unread_v<ls::flatten::bind_shape<ls::shape<4, 2, 2>>>);
// Batch norm reads its input from bf16 encodings (a convolution's output, a dense layer's) and
// writes the relu it applies as bf16 encodings for the next layer: every activation of this net
// that a backward reads is kept in bf16, except avg pooling's output, kept nowhere. Its reference
// is the same net with a layer that rounds batch norm's input to bf16 and passes the gradient
// through unchanged, trained with activations in fp32: the values each layer reads are the same.
template <class... Round>
using chain_bn_with = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<4, 3, 1, 1>, Round..., ls::batch_norm<>, ls::relu,
                                     ls::max_pool2d<2>, ls::conv2d<8, 3, 1, 1>, Round..., ls::batch_norm<>, ls::relu,
                                     ls::avg_pool2d<2>, ls::flatten, ls::dense<392, 16>, Round..., ls::batch_norm<1, 3>,
                                     ls::relu, ls::dense<16, 10>>;
// x rounded to bf16 (as the encodings keep it), with the gradient of the identity.
struct round_bf16_fn {
  template <class T> static T f(T x) { return static_cast<T>(ls::round_to_bf16(static_cast<float>(x))); }
  template <class T> static T df(T, T) { return T(1); }
  template <class T> static T grad(T, T, T dy) { return dy; }
};
using chain_bn = chain_bn_with<>;
using chain_bn_rounded = chain_bn_with<ls::activation<round_bf16_fn>>;
// Kept in bf16, per image: reshape's output, the two convolutions' outputs (read by batch norm),
// the relus batch norm applies (read by max and avg pooling's forward, by the last dense layer),
// max pooling's output, flatten's, the dense layer's (read by batch norm): half of each.
constexpr std::size_t chain_bn_kept = (784 + 4 * 784 + 4 * 784 + 4 * 196 + 8 * 196 + 8 * 196 + 392 + 16 + 16) / 2;
static_assert(chain_bn::bind<784>::workspace_per_sample_bf16 == chain_bn::bind<784>::workspace_per_sample - chain_bn_kept);

// A 1024 x 1024 weight gradient (4 MiB: deferred under run_to_run accumulation) reading a kept input.
using chain_deferred = ls::sequential<ls::dense<784, 1024>, ls::relu, ls::dense<1024, 1024>, ls::relu, ls::dense<1024, 10>>;

using chain2_bound = ls::sequential<ls::dense<784, 40>, ls::relu, ls::dense<40, 24>, ls::relu,
                                    ls::dense<24, 10>>::bind<784>;
// Activations (40 + 24 per row, in bf16 20 + 12), then two gradient buffers of the widest (40).
static_assert(chain2_bound::workspace_per_sample == 40 + 24 + 2 * 40);
static_assert(chain2_bound::workspace_per_sample_bf16 == 20 + 12 + 2 * 40);
static_assert(ls::workspace_bf16_v<chain2_bound> == chain2_bound::workspace_per_sample_bf16);
// A relu before dropout is kept in bf16 (dropout's forward reads the fp32 values in the first
// gradient buffer, its backward only its mask); dropout's output, read by a dense layer and not by
// dropout's backward, is kept in bf16 too.
using mlp_dropout_bound = mlp_dropout::bind<784>;
static_assert(mlp_dropout_bound::workspace_per_sample_bf16 == mlp_dropout_bound::workspace_per_sample - 16 - 16);
// A relu before dropout at the model's end (dropout's output is the model's): the relu is kept.
using chain_dropout_last = ls::sequential<ls::dense<784, 19>, ls::relu, ls::dropout<1, 3>, ls::dense<19, 10>, ls::relu,
                                          ls::dropout<1, 2>>;
static_assert(chain_dropout_last::bind<784>::workspace_per_sample_bf16 ==
              chain_dropout_last::bind<784>::workspace_per_sample - (19 - 10) - (19 - 10) - (10 - 5));
// Two dense layers in a row: the first one's output is kept in bf16.
using chain_linear = ls::sequential<ls::dense<784, 12>, ls::dense<12, 10>>;
static_assert(chain_linear::bind<784>::workspace_per_sample_bf16 == chain_linear::bind<784>::workspace_per_sample - 6);
// Nothing is kept in bf16 before the model's output or before a layer that reads fp32: a tanh
// (its gradient reads more than the sign), dropout's output read by a tanh, and a tanh's output
// (its backward reads it) read by a dense layer.
using chain_fp32 = ls::sequential<ls::dense<784, 12>, ls::tanh, ls::dropout<1, 4>, ls::tanh, ls::dense<12, 10>>;
static_assert(chain_fp32::bind<784>::workspace_per_sample_bf16 == chain_fp32::bind<784>::workspace_per_sample);
static_assert(ls::grad_from_sign_v<ls::relu_fn> && !ls::grad_from_sign_v<ls::tanh_fn>);
static_assert(ls::bf16_activations_v<ls::dense<3, 4>::bind<3>> && !ls::bf16_activations_v<ls::relu::bind<3>>);
static_assert(ls::input_unread_v<ls::dropout<1, 4>::bind<3>> && !ls::input_unread_v<ls::dense<3, 4>::bind<3>> &&
              !ls::input_unread_v<ls::relu::bind<3>>);

/// What one training run left behind.
struct act_run {
  std::vector<float> params;
  std::vector<float> predictions;
  std::size_t activation_bytes = 0;  // replica 0's
  std::size_t capacity = 0;          // rows replica 0's workspace holds
  bool kept = false;                 // replica 0's context keeps activations in bf16
};

/// Four updates of Net under mixed<bf16> on `replicas` replicas of strategy S with activations
/// kept in bf16 or not; `accumulate` batches per update (uneven sizes, one of a single row), then a
/// prediction on 9 rows. The parameters start as `init` when it is not empty.
template <class Net, class S, class Policy = ls::mixed<ls::bf16>>
act_run train_kept(std::size_t replicas, bool keep, std::size_t accumulate, bool shard = false,
                   std::span<const float> init = {}) {
  S s(ls::device_selection::first(replicas),
      ls::strategy_options{.micro_shard_rows = 4, .deferred_gradient_bytes = 64u << 20, .shard_optimizer = shard});
  auto m = s.template replicate<Net, Policy>(ls::seed{9});
  if (!init.empty()) m.load_parameters(init);
  for (std::size_t r = 0; r < m.size(); ++r) m.replica(r).context().set_bf16_activations(keep);
  std::uint64_t key = 0;
  for (std::size_t update = 0; update < 4; ++update) {
    for (std::size_t j = 0; j + 1 < accumulate; ++j)
      (void)ls::accumulate(s, m, ls::softmax_cross_entropy{},
                           distributed(make_batch(j == 0 ? 1 : 17 + j, 500 + key++), replicas));
    (void)ls::train_step(s, m, ls::adamw{.lr = 3e-3f}, ls::softmax_cross_entropy{},
                         distributed(make_batch(update == 2 ? 5 : 29, 500 + key++), replicas));
  }
  act_run out;
  out.params = m.parameters_to_host();
  const auto b = make_batch(9, 999);
  out.predictions = ls::predict(s, m, ls::data::from_memory(b.features, 784, b.labels) | ls::data::batched(4)).outputs;
  out.activation_bytes = std::as_const(m.replica(0)).memory().activations;
  out.capacity = std::as_const(m.replica(0)).model().capacity();
  out.kept = ls::model<Net>::stores_bf16_activations(m.replica(0).context());
  return out;
}

template <class Net, class S>
void check_kept_bits(const char* name, std::size_t kept_per_row) {
  for (const std::size_t replicas : {1, 2, 3})
    for (const std::size_t accumulate : {1, 3}) {
      CAPTURE(std::string(name));
      CAPTURE(replicas);
      CAPTURE(accumulate);
      const auto off = train_kept<Net, S>(replicas, false, accumulate);
      const auto on = train_kept<Net, S>(replicas, true, accumulate);
      CHECK_FALSE(off.kept);
      CHECK(on.kept);
      CHECK(on.params == off.params);
      CHECK(on.predictions == off.predictions);
      // Each row of the workspace holds kept_per_row fewer elements.
      CHECK(on.capacity == off.capacity);
      CHECK(on.capacity > 0);
      CHECK(off.activation_bytes - on.activation_bytes == on.capacity * kept_per_row * sizeof(float));
    }
}

}  // namespace

TEST_CASE("activations kept in bf16 train to the bits of keeping them in fp32 (run_to_run)") {
  check_kept_bits<chain2, act_run_to_run>("chain2", 20 + 12);
  check_kept_bits<chain_odd, act_run_to_run>("chain_odd", (13 - 7) + (7 - 4) + (11 - 6));  // the nested 13, dropout's 7, and 11
  check_kept_bits<chain_residual, act_run_to_run>("chain_residual", 9 - 5);
  check_kept_bits<chain_linear, act_run_to_run>("chain_linear", 12 - 6);
  check_kept_bits<mlp_dropout, act_run_to_run>("mlp_dropout", (32 - 16) + (32 - 16));
  check_kept_bits<chain_dropout_last, act_run_to_run>("chain_dropout_last", (19 - 10) + (19 - 10) + (10 - 5));
  check_kept_bits<chain_cnn, act_run_to_run>("chain_cnn", chain_cnn_kept);
}

TEST_CASE("activations kept in bf16 train to the bits of keeping them in fp32 (replica_count_invariant)") {
  check_kept_bits<chain2, act_invariant>("chain2", 20 + 12);
  check_kept_bits<chain_odd, act_invariant>("chain_odd", (13 - 7) + (7 - 4) + (11 - 6));
  check_kept_bits<chain_residual, act_invariant>("chain_residual", 9 - 5);
  check_kept_bits<chain_linear, act_invariant>("chain_linear", 12 - 6);
  check_kept_bits<mlp_dropout, act_invariant>("mlp_dropout", (32 - 16) + (32 - 16));
  check_kept_bits<chain_dropout_last, act_invariant>("chain_dropout_last", (19 - 10) + (19 - 10) + (10 - 5));
  check_kept_bits<chain_cnn, act_invariant>("chain_cnn", chain_cnn_kept);
}

TEST_CASE("activations that no backward reads are kept nowhere and train to the bits of keeping them") {
  const auto check = [](const act_run& transient, const act_run& kept) {
    CHECK(transient.params == kept.params);
    CHECK(transient.predictions == kept.predictions);
    CHECK(transient.capacity == kept.capacity);
    CHECK(transient.capacity > 0);
    CHECK(kept.activation_bytes - transient.activation_bytes == kept.capacity * transient_per_row * sizeof(float));
  };
  for (const std::size_t replicas : {1, 2, 3})
    for (const std::size_t accumulate : {1, 3}) {
      CAPTURE(replicas);
      CAPTURE(accumulate);
      check(train_kept<chain_transient, act_run_to_run, float>(replicas, false, accumulate),
            train_kept<chain_transient_kept, act_run_to_run, float>(replicas, false, accumulate));
      check(train_kept<chain_transient, act_invariant, float>(replicas, false, accumulate),
            train_kept<chain_transient_kept, act_invariant, float>(replicas, false, accumulate));
      const auto bf16 = train_kept<chain_transient, act_run_to_run>(replicas, true, accumulate);
      CHECK(bf16.kept);
      check(bf16, train_kept<chain_transient_kept, act_run_to_run>(replicas, true, accumulate));
      check(train_kept<chain_transient, act_invariant>(replicas, true, accumulate),
            train_kept<chain_transient_kept, act_invariant>(replicas, true, accumulate));
      // Kept in bf16 or not, the same bits (every reader rounds the same values).
      CHECK(bf16.params == train_kept<chain_transient, act_run_to_run>(replicas, false, accumulate).params);
    }
}

TEST_CASE("batch norm reads its input kept in bf16: the bits of normalising the bf16 values kept in fp32") {
  // The rounding layers shift the later layers' positions, which key their initialisation: both
  // nets start from chain_bn's parameters. (replica_count_invariant refuses batch norm.)
  act_run_to_run s(ls::device_selection::first(1));
  const auto init = s.replicate<chain_bn, ls::mixed<ls::bf16>>(ls::seed{4}).parameters_to_host();
  for (const std::size_t replicas : {1, 2, 3})
    for (const std::size_t accumulate : {1, 3}) {
      CAPTURE(replicas);
      CAPTURE(accumulate);
      const auto on = train_kept<chain_bn, act_run_to_run>(replicas, true, accumulate, false, init);
      const auto rounded = train_kept<chain_bn_rounded, act_run_to_run>(replicas, false, accumulate, false, init);
      const auto off = train_kept<chain_bn, act_run_to_run>(replicas, false, accumulate, false, init);
      CHECK(on.kept);
      CHECK(on.params == rounded.params);
      CHECK(on.predictions == rounded.predictions);
      CHECK(on.params != off.params);  // batch norm's statistics read other values
      CHECK(on.capacity == off.capacity);
      CHECK(on.capacity > 0);
      CHECK(off.activation_bytes - on.activation_bytes == on.capacity * chain_bn_kept * sizeof(float));
    }
}

TEST_CASE("activations kept in bf16: a deferred 4 MiB weight gradient and the sharded update give the same bits") {
  for (const std::size_t replicas : {1, 2})
    for (const bool shard : {false, true}) {
      CAPTURE(replicas);
      CAPTURE(shard);
      const auto off = train_kept<chain_deferred, act_run_to_run>(replicas, false, 3, shard);
      const auto on = train_kept<chain_deferred, act_run_to_run>(replicas, true, 3, shard);
      CHECK(on.params == off.params);
      CHECK(on.predictions == off.predictions);
      CHECK(on.activation_bytes < off.activation_bytes);
    }
}

TEST_CASE("activations are kept in bf16 only by float host models under mixed<bf16> with subnormals flushed") {
  CHECK(ls::host_context(1, true, ls::compute_precision::bf16).bf16_activations());
  CHECK_FALSE(ls::host_context(1, true, ls::compute_precision::fp32).bf16_activations());
  CHECK_FALSE(ls::host_context(1, true, ls::compute_precision::fp16).bf16_activations());
  CHECK_FALSE(ls::host_context(1, false, ls::compute_precision::bf16).bf16_activations());
  ls::host_context off(1, true, ls::compute_precision::bf16);
  off.set_bf16_activations(false);
  CHECK_FALSE(off.bf16_activations());
  const ls::host_context on(1, true, ls::compute_precision::bf16);
  CHECK(ls::model<chain2>::stores_bf16_activations(on));
  CHECK_FALSE(ls::model<chain2, double>::stores_bf16_activations(on));
  // A model switched between layouts regrows its workspace and keeps computing the same outputs.
  ls::host_context ctx(1, true, ls::compute_precision::bf16);
  ls::model<chain2> model(ctx, ls::seed{3});
  const auto b = make_batch(6, 77);
  const float* y = model.forward(ctx, b.features.data(), 6, ls::pass_info{});
  const std::vector<float> kept(y, y + 6 * 10);
  ctx.set_bf16_activations(false);
  y = model.forward(ctx, b.features.data(), 6, ls::pass_info{});
  CHECK(std::vector<float>(y, y + 6 * 10) == kept);
}

TEST_CASE("gemm_bf16_input computes the bits of the bf16 GEMM on its operand's widened values, for any shape") {
  ls::host_context ctx(1, true, ls::compute_precision::bf16);
  ctx.set_gemm_precision(ls::compute_precision::bf16);
  const ls::counter_rng rng(17, 3);
  for (const std::size_t m : {1, 3, 16, 37})
    for (const std::size_t n : {1, 5, 64})
      for (const std::size_t k : {0, 1, 7, 130})
        for (const bool ta : {false, true})
          for (const float beta : {0.0f, 1.0f}) {
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(k);
            CAPTURE(ta);
            CAPTURE(beta);
            std::vector<std::uint16_t> a16(m * k);
            std::vector<float> a(m * k), b(k * n), c0(m * n), c1;
            for (std::size_t i = 0; i < a.size(); ++i) {
              a16[i] = ls::to_bf16_bits(rng.uniform(i) * 4.0f - 2.0f);
              a[i] = ls::from_bf16_bits(a16[i]);
            }
            for (std::size_t i = 0; i < b.size(); ++i) b[i] = rng.uniform(1000 + i) - 0.5f;
            for (std::size_t i = 0; i < c0.size(); ++i) c0[i] = rng.uniform(5000 + i);
            c1 = c0;
            const auto ta_ = ta ? ls::backend::trans::yes : ls::backend::trans::no;
            ls::backend::gemm(ctx, ta_, ls::backend::trans::no, m, n, k, 1.0f, a.data(), ta ? m : k, b.data(), n, beta,
                              c0.data(), n);
            ls::backend::gemm_bf16_input(ctx, ta_, ls::backend::trans::no, m, n, k, 1.0f, a16.data(), b.data(), n, beta,
                                         c1.data(), n);
            CHECK(c1 == c0);
          }
}
