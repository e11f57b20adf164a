// The bf16 weight copy of mixed<bf16> host models (basic_model::has_weight_copy): the GEMMs read
// the weights from it instead of converting them at every call, with the same bits. Checked here:
// training with the copy gives the bits of training without it (1, 2 and 3 replicas, the update
// whole or sharded, both determinism policies, accumulated updates, clipping and an EMA), the
// copy is read, it follows every write of the parameters (loads, writes through parameters(),
// skipped updates), a GEMM finds only operands wholly inside it, and the conversion that writes it
// treats an element the same wherever it sits in a row.

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "distribute/common.hpp"

using namespace dist_test;
namespace ls = lockstep;

namespace {

using run_to_run = ls::basic_mirrored<ls::host_allreduce, ls::determinism::run_to_run, ls::cpus>;
using invariant = ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus>;

/// What one training run left behind.
struct copy_run {
  std::vector<float> params;
  std::vector<float> ema;
  std::uint64_t reads = 0;         // GEMM operands read from the copy, over every replica
  std::size_t copy_bytes = 0;      // replica 0's copy
  bool identical = true;           // every replica holds replica 0's parameters
};

/// Five updates of mlp_dropout under mixed<bf16> on `replicas` replicas of strategy S, with the copy
/// on or off; `accumulate` batches per update; an EMA and clipping when `recipe`; between updates 2
/// and 3 a load of new parameters, and between 3 and 4 a write of one weight through parameters().
/// A user's optimiser: plain SGD that applies no recipe (so the strategy writes the weight copy in
/// a pass of its own after it).
struct plain_sgd {
  using optimizer_concept = ls::optimizer_tag;
  static constexpr bool elementwise = true;
  float lr = 0.05f;
  [[nodiscard]] std::size_t state_size(std::size_t) const noexcept { return 0; }
  template <class T, class Ctx>
  void update(Ctx&, T* p, const T* g, T*, std::size_t n, const ls::update_info& u) const {
    for (std::size_t i = 0; i < n; ++i) p[i] -= static_cast<T>(u.lr) * g[i] * static_cast<T>(u.grad_scale);
  }
};

template <class S, class Opt = ls::adamw>
copy_run train_copy(std::size_t replicas, bool copy, bool shard, std::size_t accumulate, bool recipe,
                    const Opt& opt = ls::adamw{.lr = 3e-3f}) {
  S s(ls::device_selection::first(replicas), ls::strategy_options{.micro_shard_rows = 4, .shard_optimizer = shard});
  auto m = s.template replicate<mlp_dropout, ls::mixed<ls::bf16>>(ls::seed{5});
  for (std::size_t r = 0; r < m.size(); ++r) m.replica(r).context().set_bf16_weight_copy(copy);
  ls::update_recipe rec;
  if (recipe) {
    rec.clip_global_norm = 0.5;
    rec.ema.decay = 0.9;
  }
  std::uint64_t key = 0;
  for (std::size_t update = 0; update < 5; ++update) {
    if (update == 2) {  // new parameters: the copy must follow them
      auto p = m.parameters_to_host();
      for (std::size_t i = 0; i < p.size(); i += 3) p[i] *= -0.75f;
      m.load_parameters(p);
    }
    if (update == 3)  // a write through a replica's parameters, on every replica
      for (std::size_t r = 0; r < m.size(); ++r) m.replica(r).model().parameters().data()[7] = 0.3125f;
    for (std::size_t j = 0; j + 1 < accumulate; ++j)
      (void)ls::accumulate(s, m, ls::softmax_cross_entropy{}, distributed(make_batch(24 + j, 300 + key++), replicas));
    (void)ls::train_step(s, m, opt, ls::softmax_cross_entropy{}, distributed(make_batch(37, 300 + key++), replicas),
                         rec);
  }
  copy_run out;
  out.params = m.parameters_to_host();
  if (recipe) out.ema = m.ema_to_host();
  for (std::size_t r = 0; r < m.size(); ++r) {
    out.reads += m.replica(r).context().weight_copy_reads();
    out.identical = out.identical && std::equal(out.params.begin(), out.params.end(),
                                                std::as_const(m.replica(r)).model().parameters().data());
  }
  out.copy_bytes = std::as_const(m.replica(0)).model().weight_copy_bytes();
  return out;
}

template <class S>
void check_same_bits(const char* policy) {
  for (const std::size_t replicas : {1, 2, 3})
    for (const bool shard : {false, true})
      for (const std::size_t accumulate : {1, 3})
        for (const bool recipe : {false, true}) {
          CAPTURE(std::string(policy));
          CAPTURE(replicas);
          CAPTURE(shard);
          CAPTURE(accumulate);
          CAPTURE(recipe);
          const auto off = train_copy<S>(replicas, false, shard, accumulate, recipe);
          const auto on = train_copy<S>(replicas, true, shard, accumulate, recipe);
          CHECK(off.identical);
          CHECK(on.identical);
          CHECK(on.params == off.params);
          CHECK(on.ema == off.ema);
          CHECK(off.reads == 0);
          CHECK(off.copy_bytes == 0);
          CHECK(on.reads > 0);
          CHECK(on.copy_bytes == 2 * invariant::model_type<mlp_dropout>::param_count);
        }
}

}  // namespace

TEST_CASE("mixed<bf16>'s weight copy trains to the bits of converting the weights at every GEMM (run_to_run)") {
  check_same_bits<run_to_run>("run_to_run");
}

TEST_CASE("mixed<bf16>'s weight copy trains to the bits of converting the weights at every GEMM (replica_count_invariant)") {
  check_same_bits<invariant>("replica_count_invariant");
}

TEST_CASE("mixed<bf16>'s weight copy trains to the same bits under SGD with momentum and under a user's optimiser that applies no recipe") {
  const auto check = [](const auto& opt, const char* name) {
    for (const std::size_t replicas : {1, 2})
      for (const bool shard : {false, true})
        for (const bool recipe : {false, true}) {
          CAPTURE(std::string(name));
          CAPTURE(replicas);
          CAPTURE(shard);
          CAPTURE(recipe);
          const auto off = train_copy<run_to_run>(replicas, false, shard, 2, recipe, opt);
          const auto on = train_copy<run_to_run>(replicas, true, shard, 2, recipe, opt);
          CHECK(on.identical);
          CHECK(on.params == off.params);
          CHECK(on.ema == off.ema);
          CHECK(on.reads > 0);
        }
  };
  check(ls::sgd{.lr = 0.05f, .momentum = 0.9f}, "sgd with momentum");
  check(plain_sgd{}, "a user's optimiser");
}

TEST_CASE("the weight copy is kept only under mixed<bf16>, by default where bf16 is native, and the GEMMs of every dense layer read it") {
  run_to_run s(ls::device_selection::first(1));
  auto fp = s.replicate<mlp>(ls::seed{1});
  auto half = s.replicate<mlp, ls::mixed<ls::fp16>>(ls::seed{1});
  auto bf = s.replicate<mlp, ls::mixed<ls::bf16>>(ls::seed{1});
  // By default a copy is kept where the bf16 GEMMs are native (the emulation widens the weights
  // into an fp32 buffer anyway); asked for, fp32 and fp16 models still keep none.
  CHECK(bf.replica(0).context().bf16_weight_copy() == ls::host_bf16_native());
  for (auto* m : {&fp, &half, &bf}) m->replica(0).context().set_bf16_weight_copy(true);
  const auto b = make_batch(9, 1);
  (void)ls::train_step(s, fp, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, distributed(b, 1));
  (void)ls::train_step(s, half, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, distributed(b, 1));
  CHECK(std::as_const(fp.replica(0)).model().weight_copy_bytes() == 0);
  CHECK(std::as_const(half.replica(0)).model().weight_copy_bytes() == 0);
  CHECK(fp.replica(0).context().weight_copy_reads() == 0);
  CHECK(half.replica(0).context().weight_copy_reads() == 0);
  (void)ls::train_step(s, bf, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, distributed(b, 1));
  // Forward reads W of both dense layers; backward reads the second's W for its input gradient
  // (the first layer computes none).
  CHECK(bf.replica(0).context().weight_copy_reads() == 3);
  // Evaluation reads it too, and after a load the pass rewrites the copy before reading it.
  bf.load_parameters(fp.parameters_to_host());
  const auto before = bf.replica(0).context().weight_copy_reads();
  const auto pipeline = [&b] {
    return ls::data::from_memory(std::vector<float>(b.features), b.width, std::vector<std::int32_t>(b.labels)) |
           ls::data::batched(9);
  };
  const auto e = ls::evaluate(s, bf, ls::softmax_cross_entropy{}, pipeline());
  CHECK(bf.replica(0).context().weight_copy_reads() == before + 2);
  bf.replica(0).context().set_bf16_weight_copy(false);
  const auto e_off = ls::evaluate(s, bf, ls::softmax_cross_entropy{}, pipeline());
  CHECK(bf.replica(0).context().weight_copy_reads() == before + 2);
  CHECK(e.loss == e_off.loss);
  CHECK(e.samples == 9);
}

TEST_CASE("bf16_weight_copy_view finds only dense runs wholly inside the parameters") {
  std::vector<float> params(37);
  std::vector<std::uint16_t> bits(37);
  const ls::bf16_weight_copy_view v{params.data(), params.size(), bits.data()};
  CHECK(v.find(params.data(), 37) == bits.data());
  CHECK(v.find(params.data() + 36, 1) == bits.data() + 36);
  CHECK(v.find(params.data() + 5, 32) == bits.data() + 5);
  CHECK(v.find(params.data() + 5, 33) == nullptr);   // one past the end
  CHECK(v.find(params.data() + 37, 1) == nullptr);   // just after
  CHECK(v.find(params.data(), 0) == nullptr);        // nothing to read
  std::vector<float> other(8);
  CHECK(v.find(other.data(), 1) == nullptr);
  CHECK(ls::bf16_weight_copy_view{}.find(params.data(), 1) == nullptr);
  // Through a context: a strided operand is converted, a dense one read.
  ls::host_context ctx(1, true, ls::compute_precision::bf16);
  ctx.set_weight_copy(v);
  CHECK(ctx.weight_copy_of(params.data(), 4, 9, 9) == bits.data());
  CHECK(ctx.weight_copy_of(params.data(), 4, 8, 9) == nullptr);  // leading dimension 9, 8 columns: not dense
  CHECK(ctx.weight_copy_of(params.data(), 1, 8, 9) == bits.data());  // one row is dense whatever its ld
  CHECK(ctx.weight_copy_of(params.data(), 5, 8, 8) == nullptr);  // 40 values: past the end
  CHECK(ctx.weight_copy_reads() == 2);
}

TEST_CASE("a bf16 GEMM reading an operand from a weight copy computes the bits of converting it, for any shape") {
  for (const std::size_t m : {1, 2, 7, 64})
    for (const std::size_t n : {1, 3, 13, 40})
      for (const std::size_t k : {1, 5, 31})
        for (const bool tb : {false, true}) {
          CAPTURE(m);
          CAPTURE(n);
          CAPTURE(k);
          CAPTURE(tb);
          const ls::counter_rng rng(77, m * 10007 + n * 101 + k);
          std::vector<float> a(m * k), w(k * n + 3);  // w: a weight matrix inside a longer parameter vector
          for (std::size_t i = 0; i < a.size(); ++i) a[i] = rng.uniform(i) * 2 - 1;
          for (std::size_t i = 0; i < w.size(); ++i) w[i] = rng.uniform(100000 + i) * 2 - 1;
          std::vector<std::uint16_t> bits(w.size());
          ls::backend::to_bf16_weights(w.data(), w.size(), bits.data());
          ls::host_context plain(1, true, ls::compute_precision::bf16), copied(1, true, ls::compute_precision::bf16);
          plain.set_gemm_precision(ls::compute_precision::bf16);
          copied.set_gemm_precision(ls::compute_precision::bf16);
          copied.set_weight_copy({w.data(), w.size(), bits.data()});
          const auto t = tb ? ls::backend::trans::yes : ls::backend::trans::no;
          const std::size_t ldb = tb ? k : n;
          std::vector<float> c1(m * n, 1.0f), c2(m * n, 1.0f);
          ls::backend::gemm(plain, ls::backend::trans::no, t, m, n, k, 1.0f, a.data(), k, w.data() + 2, ldb, 1.0f,
                            c1.data(), n);
          ls::backend::gemm(copied, ls::backend::trans::no, t, m, n, k, 1.0f, a.data(), k, w.data() + 2, ldb, 1.0f,
                            c2.data(), n);
          CHECK(copied.weight_copy_reads() == 1);
          CHECK(plain.weight_copy_reads() == 0);
          CHECK(c1 == c2);
          // The product is the bf16-rounded one: exact products of the rounded operands, summed in fp32.
          for (std::size_t i = 0; i < m; ++i)
            for (std::size_t j = 0; j < n; ++j) {
              double ref = 1.0;
              for (std::size_t p = 0; p < k; ++p) {
                const float wv = tb ? w[2 + j * k + p] : w[2 + p * n + j];
                ref += double(ls::round_to_bf16(a[i * k + p])) * double(ls::round_to_bf16(wv));
              }
              CHECK(std::abs(double(c2[i * n + j]) - ref) <= 1e-5 * (1.0 + double(k)));
            }
        }
}

namespace {
/// Parameters that exercise the bf16 conversion: subnormals of both signs, halfway cases (ties to
/// even both ways), NaNs, infinities, the largest floats, and ordinary values.
std::vector<float> awkward_values(std::size_t n) {
  std::vector<float> v;
  const ls::counter_rng rng(5, n);
  const float specials[] = {0x1p-149f, -0x1p-149f, 0x1.fffffcp-127f, -0x1.0p-130f, 0x1p-126f, 0.0f, -0.0f,
                            1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -(1.0f + 0x1p-8f), 3.4e38f, -3.4e38f,
                            std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), 65504.0f, 1e-30f};
  for (std::size_t i = 0; i < n; ++i)
    v.push_back(i < std::size(specials) ? specials[i] : (rng.uniform(i) * 2 - 1) * std::ldexp(1.0f, static_cast<int>(i % 60) - 30));
  return v;
}

}  // namespace

TEST_CASE("the weight copy's conversion reads subnormals as the bf16 GEMMs' conversion does, wherever they sit in a row") {
  // Element by element, the vectorised conversion (where bf16 is native) is to_bf16_bits_daz, in the
  // vector body and in the tail alike, so an element's bits do not depend on its position.
  // The special values open each row: in the tail for rows under 32, in the vector body above.
  for (const std::size_t n : {1, 17, 31, 32, 33, 4099}) {
    CAPTURE(n);
    const auto v = awkward_values(n);
    std::vector<std::uint16_t> row(v.size());
    ls::backend::to_bf16_weights(v.data(), v.size(), row.data());
    for (std::size_t i = 0; i < v.size(); ++i) {
      CAPTURE(i);
      CHECK(row[i] == ls::to_bf16_bits_daz(v[i], ls::host_bf16_native()));
    }
  }
}
