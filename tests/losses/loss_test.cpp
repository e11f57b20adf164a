// Tests of losses/: values against naive references, gradients against finite differences (in
// double), the sum-and-count contract, and the errors for bad labels and targets.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <lockstep/lockstep.hpp>

#include "losses/xent_reference.hpp"

namespace ls = lockstep;

static_assert(ls::loss<ls::softmax_cross_entropy> && ls::loss<ls::mse>);
static_assert(!ls::loss<int>);

namespace {

struct problem {
  std::size_t rows, cols;
  std::vector<double> z, t;
  std::vector<std::int32_t> labels;
  problem(std::size_t r, std::size_t c, std::uint64_t seed, double spread = 3.0)
      : rows(r), cols(c), z(r * c), t(r * c), labels(r) {
    const ls::counter_rng rng(seed, 0);
    for (std::size_t i = 0; i < z.size(); ++i) z[i] = (rng.uniform_double(i) * 2 - 1) * spread;
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = rng.uniform_double(50000 + i) * 2 - 1;
    for (std::size_t i = 0; i < r; ++i) labels[i] = static_cast<std::int32_t>(rng.u32(90000 + i) % c);
  }
  ls::targets<double> targets() const { return {labels.data(), t.data(), cols}; }
};

template <class Loss>
double reference(const problem& p);

template <>
double reference<ls::softmax_cross_entropy>(const problem& p) {
  double total = 0;
  for (std::size_t r = 0; r < p.rows; ++r) {
    const double* z = p.z.data() + r * p.cols;
    const double m = *std::max_element(z, z + p.cols);
    double s = 0;
    for (std::size_t c = 0; c < p.cols; ++c) s += std::exp(z[c] - m);
    total += -(z[p.labels[r]] - m - std::log(s));
  }
  return total;
}

template <>
double reference<ls::mse>(const problem& p) {
  double total = 0;
  for (std::size_t r = 0; r < p.rows; ++r) {
    double s = 0;
    for (std::size_t c = 0; c < p.cols; ++c) {
      const double d = p.z[r * p.cols + c] - p.t[r * p.cols + c];
      s += d * d;
    }
    total += s / double(p.cols);
  }
  return total;
}

template <class Loss>
void check_loss(std::size_t rows, std::size_t cols, std::uint64_t seed) {
  CAPTURE(rows);
  CAPTURE(cols);
  const Loss loss;
  const ls::host_context ctx;
  problem p(rows, cols, seed);
  std::vector<double> grad(rows * cols + 1, std::nan("")), scratch(rows * Loss::scratch_per_row + 1);
  grad[rows * cols] = 7.0;
  const ls::loss_sum l = xent_ref::evaluate_cols(loss, ctx, p.z.data(), rows, cols, p.targets(), grad.data(), scratch.data());
  CHECK(l.count == rows);
  CHECK(l.sum == doctest::Approx(reference<Loss>(p)).epsilon(1e-12));
  CHECK(grad[rows * cols] == 7.0);
  // without a gradient: the same sum
  const ls::loss_sum l2 =
      xent_ref::evaluate_cols(loss, ctx, p.z.data(), rows, cols, p.targets(), static_cast<double*>(nullptr), scratch.data());
  CHECK(l2.sum == l.sum);
  CHECK(l2.count == rows);
  // the gradient of the SUM against 5-point central differences
  const double h = 1e-4;
  double worst = 0, scale = 0;
  std::vector<double> numeric(rows * cols);
  for (std::size_t i = 0; i < rows * cols; ++i) {
    const double v0 = p.z[i];
    auto at = [&](double d) {
      p.z[i] = v0 + d;
      return xent_ref::evaluate_cols(loss, ctx, p.z.data(), rows, cols, p.targets(), static_cast<double*>(nullptr), scratch.data())
          .sum;
    };
    numeric[i] = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
    p.z[i] = v0;
    scale = std::max(scale, std::abs(numeric[i]));
  }
  for (std::size_t i = 0; i < rows * cols; ++i) {
    REQUIRE(std::isfinite(grad[i]));
    worst = std::max(worst, std::abs(grad[i] - numeric[i]) /
                                std::max({std::abs(grad[i]), std::abs(numeric[i]), 1e-3 * scale}));
  }
  CHECK(worst < 1e-6);
}

}  // namespace

TEST_CASE_TEMPLATE("losses: value and gradient of the sum over several shapes", L, ls::softmax_cross_entropy,
                   ls::mse) {
  check_loss<L>(1, 1, 1);
  check_loss<L>(1, 2, 2);
  check_loss<L>(3, 5, 3);
  check_loss<L>(7, 3, 4);
  check_loss<L>(13, 10, 5);
}

TEST_CASE_TEMPLATE("losses: an empty shard sums to zero over zero samples", L, ls::softmax_cross_entropy, ls::mse) {
  const ls::host_context ctx;
  const L loss;
  const ls::loss_sum l = xent_ref::evaluate_cols(loss, ctx, static_cast<const float*>(nullptr), 0, 4, ls::targets<float>{},
                                       static_cast<float*>(nullptr), static_cast<float*>(nullptr));
  CHECK(l.sum == 0.0);
  CHECK(l.count == 0);
}

TEST_CASE("losses: the sum is additive over row splits, so shards can be summed") {
  const ls::host_context ctx;
  problem p(11, 4, 8);
  std::vector<double> scratch(11 * ls::softmax_cross_entropy::scratch_per_row);
  for (std::size_t cut : {0u, 1u, 5u, 11u}) {
    CAPTURE(cut);
    auto part = [&](const auto& loss, std::size_t first, std::size_t n) {
      ls::targets<double> t{p.labels.data() + first, p.t.data() + first * 4, 4};
      return xent_ref::evaluate_cols(loss, ctx, p.z.data() + first * 4, n, 4, t, static_cast<double*>(nullptr), scratch.data());
    };
    for (int which = 0; which < 2; ++which) {
      ls::loss_sum whole, a, b;
      if (which == 0) {
        whole = part(ls::softmax_cross_entropy{}, 0, 11);
        a = part(ls::softmax_cross_entropy{}, 0, cut);
        b = part(ls::softmax_cross_entropy{}, cut, 11 - cut);
      } else {
        whole = part(ls::mse{}, 0, 11);
        a = part(ls::mse{}, 0, cut);
        b = part(ls::mse{}, cut, 11 - cut);
      }
      CHECK(a.count + b.count == whole.count);
      CHECK(a.sum + b.sum == doctest::Approx(whole.sum).epsilon(1e-13));
    }
  }
}

TEST_CASE("softmax_cross_entropy is stable for large logits and in float") {
  const ls::host_context ctx;
  const ls::softmax_cross_entropy loss;
  std::vector<float> z = {1000.0f, 0.0f, -1000.0f, 88.0f, 89.0f, 90.0f};
  std::vector<std::int32_t> labels = {0, 1};
  std::vector<float> grad(6), scratch(2 * ls::softmax_cross_entropy::scratch_per_row);
  const ls::loss_sum l = xent_ref::evaluate_cols(loss, ctx, z.data(), 2, 3, ls::targets<float>{labels.data(), nullptr, 0},
                                       grad.data(), scratch.data());
  // row 0: loss ~ 0; row 1: log(e^-1 + 1 + e^1) - 0 + ... relative to label 1 (89)
  const double row1 = std::log(std::exp(-1.0) + 1.0 + std::exp(1.0));
  CHECK(l.sum == doctest::Approx(0.0 + row1).epsilon(1e-6));
  for (float g : grad) CHECK(std::isfinite(g));
  CHECK(grad[0] == doctest::Approx(0.0f).epsilon(1e-6));
  // each row of the gradient sums to zero
  CHECK(grad[0] + grad[1] + grad[2] == doctest::Approx(0.0f));
  CHECK(grad[3] + grad[4] + grad[5] == doctest::Approx(0.0f));
}

TEST_CASE("softmax_cross_entropy: labels outside 0 .. classes-1 raise data_error") {
  const ls::host_context ctx;
  const ls::softmax_cross_entropy loss;
  std::vector<float> z(3 * 4, 0.5f), grad(12), scratch(3 * ls::softmax_cross_entropy::scratch_per_row);
  for (std::int32_t bad : {-1, 4, 1000}) {
    CAPTURE(bad);
    std::vector<std::int32_t> labels = {0, bad, 2};
    CHECK_THROWS_AS(xent_ref::evaluate_cols(loss, ctx, z.data(), 3, 4, ls::targets<float>{labels.data(), nullptr, 0}, grad.data(),
                                  scratch.data()),
                    ls::data_error);
  }
  CHECK_THROWS_AS(
      xent_ref::evaluate_cols(loss, ctx, z.data(), 3, 4, ls::targets<float>{}, grad.data(), scratch.data()), ls::shape_error);
}

TEST_CASE("mse: targets of the wrong width raise shape_error") {
  const ls::host_context ctx;
  const ls::mse loss;
  std::vector<float> z(6), t(6), grad(6), scratch(2);
  CHECK_THROWS_AS(xent_ref::evaluate_cols(loss, ctx, z.data(), 2, 3, ls::targets<float>{nullptr, t.data(), 2}, grad.data(),
                                scratch.data()),
                  ls::shape_error);
  CHECK_THROWS_AS(xent_ref::evaluate_cols(loss, ctx, z.data(), 2, 3, ls::targets<float>{}, grad.data(), scratch.data()),
                  ls::shape_error);
}

namespace {
ls::data::batch labelled(std::size_t rows, std::size_t width, std::int32_t label) {
  ls::data::batch b;
  b.width = width;
  b.features.assign(rows * width, 0.25f);
  b.labels.assign(rows, label);
  for (std::size_t r = 0; r < rows; ++r) b.indices.push_back(r);
  return b;
}
}  // namespace

TEST_CASE("replica: bad shards raise lockstep errors that name the problem") {
  using net = ls::sequential<ls::dense<4, 6>, ls::relu, ls::dense<6, 3>>;
  ls::replica<net> rep(ls::host_context{1}, ls::seed{1});
  const ls::softmax_cross_entropy xent;

  SUBCASE("a shard whose width differs from the model's input") {
    const ls::data::batch b = labelled(5, 7, 0);
    try {
      rep.forward_backward(xent, ls::data::whole(b), ls::pass_info{});
      FAIL("no exception");
    } catch (const ls::shape_error& e) {
      const std::string msg = e.what();
      CHECK(msg.find('7') != std::string::npos);
      CHECK(msg.find('4') != std::string::npos);
    }
    CHECK_THROWS_AS(rep.predict(ls::data::whole(b), ls::pass_info{}), ls::shape_error);
    CHECK_THROWS_AS(rep.evaluate(xent, ls::data::whole(b), ls::pass_info{}), ls::error);
  }
  SUBCASE("labels out of range") {
    for (std::int32_t bad : {-3, 3, 77}) {
      const ls::data::batch b = labelled(4, 4, bad);
      CHECK_THROWS_AS(rep.forward_backward(xent, ls::data::whole(b), ls::pass_info{}), ls::data_error);
      CHECK_THROWS_AS(rep.evaluate(xent, ls::data::whole(b), ls::pass_info{}), ls::data_error);
    }
  }
  SUBCASE("regression targets of the wrong width") {
    ls::data::batch b = labelled(4, 4, 0);
    b.labels.clear();
    b.target_width = 2;
    b.targets.assign(8, 0.5f);
    CHECK_THROWS_AS(rep.forward_backward(ls::mse{}, ls::data::whole(b), ls::pass_info{}), ls::shape_error);
  }
  SUBCASE("a float replica and a double replica agree") {
    ls::replica<net, ls::cpu<0>, double> drep(ls::host_context{1}, ls::seed{1});
    const ls::data::batch b = labelled(6, 4, 2);
    const ls::loss_sum lf = rep.forward_backward(xent, ls::data::whole(b), ls::pass_info{});
    const ls::loss_sum ld = drep.forward_backward(xent, ls::data::whole(b), ls::pass_info{});
    CHECK(lf.count == 6);
    CHECK(ld.count == 6);
    CHECK(lf.sum == doctest::Approx(ld.sum).epsilon(1e-5));
    for (std::size_t i = 0; i < decltype(rep)::model_type::param_count; ++i)
      CHECK(double(rep.model().gradients()[i]) == doctest::Approx(drep.model().gradients()[i]).epsilon(1e-4).scale(1e-3));
  }
}

TEST_CASE("softmax_cross_entropy counts top-1 hits as the arg-max with ties to the lowest index") {
  for (std::size_t rows : {0u, 1u, 2u, 7u, 31u}) {
    for (std::size_t cols : {1u, 2u, 3u, 10u}) {
      CAPTURE(rows);
      CAPTURE(cols);
      problem p(rows, cols, 11 + rows * 13 + cols);
      // Quantise the logits so that ties occur, and make some rows all-equal.
      for (auto& v : p.z) v = std::round(v);
      for (std::size_t r = 0; r < rows; r += 5)
        for (std::size_t c = 0; c < cols; ++c) p.z[r * cols + c] = 1.0;
      std::size_t expected = 0;
      for (std::size_t r = 0; r < rows; ++r) {
        const double* row = p.z.data() + r * cols;
        const std::size_t arg = static_cast<std::size_t>(std::max_element(row, row + cols) - row);
        expected += arg == static_cast<std::size_t>(p.labels[r]) ? 1 : 0;
      }
      std::vector<double> scratch(rows * ls::softmax_cross_entropy::scratch_per_row + 1);
      const ls::host_context ctx;
      const ls::loss_sum l = xent_ref::evaluate_cols(ls::softmax_cross_entropy{}, ctx, p.z.data(), rows, cols, p.targets(),
                                                                   static_cast<double*>(nullptr), scratch.data());
      CHECK(l.count == rows);
      CHECK(l.correct == expected);
    }
  }
  static_assert(ls::counts_correct_v<ls::softmax_cross_entropy> && !ls::counts_correct_v<ls::mse>);
}

TEST_CASE("softmax_cross_entropy: confident rows in float match a double reference") {
  // Rows whose log-sum-exp is close to their largest logit: rounding it to float before the
  // subtraction used to cost up to a third of the loss. Every label of every row is checked.
  const auto rows = xent_ref::confident_rows();
  const ls::softmax_cross_entropy loss;
  const ls::host_context ctx;
  for (const auto& z : rows) {
    CAPTURE(z.size());
    CAPTURE(z[0]);
    for (std::int32_t y = 0; y < std::int32_t(z.size()); ++y) {
      CAPTURE(y);
      const std::int32_t labels[1] = {y};
      std::vector<float> grad(z.size()), scratch(2);
      const ls::loss_sum l =
          xent_ref::evaluate_cols(loss, ctx, z.data(), 1, z.size(), ls::targets<float>{labels, nullptr, z.size()}, grad.data(), scratch.data());
      xent_ref::check_row(l.sum, grad, z, y);
    }
  }
}

TEST_CASE("softmax_cross_entropy: a logit that is not finite is a data_error") {
  const ls::softmax_cross_entropy loss;
  const ls::host_context ctx;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::vector<float>& z : std::vector<std::vector<float>>{{inf, 0, 1}, {0, inf, 1}, {-inf, -inf}, {nan, 1}, {1, nan}}) {
    for (std::int32_t y = 0; y < std::int32_t(z.size()); ++y) {
      CAPTURE(y);
      const std::int32_t labels[1] = {y};
      std::vector<float> scratch(2);
      CHECK_THROWS_AS(xent_ref::evaluate_cols(loss, ctx, z.data(), 1, z.size(), ls::targets<float>{labels, nullptr, z.size()},
                                    static_cast<float*>(nullptr), scratch.data()),
                      ls::data_error);
    }
  }
}
