#pragma once
// Shared helpers of the distribute tests: random Fashion-MNIST-shaped batches and small models.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <doctest/doctest.h>

#include <lockstep/lockstep.hpp>

namespace dist_test {

namespace ls = lockstep;

/// 784-32-10 MLP (Fashion-MNIST shaped, small to keep the tests quick).
using mlp = ls::sequential<ls::dense<784, 32>, ls::relu, ls::dense<32, 10>>;
/// The same with dropout, whose masks must not depend on the replica count.
using mlp_dropout = ls::sequential<ls::dense<784, 32>, ls::relu, ls::dropout<1, 4>, ls::dense<32, 10>>;

/// A global batch of `rows` random samples (784 features in [0, 1), 10 classes), keyed by `key`.
inline ls::data::batch make_batch(std::size_t rows, std::uint64_t key) {
  ls::data::batch b;
  b.width = 784;
  const ls::counter_rng rng(1234, key);
  b.features.resize(rows * 784);
  for (std::size_t i = 0; i < b.features.size(); ++i) b.features[i] = rng.uniform(i);
  for (std::size_t r = 0; r < rows; ++r) {
    b.labels.push_back(static_cast<std::int32_t>(rng.u32(rows * 784 + r) % 10));
    b.indices.push_back(key * 1000 + r);
  }
  return b;
}

/// `b` cut into n shards.
inline ls::data::distributed_batch distributed(const ls::data::batch& b, std::size_t n) {
  auto g = std::make_shared<const ls::data::batch>(b);
  ls::data::distributed_batch d;
  d.shards = ls::data::split(*g, n);
  d.global = std::move(g);
  return d;
}

/// Global batch sizes of the 20 training steps: full, uneven, smaller than 4 replicas, and an
/// uneven last batch.
inline const std::vector<std::size_t>& step_sizes() {
  static const std::vector<std::size_t> s{64, 64, 48, 33, 64, 17, 64, 64, 5, 64, 64, 3, 64, 64, 1, 64, 2, 64, 64, 37};
  return s;
}

/// Trains a fresh replicated Net with strategy S for the 20 steps; returns replica 0's parameters
/// after checking that every replica holds exactly the same parameters.
template <class Net, class S, class Opt>
std::vector<float> train(S& s, const Opt& opt, bool* replicas_identical = nullptr) {
  auto m = s.template replicate<Net>(ls::seed{42});
  for (std::size_t i = 0; i < step_sizes().size(); ++i) {
    const auto b = make_batch(step_sizes()[i], i);
    const auto st = ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(b, s.num_replicas()));
    if (st.count != b.rows() || !std::isfinite(st.loss_sum)) return {};
  }
  auto p = m.parameters_to_host();
  if (replicas_identical) {
    *replicas_identical = m.step() == step_sizes().size();
    for (std::size_t r = 1; r < m.size(); ++r)
      *replicas_identical = *replicas_identical && std::equal(p.begin(), p.end(), m.replica(r).model().parameters().data());
  }
  return p;
}

/// Runs `f`, which must throw a replica_error naming replica `replica` and step `step` whose
/// nested exception is an E; returns that nested exception's message ("" when the checks fail).
template <class E, class F>
std::string expect_replica_error(F&& f, std::size_t replica, std::uint64_t step = ls::replica_error::no_step) {
  try {
    f();
  } catch (const ls::replica_error& e) {
    CHECK(e.replica() == replica);
    CHECK(e.step() == step);
    const std::string what = e.what();
    CHECK(what.find("replica " + std::to_string(replica)) != std::string::npos);
    try {
      std::rethrow_if_nested(e);
    } catch (const E& inner) {
      return inner.what();
    } catch (...) {
      FAIL("the nested exception has another type");
      return {};
    }
    FAIL("the replica_error holds no nested exception");
    return {};
  } catch (...) {
    FAIL("another exception than a replica_error");
    return {};
  }
  FAIL("no exception");
  return {};
}

/// Largest |a - b| divided by the largest |b| (0 when equal).
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace dist_test
