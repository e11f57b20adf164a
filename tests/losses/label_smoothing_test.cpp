// Label smoothing of softmax cross-entropy: loss and gradient against a double reference of the
// cross-entropy with the target (1 - eps) onehot + eps / classes, over many shapes and eps; eps = 0
// is exactly the unsmoothed loss; the gradient matches finite differences in double; a bad eps
// is a config_error naming the option.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <lockstep/lockstep.hpp>

#include "losses/xent_reference.hpp"

namespace ls = lockstep;

namespace {

/// The smoothed cross-entropy of one row of logits z (cols) with label y, and its gradient.
double smoothed(const std::vector<double>& z, std::size_t y, double eps, std::vector<double>* grad) {
  const std::size_t cols = z.size();
  const double m = *std::max_element(z.begin(), z.end());
  double s = 0;
  for (const double v : z) s += std::exp(v - m);
  const double lse = m + std::log(s);
  double loss = 0;
  for (std::size_t c = 0; c < cols; ++c) {
    const double target = (c == y ? 1.0 - eps : 0.0) + eps / static_cast<double>(cols);
    loss += target * (lse - z[c]);
    if (grad) (*grad)[c] = std::exp(z[c] - lse) - target;
  }
  return loss;
}

template <class T>
struct rows {
  std::size_t n, cols;
  std::vector<T> z;
  std::vector<std::int32_t> labels;
  rows(std::size_t r, std::size_t c, std::uint64_t seed, double spread) : n(r), cols(c), z(r * c), labels(r) {
    const ls::counter_rng rng(seed, 4);
    for (std::size_t i = 0; i < z.size(); ++i) z[i] = static_cast<T>((rng.uniform_double(i) * 2 - 1) * spread);
    for (std::size_t i = 0; i < r; ++i) labels[i] = static_cast<std::int32_t>(rng.u32(70000 + i) % c);
  }
};

}  // namespace

TEST_CASE("label smoothing: loss and gradient against the double reference") {
  ls::host_context ctx;
  for (const float eps : {0.05f, 0.1f, 0.3f, 0.9f}) {
    for (const std::size_t cols : {1u, 2u, 3u, 10u, 16u}) {
      for (const std::size_t n : {0u, 1u, 7u, 33u}) {
        CAPTURE(eps);
        CAPTURE(cols);
        CAPTURE(n);
        const rows<double> p(n, cols, 31 * cols + n, 6.0);
        std::vector<double> grad(n * cols), scratch(2 * n + 1);
        const ls::softmax_cross_entropy loss{.label_smoothing = eps};
        const auto got = xent_ref::evaluate_cols(loss, ctx, p.z.data(), n, cols,
                                                 ls::targets<double>{p.labels.data(), nullptr, cols}, grad.data(),
                                                 scratch.data());
        double want = 0;
        std::size_t hits = 0;
        for (std::size_t r = 0; r < n; ++r) {
          std::vector<double> z(p.z.begin() + static_cast<std::ptrdiff_t>(r * cols),
                                p.z.begin() + static_cast<std::ptrdiff_t>((r + 1) * cols));
          std::vector<double> g(cols);
          want += smoothed(z, static_cast<std::size_t>(p.labels[r]), static_cast<double>(eps), &g);
          for (std::size_t c = 0; c < cols; ++c) CHECK(grad[r * cols + c] == doctest::Approx(g[c]).epsilon(1e-12).scale(1));
          hits += static_cast<std::size_t>(std::max_element(z.begin(), z.end()) - z.begin()) ==
                          static_cast<std::size_t>(p.labels[r])
                      ? 1
                      : 0;
        }
        CHECK(got.count == n);
        CHECK(got.sum == doctest::Approx(want).epsilon(1e-12).scale(1));
        CHECK(got.correct == hits);
      }
    }
  }
}

TEST_CASE("label smoothing: the gradient is the derivative of the loss sum (finite differences, double)") {
  ls::host_context ctx;
  const rows<double> p(5, 7, 3, 4.0);
  const ls::softmax_cross_entropy loss{.label_smoothing = 0.2f};
  std::vector<double> grad(p.z.size()), scratch(10), unused(p.z.size());
  (void)xent_ref::evaluate_cols(loss, ctx, p.z.data(), p.n, p.cols, ls::targets<double>{p.labels.data(), nullptr, 7},
                                grad.data(), scratch.data());
  for (std::size_t i = 0; i < p.z.size(); ++i) {
    auto up = p.z, down = p.z;
    const double h = 1e-6;
    up[i] += h;
    down[i] -= h;
    const double fu = xent_ref::evaluate_cols(loss, ctx, up.data(), p.n, p.cols,
                                              ls::targets<double>{p.labels.data(), nullptr, 7}, unused.data(), scratch.data())
                          .sum;
    const double fd = xent_ref::evaluate_cols(loss, ctx, down.data(), p.n, p.cols,
                                              ls::targets<double>{p.labels.data(), nullptr, 7}, unused.data(), scratch.data())
                          .sum;
    CHECK(grad[i] == doctest::Approx((fu - fd) / (2 * h)).epsilon(1e-6).scale(1));
  }
}

TEST_CASE("label smoothing: 0 is exactly the plain loss, and a bad value is a config_error naming it") {
  ls::host_context ctx;
  const rows<float> p(20, 10, 8, 5.0);
  std::vector<float> g1(p.z.size()), g2(p.z.size()), s1(40), s2(40);
  const auto plain = xent_ref::evaluate_cols(ls::softmax_cross_entropy{}, ctx, p.z.data(), p.n, p.cols,
                                             ls::targets<float>{p.labels.data(), nullptr, 10}, g1.data(), s1.data());
  const auto zero = xent_ref::evaluate_cols(ls::softmax_cross_entropy{.label_smoothing = 0.0f}, ctx, p.z.data(), p.n,
                                            p.cols, ls::targets<float>{p.labels.data(), nullptr, 10}, g2.data(), s2.data());
  CHECK(plain.sum == zero.sum);  // ε = 0 takes the plain path
  CHECK(g1 == g2);
  // ... and the smoothed formula itself reduces to the plain loss at ε = 0 (the branch is a
  // shortcut, not a different loss): its rows against the plain path's, gradient included.
  std::vector<float> g3(p.z.size()), per_row(p.n), hit(p.n);
  ls::backend::for_each_index(ctx, p.n,
                              ls::detail::softmax_xent_smoothed_row_op<float>{p.z.data(), p.labels.data(), g3.data(),
                                                                     per_row.data(), hit.data(), p.cols, 0.0f});
  double smoothed_sum = 0, hits = 0;
  for (std::size_t r = 0; r < p.n; ++r) {
    smoothed_sum += per_row[r];
    hits += hit[r];
  }
  CHECK(smoothed_sum == doctest::Approx(plain.sum).epsilon(1e-6));
  CHECK(static_cast<std::size_t>(hits) == plain.correct);
  for (std::size_t i = 0; i < g3.size(); ++i) {
    CAPTURE(i);
    CHECK(g3[i] == doctest::Approx(g1[i]).epsilon(1e-6).scale(1));
  }
  for (const float bad : {-0.1f, 1.0f, std::nanf("")}) {
    try {
      (void)xent_ref::evaluate_cols(ls::softmax_cross_entropy{.label_smoothing = bad}, ctx, p.z.data(), p.n, p.cols,
                                    ls::targets<float>{p.labels.data(), nullptr, 10}, g2.data(), s2.data());
      FAIL("accepted");
    } catch (const ls::config_error& e) {
      CHECK(std::string(e.what()).find("label_smoothing") != std::string::npos);
    }
  }
}
