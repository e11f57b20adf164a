// The complete reducer example of docs/extending.md, compiled and run: a reducer written outside
// the library's namespace against the reducer concept, run through the public reducer conformance
// suite and used by a strategy to train. The text between `example-begin NAME` and `example-end`
// is what the page shows (tests/extending/check_docs.cmake checks that the page and this file agree).

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

// example-begin reducer
#include <lockstep/lockstep.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

namespace my {

/// Every replica posts its pointer for a bucket; the last to arrive sums the bucket in replica
/// order (a fixed order: repeated runs are bitwise equal) and writes the sum to every replica's
/// data; the others sleep on a condition variable until then.
class rendezvous_reducer {
public:
  using reducer_concept = lockstep::reducer_tag;  // opts in to lockstep::reducer
  template <class... Devices>                     // serves any set of host replicas
  static constexpr bool supports = (lockstep::is_cpu_v<Devices> && ...);

  explicit rendezvous_reducer(const lockstep::reducer_config& c)
      : replicas_(c.replicas), timeout_(c.timeout), buckets_(c.ids, bucket(c.replicas)) {}

  // Sums in place in the replicas' own buffers: no workspace.
  std::size_t workspace_bytes(std::size_t /*max_bucket_bytes*/) const { return 0; }
  void bind(std::size_t /*replica*/, void* /*workspace*/, std::size_t /*bytes*/) {}

  // Called by replica r's thread, for bucket `id`, in the same bucket order on every replica.
  template <class Ctx, class T>
  void start(std::size_t r, Ctx&, T* data, std::size_t count, std::size_t id) {
    const std::lock_guard lock(mutex_);
    bucket& b = buckets_[id];
    b.seen[r] = b.generation;
    b.data[r] = data;
    if (++b.arrived < replicas_) return;
    for (std::size_t i = 0; i < count; ++i) {  // the last to arrive sums for everyone
      T s = static_cast<T*>(b.data[0])[i];
      for (std::size_t k = 1; k < replicas_; ++k) s += static_cast<T*>(b.data[k])[i];
      for (std::size_t k = 0; k < replicas_; ++k) static_cast<T*>(b.data[k])[i] = s;
    }
    ++b.generation;
    b.arrived = 0;
    std::fill(b.data.begin(), b.data.end(), nullptr);
    woken_.notify_all();
  }

  // Returns once bucket `id` holds the sum; throws after the timeout, naming who did not arrive.
  template <class Ctx>
  void wait(std::size_t r, Ctx&, std::size_t id) {
    std::unique_lock lock(mutex_);
    bucket& b = buckets_[id];
    if (!woken_.wait_for(lock, timeout_, [&] { return aborted_ || b.generation > b.seen[r]; })) {
      std::string missing;
      for (std::size_t k = 0; k < replicas_; ++k)
        if (b.data[k] == nullptr) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      throw lockstep::timeout_error("my::rendezvous_reducer: bucket " + std::to_string(id) + ": replica(s) " +
                                    missing + " did not arrive");
    }
    if (aborted_) throw lockstep::replica_error("my::rendezvous_reducer: aborted");
  }

  // A sum to which only the root contributes, on the spare bucket after the model's.
  template <class Ctx, class T>
  void broadcast(std::size_t r, Ctx& ctx, T* data, std::size_t count, std::size_t root) {
    if (r != root) std::fill(data, data + count, T(0));
    start(r, ctx, data, count, buckets_.size() - 1);
    wait(r, ctx, buckets_.size() - 1);
  }

  // From any thread, when a replica failed: every waiter throws.
  void abort() {
    const std::lock_guard lock(mutex_);
    aborted_ = true;
    woken_.notify_all();
  }
  // When no replica is inside: ready for the next step.
  void reset() {
    const std::lock_guard lock(mutex_);
    aborted_ = false;
    for (bucket& b : buckets_) b = bucket(replicas_);
  }

private:
  struct bucket {
    explicit bucket(std::size_t n) : data(n, nullptr), seen(n, 0) {}
    std::vector<void*> data;         // each replica's buffer while the bucket is open
    std::vector<std::size_t> seen;   // the generation each replica joined
    std::size_t arrived = 0, generation = 0;
  };
  std::size_t replicas_;
  std::chrono::milliseconds timeout_;
  std::vector<bucket> buckets_;
  std::mutex mutex_;
  std::condition_variable woken_;
  bool aborted_ = false;
};

}  // namespace my
// example-end

namespace ls = lockstep;

static_assert(ls::reducer<my::rendezvous_reducer>);
static_assert(my::rendezvous_reducer::supports<ls::cpu<0>, ls::cpu<1>> && !my::rendezvous_reducer::supports<ls::gpu<0>>);

// example-begin reducer_use
#include <lockstep/testing/reducer.hpp>

// The reducer through the library's reducer suite (one thread per replica, as in a strategy).
TEST_CASE_TEMPLATE_INVOKE(lockstep_reducer_conformance, my::rendezvous_reducer);

// A strategy over three host replicas that aggregates with it.
std::vector<float> train_with_my_reducer() {
  using net = ls::sequential<ls::dense<6, 8>, ls::tanh, ls::dense<8, 3>>;
  std::vector<float> x(40 * 6);
  std::vector<std::int32_t> y(40);
  const ls::counter_rng rng(1, 2);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i) * 2 - 1;
  for (std::size_t r = 0; r < y.size(); ++r) y[r] = static_cast<std::int32_t>(r % 3);
  const auto data = ls::data::from_memory(std::move(x), 6, std::move(y)) | ls::data::batched(9);

  ls::basic_mirrored<my::rendezvous_reducer, ls::determinism::run_to_run, ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> strategy;
  auto model = strategy.replicate<net>(ls::seed{2});
  ls::fit(strategy, model, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, data, {.epochs = 2, .quiet = true});
  return model.parameters_to_host();
}
// example-end

TEST_CASE("extending: the user-defined reducer of docs/extending.md trains bitwise like the library's") {
  const std::vector<float> mine = train_with_my_reducer();
  // The same run with the library's host_allreduce, which also sums in replica order.
  using net = ls::sequential<ls::dense<6, 8>, ls::tanh, ls::dense<8, 3>>;
  std::vector<float> x(40 * 6);
  std::vector<std::int32_t> y(40);
  const ls::counter_rng rng(1, 2);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i) * 2 - 1;
  for (std::size_t r = 0; r < y.size(); ++r) y[r] = static_cast<std::int32_t>(r % 3);
  const auto data = ls::data::from_memory(std::move(x), 6, std::move(y)) | ls::data::batched(9);
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> library;
  auto model = library.replicate<net>(ls::seed{2});
  const ls::history h = ls::fit(library, model, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, data,
                                {.epochs = 2, .quiet = true});
  REQUIRE(h.epochs.size() == 2);
  CHECK(h.last().samples == 40);
  CHECK(mine == model.parameters_to_host());
  CHECK(mine != std::vector<float>(mine.size(), 0.0f));
}
