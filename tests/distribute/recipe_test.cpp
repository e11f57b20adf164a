// The update recipe: the reduced-gradient epilogue's arithmetic (chunk grid, lanes, decision);
// clipping by global norm against a double reference, with the same norm bits on every replica
// and for every replica count; per-value clipping, by the library's optimisers and by a user's
// (the same bits); the order of operations with every option on; the EMA against its recurrence,
// sharded and not, with batch norm's running statistics, and swapped in for evaluation and back;
// the non-finite guard (skip, the limit of consecutive skips, raise) with a NaN in one replica's
// shard; the public "skip decisions agree" check on the library's strategies.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <lockstep/layers/batch_norm.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/testing/recipe.hpp>

#include "distribute/common.hpp"
#include "support/plain_sgd.hpp"

using namespace dist_test;
namespace ls = lockstep;

namespace {

using invariant = ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus>;
using host = ls::mirrored<ls::cpus>;

/// A regression batch for y = x W + b with `in` features and `out` targets.
ls::data::batch regression_batch(std::size_t rows, std::size_t in, std::size_t out, std::uint64_t key) {
  ls::data::batch b;
  b.width = in;
  b.target_width = out;
  const ls::counter_rng rng(77, key);
  for (std::size_t i = 0; i < rows * in; ++i) b.features.push_back(2 * rng.uniform(i) - 1);
  for (std::size_t i = 0; i < rows * out; ++i) b.targets.push_back(3 * rng.uniform(100000 + i) - 1);
  for (std::size_t r = 0; r < rows; ++r) b.indices.push_back(key * 1000 + r);
  return b;
}

/// The gradient sums of mse over `b` for dense<in, out> with parameters p (W row-major, then b),
/// in double.
std::vector<double> mse_gradient_sums(const std::vector<float>& p, const ls::data::batch& b, std::size_t in,
                                      std::size_t out) {
  std::vector<double> g(in * out + out, 0.0);
  for (std::size_t r = 0; r < b.rows(); ++r)
    for (std::size_t o = 0; o < out; ++o) {
      double y = p[in * out + o];
      for (std::size_t i = 0; i < in; ++i) y += static_cast<double>(b.features[r * in + i]) * p[i * out + o];
      const double d = 2.0 * (y - b.targets[r * out + o]) / static_cast<double>(out);
      for (std::size_t i = 0; i < in; ++i) g[i * out + o] += static_cast<double>(b.features[r * in + i]) * d;
      g[in * out + o] += d;
    }
  return g;
}

/// ema = keep ema + take p in the parameter type, as the library computes it.
void ema_step(std::vector<float>& e, const std::vector<float>& p, double decay, bool first) {
  const float keep = static_cast<float>(first ? 0.0 : decay), take = static_cast<float>(1.0 - (first ? 0.0 : decay));
  for (std::size_t i = 0; i < e.size(); ++i) e[i] = keep * e[i] + take * p[i];
}

}  // namespace

TEST_CASE("epilogue: the grid's slices, the lanes of a chunk and the decision") {
  for (const std::size_t params : {0u, 1u, 2u, 1023u, 1024u, 1025u, 4099u, 25450u}) {
    for (std::size_t n = 1; n <= 7; ++n) {
      CAPTURE(params);
      CAPTURE(n);
      std::size_t next = 0;
      for (std::size_t r = 0; r < n; ++r) {
        const auto [lo, hi] = ls::grid_slice(params, r, n);
        CHECK(lo == next);
        CHECK(hi >= lo);
        CHECK((lo % ls::epilogue_chunk == 0 || lo == params));
        CHECK((hi - lo) <= (ls::epilogue_chunks(params) + n - 1) / n * ls::epilogue_chunk);
        next = hi;
      }
      CHECK(next == params);
    }
  }
  // A chunk's sum is its lanes (the CUDA kernel's per-thread body) added pairwise, whichever copy
  // of the loop runs, and close to the exact sum of squares.
  for (const std::size_t len : {0u, 1u, 15u, 16u, 17u, 1000u, 1024u, 3000u}) {
    CAPTURE(len);
    std::vector<float> x(len);
    const ls::counter_rng rng(5, len);
    for (std::size_t i = 0; i < len; ++i) x[i] = (rng.uniform(i) - 0.5f) * 1e3f;
    for (std::size_t c = 0; c < ls::epilogue_chunks(len); ++c) {
      double lanes[ls::epilogue_lanes];
      for (std::size_t l = 0; l < ls::epilogue_lanes; ++l) lanes[l] = ls::epilogue_lane_sum(x.data(), len, c, l);
      for (std::size_t w = ls::epilogue_lanes / 2; w > 0; w /= 2)
        for (std::size_t l = 0; l < w; ++l) lanes[l] += lanes[l + w];
      const std::size_t lo = c * ls::epilogue_chunk, n = std::min(ls::epilogue_chunk, len - lo);
      const double chunk = ls::chunk_sum_of_squares(x.data() + lo, n);
      CHECK(chunk == lanes[0]);
      // The copy chosen at run time (AVX2 where the CPU has it) and the baseline copy agree bitwise.
      CHECK(chunk == ls::detail::chunk_sum_of_squares_any(x.data() + lo, n));
      long double exact = 0;
      for (std::size_t i = lo; i < lo + n; ++i) exact += static_cast<long double>(x[i]) * x[i];
      CHECK(static_cast<double>(std::fabs(exact - chunk)) <= 1e-14 * static_cast<double>(exact) + 1e-300);
    }
  }
  // The decision: the norm of the applied gradient, the clip factor, the scale, the skip.
  const double chunks[3] = {9.0, 16.0, 0.0};  // sum of squares 25: norm of the sums 5
  ls::epilogue_inputs in{.rows = 10, .loss_scale = 1, .clip_global_norm = 0.25, .nonfinite = ls::nonfinite_policy::skip};
  auto r = ls::decide_update(chunks, 3, in);
  CHECK(r.finite);
  CHECK(r.norm == doctest::Approx(0.5));
  CHECK(r.factor == doctest::Approx(0.5));
  CHECK(r.scale == doctest::Approx(0.05));
  CHECK_FALSE(r.skip);
  in.loss_scale = 4;  // sums carrying a loss scale of 4: the applied gradient is 4 times smaller
  r = ls::decide_update(chunks, 3, in);
  CHECK(r.norm == doctest::Approx(0.125));
  CHECK(r.factor == 1.0);
  CHECK(r.scale == doctest::Approx(0.025));
  const double bad[2] = {1.0, std::numeric_limits<double>::infinity()};
  r = ls::decide_update(bad, 2, in);
  CHECK_FALSE(r.finite);
  CHECK(r.skip);
  CHECK(r.factor == 1.0);
  in.nonfinite = ls::nonfinite_policy::apply;
  CHECK_FALSE(ls::decide_update(bad, 2, in).skip);
  CHECK(ls::first_nonfinite_chunk(bad, 2) == 1);
}

TEST_CASE("epilogue on the grid's slices: each replica's own chunks, summed over the replicas, are every chunk's sum bitwise") {
  // What a replica that holds the reduced sums of its slice only computes (reduces_to_slices_v:
  // the device kernel sums chunks [first, last) and writes 0 for the others, the host scans them
  // into zeros), then the reducer's sum over the replicas: each chunk has one replica that
  // computes it, so the sums, and the decision, are those of a scan of every chunk.
  for (const std::size_t params : {0u, 1u, 1023u, 1025u, 4099u, 25450u}) {
    for (std::size_t n = 1; n <= 6; ++n) {
      CAPTURE(params);
      CAPTURE(n);
      std::vector<float> g(params);
      const ls::counter_rng rng(9, params + n);
      for (std::size_t i = 0; i < params; ++i) g[i] = (rng.uniform(i) - 0.5f) * 40.0f;
      if (params > 1100) g[1100] = std::numeric_limits<float>::infinity();  // a chunk that is not finite
      if (params > 20000) g[20000] = std::numeric_limits<float>::quiet_NaN();
      const std::size_t count = ls::epilogue_chunks(params);
      std::vector<double> whole(count), summed(count, 0.0);
      ls::scan_chunks(g.data(), params, 0, count, whole.data());
      std::size_t next = 0;
      for (std::size_t r = 0; r < n; ++r) {
        const auto [first, last] = ls::grid_slice_chunks(params, r, n);
        CHECK(first == next);
        next = last;
        const auto [lo, hi] = ls::grid_slice(params, r, n);  // the slice holds exactly those chunks' elements
        CHECK(lo == std::min(first * ls::epilogue_chunk, params));
        CHECK(hi == std::min(last * ls::epilogue_chunk, params));
        std::vector<float> mine(params, std::numeric_limits<float>::quiet_NaN());  // sums it does not hold
        std::copy(g.begin() + static_cast<std::ptrdiff_t>(lo), g.begin() + static_cast<std::ptrdiff_t>(hi),
                  mine.begin() + static_cast<std::ptrdiff_t>(lo));
        std::vector<double> own(count, 0.0);
        ls::scan_chunks(mine.data(), params, first, last, own.data());
        for (std::size_t c = 0; c < count; ++c) summed[c] += own[c];  // the reducer's sum (any order: x + 0 is x)
      }
      CHECK(next == count);
      for (std::size_t c = 0; c < count; ++c) {
        CAPTURE(c);
        CHECK(std::memcmp(&summed[c], &whole[c], sizeof(double)) == 0);
      }
      const ls::epilogue_inputs in{.rows = 7, .loss_scale = 1, .clip_global_norm = 0.5, .nonfinite = ls::nonfinite_policy::skip};
      const ls::epilogue_result a = ls::decide_update(summed.data(), count, in), b = ls::decide_update(whole.data(), count, in);
      CHECK(a.skip == b.skip);
      CHECK(a.finite == b.finite);
      CHECK(std::memcmp(&a.scale, &b.scale, sizeof(double)) == 0);
    }
  }
}

TEST_CASE("bucket_part: the parts of a bucket in the replicas' slices partition it, for every bucket layout and slicing") {
  for (const std::size_t params : {1u, 7u, 1024u, 5000u, 25450u}) {
    for (std::size_t n = 1; n <= 5; ++n) {
      for (const std::size_t buckets : {1u, 2u, 3u, 9u}) {
        CAPTURE(params);
        CAPTURE(n);
        CAPTURE(buckets);
        std::vector<int> owner(params, -1);
        for (std::size_t b = 0; b < buckets; ++b) {  // uneven buckets covering [0, params)
          const std::size_t offset = params * b * b / (buckets * buckets);
          const std::size_t end = params * (b + 1) * (b + 1) / (buckets * buckets);
          std::size_t covered = 0;
          for (std::size_t r = 0; r < n; ++r) {
            const auto slice = ls::grid_slice(params, r, n);
            const auto [lo, hi] = ls::bucket_part(offset, end - offset, slice);
            CHECK(lo <= hi);
            if (hi == lo) continue;
            CHECK(lo >= std::max(offset, slice.first));
            CHECK(hi <= std::min(end, slice.second));
            for (std::size_t i = lo; i < hi; ++i) {
              CHECK(owner[i] == -1);  // no element in two parts
              owner[i] = static_cast<int>(r);
            }
            covered += hi - lo;
          }
          CHECK(covered == end - offset);
        }
        CHECK(std::count(owner.begin(), owner.end(), -1) == 0);
      }
    }
  }
}

TEST_CASE("clipping by global norm: against a double reference on a net with a known norm") {
  using lin = ls::sequential<ls::dense<3, 2>>;
  for (const std::size_t n : {1u, 2u, 3u}) {
    CAPTURE(n);
    host s(ls::device_selection::first(n));
    auto m = s.replicate<lin>(ls::seed{4});
    const auto b = regression_batch(7, 3, 2, 1);
    const auto p0 = m.parameters_to_host();
    const auto g = mse_gradient_sums(p0, b, 3, 2);
    double sq = 0;
    for (const double v : g) sq += v * v;
    const double norm = std::sqrt(sq) / 7.0;  // the norm of the gradient the optimiser applies
    ls::update_recipe recipe;
    recipe.clip_global_norm = norm / 4;
    const float lr = 0.1f;
    const auto st = ls::train_step(s, m, ls::sgd{.lr = lr}, ls::mse{}, distributed(b, n), recipe);
    CHECK(st.grad_norm == doctest::Approx(norm).epsilon(1e-6));
    CHECK(st.clip_factor == doctest::Approx(0.25).epsilon(1e-6));
    const auto p1 = m.parameters_to_host();
    for (std::size_t i = 0; i < p1.size(); ++i) {
      CAPTURE(i);
      CHECK(p1[i] == doctest::Approx(p0[i] - lr * 0.25 * g[i] / 7.0).epsilon(1e-5));
    }
    for (std::size_t r = 1; r < m.size(); ++r) CHECK(std::equal(p1.begin(), p1.end(), m.replica(r).model().parameters().data()));
    // A bound above the norm changes nothing: factor 1, the plain update.
    host t(ls::device_selection::first(n));
    auto a = t.replicate<lin>(ls::seed{4});
    auto c = t.replicate<lin>(ls::seed{4});
    recipe.clip_global_norm = norm * 2;
    const auto sa = ls::train_step(t, a, ls::sgd{.lr = lr}, ls::mse{}, distributed(b, n), recipe);
    (void)ls::train_step(t, c, ls::sgd{.lr = lr}, ls::mse{}, distributed(b, n));
    CHECK(sa.clip_factor == 1.0);
    CHECK(a.parameters_to_host() == c.parameters_to_host());
  }
}

TEST_CASE("clipping by global norm: the same norm bits on every replica count under replica_count_invariant") {
  std::vector<std::vector<double>> norms;
  std::vector<std::vector<float>> params;
  for (const std::size_t n : {1u, 2u, 3u, 5u}) {
    invariant s(ls::device_selection::first(n), ls::strategy_options{.micro_shard_rows = 4});
    auto m = s.replicate<mlp_dropout>(ls::seed{6});
    ls::update_recipe recipe;
    recipe.clip_global_norm = 0.2;
    recipe.nonfinite = ls::nonfinite_policy::skip;
    std::vector<double> mine;
    for (std::size_t u = 0; u < 6; ++u)
      mine.push_back(
          ls::train_step(s, m, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{}, distributed(make_batch(23 + u, u), n), recipe)
              .grad_norm);
    norms.push_back(mine);
    params.push_back(m.parameters_to_host());
  }
  for (std::size_t i = 1; i < norms.size(); ++i) {
    CAPTURE(i);
    CHECK(std::memcmp(norms[i].data(), norms[0].data(), norms[0].size() * sizeof(double)) == 0);
    CHECK(params[i] == params[0]);
  }
  for (const double v : norms[0]) CHECK(std::isfinite(v));
}

TEST_CASE("per-value clipping and the EMA: the library's fused pass and a user optimiser's separate passes give the same bits") {
  for (const bool shard : {false, true}) {
    CAPTURE(shard);
    const auto run = [&](auto opt) {
      host s(ls::device_selection::first(3), ls::strategy_options{.shard_optimizer = shard});
      auto m = s.replicate<mlp>(ls::seed{8});
      ls::update_recipe recipe;
      recipe.clip_value = 0.002f;
      recipe.clip_global_norm = 0.5;
      recipe.ema = {.decay = 0.9, .start_step = 1, .every = 1};
      for (std::size_t u = 0; u < 5; ++u)
        (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(make_batch(30, u), 3), recipe);
      return std::make_pair(m.parameters_to_host(), m.ema_to_host());
    };
    const auto fused = run(ls::sgd{.lr = 0.5f});
    const auto separate = run(user::plain_sgd{.lr = 0.5f});
    CHECK(fused.first == separate.first);
    CHECK(fused.second == separate.second);
    CHECK_FALSE(fused.second.empty());
  }
  // The clamp itself: every element of the applied gradient within the bound.
  using lin = ls::sequential<ls::dense<3, 2>>;
  host s(ls::device_selection::first(1));
  auto m = s.replicate<lin>(ls::seed{4});
  const auto b = regression_batch(5, 3, 2, 9);
  const auto p0 = m.parameters_to_host();
  const auto g = mse_gradient_sums(p0, b, 3, 2);
  ls::update_recipe recipe;
  recipe.clip_value = 0.05f;
  (void)ls::train_step(s, m, ls::sgd{.lr = 1.0f}, ls::mse{}, distributed(b, 1), recipe);
  const auto p1 = m.parameters_to_host();
  for (std::size_t i = 0; i < p1.size(); ++i)
    CHECK(p1[i] == doctest::Approx(p0[i] - std::clamp(g[i] / 5.0, -0.05, 0.05)).epsilon(1e-5));
}

TEST_CASE("the order of operations with every option on: reduce, unscale, guard, clip by norm, clip values, optimiser, EMA") {
  using lin = ls::sequential<ls::dense<3, 2>>;
  constexpr std::size_t P = 8;
  host s(ls::device_selection::first(2));
  auto m = s.replicate<lin>(ls::seed{4});
  ls::update_recipe recipe;
  recipe.clip_global_norm = 0.3;
  recipe.clip_value = 0.06f;
  recipe.nonfinite = ls::nonfinite_policy::skip;
  recipe.ema = {.decay = 0.8, .start_step = 0, .every = 1};
  const float lr = 0.5f;
  std::vector<double> p(P), ema(P);
  {
    const auto init = m.parameters_to_host();
    for (std::size_t i = 0; i < P; ++i) p[i] = init[i];
  }
  bool first_ema = true;
  for (std::size_t u = 0; u < 4; ++u) {
    CAPTURE(u);
    // Each update: two batches (4 and 3 rows) accumulated; update 2 has a NaN and is skipped.
    auto b1 = regression_batch(4, 3, 2, 10 + u), b2 = regression_batch(3, 3, 2, 20 + u);
    if (u == 2) b2.features[4] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> pf(p.begin(), p.end());
    auto g = mse_gradient_sums(pf, b1, 3, 2);
    const auto g2 = mse_gradient_sums(pf, b2, 3, 2);
    for (std::size_t i = 0; i < P; ++i) g[i] += g2[i];  // reduce (over both batches)
    (void)ls::accumulate(s, m, ls::mse{}, distributed(b1, 2));
    const auto st = ls::train_step(s, m, ls::sgd{.lr = lr}, ls::mse{}, distributed(b2, 2), recipe);
    if (u == 2) {  // guard: skipped before anything else
      CHECK(st.skipped);
      continue;
    }
    CHECK_FALSE(st.skipped);
    double sq = 0;
    for (auto& v : g) {
      v /= 7.0;  // unscale
      sq += v * v;
    }
    const double norm = std::sqrt(sq);
    const double factor = norm > recipe.clip_global_norm ? recipe.clip_global_norm / norm : 1.0;
    CHECK(st.grad_norm == doctest::Approx(norm).epsilon(1e-6));
    CHECK(st.clip_factor == doctest::Approx(factor).epsilon(1e-6));
    for (std::size_t i = 0; i < P; ++i) {
      const double clipped = std::clamp(g[i] * factor, -0.06, 0.06);  // then per value
      p[i] -= lr * clipped;                                            // the optimiser
      ema[i] = first_ema ? p[i] : 0.8 * ema[i] + 0.2 * p[i];           // then the EMA
    }
    first_ema = false;
    const auto got = m.parameters_to_host(), got_ema = m.ema_to_host();
    for (std::size_t i = 0; i < P; ++i) {
      CHECK(got[i] == doctest::Approx(p[i]).epsilon(1e-5));
      CHECK(got_ema[i] == doctest::Approx(ema[i]).epsilon(1e-5));
    }
  }
  CHECK(m.step() == 4);
  CHECK(m.skipped_updates() == 1);
  CHECK(m.ema_updates() == 3);
}

TEST_CASE("EMA: the recurrence bitwise, sharded and not, with batch norm's running statistics averaged too") {
  using bn_net = ls::sequential<ls::reshape<1, 28, 28>, ls::conv2d<2, 5, 3, 0>, ls::batch_norm<>, ls::relu,
                                ls::max_pool2d<2>, ls::flatten, ls::dense<32, 10>>;
  ls::update_recipe recipe;
  recipe.ema = {.decay = 0.75, .start_step = 2, .every = 2};  // updates 3, 5, 7, ...
  for (const bool shard : {false, true}) {
    CAPTURE(shard);
    host s(ls::device_selection::first(3), ls::strategy_options{.shard_optimizer = shard});
    auto m = s.replicate<bn_net>(ls::seed{12});
    std::vector<float> ref;
    for (std::size_t u = 1; u <= 8; ++u) {
      (void)ls::train_step(s, m, ls::adam{.lr = 1e-3f}, ls::softmax_cross_entropy{}, distributed(make_batch(12, u), 3),
                           recipe);
      if (u >= 3 && (u - 3) % 2 == 0) {
        const auto p = m.parameters_to_host();  // parameters and running statistics
        if (ref.empty()) ref.assign(p.size(), 0.0f);
        ema_step(ref, p, recipe.ema.decay, u == 3);
      }
      CAPTURE(u);
      CHECK(m.ema_updates() == (u < 3 ? 0 : (u - 3) / 2 + 1));
      CHECK(m.ema_to_host() == ref);
    }
    CHECK(m.optimizer_sharded() == shard);
    if (shard)  // each replica keeps the EMA of its slice (and of the state) only
      CHECK(m.replica(1).ema().size() < ls::replicated<bn_net>::stored_count);
  }
}

namespace {
/// Three evaluation batches.
struct source {
  ls::data::generator<ls::data::batch> epoch(std::uint64_t) const {
    for (std::size_t i = 0; i < 3; ++i) co_yield make_batch(20, 50 + i);
  }
};
}  // namespace

TEST_CASE("EMA: evaluate with weights::ema swaps the average in and restores the live weights bitwise") {
  host s(ls::device_selection::first(2), ls::strategy_options{.shard_optimizer = true});
  auto m = s.replicate<mlp_dropout>(ls::seed{3});
  ls::update_recipe recipe;
  recipe.ema.decay = 0.9;
  CHECK_THROWS_AS((void)ls::with_ema_weights(m, [] { return 0; }), ls::config_error);  // none yet
  for (std::size_t u = 0; u < 6; ++u)
    (void)ls::train_step(s, m, ls::adam{.lr = 3e-3f}, ls::softmax_cross_entropy{}, distributed(make_batch(32, u), 2), recipe);
  const auto live = m.parameters_to_host();
  const auto state = m.optimizer_state_to_host();
  const auto with_ema = ls::evaluate(s, m, ls::softmax_cross_entropy{}, source{}, ls::weights::ema);
  CHECK(m.parameters_to_host() == live);  // bitwise restored
  for (std::size_t r = 0; r < m.size(); ++r) CHECK(std::equal(live.begin(), live.end(), m.replica(r).model().parameters().data()));
  CHECK(m.optimizer_state_to_host() == state);
  // ... and it evaluated the average: a model loaded with it gives the same numbers.
  auto copy = s.replicate<mlp_dropout>(ls::seed{3});
  copy.load_parameters(m.ema_to_host());
  const auto direct = ls::evaluate(s, copy, ls::softmax_cross_entropy{}, source{});
  CHECK(with_ema.loss == direct.loss);
  CHECK(with_ema.accuracy == direct.accuracy);
  CHECK(with_ema.loss != ls::evaluate(s, m, ls::softmax_cross_entropy{}, source{}).loss);
  // The swap restores the live weights when the pass throws too.
  CHECK_THROWS_AS(ls::with_ema_weights(m, []() -> int { throw ls::config_error("in the pass"); }), ls::config_error);
  CHECK(m.parameters_to_host() == live);
}

namespace {
using reg_net = ls::sequential<ls::dense<6, 8>, ls::relu, ls::dense<8, 3>>;

/// A regression batch of `rows` rows; row `nan_row` (if below rows) gets a NaN feature.
ls::data::batch reg_batch(std::size_t u, std::size_t rows) { return regression_batch(rows, 6, 3, 300 + u); }
}  // namespace

TEST_CASE("non-finite guard: a NaN in one replica's shard skips the update on every replica, and the limit raises a numerics_error naming step, layer and replica") {
  host s(ls::device_selection::first(3));
  auto m = s.replicate<reg_net>(ls::seed{2});
  ls::update_recipe recipe;
  recipe.nonfinite = ls::nonfinite_policy::skip;
  recipe.max_consecutive_skips = 3;
  recipe.ema.decay = 0.5;
  const ls::adam opt{.lr = 1e-2f};
  (void)ls::train_step(s, m, opt, ls::mse{}, distributed(reg_batch(0, 12), 3), recipe);
  const auto params = m.parameters_to_host(), state = m.optimizer_state_to_host(), ema = m.ema_to_host();
  for (std::size_t u = 1; u <= 2; ++u) {
    auto b = reg_batch(u, 12);
    b.features[9 * 6 + 2] = std::numeric_limits<float>::quiet_NaN();  // row 9: replica 2's shard
    const auto st = ls::train_step(s, m, opt, ls::mse{}, distributed(b, 3), recipe);
    CHECK(st.skipped);
    CHECK(std::isnan(st.grad_norm));
    CHECK(m.parameters_to_host() == params);
    CHECK(m.optimizer_state_to_host() == state);
    CHECK(m.ema_to_host() == ema);
    CHECK(m.step() == u + 1);  // the batch is consumed and the schedule advances
    CHECK(m.consecutive_skips() == u);
  }
  // An applied update resets the run of skips.
  (void)ls::train_step(s, m, opt, ls::mse{}, distributed(reg_batch(3, 12), 3), recipe);
  CHECK(m.consecutive_skips() == 0);
  CHECK(m.skipped_updates() == 2);
  CHECK(m.parameters_to_host() != params);
  // Three in a row: the third raises.
  std::string msg;
  for (std::size_t u = 4; u <= 6; ++u) {
    auto b = reg_batch(u, 12);
    b.features[9 * 6] = std::numeric_limits<float>::infinity();
    try {
      (void)ls::train_step(s, m, opt, ls::mse{}, distributed(b, 3), recipe);
    } catch (const ls::numerics_error& e) {
      msg = e.what();
      CHECK(u == 6);
      CHECK(e.step() == 6);
    }
  }
  CAPTURE(msg);
  CHECK(msg.find("3 updates in a row") != std::string::npos);
  CHECK(msg.find("update 7") != std::string::npos);
  CHECK(msg.find("of layer 0") != std::string::npos);  // the first non-finite gradient: the first layer's
  CHECK(msg.find("replica 2 of worker 0") != std::string::npos);
  CHECK(m.skipped_updates() == 5);
}

namespace {
/// The identity forward, whose backward gives global row 5 (sample_offset + r) an infinite input
/// gradient: a finite loss with a non-finite gradient below it.
struct infinite_below_row_5 {
  using layer_concept = ls::layer_tag;
  static constexpr std::size_t expected_input = 0;
  template <std::size_t In>
  struct bind {
    static constexpr std::size_t input_size = In, output_size = In, param_count = 0, workspace_per_sample = 0;
    template <class T>
    static void init(T*, const ls::counter_rng&) {}
    template <class T, class Ctx>
    static void forward(Ctx&, const ls::forward_args<T, Ctx, ls::shape<In>, ls::shape<In>>& a) {
      std::copy_n(a.x.data(), a.batch() * In, a.y.data());
    }
    template <class T, class Ctx>
    static void backward(Ctx&, const ls::backward_args<T, Ctx, ls::shape<In>, ls::shape<In>>& a) {
      if (!a.dx) return;
      for (std::size_t r = 0; r < a.batch(); ++r)
        for (std::size_t j = 0; j < In; ++j)
          a.dx.data()[r * In + j] =
              a.info.sample_offset + r == 5 ? std::numeric_limits<T>::infinity() : a.dy.data()[r * In + j];
    }
  };
};
}  // namespace

TEST_CASE("non-finite guard: the message names the replica whose shard gives a non-finite gradient, also below batch norm") {
  // The shards run again each on its own to find the culprit: batch norm then normalises over the
  // shard (it refused the replay, asked for the global batch without a row exchange, and the
  // message named no replica).
  using bn_reg_net = ls::sequential<ls::dense<6, 8>, ls::batch_norm<>, infinite_below_row_5, ls::dense<8, 3>>;
  using plain_reg_net = ls::sequential<ls::dense<6, 8>, ls::relu, infinite_below_row_5, ls::dense<8, 3>>;
  const auto check = [](auto net_tag) {
    using net = typename decltype(net_tag)::type;
    host s(ls::device_selection::first(3));
    auto m = s.replicate<net>(ls::seed{2});
    ls::update_recipe recipe;
    recipe.nonfinite = ls::nonfinite_policy::raise;
    std::string msg;
    try {
      (void)ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::mse{}, distributed(reg_batch(1, 12), 3), recipe);
      FAIL("no numerics_error");
    } catch (const ls::numerics_error& e) {
      msg = e.what();
    }
    CAPTURE(msg);
    // rows 4 to 7: replica 1
    CHECK(msg.find("the shard of replica 1 of worker 0 gave a finite loss but a non-finite gradient") != std::string::npos);
  };
  check(std::type_identity<plain_reg_net>{});
  check(std::type_identity<bn_reg_net>{});
}

TEST_CASE("non-finite guard, raise: a numerics_error at once, nothing changed") {
  for (const bool invariant_det : {false, true}) {
    CAPTURE(invariant_det);
    const auto check = [&](auto& s) {
      auto m = s.template replicate<reg_net>(ls::seed{2});
      ls::update_recipe recipe;
      recipe.nonfinite = ls::nonfinite_policy::raise;
      (void)ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::mse{}, distributed(reg_batch(0, 8), 2), recipe);
      const auto params = m.parameters_to_host();
      auto b = reg_batch(1, 8);
      b.features[1 * 6] = std::numeric_limits<float>::quiet_NaN();  // row 1: replica 0
      try {
        (void)ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::mse{}, distributed(b, 2), recipe);
        FAIL("no numerics_error");
      } catch (const ls::numerics_error& e) {
        const std::string msg = e.what();
        CAPTURE(msg);
        CHECK(e.step() == 1);
        CHECK(msg.find("not finite") != std::string::npos);
        CHECK(msg.find("replica 0 of worker 0") != std::string::npos);
      }
      CHECK(m.step() == 1);
      CHECK(m.parameters_to_host() == params);
      // The strategy is still usable.
      (void)ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::mse{}, distributed(reg_batch(2, 8), 2), recipe);
      CHECK(m.step() == 2);
    };
    if (invariant_det) {
      invariant s(ls::device_selection::first(2), ls::strategy_options{.micro_shard_rows = 2});
      check(s);
    } else {
      host s(ls::device_selection::first(2));
      check(s);
    }
  }
}

TEST_CASE("non-finite guard with batch norm: a skipped, raised or failed update leaves the running statistics as they were") {
  using bn_net = ls::sequential<ls::dense<6, 8>, ls::batch_norm<>, ls::relu, ls::dense<8, 3>>;
  const ls::adam opt{.lr = 1e-2f};
  const auto poisoned = [](std::size_t u) {
    auto b = reg_batch(u, 12);
    b.features[7 * 6 + 1] = std::numeric_limits<float>::quiet_NaN();  // row 7: replica 1's shard
    return b;
  };
  for (const auto policy : {ls::nonfinite_policy::skip, ls::nonfinite_policy::raise}) {
    CAPTURE(static_cast<int>(policy));
    host s(ls::device_selection::first(2));
    auto m = s.replicate<bn_net>(ls::seed{2});
    ls::update_recipe recipe;
    recipe.nonfinite = policy;
    (void)ls::train_step(s, m, opt, ls::mse{}, distributed(reg_batch(0, 12), 2), recipe);
    const auto before = m.parameters_to_host();  // the parameters, then the running statistics
    // a poisoned batch: the forward pass moved the statistics (to NaN), the guard puts them back
    try {
      const auto st = ls::train_step(s, m, opt, ls::mse{}, distributed(poisoned(1), 2), recipe);
      CHECK(st.skipped);
      CHECK(policy == ls::nonfinite_policy::skip);
    } catch (const ls::numerics_error&) {
      CHECK(policy == ls::nonfinite_policy::raise);
    }
    CHECK(m.parameters_to_host() == before);
    // the same after clean batches accumulated into the update: back to where the update began
    (void)s.accumulate(m, ls::mse{}, distributed(reg_batch(2, 12), 2));
    CHECK(m.parameters_to_host() != before);  // the accumulated batch moved them
    try {
      (void)ls::train_step(s, m, opt, ls::mse{}, distributed(poisoned(3), 2), recipe);
    } catch (const ls::numerics_error&) {
    }
    CHECK(m.parameters_to_host() == before);
    // a step that fails after its forward pass (targets of another width) changes nothing either
    auto wrong = reg_batch(4, 12);
    wrong.target_width = 2;
    wrong.targets.resize(12 * 2);
    CHECK_THROWS(ls::train_step(s, m, opt, ls::mse{}, distributed(wrong, 2), recipe));
    CHECK(m.parameters_to_host() == before);
    // and the next clean update trains as from `before`
    (void)ls::train_step(s, m, opt, ls::mse{}, distributed(reg_batch(5, 12), 2), recipe);
    CHECK(m.parameters_to_host() != before);
  }
}

TEST_CASE("the public recipe suite: skip decisions agree on the library's strategies") {
  const auto batches = [](std::size_t u, std::size_t rows) { return reg_batch(u, rows); };
  for (const std::size_t n : {1u, 2u, 3u}) {
    CAPTURE(n);
    ls::testing::recipe_check c;
    c.updates = 4;
    c.rows = 24;
    c.recipe.ema.decay = 0.9;
    c.recipe.clip_global_norm = 1.0;
    host h(ls::device_selection::first(n));
    CHECK(ls::testing::skip_decisions_agree<reg_net>(h, ls::adam{.lr = 1e-2f}, ls::mse{}, batches, 2, 23, c));
    invariant i(ls::device_selection::first(n), ls::strategy_options{.micro_shard_rows = 4});
    CHECK(ls::testing::skip_decisions_agree<reg_net>(i, ls::adam{.lr = 1e-2f}, ls::mse{}, batches, 1, 0, c));
    host sharded(ls::device_selection::first(n), ls::strategy_options{.shard_optimizer = true});
    CHECK(ls::testing::skip_decisions_agree<reg_net>(sharded, ls::adam{.lr = 1e-2f}, ls::mse{}, batches, 3, 11, c));
  }
}

TEST_CASE("update_recipe: meaningless values are a config_error naming the field") {
  host s(ls::device_selection::first(1));
  auto m = s.replicate<mlp>(ls::seed{1});
  const auto b = distributed(make_batch(4, 0), 1);
  const auto refuse = [&](ls::update_recipe r, const char* field) {
    try {
      (void)ls::train_step(s, m, ls::sgd{}, ls::softmax_cross_entropy{}, b, r);
      FAIL("accepted");
    } catch (const ls::config_error& e) {
      CHECK(std::string(e.what()).find(field) != std::string::npos);
    }
  };
  ls::update_recipe r;
  r.clip_global_norm = -1;
  refuse(r, "clip_global_norm");
  r = {};
  r.clip_value = std::numeric_limits<float>::infinity();
  refuse(r, "clip_value");
  r = {};
  r.ema.decay = 1.0;
  refuse(r, "ema.decay");
  r = {};
  r.ema.decay = 0.5;
  r.ema.every = 0;
  refuse(r, "ema.every");
  CHECK(m.step() == 0);
}

TEST_CASE("recipe: models of different sizes taking turns on one strategy clip as on strategies of their own") {
  using narrow = ls::sequential<ls::dense<784, 2>, ls::relu, ls::dense<2, 10>>;  // 1 600 parameters: 2 chunks
  const ls::update_recipe clip{.clip_global_norm = 0.05};
  for (const bool sharded : {false, true})
    for (const bool narrow_first : {false, true}) {
      CAPTURE(sharded);
      CAPTURE(narrow_first);
      const ls::strategy_options o{.shard_optimizer = sharded};
      host shared(ls::device_selection::first(2), o), own_wide(ls::device_selection::first(2), o),
          own_narrow(ls::device_selection::first(2), o);
      auto wide = shared.replicate<mlp>(ls::seed{42});  // 25 450 parameters: 25 chunks
      auto thin = shared.replicate<narrow>(ls::seed{43});
      auto wide_alone = own_wide.replicate<mlp>(ls::seed{42});
      auto thin_alone = own_narrow.replicate<narrow>(ls::seed{43});
      const ls::adam opt{.lr = 1e-2f};
      const auto step = [&](auto& s, auto& m, std::size_t i) {
        return ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(make_batch(12, i), 2), clip);
      };
      for (std::size_t i = 0; i < 4; ++i) {
        CAPTURE(i);
        if (narrow_first) CHECK(step(shared, thin, i).grad_norm == step(own_narrow, thin_alone, i).grad_norm);
        CHECK(step(shared, wide, i).grad_norm == step(own_wide, wide_alone, i).grad_norm);
        if (!narrow_first) CHECK(step(shared, thin, i).grad_norm == step(own_narrow, thin_alone, i).grad_norm);
      }
      CHECK(wide.parameters_to_host() == wide_alone.parameters_to_host());
      CHECK(thin.parameters_to_host() == thin_alone.parameters_to_host());
    }
}

TEST_CASE("EMA: one loaded before the first update survives the strategy's choice to shard the update") {
  const ls::adam opt{.lr = 1e-2f};
  ls::update_recipe recipe;
  recipe.ema.decay = 0.9;
  const auto run = [&](ls::optimizer_sharding sharding) {
    host s(ls::device_selection::first(2), ls::strategy_options{.shard_optimizer = sharding});
    auto m = s.replicate<mlp>(ls::seed{4});
    m.load_ema(std::vector<float>(m.stored_count, 0.5f), 3);  // a warm start: weights' average, no optimiser state
    for (std::size_t i = 0; i < 2; ++i)
      (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(make_batch(10, i), 2), recipe);
    return std::make_pair(m.ema_to_host(), m.parameters_to_host());
  };
  const auto automatic = run(ls::optimizer_sharding::automatic()), unsharded = run(false);
  CHECK(automatic.second == unsharded.second);
  CHECK(automatic.first == unsharded.first);  // ema = 0.9 × 0.5-based average + 0.1 × p, not from zeros
  REQUIRE(!automatic.first.empty());
  CHECK(automatic.first[0] > 0.3f);
}

TEST_CASE("EMA and optimiser state loaded before the first update keep their bits when the update is sharded afterwards, on and off the grid") {
  const ls::adam opt{.lr = 1e-2f};
  ls::update_recipe recipe;
  recipe.ema.decay = 0.9;
  for (const std::size_t n : {2u, 3u}) {
    CAPTURE(n);
    const auto run = [&](int layout) {  // 0: not sharded, 1: sharded, 2: sharded on the grid
      host s(ls::device_selection::first(n), ls::strategy_options{.shard_optimizer = false});
      auto m = s.replicate<mlp>(ls::seed{4});
      std::vector<float> loaded(m.stored_count);
      for (std::size_t i = 0; i < loaded.size(); ++i) loaded[i] = 0.25f + static_cast<float>(i % 97) / 128.0f;
      m.load_ema(loaded, 3);
      std::vector<float> moments(opt.state_size(ls::model<mlp>::param_count));  // a warm start's Adam moments
      for (std::size_t i = 0; i < moments.size(); ++i) moments[i] = static_cast<float>(i % 13 + 1) * 1e-4f;
      m.load_optimizer_state(moments);
      if (layout > 0) m.set_optimizer_sharding(true, layout == 2);  // after both were loaded, unsharded
      CHECK(m.optimizer_sharded() == (layout > 0));
      CHECK(m.ema_to_host() == loaded);
      CHECK(m.ema_updates() == 3);
      CHECK(m.optimizer_state_to_host() == moments);
      for (std::size_t i = 0; i < 2; ++i)
        (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(make_batch(12, i), n), recipe);
      return std::make_pair(m.ema_to_host(), m.parameters_to_host());
    };
    const auto plain = run(0);
    for (const int layout : {1, 2}) {
      CAPTURE(layout);
      const auto sharded = run(layout);
      CHECK(sharded.second == plain.second);
      CHECK(sharded.first == plain.first);  // from the loaded average and moments, not from zeros
    }
  }
}

TEST_CASE("restore: a checkpoint without optimiser state replaces the state a trained model holds (sharded or not)") {
  for (const bool sharded : {false, true}) {
    CAPTURE(sharded);
    host s(ls::device_selection::first(2), ls::strategy_options{.shard_optimizer = sharded});
    const ls::adam opt{.lr = 1e-2f};
    auto fresh = s.replicate<mlp>(ls::seed{5});
    const ls::model_state at_start = ls::capture(fresh);  // step 0: no optimiser state
    REQUIRE(at_start.optimizer_state.empty());
    // A model that has trained (Adam's moments, a step counter), then restored to the start.
    auto used = s.replicate<mlp>(ls::seed{6});
    for (std::size_t i = 0; i < 3; ++i) (void)ls::train_step(s, used, opt, ls::softmax_cross_entropy{}, distributed(make_batch(16, i), 2));
    REQUIRE(!used.optimizer_state_to_host().empty());
    ls::restore(used, at_start, opt);
    CHECK(used.optimizer_state_to_host().empty());
    for (std::size_t i = 0; i < 3; ++i) {
      const auto d = distributed(make_batch(16, 10 + i), 2);
      (void)ls::train_step(s, fresh, opt, ls::softmax_cross_entropy{}, d);
      (void)ls::train_step(s, used, opt, ls::softmax_cross_entropy{}, d);
    }
    CHECK(used.parameters_to_host() == fresh.parameters_to_host());
    CHECK(used.optimizer_state_to_host() == fresh.optimizer_state_to_host());
  }
}

namespace {
/// The identity whose gradient overflows (the loss stays finite, the gradient does not) and whose
/// forward throws once it has run `limit` times (below zero: never): the non-finite guard's
/// diagnostics run the forward again, and that run fails.
struct overflow_then_throw_fn {
  static inline long calls = 0;   // forward evaluations so far (this test's only)
  static inline long limit = -1;  // evaluations before the forward throws
  template <class T> static T f(T x) {
    if (limit >= 0 && ++calls > limit) throw std::runtime_error("the diagnostic forward failed");
    return x;
  }
  template <class T> static T grad(T, T, T) { return std::numeric_limits<T>::infinity(); }
};
}  // namespace

TEST_CASE("non-finite guard: at the limit, a diagnostic pass that throws still gives the numerics_error, and the skipped update is consumed") {
  using net = ls::sequential<ls::dense<6, 4>, ls::activation<overflow_then_throw_fn>, ls::dense<4, 3>>;
  host s(ls::device_selection::first(1));
  auto m = s.replicate<net>(ls::seed{2});
  ls::update_recipe recipe;
  recipe.nonfinite = ls::nonfinite_policy::skip;
  recipe.max_consecutive_skips = 2;
  // The first skipped update counts the forward's evaluations; the second reaches the limit, and
  // the forward its diagnostics run again throws: the error names the update and no replica.
  overflow_then_throw_fn::calls = 0;
  overflow_then_throw_fn::limit = std::numeric_limits<long>::max();
  const auto first = ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::mse{}, distributed(reg_batch(0, 5), 1), recipe);
  CHECK(first.skipped);
  CHECK(std::isfinite(first.loss_sum));
  const long per_step = overflow_then_throw_fn::calls;
  REQUIRE(per_step > 0);
  overflow_then_throw_fn::limit = 2 * per_step;
  std::string msg;
  try {
    (void)ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::mse{}, distributed(reg_batch(1, 5), 1), recipe);
  } catch (const ls::numerics_error& e) {
    msg = e.what();
    CHECK(e.step() == 1);
  }
  CAPTURE(msg);
  CHECK(msg.find("update 2 (step 1)") != std::string::npos);
  CHECK(msg.find("2 updates in a row") != std::string::npos);
  CHECK(msg.find("of layer 0") != std::string::npos);
  CHECK(msg.find("no replica's shard") != std::string::npos);
  overflow_then_throw_fn::limit = -1;
  CHECK(overflow_then_throw_fn::calls > 2 * per_step);  // the diagnostics ran the forward again
  CHECK(m.skipped_updates() == 2);
  CHECK(m.step() == 2);  // both skipped updates consumed: never more skipped updates than updates
  CHECK(m.consecutive_skips() == 2);
  // The model goes on from there: the next overflow is the third in a row, past the limit.
  CHECK_THROWS_AS(ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::mse{}, distributed(reg_batch(2, 5), 1), recipe),
                  ls::numerics_error);
  CHECK(m.step() == 3);
  CHECK(m.skipped_updates() == 3);
}
