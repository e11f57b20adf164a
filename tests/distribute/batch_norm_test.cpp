// Batch norm over the global batch through the strategies: a CNN with batch norm trains on N
// replicas like one device (parameters and running statistics), also with empty and uneven
// shards; a network whose only trainable layers are batch norms trains bitwise alike on 1 to 4
// replicas; replica_count_invariant refuses batch norm; evaluation uses the running statistics and
// gives the same results on every replica count; checkpoints carry the running statistics exactly.

#include <doctest/doctest.h>

#include <chrono>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/layers/batch_norm.hpp>
#include <lockstep/layers/conv.hpp>

#include "distribute/common.hpp"

using namespace dist_test;
namespace ls = lockstep;

namespace {

/// A small CNN with batch norm on 8 x 8 grey images (flat rows of 64).
using bn_cnn = ls::sequential<ls::reshape<1, 8, 8>, ls::conv2d<4, 3, 1, 1>, ls::batch_norm<>, ls::relu,
                              ls::max_pool2d<2>, ls::flatten, ls::dense<64, 10>>;
/// Only batch norms are trainable: per channel of 10 x 2 x 2 images, then per feature of the pooled rows.
using bn_only = ls::sequential<ls::reshape<10, 2, 2>, ls::batch_norm<>, ls::relu, ls::global_avg_pool,
                               ls::batch_norm<1, 4>>;

static_assert(ls::replicated<bn_cnn>::param_count == (4 * 9 + 4) + 8 + (64 * 10 + 10));
static_assert(ls::replicated<bn_cnn>::stored_count == ls::replicated<bn_cnn>::param_count + 8);
static_assert(ls::replicated<bn_only>::param_count == 40 && ls::replicated<bn_only>::stored_count == 80);

template <class Net>
constexpr std::size_t width_of = ls::model<Net>::input_size;

/// A global batch of `rows` samples of `width` features (values in [-1, 2), 10 classes), keyed by `key`.
ls::data::batch make_rows(std::size_t rows, std::size_t width, std::uint64_t key) {
  ls::data::batch b;
  b.width = width;
  const ls::counter_rng rng(4321, key);
  b.features.resize(rows * width);
  for (std::size_t i = 0; i < b.features.size(); ++i) b.features[i] = 3 * rng.uniform(i) - 1;
  for (std::size_t r = 0; r < rows; ++r) {
    b.labels.push_back(static_cast<std::int32_t>(rng.u32(rows * width + r) % 10));
    b.indices.push_back(key * 1000 + r);
  }
  return b;
}

const ls::sgd optimiser{.lr = 0.05f, .momentum = 0.9f};

/// Trains replicated model `m` with strategy `s` on the 20 global batches of step_sizes() from
/// `first` on (batch i keyed by i); checks every replica holds the same parameters and state.
template <class Net, class S, class M>
void train_steps(S& s, M& m, std::size_t first = 0, std::size_t last = 20) {
  for (std::size_t i = first; i < last; ++i) {
    const auto b = make_rows(step_sizes()[i], width_of<Net>, i);
    const auto st = ls::train_step(s, m, optimiser, ls::softmax_cross_entropy{}, distributed(b, s.num_replicas()));
    REQUIRE(st.count == b.rows());
    REQUIRE(std::isfinite(st.loss_sum));
  }
  const auto p = m.parameters_to_host();
  for (std::size_t r = 1; r < m.size(); ++r) {
    CAPTURE(r);
    CHECK(std::memcmp(p.data(), m.replica(r).model().parameters().data(), p.size() * sizeof(float)) == 0);
  }
}

/// A fresh Net trained for the 20 steps with `s`: parameters, then running statistics.
template <class Net, class S>
std::vector<float> trained(S& s) {
  auto m = s.template replicate<Net>(ls::seed{42});
  train_steps<Net>(s, m);
  CHECK(m.step() == step_sizes().size());
  return m.parameters_to_host();
}

std::vector<float> slice(const std::vector<float>& v, std::size_t lo, std::size_t hi) {
  return {v.begin() + static_cast<std::ptrdiff_t>(lo), v.begin() + static_cast<std::ptrdiff_t>(hi)};
}

/// The running statistics of a stored parameter vector of Net (everything after the parameters).
template <class Net>
std::vector<float> running_stats(const std::vector<float>& stored) {
  return slice(stored, ls::replicated<Net>::param_count, ls::replicated<Net>::stored_count);
}

/// The running statistics of a fresh Net: means 0, variances 1.
template <class Net>
std::vector<float> initial_stats() {
  ls::one_device<ls::cpu<0>> one;
  return running_stats<Net>(one.replicate<Net>(ls::seed{42}).parameters_to_host());
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// The message of the config_error that `f` throws (the step refuses before any replica runs,
/// so it is not wrapped in a replica_error), or a description of what happened instead.
std::string config_error_of(const auto& f) {
  try {
    f();
  } catch (const ls::config_error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(another exception: ") + e.what() + ")";
  }
  return "(no exception)";
}

}  // namespace

TEST_CASE("batch norm CNN: N replicas train like one device, parameters and running statistics") {
  constexpr std::size_t P = ls::replicated<bn_cnn>::param_count, stored = ls::replicated<bn_cnn>::stored_count;
  ls::one_device<ls::cpu<0>> one;
  const auto ref = trained<bn_cnn>(one);
  REQUIRE(ref.size() == stored);
  // Training moved the running statistics away from their start (mean 0, variance 1).
  const auto start = initial_stats<bn_cnn>();
  CHECK(running_stats<bn_cnn>(ref) != start);
  const auto check = [&](const std::vector<float>& p, std::size_t replicas) {
    CAPTURE(replicas);
    REQUIRE(p.size() == stored);
    CHECK(relative_difference(slice(p, 0, P), slice(ref, 0, P)) <= 1e-5);
    CHECK(relative_difference(running_stats<bn_cnn>(p), running_stats<bn_cnn>(ref)) <= 1e-5);
  };
  {
    ls::mirrored<ls::cpu<0>, ls::cpu<1>> two;
    check(trained<bn_cnn>(two), 2);
  }
  // The run-time form over 2, 3 and 4 replicas: step_sizes() holds global batches of 1, 2 and 3
  // rows (empty shards) and uneven ones (33, 17, 5, 37).
  for (const std::size_t n : {2u, 3u, 4u}) {
    ls::mirrored<ls::cpus> s(ls::device_selection::first(n));
    REQUIRE(s.num_replicas() == n);
    check(trained<bn_cnn>(s), n);
  }
}

TEST_CASE("batch norm CNN: a global batch smaller than the replica count leaves shards empty and still trains alike") {
  // Single steps on 1, 2 and 3 rows over 4 replicas from the same start: the statistics are those
  // of the few rows that exist; the empty replicas still take part in every exchange.
  for (const std::size_t rows : {1u, 2u, 3u, 5u}) {
    CAPTURE(rows);
    const auto b = make_rows(rows, 64, 100 + rows);
    ls::one_device<ls::cpu<0>> one;
    auto m1 = one.replicate<bn_cnn>(ls::seed{9});
    ls::train_step(one, m1, optimiser, ls::softmax_cross_entropy{}, distributed(b, 1));
    ls::mirrored<ls::cpus> four(ls::device_selection::first(4));
    auto m4 = four.replicate<bn_cnn>(ls::seed{9});
    const auto d = distributed(b, 4);
    std::size_t empty = 0;
    for (const auto& sh : d.shards) empty += sh.size == 0 ? 1 : 0;
    CHECK(empty == (rows < 4 ? 4 - rows : 0));
    const auto st = ls::train_step(four, m4, optimiser, ls::softmax_cross_entropy{}, d);
    CHECK(st.count == rows);
    const auto a = m1.parameters_to_host(), c = m4.parameters_to_host();
    REQUIRE(a.size() == c.size());
    CHECK(relative_difference(c, a) <= 1e-6);
    // The running statistics saw the batch: bitwise the same (they are computed from the global
    // rows in global order, whatever the split).
    CHECK(bitwise_equal(running_stats<bn_cnn>(c), running_stats<bn_cnn>(a)));
    CHECK(running_stats<bn_cnn>(a) != initial_stats<bn_cnn>());
  }
}

TEST_CASE("a network whose only trainable layers are batch norms trains bitwise alike on 1, 2, 3 and 4 replicas") {
  ls::one_device<ls::cpu<0>> one;
  const auto p1 = trained<bn_only>(one);
  REQUIRE(p1.size() == ls::replicated<bn_only>::stored_count);
  {
    ls::one_device<ls::cpu<0>> again;
    CHECK(bitwise_equal(trained<bn_only>(again), p1));  // run to run
  }
  ls::one_device<ls::cpu<0>> fresh;
  const auto initial = fresh.replicate<bn_only>(ls::seed{42}).parameters_to_host();
  CHECK(!bitwise_equal(slice(p1, 0, 40), slice(initial, 0, 40)));  // training moved γ and β
  CHECK(running_stats<bn_only>(p1) != running_stats<bn_only>(initial));
  {
    ls::mirrored<ls::cpu<0>, ls::cpu<1>> two;
    CHECK(bitwise_equal(trained<bn_only>(two), p1));
  }
  {
    ls::basic_mirrored<ls::reduce_to_one_device<ls::cpu<2>>, ls::determinism::run_to_run, ls::cpu<0>, ls::cpu<1>,
                       ls::cpu<2>>
        three_to_one;
    CHECK(bitwise_equal(trained<bn_only>(three_to_one), p1));
  }
  for (const std::size_t n : {1u, 2u, 3u, 4u}) {
    CAPTURE(n);
    ls::mirrored<ls::cpus> s(ls::device_selection::first(n));
    CHECK(bitwise_equal(trained<bn_only>(s), p1));
  }
}

namespace {
/// Strategy S with a bucket per layer and a short collective timeout.
template <class S>
struct bucket_per_layer : S {
  bucket_per_layer() : S(ls::strategy_options{.timeout = std::chrono::seconds(5), .bucket_bytes = 0}) {}
};
}  // namespace

TEST_CASE("batch norm with a bucket per layer: reduce_to_one_device on the host trains as host_allreduce, with no wait") {
  // The dense layer's bucket is summed while the replicas run batch norm's backward, whose row
  // exchange makes each wait for the others: the aggregating replica must not wait for another
  // replica's share of a bucket (it waited until the timeout about every other step).
  bucket_per_layer<ls::mirrored<ls::cpu<0>, ls::cpu<1>>> all2;
  bucket_per_layer<ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>> all3;
  const auto want2 = trained<bn_cnn>(all2), want3 = trained<bn_cnn>(all3);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    bucket_per_layer<ls::basic_mirrored<ls::reduce_to_one_device<ls::cpu<0>>, ls::determinism::run_to_run, ls::cpu<0>,
                                        ls::cpu<1>>>
        to_first;
    CHECK(bitwise_equal(trained<bn_cnn>(to_first), want2));
    bucket_per_layer<ls::basic_mirrored<ls::reduce_to_one_device<ls::cpu<1>>, ls::determinism::run_to_run, ls::cpu<0>,
                                        ls::cpu<1>, ls::cpu<2>>>
        to_middle;
    CHECK(bitwise_equal(trained<bn_cnn>(to_middle), want3));
  }
}

TEST_CASE("replica_count_invariant refuses batch norm with a config_error that names it") {
  const auto b = make_rows(8, 64, 1);
  {
    ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpu<0>, ls::cpu<1>> s;
    auto m = s.replicate<bn_cnn>(ls::seed{1});
    const auto before = m.parameters_to_host();
    const std::string what =
        config_error_of([&] { ls::train_step(s, m, optimiser, ls::softmax_cross_entropy{}, distributed(b, 2)); });
    CAPTURE(what);
    CHECK(what.find("batch_norm") != std::string::npos);
    CHECK(what.find("replica_count_invariant") != std::string::npos);
    CHECK(m.parameters_to_host() == before);  // nothing was applied
  }
  {  // the run-time form, one replica: refused too (the micro-shards of one replica still run apart)
    ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus> s(
        ls::device_selection::first(1));
    auto m = s.replicate<bn_only>(ls::seed{1});
    const auto c = make_rows(8, 40, 1);
    const std::string what =
        config_error_of([&] { ls::train_step(s, m, optimiser, ls::softmax_cross_entropy{}, distributed(c, 1)); });
    CAPTURE(what);
    CHECK(what.find("batch_norm") != std::string::npos);
  }
}

namespace {

/// Evaluates and predicts, on every replica count and several batchings, a trained Net loaded into
/// each strategy, and compares with one device: exactly when `bitwise`, else (a dense layer's
/// matrix product may round a row differently in batches of another size) to float rounding.
template <class Net>
void check_evaluation(bool bitwise) {
  CAPTURE(bitwise);
  std::vector<float> stored;
  {  // trained, so that the running statistics are not the initial ones
    ls::one_device<ls::cpu<0>> one;
    stored = trained<Net>(one);
  }
  REQUIRE(running_stats<Net>(stored) != initial_stats<Net>());
  const auto data_of = [](std::size_t batch) {
    const auto b = make_rows(61, 64, 777);  // 61 samples: uneven last batches
    std::vector<float> x = b.features;
    std::vector<std::int32_t> y = b.labels;
    return ls::data::from_memory(std::move(x), 64, std::move(y)) | ls::data::batched(batch);
  };
  const auto run = [&](auto& s, std::size_t batch) {
    auto m = s.template replicate<Net>(ls::seed{5});
    m.load_parameters(std::span<const float>(stored.data(), stored.size()));
    const auto data = data_of(batch);
    const auto e = ls::evaluate(s, m, ls::softmax_cross_entropy{}, data);
    const auto p = ls::predict(s, m, data);
    CHECK(bitwise_equal(m.parameters_to_host(), stored));  // evaluation leaves the running statistics alone
    return std::pair{e, p};
  };
  ls::one_device<ls::cpu<0>> one;
  const auto first = run(one, 13);
  const ls::evaluation& e1 = first.first;
  const ls::predictions& p1 = first.second;
  REQUIRE(e1.samples == 61);
  REQUIRE(p1.rows() == 61);
  REQUIRE(std::isfinite(e1.loss));
  const auto same = [&](const std::pair<ls::evaluation, ls::predictions>& got) {
    const auto& [e, p] = got;
    CHECK(e.samples == e1.samples);
    CHECK(e.sums.correct == e1.sums.correct);
    CHECK(e.sums.top_k_correct == e1.sums.top_k_correct);
    CHECK(std::abs(e.loss - e1.loss) <= (bitwise ? 1e-12 : 1e-6) * std::abs(e1.loss));
    CHECK(p.indices == p1.indices);
    REQUIRE(p.outputs.size() == p1.outputs.size());
    if (bitwise) {
      CHECK(bitwise_equal(p.outputs, p1.outputs));  // each row's outputs, bit for bit
    } else {
      // Were the batch's own statistics used, outputs would move by far more than rounding.
      double worst = 0;
      for (std::size_t i = 0; i < p.outputs.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(p.outputs[i]) - p1.outputs[i]) /
                                    std::max(1.0, std::abs(static_cast<double>(p1.outputs[i]))));
      CHECK(worst <= 1e-5);
    }
  };
  {  // other batchings on one device: a row's output does not depend on the other rows of its batch
    ls::one_device<ls::cpu<0>> again;
    same(run(again, 61));
    same(run(again, 7));
    same(run(again, 1));
  }
  {
    ls::mirrored<ls::cpu<0>, ls::cpu<1>> two;
    same(run(two, 13));
  }
  for (const std::size_t n : {2u, 3u, 4u}) {
    CAPTURE(n);
    ls::mirrored<ls::cpus> s(ls::device_selection::first(n));
    same(run(s, 13));
    same(run(s, 2));  // global batches of 2 rows over up to 4 replicas: empty shards
  }
}

/// Batch norm between a convolution (one matrix product per image) and global pooling: every
/// row's evaluation is computed alike whatever the batch, so results can be compared bit for bit.
using bn_conv_only =
    ls::sequential<ls::reshape<1, 8, 8>, ls::conv2d<10, 3, 1, 1>, ls::batch_norm<>, ls::relu, ls::global_avg_pool>;

}  // namespace

TEST_CASE("evaluate: batch norm uses its running statistics, bitwise the same on every replica count and batching") {
  check_evaluation<bn_conv_only>(true);
}

TEST_CASE("evaluate: a batch norm CNN with a dense head gives the same results on every replica count") {
  check_evaluation<bn_cnn>(false);
}

TEST_CASE("checkpoints carry the running statistics: save, restore into a fresh model, continue bitwise") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("lockstep_bn_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path file = dir / "bn.lsck";
  constexpr std::size_t k = 8;

  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> s;
  auto a = s.replicate<bn_cnn>(ls::seed{42});
  train_steps<bn_cnn>(s, a, 0, k);
  const auto at_save = a.parameters_to_host();
  ls::save_checkpoint(file, ls::capture(a));
  train_steps<bn_cnn>(s, a, k, 20);
  const auto continued = a.parameters_to_host();

  const auto loaded = ls::load_checkpoint(file, ls::model_signature<bn_cnn>());
  REQUIRE(loaded.parameters.size() == ls::replicated<bn_cnn>::stored_count);
  CHECK(bitwise_equal(loaded.parameters, at_save));  // the state after the parameters, exactly
  CHECK(running_stats<bn_cnn>(loaded.parameters) != initial_stats<bn_cnn>());
  CHECK(loaded.step == k);

  auto b = s.replicate<bn_cnn>(ls::seed{1234});  // another initialisation: restore replaces all of it
  ls::restore(b, loaded, optimiser);
  CHECK(bitwise_equal(b.parameters_to_host(), at_save));
  CHECK(b.step() == k);
  train_steps<bn_cnn>(s, b, k, 20);
  CHECK(bitwise_equal(b.parameters_to_host(), continued));

  // The running statistics in the checkpoint matter: restored without them (reset to mean 0,
  // variance 1), the parameters continue alike but the running statistics end elsewhere.
  auto tampered = loaded;
  const auto fresh_stats = initial_stats<bn_cnn>();
  std::copy(fresh_stats.begin(), fresh_stats.end(),
            tampered.parameters.begin() + static_cast<std::ptrdiff_t>(ls::replicated<bn_cnn>::param_count));
  auto c = s.replicate<bn_cnn>(ls::seed{42});
  ls::restore(c, tampered, optimiser);
  train_steps<bn_cnn>(s, c, k, 20);
  const auto c_end = c.parameters_to_host();
  constexpr std::size_t P = ls::replicated<bn_cnn>::param_count;
  CHECK(bitwise_equal(slice(c_end, 0, P), slice(continued, 0, P)));  // training uses batch statistics only
  CHECK(!bitwise_equal(running_stats<bn_cnn>(c_end), running_stats<bn_cnn>(continued)));
  fs::remove_all(dir);
}
