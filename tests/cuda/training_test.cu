// Training on GPUs against training on the host: one_device<gpu<0>>, mirrored<gpu<0>, gpu<0>>
// (replicas sharing one GPU, the on-device reducer), aggregation on one designated device
// (reduce_to_one_device<gpu<K>> and reduce_to_one_device<cpu<0>>) and, with two GPUs,
// mirrored<gpu<0>, gpu<1>> (NCCL) and the aggregating reducers across GPUs. Each must follow the
// host's single-device training on the same global batches.

#include "gpu_test.hpp"
#include "../support/plain_relu.hpp"

#include <lockstep/distribute/mirrored.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using namespace lockstep_test;

namespace {

// Smooth activations only: the device's GEMMs round differently from the host's, and a ReLU
// pre-activation within that rounding of zero would switch a unit off on one side only (a
// gradient difference of order 1, not 1e-4). GELU and tanh turn a rounding difference into a
// difference of the same order, so the 1e-4 tolerance holds for every batch.
using net = ls::sequential<ls::dense<20, 32>, ls::gelu, ls::dropout<1, 10>, ls::dense<32, 32>, ls::tanh,
                           ls::dense<32, 5>>;
constexpr std::size_t steps = 20;

// Global batch number k: 13 + k % 7 rows (uneven, sometimes not divisible by the replica count).
std::shared_ptr<const ls::data::batch> make_batch(std::size_t k) {
  auto b = std::make_shared<ls::data::batch>();
  const std::size_t rows = 13 + k % 7;
  b->width = 20;
  b->features = random_vector(rows * 20, 500 + k, -1.0f, 1.0f);
  b->labels.resize(rows);
  b->indices.resize(rows);
  const ls::counter_rng rng(77, k);
  for (std::size_t i = 0; i < rows; ++i) {
    b->labels[i] = static_cast<std::int32_t>(rng.u32(i) % 5);
    b->indices[i] = k * 100 + i;
  }
  return b;
}

ls::data::distributed_batch distribute(const std::shared_ptr<const ls::data::batch>& b, std::size_t n) {
  return ls::data::distributed_batch{b, ls::data::split(*b, n)};
}

struct run_result {
  std::vector<double> losses;
  std::vector<float> params;
  std::vector<bool> skipped;  // per step: the update was skipped (an overflow under mixed<fp16>)
};

// The net with batch norm after the first two dense layers (statistics over the global batch).
using bn_net = ls::sequential<ls::dense<20, 32>, ls::batch_norm<>, ls::gelu, ls::dense<32, 32>, ls::batch_norm<3, 10>,
                              ls::tanh, ls::dense<32, 5>>;
// The same rows as 5 x 2 x 2 images: a convolution, batch norm per channel over the batch and
// positions, a dense layer.
using bn_image_net = ls::sequential<ls::reshape<5, 2, 2>, ls::conv2d<6, 3, 1, 1>, ls::batch_norm<>, ls::tanh,
                                    ls::flatten, ls::dense<24, 5>>;

// Trains `steps` steps of Net under precision policy P with strategy S on the fixed batch sequence.
template <class P = float, class Net = net, class S>
run_result train(S& s) {
  auto m = s.template replicate<Net, P>(ls::seed{3});
  const ls::sgd opt{.lr = 0.05f, .momentum = 0.9f};
  run_result out;
  for (std::size_t k = 0; k < steps; ++k) {
    const auto st = ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distribute(make_batch(k), s.num_replicas()));
    out.losses.push_back(st.loss_sum);
    out.skipped.push_back(st.skipped);
  }
  out.params = m.parameters_to_host();
  // Every replica holds the same parameters and non-trainable state (batch norm's running
  // statistics follow the parameters: stored_count in all).
  for (std::size_t r = 1; r < s.num_replicas(); ++r) {
    std::vector<float> pr(m.stored_count);
    auto& rep = m.replica(r);
    copy_to_host(rep.context(), pr.data(), rep.model().parameters().data(), pr.size());
    CHECK(pr == out.params);
  }
  return out;
}

template <class S, class Net = net>
void check_against_host(const char* name) {
  const std::string label(name);  // doctest prints a const char* as an address
  CAPTURE(label);
  ls::one_device<ls::cpu<0>> host;
  const run_result want = train<float, Net>(host);
  S gpu{ls::strategy_options{.bucket_bytes = 1024}};  // several buckets
  const run_result got = train<float, Net>(gpu);
  REQUIRE(got.losses.size() == want.losses.size());
  for (std::size_t k = 0; k < steps; ++k) {
    CAPTURE(k);
    CHECK(std::abs(got.losses[k] - want.losses[k]) <= 1e-4 * (1.0 + std::abs(want.losses[k])));
  }
  check_close(got.params, want.params, 1e-4, "parameters after 20 steps");
}

// Strategy S (3 replicas) all-reduces each of `counts` elements to exactly (a + b) + c on every
// replica; a replica that fails before its collective releases the others and the caller sees its
// error; the strategy trains again afterwards.
template <class S>
void check_exact_sums_and_release(std::initializer_list<std::size_t> counts = {0, 1, 257, 1801}) {
  static_assert(S::replica_count == 3);
  S s{ls::strategy_options{.timeout = test_timeout(5000)}};
  auto m = s.template replicate<net>(ls::seed{1});
  const auto b = make_batch(0);
  for (std::size_t count : counts) {
    CAPTURE(count);
    std::vector<std::vector<float>> inputs(3);
    for (std::size_t r = 0; r < 3; ++r) inputs[r] = random_vector(count, 900 + r);
    std::vector<float> want(count);
    for (std::size_t i = 0; i < count; ++i) want[i] = (inputs[0][i] + inputs[1][i]) + inputs[2][i];
    auto results = s.run(
        [&](std::size_t r, const ls::data::shard&) {
          auto& ctx = m.replica(r).context();
          ctx.activate();
          auto d = to_device(ctx, inputs[r]);
          s.all_reduce(r, ctx, d.data(), count);
          return to_host(ctx, d.data(), count);
        },
        distribute(b, 3));
    for (const auto& got : results) CHECK(got == want);
  }
  // The caller sees a replica_error naming replica 1, with the replica's own error nested.
  bool named = false, nested = false;
  try {
    (void)s.run(
        [&](std::size_t r, const ls::data::shard&) {
          if (r == 1) throw ls::data_error("injected failure");
          auto& ctx = m.replica(r).context();
          ctx.activate();
          ls::buffer<float, ls::gpu<0>> d(4);
          fill(ctx, d.data(), 4, 1.0f);
          s.all_reduce(r, ctx, d.data(), 4);
          return 0;
        },
        distribute(b, 3));
  } catch (const ls::replica_error& e) {
    named = e.replica() == 1;
    try {
      std::rethrow_if_nested(e);
    } catch (const ls::data_error& inner) {
      nested = std::string(inner.what()).find("injected failure") != std::string::npos;
    } catch (...) {
    }
  }
  CHECK(named);
  CHECK(nested);
  const auto st = ls::train_step(s, m, ls::sgd{}, ls::softmax_cross_entropy{}, distribute(b, 3));
  CHECK(st.count == b->rows());
}

// A strategy with reducer R over devices Ds (aggregation on one designated device).
template <class R, class... Ds>
using aggregating = ls::basic_mirrored<R, ls::determinism::run_to_run, Ds...>;
using on_gpu0 = ls::reduce_to_one_device<ls::gpu<0>>;
using on_gpu1 = ls::reduce_to_one_device<ls::gpu<1>>;
using on_host = ls::reduce_to_one_device<ls::cpu<0>>;

static_assert(ls::reducer<on_gpu0> && ls::reducer<on_host>);
static_assert(on_gpu0::supports<ls::gpu<0>, ls::gpu<0>> && on_gpu0::supports<ls::gpu<1>, ls::gpu<0>>);
static_assert(!on_gpu1::supports<ls::gpu<0>, ls::gpu<0>> && !on_gpu0::supports<ls::cpu<0>, ls::cpu<1>>);
static_assert(on_host::supports<ls::gpu<0>, ls::gpu<0>> && on_host::supports<ls::gpu<0>, ls::gpu<1>>);
static_assert(on_host::supports<ls::cpu<0>, ls::cpu<1>> && !on_host::supports<ls::cpu<1>, ls::cpu<2>>);

}  // namespace

TEST_CASE("host: the root replica is the FIRST replica on the aggregation device (no GPU needed)") {
  CHECK(ls::detail::aggregation_root<on_gpu0, ls::gpus>(std::vector<std::size_t>{0, 0, 0}) == 0);
  CHECK(ls::detail::aggregation_root<on_gpu1, ls::gpus>(std::vector<std::size_t>{0, 1, 1}) == 1);
  CHECK(ls::detail::aggregation_root<on_host, ls::gpus>(std::vector<std::size_t>{1, 0}) == 0);
}

TEST_CASE("gpu: one_device<gpu<0>> trains like one_device<cpu<0>> over 20 steps") {
  LOCKSTEP_REQUIRE_GPUS(1);
  check_against_host<ls::one_device<ls::gpu<0>>>("one_device<gpu<0>>");
}

namespace {
// Trains under policy P on GPU (strategy G) and on the host under policy HostP: the same skipped
// updates, losses and parameters within `rel` (the formats' rounding of values that differ in
// their last fp32 bits, from sums in another order, is what may differ).
template <class P, class HostP, class G>
void check_policy_against_host(const char* name, double rel) {
  const std::string label(name);  // doctest prints a const char* as an address
  CAPTURE(label);
  ls::one_device<ls::cpu<0>> host;
  const run_result want = train<HostP>(host);
  G gpu{ls::strategy_options{.bucket_bytes = 1024}};
  const run_result got = train<P>(gpu);
  CHECK(got.skipped == want.skipped);
  for (std::size_t k = 0; k < steps; ++k) {
    CAPTURE(k);
    CHECK(std::abs(got.losses[k] - want.losses[k]) <= rel * (1.0 + std::abs(want.losses[k])));
  }
  check_close(got.params, want.params, rel, "parameters after 20 steps");
}
}  // namespace

TEST_CASE("gpu: mixed<bf16> and mixed<fp16> on GPUs train like the host under the same policy, tf32 like fp32") {
  LOCKSTEP_REQUIRE_GPUS(1);
  using one = ls::one_device<ls::gpu<0>>;
  using two = ls::mirrored<ls::gpu<0>, ls::gpu<0>>;
  check_policy_against_host<ls::mixed<ls::bf16>, ls::mixed<ls::bf16>, one>("mixed<bf16> one_device", 2e-2);
  check_policy_against_host<ls::mixed<ls::bf16>, ls::mixed<ls::bf16>, two>("mixed<bf16> two replicas", 2e-2);
  check_policy_against_host<ls::mixed<ls::fp16>, ls::mixed<ls::fp16>, two>("mixed<fp16> two replicas", 5e-3);
  check_policy_against_host<ls::tf32, float, one>("tf32 against fp32", 2e-2);
}

namespace {
// Strategy S under mixed<bf16>, trained with the bf16 weight copy and without it (the weights
// packed at every GEMM): both multiply the same bf16 values, so every few updates the copy's
// evaluation equals the packed one's up to the order of fp32 sums (a copy one update stale would
// differ by the update), each training step reads five operands from the copy per replica, and the
// two runs train alike.
template <class S>
void check_weight_copy(const char* name, const ls::strategy_options& o) {
  const std::string label(name);  // doctest prints a const char* as an address
  CAPTURE(label);
  const auto b = make_batch(3);
  const auto pipeline = [&b] {
    return ls::data::from_memory(std::vector<float>(b->features), b->width, std::vector<std::int32_t>(b->labels)) |
           ls::data::batched(8);
  };
  const ls::softmax_cross_entropy loss;
  std::vector<double> losses[2];
  std::vector<float> params[2];
  for (const bool copy : {true, false}) {
    CAPTURE(copy);
    S s{o};
    auto m = s.template replicate<net, ls::mixed<ls::bf16>>(ls::seed{3});
    const auto set_copy = [&](bool on) {
      for (std::size_t r = 0; r < s.num_replicas(); ++r) m.replica(r).context().set_bf16_weight_copy(on);
    };
    const auto reads = [&] {
      std::uint64_t n = 0;
      for (std::size_t r = 0; r < s.num_replicas(); ++r) n += m.replica(r).context().weight_copy_reads();
      return n;
    };
    for (std::size_t r = 0; r < s.num_replicas(); ++r) CHECK(m.replica(r).context().bf16_weight_copy());  // the default
    set_copy(copy);
    const ls::sgd opt{.lr = 0.05f, .momentum = 0.9f};
    std::uint64_t train_reads = 0;
    for (std::size_t k = 0; k < steps; ++k) {
      CAPTURE(k);
      const std::uint64_t before = reads();
      const auto st = ls::train_step(s, m, opt, loss, distribute(make_batch(k), s.num_replicas()));
      train_reads += reads() - before;
      losses[copy].push_back(st.loss_sum);
      if (copy && k % 5 == 4) {
        const auto with = ls::evaluate(s, m, loss, pipeline());
        set_copy(false);
        const auto without = ls::evaluate(s, m, loss, pipeline());
        set_copy(true);
        CHECK(with.samples == b->rows());
        CHECK(std::abs(with.loss - without.loss) <= 1e-4 * (1.0 + std::abs(without.loss)));
      }
    }
    // Per replica and step: the three dense layers' W in forward, the last two's in backward (the
    // first computes no input gradient).
    CHECK(train_reads == (copy ? 5 * steps * s.num_replicas() : 0));
    for (std::size_t r = 0; r < s.num_replicas(); ++r)
      CHECK(std::as_const(m.replica(r)).model().weight_copy_bytes() == (copy ? m.stored_count * sizeof(std::uint16_t) : 0));
    params[copy] = m.parameters_to_host();
  }
  for (std::size_t k = 0; k < steps; ++k) {
    CAPTURE(k);
    CHECK(std::abs(losses[1][k] - losses[0][k]) <= 2e-2 * (1.0 + std::abs(losses[0][k])));
  }
  check_close(params[1], params[0], 2e-2, "parameters after 20 steps, with the copy and without");
}
}  // namespace

TEST_CASE("gpu: [weight_copy] under mixed<bf16> GPU GEMMs read the weights from a bf16 copy rewritten after every update, sharded or not") {
  LOCKSTEP_REQUIRE_GPUS(1);
  check_weight_copy<ls::one_device<ls::gpu<0>>>("one_device<gpu<0>>", {});
  check_weight_copy<ls::mirrored<ls::gpu<0>, ls::gpu<0>>>("mirrored<gpu<0> x 2>", {.bucket_bytes = 1024});
  check_weight_copy<ls::mirrored<ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>>(
      "mirrored<gpu<0> x 3>, sharded update", {.bucket_bytes = 1024, .shard_optimizer = true});
}

TEST_CASE("gpu: mirrored<gpu<0>, gpu<0>> (on-device reducer) trains like one host device over 20 steps") {
  static_assert(std::is_same_v<ls::select_reducer_t<ls::gpu<0>, ls::gpu<0>>, ls::same_device_allreduce>);
  LOCKSTEP_REQUIRE_GPUS(1);
  check_against_host<ls::mirrored<ls::gpu<0>, ls::gpu<0>>>("mirrored<gpu<0>, gpu<0>>");
  check_against_host<ls::mirrored<ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>>("mirrored<gpu<0> x 3>");
}

TEST_CASE("gpu: the on-device reducer sums uneven buckets in replica order and releases peers of a failed replica") {
  LOCKSTEP_REQUIRE_GPUS(1);
  check_exact_sums_and_release<ls::mirrored<ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>>({0, 1, 257, 10007});
}

TEST_CASE("gpu: reduce_to_one_device<gpu<0>> over gpu<0> replicas trains like one host device over 20 steps") {
  LOCKSTEP_REQUIRE_GPUS(1);
  check_against_host<aggregating<on_gpu0, ls::gpu<0>, ls::gpu<0>>>("reduce_to_one_device<gpu<0>>, gpu<0> x 2");
  check_against_host<aggregating<on_gpu0, ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>>("reduce_to_one_device<gpu<0>>, gpu<0> x 3");
}

TEST_CASE("gpu: reduce_to_one_device<cpu<0>> over gpu<0> replicas trains like one host device over 20 steps") {
  LOCKSTEP_REQUIRE_GPUS(1);
  check_against_host<aggregating<on_host, ls::gpu<0>, ls::gpu<0>>>("reduce_to_one_device<cpu<0>>, gpu<0> x 2");
  check_against_host<aggregating<on_host, ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>>("reduce_to_one_device<cpu<0>>, gpu<0> x 3");
}

TEST_CASE("gpu: reduce_to_one_device on one GPU sums in replica order and releases peers of a failed replica") {
  LOCKSTEP_REQUIRE_GPUS(1);
  SUBCASE("aggregating on gpu<0>") { check_exact_sums_and_release<aggregating<on_gpu0, ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>>(); }
  SUBCASE("aggregating on the host") { check_exact_sums_and_release<aggregating<on_host, ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>>(); }
}

TEST_CASE("multigpu: reduce_to_one_device across two GPUs trains like one host device and sums in replica order") {
  LOCKSTEP_REQUIRE_GPUS(2);
  // The root (gpu<1>) is not replica 0; replica 2 shares gpu<0> with replica 0 (both are staged).
  check_against_host<aggregating<on_gpu1, ls::gpu<0>, ls::gpu<1>>>("reduce_to_one_device<gpu<1>>, gpu<0>, gpu<1>");
  check_against_host<aggregating<on_gpu1, ls::gpu<0>, ls::gpu<1>, ls::gpu<0>>>("reduce_to_one_device<gpu<1>>, gpu<0>, gpu<1>, gpu<0>");
  check_against_host<aggregating<on_host, ls::gpu<0>, ls::gpu<1>>>("reduce_to_one_device<cpu<0>>, gpu<0>, gpu<1>");
  check_exact_sums_and_release<aggregating<on_gpu1, ls::gpu<0>, ls::gpu<1>, ls::gpu<0>>>();
  check_exact_sums_and_release<aggregating<on_host, ls::gpu<1>, ls::gpu<0>, ls::gpu<1>>>();
}

#if defined(LOCKSTEP_HAS_NCCL)
TEST_CASE("multigpu: mirrored<gpu<0>, gpu<1>> (NCCL) trains like one host device over 20 steps") {
  static_assert(std::is_same_v<ls::select_reducer_t<ls::gpu<0>, ls::gpu<1>>, ls::nccl_allreduce>);
  // a sharded update on the reduce-scatter grid for float models; a double model's epilogue reads
  // its whole gradient back, so it shards on plain slices of a whole all-reduce
  using nccl_mirrored = ls::mirrored<ls::gpu<0>, ls::gpu<1>>;
  static_assert(nccl_mirrored::shards_on_grid_for<float> == nccl_mirrored::shards_on_grid);
  static_assert(!nccl_mirrored::shards_on_grid_for<double>);
  LOCKSTEP_REQUIRE_GPUS(2);
  check_against_host<ls::mirrored<ls::gpu<0>, ls::gpu<1>>>("mirrored<gpu<0>, gpu<1>>");
}
#endif

TEST_CASE("gpu: [batch_norm] batch norm on GPUs trains like the host over 20 steps, with 1, 2 and 3 replicas on gpu<0>") {
  LOCKSTEP_REQUIRE_GPUS(1);
  // The global batches have 13 to 19 rows: three replicas get uneven shards, and the statistics
  // must still be those of the global batch (the replicas exchange each row's sums).
  check_against_host<ls::one_device<ls::gpu<0>>, bn_net>("one_device<gpu<0>>, dense + batch_norm");
  check_against_host<ls::mirrored<ls::gpu<0>, ls::gpu<0>>, bn_net>("mirrored<gpu<0> x 2>, dense + batch_norm");
  check_against_host<ls::mirrored<ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>, bn_net>("mirrored<gpu<0> x 3>, dense + batch_norm");
  check_against_host<ls::one_device<ls::gpu<0>>, bn_image_net>("one_device<gpu<0>>, conv2d + batch_norm");
  check_against_host<ls::mirrored<ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>, bn_image_net>("mirrored<gpu<0> x 3>, conv2d + batch_norm");
  check_against_host<aggregating<on_host, ls::gpu<0>, ls::gpu<0>>, bn_image_net>("reduce_to_one_device<cpu<0>>, gpu<0> x 2, conv2d + batch_norm");
}

TEST_CASE("gpu: [batch_norm] batch norm on GPUs is bitwise run to run, and its running statistics match the host") {
  LOCKSTEP_REQUIRE_GPUS(1);
  using three = ls::mirrored<ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>;
  three a{ls::strategy_options{.bucket_bytes = 1024}}, b{ls::strategy_options{.bucket_bytes = 1024}};
  const run_result first = train<float, bn_image_net>(a);
  const run_result second = train<float, bn_image_net>(b);
  CHECK(first.params == second.params);
  CHECK(first.losses == second.losses);
  // parameters_to_host carries the running statistics after the parameters: after 20 updates they
  // follow the host's within the same tolerance.
  ls::one_device<ls::cpu<0>> host;
  const run_result want = train<float, bn_image_net>(host);
  REQUIRE(want.params.size() == first.params.size());
  check_close(first.params, want.params, 1e-4, "parameters and running statistics");
}

namespace {
// Batch norm followed by a relu, on images (per channel over the batch and positions) and on flat
// rows: with ls::relu each batch norm applies it in its normalisation kernel (fused), with
// plain_relu the two layers run apart.
template <class Relu>
using bn_relu_net = ls::sequential<ls::reshape<5, 2, 2>, ls::conv2d<6, 3, 1, 1>, ls::batch_norm<>, Relu, ls::flatten,
                                   ls::dense<24, 8>, ls::batch_norm<>, Relu, ls::dense<8, 5>>;
using test_support::plain_relu;  // relu that never fuses
static_assert(ls::bind_t<bn_relu_net<ls::relu>, 20>::fused[2] && ls::bind_t<bn_relu_net<ls::relu>, 20>::fused[6]);
static_assert(!ls::bind_t<bn_relu_net<plain_relu>, 20>::fused[2] && !ls::bind_t<bn_relu_net<plain_relu>, 20>::fused[6]);
}  // namespace

TEST_CASE("gpu: [batch_norm] batch norm applying the relu after it trains bit for bit like the two layers apart, 1 and 3 replicas on gpu<0>") {
  LOCKSTEP_REQUIRE_GPUS(1);
  // The same kernels but the normalisation's (which applies relu to the value it writes) and
  // relu's backward (from the output): the same bits, losses and parameters after 20 updates.
  ls::one_device<ls::gpu<0>> one_fused, one_plain;
  const run_result a = train<float, bn_relu_net<ls::relu>>(one_fused);
  const run_result b = train<float, bn_relu_net<plain_relu>>(one_plain);
  CHECK(a.losses == b.losses);
  CHECK(a.params == b.params);
  using three = ls::mirrored<ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>;
  three three_fused{ls::strategy_options{.bucket_bytes = 1024}}, three_plain{ls::strategy_options{.bucket_bytes = 1024}};
  const run_result c = train<float, bn_relu_net<ls::relu>>(three_fused);
  const run_result d = train<float, bn_relu_net<plain_relu>>(three_plain);
  CHECK(c.losses == d.losses);
  CHECK(c.params == d.params);
}

namespace {
// Device operations (kernels, cuBLAS calls, copies) one steady training step of Net queues on
// one_device<gpu<0>> at `batch` rows (of `width` features, labels below 10).
template <class Net>
std::uint64_t launches_per_step(std::size_t batch) {
  ls::one_device<ls::gpu<0>> s;
  auto m = s.template replicate<Net>(ls::seed{2});
  constexpr std::size_t width = decltype(m)::model_type::input_size;
  auto b = std::make_shared<ls::data::batch>();
  b->width = width;
  b->features = random_vector(batch * width, 41, -1.0f, 1.0f);
  b->labels.resize(batch);
  b->indices.resize(batch);
  for (std::size_t i = 0; i < batch; ++i) {
    b->labels[i] = static_cast<std::int32_t>(i % 10);
    b->indices[i] = i;
  }
  const ls::sgd opt{.lr = 0.01f};
  (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distribute(b, 1));  // warm-up: scratch grows
  const auto& ctx = m.replica(0).context();
  const std::uint64_t before = ctx.launches();
  (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distribute(b, 1));
  return ctx.launches() - before;
}
}  // namespace

TEST_CASE("gpu: [batched_conv] the CNN's step queues at most 100 device operations, the same at every batch") {
  LOCKSTEP_REQUIRE_GPUS(1);
  using cnn = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<32, 5, 1, 2>, ls::relu, ls::max_pool2d<2>,
                             ls::conv2d<64, 5, 1, 2>, ls::relu, ls::max_pool2d<2>, ls::flatten, ls::dense<3136, 1024>,
                             ls::relu, ls::dense<1024, 10>>;
  const std::uint64_t at8 = launches_per_step<cnn>(8), at64 = launches_per_step<cnn>(64), at256 = launches_per_step<cnn>(256);
  MESSAGE("device operations per CNN step: " << at8 << " at batch 8, " << at64 << " at 64, " << at256 << " at 256");
  CHECK(at8 <= 100);
  CHECK(at64 == at8);
  CHECK(at256 == at8);
}

namespace {
// 20 steps of net with AdamW and an EMA-free update on strategy S made with `options`: the losses,
// the parameters and the optimiser state put together (the layout of an unsharded state).
template <class S>
run_result train_adamw(ls::strategy_options options, std::vector<float>& state) {
  S s{options};
  auto m = s.template replicate<net>(ls::seed{4});
  const ls::adamw opt{.lr = 0.01f};
  run_result out;
  for (std::size_t k = 0; k < steps; ++k)
    out.losses.push_back(ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distribute(make_batch(k), s.num_replicas())).loss_sum);
  out.params = m.parameters_to_host();
  state = m.optimizer_state_to_host();
  for (std::size_t r = 1; r < s.num_replicas(); ++r) {  // every replica holds every updated slice
    std::vector<float> pr(m.param_count);
    copy_to_host(m.replica(r).context(), pr.data(), m.replica(r).model().parameters().data(), pr.size());
    CHECK(pr == std::vector<float>(out.params.begin(), out.params.begin() + static_cast<std::ptrdiff_t>(m.param_count)));
  }
  return out;
}

template <class S>
void check_sharded_is_unsharded(const char* name) {
  const std::string label(name);  // doctest prints a const char* as an address
  CAPTURE(label);
  std::vector<float> plain_state, sharded_state;
  const run_result plain = train_adamw<S>(ls::strategy_options{.bucket_bytes = 1024}, plain_state);
  const run_result sharded = train_adamw<S>(ls::strategy_options{.bucket_bytes = 1024, .shard_optimizer = true}, sharded_state);
  CHECK(sharded.losses == plain.losses);
  CHECK(sharded.params == plain.params);
  CHECK(sharded_state == plain_state);
}
}  // namespace

TEST_CASE("gpu: [zero1] the sharded update of replicas sharing gpu<0> is bitwise the unsharded one, 2 and 3 replicas") {
  LOCKSTEP_REQUIRE_GPUS(1);
  check_sharded_is_unsharded<ls::mirrored<ls::gpu<0>, ls::gpu<0>>>("mirrored<gpu<0> x 2>, same-device reducer");
  check_sharded_is_unsharded<ls::mirrored<ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>>("mirrored<gpu<0> x 3>, same-device reducer");
  check_sharded_is_unsharded<aggregating<on_gpu0, ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>>("reduce_to_one_device<gpu<0>>, gpu<0> x 3");
}

TEST_CASE("multigpu: [zero1] the sharded update of replicas on two GPUs is bitwise the unsharded one (peer copies)") {
  LOCKSTEP_REQUIRE_GPUS(2);
  check_sharded_is_unsharded<aggregating<on_gpu0, ls::gpu<0>, ls::gpu<1>, ls::gpu<1>>>(
      "reduce_to_one_device<gpu<0>>, gpu<0> and gpu<1> x 2");
  check_sharded_is_unsharded<aggregating<on_host, ls::gpu<0>, ls::gpu<1>>>("reduce_to_one_device<cpu<0>>, gpu<0> and gpu<1>");
}

namespace {
// The calling thread's current CUDA device.
int current_device() {
  int d = -1;
  REQUIRE(cudaGetDevice(&d) == cudaSuccess);
  return d;
}

// Replicate, train, evaluate, broadcast and load state with strategy S while the caller's current
// device is `mine`: after each call it is still `mine` (replica 0's device is another).
template <class S>
void check_caller_device_kept(int mine, const char* name) {
  const std::string label(name);
  CAPTURE(label);
  REQUIRE(cudaSetDevice(mine) == cudaSuccess);
  S s;
  auto m = s.template replicate<net>(ls::seed{5});
  CHECK(current_device() == mine);
  const ls::adamw opt{.lr = 0.01f};
  for (std::size_t k = 0; k < 3; ++k) {
    (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distribute(make_batch(k), s.num_replicas()));
    CHECK(current_device() == mine);
  }
  s.broadcast(m);
  CHECK(current_device() == mine);
  (void)s.run([&](std::size_t r, const ls::data::shard&) { return m.replica(r).context().ordinal(); },
              distribute(make_batch(9), s.num_replicas()));
  CHECK(current_device() == mine);
  m.load_optimizer_state(m.optimizer_state_to_host());
  m.load_ema(std::vector<float>(m.stored_count, 0.25f), 1);
  CHECK(current_device() == mine);
}
}  // namespace

TEST_CASE("multigpu: the caller's current CUDA device is kept by replicate, train_step, broadcast, run and the state loads") {
  LOCKSTEP_REQUIRE_GPUS(2);
  check_caller_device_kept<ls::one_device<ls::gpu<1>>>(0, "one_device<gpu<1>>, the caller on device 0");
  check_caller_device_kept<ls::mirrored<ls::gpu<1>, ls::gpu<1>>>(0, "mirrored<gpu<1> x 2>, the caller on device 0");
  check_caller_device_kept<ls::one_device<ls::gpu<0>>>(1, "one_device<gpu<0>>, the caller on device 1");
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

#if defined(LOCKSTEP_HAS_NCCL)
namespace {
// 20 steps of net with AdamW on mirrored<gpu<0>, gpu<1>> (NCCL) under `recipe`, sharded or not:
// the losses, the norms, the parameters (every replica's), the optimiser state put together, and
// the buckets the reducer reduced onto the slices.
struct nccl_zero1_run {
  std::vector<double> losses, norms;
  std::vector<float> params, state;
  std::uint64_t slice_reductions = 0;
};

nccl_zero1_run train_nccl_zero1(bool shard, const ls::update_recipe& recipe) {
  using S = ls::mirrored<ls::gpu<0>, ls::gpu<1>>;
  static_assert(ls::reduces_to_slices_v<S::reducer_type>);
  S s{ls::strategy_options{.bucket_bytes = 1024, .shard_optimizer = shard}};
  auto m = s.replicate<net>(ls::seed{4});
  CHECK(m.update_plan().on_grid() == shard);
  const ls::adamw opt{.lr = 0.01f};
  nccl_zero1_run out;
  for (std::size_t k = 0; k < steps; ++k) {
    const auto st = ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distribute(make_batch(k), 2), recipe);
    out.losses.push_back(st.loss_sum);
    out.norms.push_back(st.grad_norm);
  }
  out.params = m.parameters_to_host();
  out.state = m.optimizer_state_to_host();
  std::vector<float> other(m.param_count);
  copy_to_host(m.replica(1).context(), other.data(), m.replica(1).model().parameters().data(), other.size());
  CHECK(other == std::vector<float>(out.params.begin(), out.params.begin() + static_cast<std::ptrdiff_t>(m.param_count)));
  out.slice_reductions = s.reducer().slice_reductions();
  return out;
}
}  // namespace

TEST_CASE("multigpu: [zero1] NCCL reduces each bucket onto the grid's slices and gathers them: bitwise run to run, the unsharded update within rounding") {
  LOCKSTEP_REQUIRE_GPUS(2);
  const ls::update_recipe plain{};
  const ls::update_recipe clipped{.clip_global_norm = 0.5, .nonfinite = ls::nonfinite_policy::skip};
  for (const ls::update_recipe* recipe : {&plain, &clipped}) {
    CAPTURE(recipe->clip_global_norm);
    const nccl_zero1_run whole = train_nccl_zero1(false, *recipe);
    const nccl_zero1_run a = train_nccl_zero1(true, *recipe);
    const nccl_zero1_run b = train_nccl_zero1(true, *recipe);
    CHECK(whole.slice_reductions == 0);
    CHECK(a.slice_reductions > 0);  // the buckets went through ncclReduce onto the slices
    CHECK(a.params == b.params);    // run to run, bitwise
    CHECK(a.state == b.state);
    check_close(a.params, whole.params, 1e-5, "sharded (reduce-scatter) against unsharded (all-reduce) parameters");
    check_close(a.state, whole.state, 1e-5, "sharded against unsharded optimiser state");
    for (std::size_t k = 0; k < steps; ++k) {
      CAPTURE(k);
      if (recipe->needs_epilogue()) {  // the norm the epilogue computed: the same bits run to run
        CHECK(a.norms[k] == b.norms[k]);
        CHECK(std::abs(a.norms[k] - whole.norms[k]) <= 1e-6 * (1.0 + std::abs(whole.norms[k])));
      } else {  // no epilogue ran: step_stats::grad_norm is NaN, as documented
        CHECK(std::isnan(a.norms[k]));
        CHECK(std::isnan(whole.norms[k]));
      }
    }
  }
}
#endif

namespace {
// What a run of `steps` updates of net (dropout, Adam, a learning rate that changes every step,
// and optionally clipping) on strategy S returned, deferred or not: each train_step's statistics
// then flush_stats', the parameters, and the most host syncs any steady step (after 2 warm-up
// steps) made over all replicas.
struct readback_run {
  std::vector<ls::step_stats> stats;
  std::vector<float> params;
  std::uint64_t max_syncs = 0;
};

template <class S>
readback_run run_readback(bool defer, double clip) {
  S s{ls::strategy_options{.bucket_bytes = 1024, .defer_readback = defer}};
  auto m = s.template replicate<net>(ls::seed{5});
  const ls::update_recipe recipe{.clip_global_norm = clip};
  const auto syncs = [&] {
    std::uint64_t n = 0;
    for (std::size_t r = 0; r < s.num_replicas(); ++r) n += m.replica(r).context().host_syncs();
    return n;
  };
  readback_run out;
  for (std::size_t k = 0; k < steps; ++k) {
    const ls::adam opt{.lr = 0.01f / static_cast<float>(1 + k)};
    const std::uint64_t before = syncs();
    out.stats.push_back(
        ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distribute(make_batch(k), s.num_replicas()), recipe));
    if (k >= 2) out.max_syncs = std::max(out.max_syncs, syncs() - before);
  }
  out.stats.push_back(s.flush_stats(m));
  out.params = m.parameters_to_host();
  return out;
}

bool same_stats(const ls::step_stats& a, const ls::step_stats& b) {
  const auto same = [](double x, double y) { return (std::isnan(x) && std::isnan(y)) || x == y; };
  return same(a.loss_sum, b.loss_sum) && a.count == b.count && a.correct == b.correct && a.labelled == b.labelled &&
         same(a.grad_norm, b.grad_norm) && same(a.clip_factor, b.clip_factor) && a.skipped == b.skipped;
}

template <class S>
void check_deferred_readback(const char* name) {
  const std::string label(name);  // doctest prints a const char* as an address
  CAPTURE(label);
  for (double clip : {0.0, 0.05}) {
    CAPTURE(clip);
    const readback_run eager = run_readback<S>(false, clip);
    const readback_run late = run_readback<S>(true, clip);
    REQUIRE(late.stats.size() == steps + 1);
    CHECK(late.stats[0].count == 0);
    for (std::size_t k = 1; k <= steps; ++k) {
      CAPTURE(k);
      CHECK(same_stats(late.stats[k], eager.stats[k - 1]));
    }
    CHECK(eager.stats[steps].count == 0);
    CHECK(late.params == eager.params);
    MESSAGE(label << ": host syncs per steady step " << eager.max_syncs << " undeferred, " << late.max_syncs
                 << " with defer_readback");
    CHECK(eager.max_syncs > 0);  // the counter sees the loss's wait
    CHECK(late.max_syncs == 0);
  }
}
}  // namespace

TEST_CASE("gpu: [no_host_wait] with defer_readback a step returns the previous update's statistics, bitwise the "
          "undeferred run's, and a steady step makes no host sync") {
  LOCKSTEP_REQUIRE_GPUS(1);
  check_deferred_readback<ls::one_device<ls::gpu<0>>>("one_device<gpu<0>>");
  check_deferred_readback<ls::mirrored<ls::gpu<0>, ls::gpu<0>>>("mirrored<gpu<0> x 2>, same-device reducer");
  check_deferred_readback<ls::mirrored<ls::gpu<0>, ls::gpu<0>, ls::gpu<0>>>("mirrored<gpu<0> x 3>, same-device reducer");
}

TEST_CASE("multigpu: [no_host_wait] with defer_readback NCCL replicas make no host sync in a steady step") {
  LOCKSTEP_REQUIRE_GPUS(2);
  check_deferred_readback<ls::mirrored<ls::gpu<0>, ls::gpu<1>>>("mirrored<gpu<0>, gpu<1>>, NCCL");
}

TEST_CASE("gpu: [no_host_wait] defer_readback under mixed<fp16>'s dynamic loss scale is a config_error") {
  LOCKSTEP_REQUIRE_GPUS(1);
  ls::one_device<ls::gpu<0>> s{ls::strategy_options{.defer_readback = true}};
  auto m = s.replicate<net, ls::mixed<ls::fp16>>(ls::seed{1});
  CHECK_THROWS_WITH_AS((void)ls::train_step(s, m, ls::sgd{.lr = 0.01f}, ls::softmax_cross_entropy{}, distribute(make_batch(0), 1)),
                       doctest::Contains("loss scale"), ls::config_error);
}

namespace {
// The spans of `thread` named `name` in `rec`.
std::vector<ls::trace_event> spans_named(const ls::trace_recorder& rec, std::size_t thread, const std::string& name) {
  std::vector<ls::trace_event> out;
  for (const auto& e : rec.events(thread))
    if (name == e.name) out.push_back(e);
  return out;
}

// Trains 4 steps of net on s, recording steps 1 and 2 on `rec` when given; the parameters.
template <class S>
std::vector<float> train_traced(S& s, ls::trace_recorder* rec) {
  auto m = s.template replicate<net>(ls::seed{7});
  s.set_trace(rec);
  for (std::size_t k = 0; k < 4; ++k) {
    if (rec) rec->begin_step(m.step());
    (void)ls::train_step(s, m, ls::adam{.lr = 0.01f}, ls::softmax_cross_entropy{}, distribute(make_batch(k), s.num_replicas()));
  }
  s.set_trace(nullptr);
  return m.parameters_to_host();
}

template <class S>
void check_device_spans(const char* name) {
  const std::string label(name);
  CAPTURE(label);
  S s{ls::strategy_options{.bucket_bytes = 1024}};
  const std::size_t n = s.num_replicas();
  ls::trace_recorder rec(n + 1, {.steps = {1, 3}});
  const std::int64_t before = rec.now();
  const std::vector<float> traced = train_traced(s, &rec);
  const std::int64_t after = rec.now();
  CHECK(rec.dropped() == 0);
  for (std::size_t r = 0; r < n; ++r) {
    CAPTURE(r);
    const auto fwd = spans_named(rec, r, "forward"), bwd = spans_named(rec, r, "backward");
    // The same layers' spans in each of the 2 recorded steps.
    REQUIRE(!fwd.empty());
    CHECK(fwd.size() % 2 == 0);
    CHECK(bwd.size() == fwd.size());
    CHECK(spans_named(rec, r, "update").size() == 2);
    // On the recorder's clock, well formed, and in stream order: step 1's forward spans end
    // before its backward spans start (1 us of slack for the events' float milliseconds).
    for (const auto& e : rec.events(r)) {
      CHECK(e.duration_ns >= 0);
      CHECK(e.start_ns >= before);
      CHECK(e.start_ns + e.duration_ns <= after);
    }
    const std::size_t half = fwd.size() / 2;
    std::int64_t forward_end = 0, backward_start = bwd[0].start_ns;
    for (std::size_t i = 0; i < half; ++i) {
      forward_end = std::max(forward_end, fwd[i].start_ns + fwd[i].duration_ns);
      backward_start = std::min(backward_start, bwd[i].start_ns);
    }
    CHECK(forward_end <= backward_start + 1000);
  }
  // Tracing changes no bit of the training.
  S plain{ls::strategy_options{.bucket_bytes = 1024}};
  CHECK(train_traced(plain, nullptr) == traced);
}
}  // namespace

TEST_CASE("gpu: a traced step records each replica's device spans on the recorder's clock, in stream order, changing no bit") {
  LOCKSTEP_REQUIRE_GPUS(1);
  check_device_spans<ls::one_device<ls::gpu<0>>>("one_device<gpu<0>>");
  check_device_spans<ls::mirrored<ls::gpu<0>, ls::gpu<0>>>("mirrored<gpu<0> x 2>, same-device reducer");
}

TEST_CASE("gpu: a device span opened and never closed is left out of the trace, also where its end event holds an earlier step's record") {
  LOCKSTEP_REQUIRE_GPUS(1);
  ls::cuda_context ctx(0);
  ls::trace_recorder rec(1, {.steps = {0, 10}});
  rec.begin_step(0);
  // Step 1: two spans, both closed. Step 2: the second one is opened and not closed, while its
  // end event still holds step 1's record (reading it would give a span from the past).
  for (int step = 1; step <= 2; ++step) {
    CAPTURE(step);
    ctx.trace_begin(rec);
    ctx.trace_close(ctx.trace_open("closed", "test", nullptr, 0));
    const std::size_t second = ctx.trace_open(step == 1 ? "second" : "unclosed", "test", nullptr, 0);
    if (step == 1) ctx.trace_close(second);
    REQUIRE_NOTHROW(ctx.trace_flush(rec, 0));
  }
  std::size_t closed = 0, second = 0, unclosed = 0;
  for (const auto& e : rec.events(0)) {
    closed += std::string_view(e.name) == "closed";
    second += std::string_view(e.name) == "second";
    unclosed += std::string_view(e.name) == "unclosed";
  }
  CHECK(closed == 2);
  CHECK(second == 1);
  CHECK(unclosed == 0);
}
