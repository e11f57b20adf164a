#pragma once
/// @file backend.hpp (testing)
/// The public conformance suite of device kinds (backends), for doctest. Instantiate it for your
/// own kind from your own test binary, once the kind is registered (backend_traits, device_memory,
/// its context and kernels, and its default reducer, select_kind_reducer<Kind>; see
/// docs/architecture.md, "Adding a device kind"):
///
///     TEST_CASE_TEMPLATE_INVOKE(lockstep_backend_conformance, my_kind);
///
/// For 1 and 2 replicas (as many as the kind has devices), a network with dense layers, tanh,
/// dropout and a softmax head trained with `fit` (SGD with momentum, so that a gradient off by a
/// constant factor shows) through `mirrored<Kind>` for 3 epochs of uneven
/// global batches, then evaluated and predicted, must give what the same run through
/// `mirrored<cpus>` gives: parameters within 1e-4, evaluation loss within 1e-4 relative, the same
/// samples counted, predictions within 1e-4 and in the same row order. That a kind passes says
/// the library's replica, staging, layers, losses, optimisers, reducer path, fit, evaluate and
/// predict use nothing of it beyond the concepts (tests/backend/device_backend_test.cpp runs it
/// on the archetype kind of lockstep/testing/archetypes/kind.hpp). Include it from a doctest test
/// file compiled by the compiler the kind needs.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include <lockstep/lockstep.hpp>

namespace lockstep::testing::detail {

/// The backend suite's network.
using backend_suite_net = sequential<dense<12, 16>, tanh, dropout<1, 4>, dense<16, 4>>;

/// The backend suite's data: 60 rows of 12 features in [-1, 1), 4 classes, batches of 13.
inline auto backend_suite_data() {
  std::vector<float> x(60 * 12);
  std::vector<std::int32_t> y(60);
  const counter_rng rng(5, 6);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i) * 2 - 1;
  for (std::size_t r = 0; r < y.size(); ++r) y[r] = static_cast<std::int32_t>(rng.u32(x.size() + r) % 4);
  return data::from_memory(std::move(x), 12, std::move(y)) | data::batched(13);
}

/// What one run of the backend suite gives: parameters, evaluation, predictions.
struct backend_suite_run {
  std::vector<float> parameters;  ///< replica 0's parameters after training
  evaluation eval;                ///< the evaluation after training
  predictions pred;               ///< the predictions after training
};

/// Trains, evaluates and predicts through strategy `s`.
template <class S>
backend_suite_run backend_suite_train(S& s) {
  auto m = s.template replicate<backend_suite_net>(seed{3});
  const auto data = backend_suite_data();
  // SGD with momentum: a gradient off by a constant factor (a reducer's mean for its sum) moves
  // every parameter by a different step (Adam's normalisation would hide it).
  (void)fit(s, m, sgd{.lr = 0.2f, .momentum = 0.9f}, softmax_cross_entropy{}, data, {.epochs = 3, .quiet = true});
  return {m.parameters_to_host(), evaluate(s, m, softmax_cross_entropy{}, data), predict(s, m, data)};
}

/// Largest |a - b|.
inline double backend_suite_max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

}  // namespace lockstep::testing::detail

/// The suite (see the file comment).
TEST_CASE_TEMPLATE_DEFINE("lockstep backend conformance", Kind, lockstep_backend_conformance) {
  namespace ls = lockstep;
  namespace lt = lockstep::testing::detail;
  static_assert(ls::device_backend<Kind>, "lockstep backend suite: the kind is not a complete backend (device_backend)");
  const std::size_t devices = ls::backend_traits<Kind>::device_count();
  REQUIRE(devices >= 1);
  for (std::size_t n = 1; n <= std::min<std::size_t>(2, devices); ++n) {
    CAPTURE(n);
    ls::mirrored<Kind> on_kind(ls::device_selection::first(n));
    ls::mirrored<ls::cpus> on_host(ls::device_selection::first(n));
    const auto got = lt::backend_suite_train(on_kind);
    const auto want = lt::backend_suite_train(on_host);
    REQUIRE(got.parameters.size() == want.parameters.size());
    CHECK(lt::backend_suite_max_difference(got.parameters, want.parameters) < 1e-4);
    CHECK(got.eval.samples == 60);
    CHECK(got.eval.samples == want.eval.samples);
    CHECK(got.eval.loss == doctest::Approx(want.eval.loss).epsilon(1e-4));
    CHECK(got.pred.indices == want.pred.indices);
    CHECK(got.pred.outputs.size() == want.pred.outputs.size());
    CHECK(lt::backend_suite_max_difference(got.pred.outputs, want.pred.outputs) < 1e-4);
  }
}
