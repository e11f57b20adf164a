#pragma once
/// @file strategy.hpp (testing)
/// The public conformance suite of strategies, for doctest. Instantiate it for your own strategy
/// from your own test binary:
///
///     TEST_CASE_TEMPLATE_INVOKE(lockstep_strategy_conformance, my_strategy);
///
/// The suite makes strategies and models through `lockstep::testing::strategy_maker<S>`: by
/// default `S(device_selection::first(n))` for n = 1, 2 and 3 host replicas and
/// `s.replicate<Net>(seed)`; specialise it for a strategy made otherwise (see the member list
/// below). For each replica count it checks the contracts every strategy keeps:
///  - one-device equivalence: 20 training steps of an MLP with dropout — full, uneven, tiny and
///    empty-shard global batches — give every replica the same bits, and the parameters of
///    `one_device<cpu<0>>` on the same global batches within 1e-5 relative (and, for a
///    replica_count_invariant strategy, bitwise those of the same strategy with one replica);
///  - exactly once: over those batches, `run` hands every sample of every global batch to
///    exactly one replica, in the shards the strategy's world plans;
///  - failure release: a replica that throws inside `run`, or inside `train_step` while the others
///    wait in the gradient's collectives, makes the call throw (at once, not after the timeout),
///    and a strategy whose world recovers (`recovers_after_failure`) runs and trains again;
///  - reduce: the local replicas' values combined by sum, mean, min and max.
/// Include it from a doctest test file compiled by a host compiler.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include <lockstep/core/random.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/data/shard_batches.hpp>
#include <lockstep/distribute.hpp>
#include <lockstep/layers.hpp>
#include <lockstep/losses.hpp>
#include <lockstep/optimizers.hpp>

namespace lockstep::testing {

/// How the strategy suite makes strategies of type S and their models. Specialise it for a
/// strategy that is not constructible from a device_selection, or whose models are not made by
/// `replicate`: members `replica_counts()` (the counts to check), `make(n)` (a strategy of n
/// local replicas), `replicate<Net>(s, seed)` (a model of s) and `invariant` (true when the
/// strategy promises bitwise the one-device result).
template <class S>
struct strategy_maker {
  /// The replica counts the suite checks.
  static std::vector<std::size_t> replica_counts() { return {1, 2, 3}; }
  /// A strategy of `n` local replicas.
  static S make(std::size_t n) { return S(device_selection::first(n)); }
  /// A model of Net made by `s`.
  template <class Net>
  static auto replicate(S& s, seed k) {
    return s.template replicate<Net>(k);
  }
  /// True when the strategy promises the bits of its one-replica run for every replica count
  /// (replica_count_invariant).
  static constexpr bool invariant = [] {
    if constexpr (requires { S::determinism_level; })
      return S::determinism_level == determinism::replica_count_invariant;
    else
      return false;
  }();
};

namespace detail {

/// The suite's network: 784-32-10 with dropout (masks keyed by the global sample index).
using suite_mlp = sequential<dense<784, 32>, relu, dropout<1, 4>, dense<32, 10>>;

/// Global batch sizes of the suite's 20 steps: full, uneven, fewer rows than replicas, one row.
inline const std::vector<std::size_t>& suite_batch_sizes() {
  static const std::vector<std::size_t> s{64, 64, 48, 33, 64, 17, 64, 64, 5, 64, 64, 3, 64, 64, 1, 64, 2, 64, 64, 37};
  return s;
}

/// Global batch `key` of `rows` rows (784 features in [0, 1), 10 classes; indices key·1000 + row).
inline data::batch suite_batch(std::size_t rows, std::uint64_t key) {
  data::batch b;
  b.width = 784;
  const counter_rng rng(1234, key);
  b.features.resize(rows * 784);
  for (std::size_t i = 0; i < b.features.size(); ++i) b.features[i] = rng.uniform(i);
  for (std::size_t r = 0; r < rows; ++r) {
    b.labels.push_back(static_cast<std::int32_t>(rng.u32(rows * 784 + r) % 10));
    b.indices.push_back(key * 1000 + r);
  }
  return b;
}

/// Batch `b` cut into the shards of `s` (its world's plan).
template <class S>
data::distributed_batch suite_shards(S& s, data::batch b) {
  auto&& w = lockstep::detail::world_of(s);
  const shard_plan p = w.plan();
  return data::detail::make_sharded(std::move(b), p.parts, p.first, s.num_replicas());
}

/// Trains a fresh model of `s` for the suite's 20 steps with Adam; returns replica 0's
/// parameters, and whether every replica holds the same bits.
template <class S, class Maker = strategy_maker<S>>
std::vector<float> suite_train(S& s, bool& identical) {
  auto m = Maker::template replicate<suite_mlp>(s, seed{42});
  const adam opt{.lr = 1e-3f};
  for (std::size_t i = 0; i < suite_batch_sizes().size(); ++i) {
    const std::size_t rows = suite_batch_sizes()[i];
    const step_stats st = train_step(s, m, opt, softmax_cross_entropy{}, suite_shards(s, suite_batch(rows, i)));
    CHECK(st.count == rows);
    CHECK(std::isfinite(st.loss_sum));
  }
  auto p = m.parameters_to_host();
  identical = true;
  for (std::size_t r = 1; r < m.size(); ++r)
    identical = identical && std::equal(p.begin(), p.end(), m.replica(r).model().parameters().data());
  return p;
}

/// softmax_cross_entropy that throws "lockstep suite: injected failure in the loss" in a shard
/// holding a row labelled 9: a replica failing in the middle of train_step while the others go on
/// to the gradient's collectives.
struct suite_failing_loss {
  using loss_concept = loss_tag;                     ///< opts in to the loss concept
  static constexpr std::size_t scratch_per_row = 2;  ///< as softmax_cross_entropy
  /// Labels are classes 0 .. outputs - 1.
  static constexpr std::size_t label_classes(std::size_t outputs) noexcept { return outputs; }
  /// softmax_cross_entropy's, unless a label is 9.
  template <class T, class Ctx, class Shape>
  loss_sum evaluate(Ctx& ctx, const loss_args<T, Ctx, Shape>& a) const {
    for (std::size_t r = 0; r < a.rows(); ++r)
      if (a.target.labels && a.target.labels[r] == 9) throw std::runtime_error("lockstep suite: injected failure in the loss");
    return softmax_cross_entropy{}.evaluate(ctx, a);
  }
};

/// Largest |a - b| over the largest |b|.
inline double suite_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace detail

}  // namespace lockstep::testing

/// The suite (see the file comment).
TEST_CASE_TEMPLATE_DEFINE("lockstep strategy conformance", S, lockstep_strategy_conformance) {
  namespace lt = lockstep::testing;
  namespace ls = lockstep;
  using maker = lt::strategy_maker<S>;

  ls::one_device<ls::cpu<0>> single;
  bool single_identical = false;
  const std::vector<float> reference = lt::detail::suite_train(single, single_identical);
  REQUIRE(single_identical);
  // A replica_count_invariant strategy promises the bits of its own one-replica run.
  std::vector<float> one_replica;
  if constexpr (maker::invariant) {
    S s1 = maker::make(1);
    bool identical1 = false;
    one_replica = lt::detail::suite_train<S, maker>(s1, identical1);
  }

  for (const std::size_t n : maker::replica_counts()) {
    CAPTURE(n);
    S s = maker::make(n);
    REQUIRE(s.num_replicas() == n);

    SUBCASE("one-device equivalence") {
      bool identical = false;
      const std::vector<float> got = lt::detail::suite_train<S, maker>(s, identical);
      CHECK(identical);  // every replica holds the same bits after every step
      REQUIRE(got.size() == reference.size());
      CHECK(lt::detail::suite_relative_difference(got, reference) < 1e-5);
      if constexpr (maker::invariant) CHECK(got == one_replica);
    }

    SUBCASE("every sample reaches exactly one replica") {
      auto&& w = ls::detail::world_of(s);
      for (std::size_t i = 0; i < lt::detail::suite_batch_sizes().size(); ++i) {
        const std::size_t rows = lt::detail::suite_batch_sizes()[i];
        const auto db = lt::detail::suite_shards(s, lt::detail::suite_batch(rows, i));
        auto seen = s.run([](std::size_t, const ls::data::shard& sh) {
          return std::vector<std::uint64_t>(sh.indices, sh.indices + sh.size);
        }, db);
        std::vector<std::uint64_t> all;
        for (auto& v : seen) all.insert(all.end(), v.begin(), v.end());
        std::sort(all.begin(), all.end());
        CHECK(std::adjacent_find(all.begin(), all.end()) == all.end());  // no sample twice
        if (w.size() == 1) {  // one process holds every shard: every sample, once
          CHECK(all.size() == rows);
          for (std::size_t r = 0; r < all.size(); ++r) CHECK(all[r] == i * 1000 + r);
        }
      }
    }

    SUBCASE("a failing replica reaches the caller and releases the others") {
      const auto db = lt::detail::suite_shards(s, lt::detail::suite_batch(8, 0));
      const std::size_t failing = n - 1;
      const auto t0 = std::chrono::steady_clock::now();
      bool threw = false;
      try {
        s.run([&](std::size_t r, const ls::data::shard&) {
          if (r == failing) throw std::runtime_error("lockstep suite: injected failure");
          return 0;
        }, db);
      } catch (const std::exception& e) {
        threw = true;
        CHECK(std::string(e.what()).find("injected failure") != std::string::npos);
      }
      CHECK(threw);
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // not after a timeout
      using world_t = std::remove_cvref_t<decltype(ls::detail::world_of(s))>;
      if constexpr (world_t::recovers_after_failure) {
        const auto again = s.run([](std::size_t, const ls::data::shard& sh) { return static_cast<int>(sh.size); }, db);
        int total = 0;
        for (const int v : again) total += v;
        CHECK(total == 8);
      }
    }

    // (The suite's failing loss reads the labels on the host: replicas whose memory the host reads.)
    constexpr bool host_memory = [] {
      if constexpr (requires { typename S::kind_type; })
        return ls::device_memory<typename S::kind_type>::host_accessible;
      else
        return true;
    }();
    if constexpr (host_memory) SUBCASE("a replica failing inside train_step releases the others from the collectives at once") {
      // The rows of the last local replica's shard are labelled 9 (the suite's loss throws on
      // them); the other replicas compute their gradients and wait in the reducer.
      auto m = maker::template replicate<lt::detail::suite_mlp>(s, ls::seed{42});
      ls::data::batch b = lt::detail::suite_batch(16, 3);
      const auto probe = lt::detail::suite_shards(s, b);
      const ls::data::shard& last = probe.shards[n - 1];
      for (std::size_t r = 0; r < b.labels.size(); ++r) b.labels[r] = b.labels[r] % 9;
      std::size_t marked = 0;
      for (std::size_t k = 0; k < last.size; ++k) {
        b.labels[static_cast<std::size_t>(last.indices[k] - 3000)] = 9;
        ++marked;
      }
      const auto t0 = std::chrono::steady_clock::now();
      bool threw = false;
      try {
        (void)ls::train_step(s, m, ls::adam{.lr = 1e-3f}, lt::detail::suite_failing_loss{}, lt::detail::suite_shards(s, b));
      } catch (const std::exception& e) {
        threw = true;
        std::string all = e.what();  // the replica's error may arrive nested
        try {
          std::rethrow_if_nested(e);
        } catch (const std::exception& inner) {
          all += std::string(" / ") + inner.what();
        } catch (...) {
        }
        CHECK(all.find("injected failure in the loss") != std::string::npos);
      }
      CHECK((threw || marked == 0));  // a shard of no rows (fewer rows than replicas) cannot fail
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));  // not after a timeout
      using world_t = std::remove_cvref_t<decltype(ls::detail::world_of(s))>;
      if constexpr (world_t::recovers_after_failure) {  // the next step trains, every replica alike
        for (auto& label : b.labels) label = label % 9;
        const ls::step_stats st = ls::train_step(s, m, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{},
                                                 lt::detail::suite_shards(s, b));
        CHECK(st.count == 16);
        const auto p = m.parameters_to_host();
        for (std::size_t r = 1; r < m.size(); ++r)
          CHECK(std::equal(p.begin(), p.end(), m.replica(r).model().parameters().data()));
      }
    }

    SUBCASE("reduce combines the local replicas' values in replica order") {
      std::vector<double> v(n);
      double sum = 0, lo = 1e300, hi = -1e300;
      for (std::size_t r = 0; r < n; ++r) {
        v[r] = 0.25 + 1.5 * static_cast<double>(r * r) - (r == 1 ? 4.0 : 0.0);
        sum += v[r];
        lo = std::min(lo, v[r]);
        hi = std::max(hi, v[r]);
      }
      CHECK(static_cast<double>(s.reduce(ls::reduce_op::sum, v)) == sum);
      CHECK(static_cast<double>(s.reduce(ls::reduce_op::mean, v)) == doctest::Approx(sum / static_cast<double>(n)));
      CHECK(static_cast<double>(s.reduce(ls::reduce_op::min, v)) == lo);
      CHECK(static_cast<double>(s.reduce(ls::reduce_op::max, v)) == hi);
    }
  }
}
