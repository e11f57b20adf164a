// The public conformance suites run on types with one planted defect each, of the kind each check
// exists to catch: every run must fail, in the check its CTest names (programs.cmake runs one
// test case per defect and matches the failing check's text). A suite that passes one of these
// types has a check that cannot fail.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <vector>

#include <lockstep/distribute/reducers/host_allreduce.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/testing/layer.hpp>
#include <lockstep/testing/optimizer.hpp>
#include <lockstep/testing/reducer.hpp>

#include "support/scale_shift.hpp"

namespace mutant {

namespace ls = lockstep;

/// A reducer whose broadcast copies replica 0's data, whatever the root.
struct broadcast_from_zero : ls::host_allreduce {
  using ls::host_allreduce::host_allreduce;
  /// Broadcasts from replica 0 (the defect: `root` is ignored).
  template <class Ctx, class T>
  void broadcast(std::size_t replica, Ctx& ctx, T* data, std::size_t count, std::size_t) {
    ls::host_allreduce::broadcast(replica, ctx, data, count, 0);
  }
};

/// A reducer that keeps state from a bucket's earlier rounds: from its second round on, a bucket's
/// first element is off by one (a stale partial sum).
struct stale_bucket : ls::host_allreduce {
  /// As host_allreduce, with a round count and the data of each replica and bucket.
  explicit stale_bucket(const ls::reducer_config& c)
      : ls::host_allreduce(c), replicas_(c.replicas), data_(c.replicas * c.ids), rounds_(new std::atomic<int>[c.ids]) {
    for (std::size_t i = 0; i < c.ids; ++i) rounds_[i] = 0;
  }
  /// Remembers where replica `replica`'s part of `bucket` is.
  template <class Ctx, class T>
  void start(std::size_t replica, Ctx& ctx, T* data, std::size_t count, std::size_t bucket) {
    data_[bucket * replicas_ + replica] = count ? data : nullptr;
    ls::host_allreduce::start(replica, ctx, data, count, bucket);
  }
  /// Completes the bucket; from its second round on, adds 1 to its first element (the defect).
  template <class Ctx>
  void wait(std::size_t replica, Ctx& ctx, std::size_t bucket) {
    ls::host_allreduce::wait(replica, ctx, bucket);
    const int arrivals = rounds_[bucket].fetch_add(1);
    if (arrivals >= static_cast<int>(replicas_) && data_[bucket * replicas_ + replica])
      data_[bucket * replicas_ + replica][0] += 1.0f;
  }

private:
  std::size_t replicas_;
  std::vector<float*> data_;
  std::unique_ptr<std::atomic<int>[]> rounds_;
};

/// A reducer in which replicas other than 0 copy replica 0's sum at their wait, while replica 0's
/// wait returns without waiting for those copies (the defect: replica 0 may already be writing its
/// buffer again).
struct copies_after_return : ls::host_allreduce {
  /// As host_allreduce, remembering each replica's data.
  explicit copies_after_return(const ls::reducer_config& c)
      : ls::host_allreduce(c), replicas_(c.replicas), data_(c.replicas * c.ids), counts_(c.replicas * c.ids) {}
  /// Remembers where replica `replica`'s part of `bucket` is.
  template <class Ctx, class T>
  void start(std::size_t replica, Ctx& ctx, T* data, std::size_t count, std::size_t bucket) {
    data_[bucket * replicas_ + replica] = data;
    counts_[bucket * replicas_ + replica] = count;
    ls::host_allreduce::start(replica, ctx, data, count, bucket);
  }
  /// Completes the bucket, then copies replica 0's sum (the defect: no wait for replica 0).
  template <class Ctx>
  void wait(std::size_t replica, Ctx& ctx, std::size_t bucket) {
    ls::host_allreduce::wait(replica, ctx, bucket);
    const std::size_t n = counts_[bucket * replicas_ + replica];
    if (replica != 0 && n) std::memcpy(data_[bucket * replicas_ + replica], data_[bucket * replicas_], n * sizeof(float));
  }

private:
  std::size_t replicas_;
  std::vector<float*> data_;
  std::vector<std::size_t> counts_;
};

/// A reducer that waits an hour for a replica that never arrives, whatever timeout it was given (the
/// defect); it honours abort().
struct ignores_timeout : ls::host_allreduce {
  /// host_allreduce with a timeout of one hour.
  explicit ignores_timeout(const ls::reducer_config& c) : ls::host_allreduce(an_hour(c)) {}

private:
  static ls::reducer_config an_hour(ls::reducer_config c) {
    c.timeout = std::chrono::hours(1);
    return c;
  }
};

/// Which key a row_mask mutant's backward gives a row's mask.
enum class mask_key {
  shard_row,   ///< the shard's own row r (the defect: right on one whole batch, wrong in every shard but the first)
  batch_place  ///< sample_offset + r, as forward (the defect both share: update_offset is ignored)
};

/// y = x * mask(row) per feature, forward keying the mask by the row's place in its batch
/// (sample_offset + r) and backward by `Backward`. Neither keys by the row's place in the update
/// (update_offset + sample_offset + r): every batch of an accumulated update draws the same masks,
/// which each check on one batch misses.
template <mask_key Backward>
struct row_mask {
  using layer_concept = ls::layer_tag;
  static constexpr std::size_t expected_input = 0;

  template <std::size_t In>
  struct bind {
    static constexpr std::size_t input_size = In, output_size = In, param_count = 0, workspace_per_sample = 0;
    static double mask(std::uint64_t row, std::size_t j) { return 0.5 + static_cast<double>((row * 7 + j) % 3); }

    template <class T>
    static void init(T*, const ls::counter_rng&) {}
    template <class T, class Ctx>
    static void forward(Ctx&, const ls::forward_args<T, Ctx, ls::shape<In>, ls::shape<In>>& a) {
      for (std::size_t r = 0; r < a.batch(); ++r)
        for (std::size_t j = 0; j < In; ++j)
          a.y.data()[r * In + j] = a.x.data()[r * In + j] * static_cast<T>(mask(a.info.sample_offset + r, j));
    }
    template <class T, class Ctx>
    static void backward(Ctx&, const ls::backward_args<T, Ctx, ls::shape<In>, ls::shape<In>>& a) {
      if (!a.dx) return;
      const std::uint64_t first = Backward == mask_key::shard_row ? 0 : a.info.sample_offset;
      for (std::size_t r = 0; r < a.batch(); ++r)
        for (std::size_t j = 0; j < In; ++j)
          a.dx.data()[r * In + j] = a.dy.data()[r * In + j] * static_cast<T>(mask(first + r, j));
    }
  };
};

/// Forward keyed by the row's place in the batch, backward by the shard's row (caught by the
/// sharded-batch check).
using local_row_mask = row_mask<mask_key::shard_row>;
/// Forward and backward keyed alike by the row's place in the batch, not in the update (caught
/// only by the update_offset check).
using update_blind_mask = row_mask<mask_key::batch_place>;

/// y = x * a + b per feature with right gradients, which says it accumulates gradients
/// (`accumulates_gradients`) but overwrites dparams under pass_info::accumulate (the defect).
using claims_accumulation = test_support::scale_shift<test_support::scale_shift_defect::overwrites_accumulation>;

/// SGD with momentum that zeroes its momentum at the first update of each optimiser object (the
/// defect: fit makes a fresh copy of the optimiser for every update, so momentum never builds up).
struct forgets_momentum {
  using optimizer_concept = ls::optimizer_tag;
  float lr = 0.01f;
  mutable bool started = false;
  std::size_t state_size(std::size_t n) const { return n; }
  template <class T, class Ctx>
  void update(Ctx&, T* p, const T* g, T* v, std::size_t n, const ls::update_info& u) const {
    if (!started) {
      for (std::size_t i = 0; i < n; ++i) v[i] = T(0);
      started = true;
    }
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = T(0.9) * v[i] + g[i] * static_cast<T>(u.grad_scale);
      p[i] -= static_cast<T>(u.lr) * v[i];
    }
  }
};

/// Gradient ascent (the defect: the sign).
struct ascends {
  using optimizer_concept = ls::optimizer_tag;
  float lr = 0.01f;
  std::size_t state_size(std::size_t) const { return 0; }
  template <class T, class Ctx>
  void update(Ctx&, T* p, const T* g, T*, std::size_t n, const ls::update_info& u) const {
    for (std::size_t i = 0; i < n; ++i) p[i] += static_cast<T>(u.lr) * g[i] * static_cast<T>(u.grad_scale);
  }
};

/// The layers bound to 5 features (one name each, for the test case names).
using row_mask_layer = ls::bind_t<local_row_mask, 5>;
using accumulating_layer = ls::bind_t<claims_accumulation, 5>;
using update_blind_layer = ls::bind_t<update_blind_mask, 5>;

}  // namespace mutant

TYPE_TO_STRING(mutant::broadcast_from_zero);
TYPE_TO_STRING(mutant::stale_bucket);
TYPE_TO_STRING(mutant::copies_after_return);
TYPE_TO_STRING(mutant::ignores_timeout);
TYPE_TO_STRING(mutant::row_mask_layer);
TYPE_TO_STRING(mutant::accumulating_layer);
TYPE_TO_STRING(mutant::update_blind_layer);
TYPE_TO_STRING(mutant::forgets_momentum);
TYPE_TO_STRING(mutant::ascends);

TEST_CASE_TEMPLATE_INVOKE(lockstep_reducer_conformance, mutant::broadcast_from_zero, mutant::stale_bucket,
                          mutant::copies_after_return, mutant::ignores_timeout);
TEST_CASE_TEMPLATE_INVOKE(lockstep_layer_conformance, mutant::row_mask_layer, mutant::accumulating_layer,
                          mutant::update_blind_layer);
TEST_CASE_TEMPLATE_INVOKE(lockstep_optimizer_conformance, mutant::forgets_momentum, mutant::ascends);
