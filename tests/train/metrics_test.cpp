#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>

#include "train/helpers.hpp"

using namespace train_test;

TEST_CASE("metrics: rank_of ties resolve to the lowest index like argmax") {
  const float row[] = {0.5f, 2.0f, 2.0f, -1.0f};
  CHECK(ls::rank_of(row, 4, 1) == 0);
  CHECK(ls::rank_of(row, 4, 2) == 1);
  CHECK(ls::rank_of(row, 4, 0) == 2);
  CHECK(ls::rank_of(row, 4, 3) == 3);
  ls::metric_sums m;
  const std::int32_t labels[] = {2};
  ls::count_predictions(row, 1, 4, labels, 2, m);
  CHECK(m.correct == 0);
  CHECK(m.top_k_correct == 1);
  // labels the loss's rule let through beyond the outputs are misses (as training counts them)
  const std::int32_t beyond[] = {4, -1};
  ls::metric_sums b;
  ls::count_predictions(row, 1, 4, beyond, 4, b);
  ls::count_predictions(row, 1, 4, beyond + 1, 4, b);
  CHECK(b.labelled == 2);
  CHECK(b.correct == 0);
  CHECK(b.top_k_correct == 0);
}

TEST_CASE("evaluate and fit: rows with a class label beside a regression loss's targets evaluate, labels beyond the outputs counted as misses") {
  // mse checks no labels; a table may carry both (a CSV's label column and target columns). The
  // accuracy then counts label 0 of a one-output model as a hit and the others as misses, in
  // validation as in training (evaluate refused such labels while training took them).
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<ls::sequential<ls::dense<2, 1>>>(ls::seed{3});
  for (const std::size_t rows : {1u, 7u, 13u}) {
    CAPTURE(rows);
    auto t = std::make_shared<ls::data::table>();
    t->rows = rows;
    t->width = 2;
    t->target_width = 1;
    std::size_t zeros = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      t->values.push_back(static_cast<float>(r) * 0.25f);
      t->values.push_back(1.0f - static_cast<float>(r) * 0.125f);
      t->targets.push_back(static_cast<float>(r % 3));
      t->labels.push_back(static_cast<std::int32_t>(r % 3));
      zeros += r % 3 == 0 ? 1 : 0;
    }
    const auto data = ls::data::from_table(t) | ls::data::batched(3);
    const auto ev = ls::evaluate(s, m, ls::mse{}, data);
    CHECK(ev.samples == rows);
    CHECK(std::isfinite(ev.loss));
    CHECK(ev.accuracy == doctest::Approx(static_cast<double>(zeros) / static_cast<double>(rows)));
    const auto h = ls::fit(s, m, ls::sgd{.lr = 0.0f}, ls::mse{}, data, {.validation = data, .quiet = true});
    CHECK(h.last().val_accuracy == ev.accuracy);
    CHECK(h.last().train_accuracy == ev.accuracy);
  }
}

namespace {

// Reference metrics on one model instance, one sample at a time (independent of batching).
struct reference {
  double loss = 0;
  std::uint64_t correct = 0, top2 = 0, n = 0;
};
template <class M>
reference reference_metrics(M& replicated, std::size_t n, std::uint64_t seed) {
  const auto params = replicated.parameters_to_host();
  ls::replica<net> r(ls::host_context(1), ls::seed{0});
  std::copy(params.begin(), params.end(), r.model().parameters().data());
  const blobs b = make_blobs(n, seed);
  reference ref;
  for (std::size_t i = 0; i < n; ++i) {
    ls::data::shard sh;
    sh.features = b.features.data() + i * width;
    sh.labels = b.labels.data() + i;
    sh.size = 1;
    sh.width = width;
    sh.global_size = 1;
    const float* out = r.predict(sh, {});
    std::vector<std::size_t> order(classes);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t c) { return out[a] > out[c]; });
    const auto label = static_cast<std::size_t>(b.labels[i]);
    ref.correct += order[0] == label;
    ref.top2 += order[0] == label || order[1] == label;
    double mx = out[0];
    for (std::size_t j = 1; j < classes; ++j) mx = std::max(mx, double(out[j]));
    double z = 0;
    for (std::size_t j = 0; j < classes; ++j) z += std::exp(double(out[j]) - mx);
    ref.loss += std::log(z) + mx - double(out[label]);
    ++ref.n;
  }
  return ref;
}

template <class Strategy>
void check_exact_evaluation() {
  Strategy s;
  auto m = s.template replicate<net>(ls::seed{11});
  for (std::size_t n : {1u, 2u, 5u, 13u, 31u, 97u}) {
    for (std::size_t bs : {1u, 3u, 8u, 64u}) {
      CAPTURE(Strategy::replica_count);
      CAPTURE(n);
      CAPTURE(bs);
      const auto ev = ls::evaluate(s, m, ls::softmax_cross_entropy{}, eval_pipeline(n, bs), {.top_k = 2});
      const auto ref = reference_metrics(m, n, 2);
      CHECK(ev.samples == n);  // every sample exactly once: no padding, no drops
      CHECK(ev.sums.labelled == n);
      CHECK(ev.sums.correct == ref.correct);
      CHECK(ev.sums.top_k_correct == ref.top2);
      CHECK(ev.accuracy == doctest::Approx(double(ref.correct) / double(n)).epsilon(1e-12));
      CHECK(ev.loss == doctest::Approx(ref.loss / double(n)).epsilon(1e-5));
    }
  }
}

}  // namespace

TEST_CASE("evaluate: exact counts, accuracy and top-k for uneven sizes and 1..4 replicas") {
  check_exact_evaluation<ls::mirrored<ls::cpu<0>>>();
  check_exact_evaluation<ls::mirrored<ls::cpu<0>, ls::cpu<1>>>();
  check_exact_evaluation<ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>>();
  check_exact_evaluation<ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>, ls::cpu<3>>>();
}

TEST_CASE("evaluate: a label outside the model's classes is a data_error naming the label and the sample") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{3});
  for (const std::size_t bad_row : {0u, 6u, 12u}) {
    CAPTURE(bad_row);
    blobs b = make_blobs(13, 2);
    b.labels[bad_row] = 7;
    const auto data = ls::data::from_memory(std::move(b.features), width, std::move(b.labels)) | ls::data::batched(5);
    std::string msg;
    try {
      (void)ls::evaluate(s, m, ls::softmax_cross_entropy{}, data);
    } catch (const std::exception& e) {
      msg = e.what();
      try {  // a replica's error arrives nested
        std::rethrow_if_nested(e);
      } catch (const ls::data_error& inner) {
        msg = inner.what();
      } catch (...) {
      }
    }
    CAPTURE(msg);
    CHECK(msg.find("label 7 of sample " + std::to_string(bad_row) + " ") != std::string::npos);
    CHECK(msg.find("outside [0, 3)") != std::string::npos);
  }
}

TEST_CASE("evaluate: an empty dataset counts nothing") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  auto m = s.replicate<net>(ls::seed{3});
  const auto ev = ls::evaluate(s, m, ls::softmax_cross_entropy{}, eval_pipeline(0, 4));
  CHECK(ev.samples == 0);
  CHECK(std::isnan(ev.accuracy));
  CHECK_THROWS_AS(ls::evaluate(s, m, ls::softmax_cross_entropy{}, eval_pipeline(3, 4), {.top_k = 0}), ls::config_error);
}

TEST_CASE("predict: every row once, in pipeline order, same outputs for 1 and 3 replicas") {
  ls::mirrored<ls::cpu<0>> one;
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> three;
  auto m1 = one.replicate<net>(ls::seed{9});
  auto m3 = three.replicate<net>(ls::seed{9});
  for (std::size_t n : {1u, 7u, 40u}) {
    CAPTURE(n);
    const auto a = ls::predict(one, m1, eval_pipeline(n, 6));
    const auto b = ls::predict(three, m3, eval_pipeline(n, 6));
    REQUIRE(a.rows() == n);
    REQUIRE(b.rows() == n);
    CHECK(a.width == classes);
    std::set<std::uint64_t> seen(b.indices.begin(), b.indices.end());
    CHECK(seen.size() == n);
    CHECK(a.indices == b.indices);
    for (std::size_t i = 0; i < a.outputs.size(); ++i) CHECK(a.outputs[i] == doctest::Approx(b.outputs[i]).epsilon(1e-5));
  }
}

namespace {

/// replica_count_invariant over Ds with micro-shards of 4 rows (batches of 10 cut 4, 4, 2).
template <class... Ds>
struct invariant_of_4 : ls::basic_mirrored<ls::select_reducer_t<Ds...>, ls::determinism::replica_count_invariant, Ds...> {
  invariant_of_4()
      : ls::basic_mirrored<ls::select_reducer_t<Ds...>, ls::determinism::replica_count_invariant, Ds...>(
            ls::strategy_options{.micro_shard_rows = 4}) {}
};

/// Wide enough that a GEMM's blocking (and so its bits) can change with the row count.
using wide_net = ls::sequential<ls::dense<width, 192>, ls::relu, ls::dense<192, 160>, ls::tanh, ls::dense<160, classes>>;

/// predict and evaluate of `wide_net` (seed 5) on `n` samples in batches of 10 with strategy S.
template <class S>
std::pair<ls::predictions, ls::evaluation> invariant_pass(std::size_t n) {
  S s;
  auto m = s.template replicate<wide_net>(ls::seed{5});
  return {ls::predict(s, m, eval_pipeline(n, 10)), ls::evaluate(s, m, ls::softmax_cross_entropy{}, eval_pipeline(n, 10))};
}

template <class S>
void check_invariant_against_one(std::size_t n, const std::pair<ls::predictions, ls::evaluation>& one) {
  CAPTURE(S::replica_count);
  const auto [p, e] = invariant_pass<S>(n);
  CHECK(p.indices == one.first.indices);
  REQUIRE(p.outputs.size() == one.first.outputs.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < p.outputs.size(); ++i) differ += p.outputs[i] != one.first.outputs[i];
  CHECK(differ == 0);  // the same bits, not merely close
  CHECK(e.samples == one.second.samples);
  CHECK(e.sums.correct == one.second.sums.correct);
  CHECK(e.sums.top_k_correct == one.second.sums.top_k_correct);
  if (n == 0)
    CHECK((std::isnan(e.loss) && std::isnan(one.second.loss)));
  else
    CHECK(e.loss == doctest::Approx(one.second.loss).epsilon(1e-12));  // per-row losses equal; only their sum's order differs
}

}  // namespace

TEST_CASE("predict and evaluate under replica_count_invariant: each micro-shard one forward pass, the same outputs for 1, 2 and 3 replicas") {
  for (const std::size_t n : {0u, 1u, 7u, 10u, 29u, 41u}) {
    CAPTURE(n);
    const auto one = invariant_pass<invariant_of_4<ls::cpu<0>>>(n);
    REQUIRE(one.first.rows() == n);
    CHECK(one.second.samples == n);
    check_invariant_against_one<invariant_of_4<ls::cpu<0>, ls::cpu<1>>>(n, one);
    check_invariant_against_one<invariant_of_4<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>>(n, one);
  }
}

TEST_CASE("evaluate: a double model's accuracy ranks its double outputs (rounded to float they would tie)") {
  // logits [1, 1 + 2^-30]: label 1 is the maximum in double; in float both are 1 and a tie goes to 0
  ls::mirrored<ls::cpu<0>> s;
  auto m = s.replicate<ls::sequential<ls::dense<1, 2>>, double>(ls::seed{1});
  const double w1 = 1.0 + std::ldexp(1.0, -30);
  m.load_parameters(std::vector<double>{1.0, w1, 0.0, 0.0});  // weights (1 x 2), then the biases
  for (const std::size_t rows : {1u, 5u}) {
    CAPTURE(rows);
    const auto data =
        ls::data::from_memory(std::vector<float>(rows, 1.0f), 1, std::vector<std::int32_t>(rows, 1)) | ls::data::batched(2);
    const auto ev = ls::evaluate(s, m, ls::softmax_cross_entropy{}, data, {.top_k = 1});
    CHECK(ev.accuracy == 1.0);
    CHECK(ev.top_k_accuracy == 1.0);
  }
}
