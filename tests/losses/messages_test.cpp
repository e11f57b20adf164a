// The messages of a bad label and of a logit that is not finite: from the loss itself, from a
// replica (which checks the labels on the host before the loss runs), and from a training step of
// a strategy (the replica, the sample's dataset index and the step named).
#include <doctest/doctest.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <string>
#include <vector>

#include <lockstep/lockstep.hpp>

#include "losses/xent_reference.hpp"

namespace ls = lockstep;

namespace {

template <class F>
std::string data_error_of(F&& f) {
  try {
    f();
  } catch (const ls::data_error& e) {
    return e.what();
  }
  return "(no data_error)";
}

/// The innermost message of what `f` throws (a replica_error nests the replica's failure).
template <class F>
std::string innermost_of(F&& f) {
  std::string msg = "(nothing thrown)";
  try {
    f();
  } catch (const std::exception& e) {
    msg = e.what();
    std::exception_ptr p;
    const std::exception* cur = &e;
    while (const auto* n = dynamic_cast<const std::nested_exception*>(cur)) {
      if (!(p = n->nested_ptr())) break;
      try {
        std::rethrow_exception(p);
      } catch (const std::exception& inner) {
        msg = inner.what();
        cur = &inner;
      }
    }
  }
  return msg;
}

}  // namespace

static_assert(ls::takes_class_labels<ls::softmax_cross_entropy> && !ls::takes_class_labels<ls::mse>);
static_assert(ls::loss_name<ls::softmax_cross_entropy>() == "lockstep::softmax_cross_entropy");

TEST_CASE("softmax_cross_entropy: a bad label and a non-finite logit are two messages, each naming the value") {
  const ls::softmax_cross_entropy loss;
  const ls::host_context ctx;
  std::vector<float> z(4 * 3, 0.5f), scratch(4 * 2);
  std::vector<std::int32_t> labels = {0, 2, 5, 1};
  CHECK(data_error_of([&] {
          xent_ref::evaluate_cols(loss, ctx, z.data(), 4, 3, ls::targets<float>{labels.data(), nullptr, 0},
                                  static_cast<float*>(nullptr), scratch.data());
        }) == "lockstep::softmax_cross_entropy: label 5 (row 2) is outside [0, 3): the model has 3 outputs");
  labels[2] = 1;
  // -inf in one column of a row whose maximum is finite is a probability of 0, not an error (row 0
  // has one, before the bad row); a row of -inf has no maximum. With and without smoothing.
  z[0 * 3 + 1] = -std::numeric_limits<float>::infinity();
  for (const float smoothing : {0.0f, 0.1f})
    for (const float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()}) {
      CAPTURE(smoothing);
      CAPTURE(bad);
      std::vector<float> zz = z;
      if (bad < 0) zz[3 * 3 + 0] = zz[3 * 3 + 1] = bad;  // row 3: -inf everywhere
      zz[3 * 3 + 2] = bad;                              // row 3, column 2
      const std::string msg = data_error_of([&] {
        xent_ref::evaluate_cols(ls::softmax_cross_entropy{smoothing}, ctx, zz.data(), 4, 3,
                                ls::targets<float>{labels.data(), nullptr, 0}, static_cast<float*>(nullptr),
                                scratch.data());
      });
      CAPTURE(msg);
      const std::string want = bad != bad ? "logit 2 of row 3 is NaN"
                               : bad > 0  ? "logit 2 of row 3 is +inf"
                                          : "logit 0 of row 3 is -inf, as is every logit of the row";
      CHECK(msg.find("lockstep::softmax_cross_entropy: " + want) == 0);
      CHECK(msg.find("label") == std::string::npos);
    }
}

TEST_CASE("rank_of: a NaN output ranks above every number, NaNs tie by index, as the loss's arg-max") {
  const float n = std::numeric_limits<float>::quiet_NaN();
  const float all_nan[3] = {n, n, n}, one_nan[3] = {n, 1, 2}, plain[4] = {1, 3, 3, 0};
  CHECK(ls::rank_of(all_nan, 3, 0) == 0);
  CHECK(ls::rank_of(all_nan, 3, 2) == 2);
  CHECK(ls::rank_of(one_nan, 3, 2) == 1);
  CHECK(ls::rank_of(one_nan, 3, 1) == 2);
  CHECK(ls::rank_of(one_nan, 3, 0) == 0);
  CHECK(ls::rank_of(plain, 4, 1) == 0);
  CHECK(ls::rank_of(plain, 4, 2) == 1);
  CHECK(ls::rank_of(plain, 4, 0) == 2);
  CHECK(ls::rank_of(plain, 4, 3) == 3);
  // the top-1 hit agrees with softmax_cross_entropy's arg-max on rows with a NaN
  const ls::host_context ctx;
  for (std::int32_t label = 0; label < 3; ++label) {
    std::vector<float> scratch(2);
    std::int32_t y = label;
    std::vector<float> row(one_nan, one_nan + 3);
    const float hit = [&] {
      ls::detail::softmax_xent_smoothed_row_op<float>{row.data(), &y, nullptr, scratch.data(), scratch.data() + 1, 3,
                                                      0.1f}(0);
      return scratch[1];
    }();
    CAPTURE(label);
    CHECK((hit == 1.0f) == (ls::rank_of(row.data(), 3, static_cast<std::size_t>(label)) == 0));
  }
}

TEST_CASE("replica: labels are checked on the host before the loss, for training and evaluation") {
  using net = ls::sequential<ls::dense<4, 6>, ls::relu, ls::dense<6, 5>>;
  ls::replica<net> rep(ls::host_context{1}, ls::seed{1});
  ls::data::batch b;
  b.width = 4;
  b.features.assign(6 * 4, 0.25f);
  b.labels = {0, 1, 2, 3, 4, 4};
  b.indices = {10, 11, 12, 13, 14, 15};
  b.labels[4] = -2;
  ls::pass_info info{true, 1, 7, 0, 0};
  info.rank = 3;
  CHECK(data_error_of([&] { rep.forward_backward(ls::softmax_cross_entropy{}, ls::data::whole(b), info); }) ==
        "lockstep::softmax_cross_entropy: label -2 of sample 14 (row 4 of replica 3's shard at step 7) is outside [0, "
        "5): the model has 5 outputs");
  CHECK(data_error_of([&] { rep.evaluate(ls::softmax_cross_entropy{}, ls::data::whole(b), info); }) ==
        "lockstep::softmax_cross_entropy: label -2 of sample 14 (row 4) is outside [0, 5): the model has 5 outputs");
}

TEST_CASE("a 5-output model on 10-class data: the training step names the label, the sample, the replica and the step") {
  // Two replicas; the global batch of 8 rows is cut 4 + 4, so row 3 of replica 0's shard is row 3
  // of the batch, and row 2 of replica 1's is row 6.
  using net = ls::sequential<ls::dense<3, 8>, ls::relu, ls::dense<8, 5>>;
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> strategy;
  auto model = strategy.replicate<net>(ls::seed{3});
  ls::data::batch b;
  b.width = 3;
  b.features.assign(8 * 3, 0.5f);
  b.labels = {0, 1, 2, 9, 4, 3, 2, 1};
  b.indices = {40, 7, 12, 41, 3, 5, 8, 9};
  const auto db = [&] {
    ls::data::distributed_batch d;
    d.global = std::make_shared<const ls::data::batch>(b);
    d.shards = ls::data::split(*d.global, 2);
    return d;
  };
  const std::string expected =
      "lockstep::softmax_cross_entropy: label 9 of sample 41 (row 3 of replica 0's shard at step 0) is outside [0, 5): "
      "the model has 5 outputs";
  CHECK(innermost_of([&] { strategy.train_step(model, ls::sgd{}, ls::softmax_cross_entropy{}, db()); }) == expected);
  CHECK(model.step() == 0);  // nothing was applied
  // Through fit, as a user meets it.
  auto data = ls::data::from_memory(b.features, 3, b.labels) | ls::data::batched(8);
  CHECK(innermost_of([&] { (void)ls::fit(strategy, model, ls::sgd{}, ls::softmax_cross_entropy{}, data, {.quiet = true}); })
            .find("lockstep::softmax_cross_entropy: label 9 of sample 3 (row 3 of replica 0's shard at step 0) is outside "
                  "[0, 5): the model has 5 outputs") == 0);
  // In replica 1's shard.
  b.labels = {0, 1, 2, 3, 4, 3, 12, 1};
  CHECK(innermost_of([&] { strategy.train_step(model, ls::sgd{}, ls::softmax_cross_entropy{}, db()); }) ==
        "lockstep::softmax_cross_entropy: label 12 of sample 8 (row 2 of replica 1's shard at step 0) is outside [0, 5): "
        "the model has 5 outputs");
}

TEST_CASE("mse: a batch without regression targets and targets of another width are two messages") {
  ls::host_context ctx;
  const ls::mse loss;
  std::vector<float> out(2 * 3, 0.5f), scratch(2), values(2 * 2, 1.0f);
  const std::vector<std::int32_t> labels = {0, 1};
  using args = ls::loss_args<float, ls::host_context, ls::shape<3>>;
  const auto message = [&](const ls::targets<float>& t) {
    try {
      (void)loss.evaluate(ctx, args{{out.data(), 2}, t, {}, scratch.data()});
    } catch (const ls::shape_error& e) {
      return std::string(e.what());
    }
    return std::string("(no shape_error)");
  };
  CHECK(message(ls::targets<float>{labels.data(), nullptr, 0}) ==
        "lockstep::mse: the batch has no regression targets (a dataset of class labels?); mse needs 3 target values "
        "per row, one per model output");
  CHECK(message(ls::targets<float>{nullptr, values.data(), 2}) == "lockstep::mse: targets have width 2 but the model outputs 3");
}
