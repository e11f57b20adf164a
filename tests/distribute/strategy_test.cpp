// Compile-time rules of strategies: the concepts, device-set validity (duplicate cpu ordinals),
// default reducer selection, and the constexpr gradient bucket layout.

#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#endif
#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include "distribute/common.hpp"

namespace ls = lockstep;

// A user-defined reducer outside the library's namespace satisfies the concept.
namespace user {
struct null_reducer {
  using reducer_concept = ls::reducer_tag;
  template <class... Ds>
  static constexpr bool supports = true;
  explicit null_reducer(const ls::reducer_config&) {}
  std::size_t workspace_bytes(std::size_t) const { return 0; }
  void bind(std::size_t, void*, std::size_t) {}
  template <class C, class T>
  void start(std::size_t, C&, T*, std::size_t, std::size_t) {}
  template <class C>
  void wait(std::size_t, C&, std::size_t) {}
  template <class C, class T>
  void broadcast(std::size_t, C&, T*, std::size_t, std::size_t) {}
  void abort() noexcept {}
  void reset() noexcept {}
};
}  // namespace user

static_assert(ls::strategy<ls::mirrored<ls::cpu<0>, ls::cpu<1>>>);
static_assert(ls::strategy<ls::one_device<ls::cpu<0>>>);
static_assert(ls::strategy<ls::basic_mirrored<user::null_reducer, ls::determinism::run_to_run, ls::cpu<0>, ls::cpu<1>>>);
static_assert(!ls::strategy<int>);
static_assert(ls::reducer<ls::host_allreduce>);
static_assert(ls::reducer<ls::reduce_to_one_device<ls::cpu<1>>>);
static_assert(ls::reducer<ls::single_device_reducer>);
static_assert(ls::reducer<user::null_reducer>);
static_assert(!ls::reducer<int>);

// Duplicate cpu ordinals are rejected; duplicate gpu ordinals are a valid set (a reducer must handle them).
static_assert(ls::valid_device_set_v<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>);
static_assert(!ls::valid_device_set_v<ls::cpu<0>, ls::cpu<0>>);
static_assert(!ls::valid_device_set_v<ls::cpu<1>, ls::cpu<2>, ls::cpu<1>>);
static_assert(!ls::distinct_cpu_ordinals_v<ls::cpu<3>, ls::cpu<3>>);
static_assert(ls::valid_device_set_v<ls::gpu<0>, ls::gpu<0>>);
static_assert(!ls::valid_device_set_v<ls::cpu<0>, ls::gpu<1>>);
static_assert(!ls::valid_device_set_v<>);
static_assert(!ls::valid_device_set_v<int>);
// The host reducers have no path for gpu devices.
static_assert(!ls::host_allreduce::supports<ls::gpu<0>, ls::gpu<1>>);
static_assert(!ls::reduce_to_one_device<ls::cpu<2>>::supports<ls::cpu<0>, ls::cpu<1>>);
static_assert(ls::reduce_to_one_device<ls::cpu<1>>::supports<ls::cpu<0>, ls::cpu<1>>);

// Default reducers from the device set.
static_assert(std::is_same_v<ls::select_reducer_t<ls::cpu<0>, ls::cpu<1>>, ls::host_allreduce>);
static_assert(std::is_same_v<ls::select_reducer_t<ls::cpu<0>>, ls::single_device_reducer>);
static_assert(ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>::replica_count == 3);

// Buckets: reverse layer order, whole layers, boundaries from the constexpr layer offsets.
using bucket_net = ls::sequential<ls::dense<4, 8>, ls::relu, ls::dense<8, 3>, ls::tanh, ls::dense<3, 2>>;
using bound = ls::model<bucket_net>::bound;
constexpr auto per_layer = ls::plan_buckets<bound>(0);
static_assert(per_layer.size == 3);
static_assert(per_layer.buckets[0].first_layer == 4 && per_layer.buckets[0].count == 3 * 2 + 2);
static_assert(per_layer.buckets[1].first_layer == 2 && per_layer.buckets[1].last_layer == 3);
static_assert(per_layer.buckets[1].offset == bound::param_offsets[2] && per_layer.buckets[1].count == 8 * 3 + 3);
static_assert(per_layer.buckets[2].first_layer == 0 && per_layer.buckets[2].offset == 0);
static_assert(per_layer.completes[4] == 1 && per_layer.completes[2] == 2 && per_layer.completes[0] == 3);
static_assert(per_layer.completes[1] == 0 && per_layer.completes[3] == 0);
constexpr auto one = ls::plan_buckets<bound>(1u << 20);
static_assert(one.size == 1 && one.buckets[0].count == bound::param_count && one.buckets[0].last_layer == 4);
// (8*3+3 + 3*2+2) * 4 bytes = 140 bytes: a 100-byte bucket closes after layers 4..2.
constexpr auto two = ls::plan_buckets<bound>(100);
static_assert(two.size == 2 && two.buckets[0].first_layer == 2 && two.buckets[1].first_layer == 0);

TEST_CASE("bucket layouts cover every gradient exactly once") {
  for (std::size_t bytes : {0u, 1u, 100u, 200u, 1000u, 1u << 20}) {
    const auto l = ls::plan_buckets<bound>(bytes);
    std::size_t next = bound::param_count;
    for (std::size_t b = 0; b < l.size; ++b) {
      CHECK(l.buckets[b].offset + l.buckets[b].count == next);
      next = l.buckets[b].offset;
    }
    CHECK(next == 0);
  }
}

TEST_CASE("a distributed batch with the wrong shard count is refused") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>> s;
  const auto b = dist_test::make_batch(4, 0);
  CHECK_THROWS_AS(s.run([](std::size_t, const ls::data::shard&) { return 0; }, dist_test::distributed(b, 3)),
                  ls::config_error);
}

TEST_CASE("distribute cuts a range of global batches into one shard per replica") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> s;
  std::vector<ls::data::batch> batches{dist_test::make_batch(7, 0), dist_test::make_batch(2, 1)};
  std::size_t seen = 0, rows = 0;
  for (auto&& d : s.shard(batches)) {
    REQUIRE(d.shards.size() == 3);
    for (const auto& sh : d.shards) rows += sh.size;
    ++seen;
  }
  CHECK(seen == 2);
  CHECK(rows == 9);
}

TEST_CASE("replicate makes identical replicas and checkpoints round-trip") {
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> s;
  auto m = s.replicate<dist_test::mlp>(ls::seed{9});
  CHECK(m.size() == 3);
  CHECK(m.step() == 0);
  const auto p = m.parameters_to_host();
  for (std::size_t r = 1; r < 3; ++r) CHECK(std::equal(p.begin(), p.end(), m.replica(r).model().parameters().data()));
  const auto b = dist_test::make_batch(12, 0);
  ls::train_step(s, m, ls::adam{}, ls::softmax_cross_entropy{}, dist_test::distributed(b, 3));
  CHECK(m.step() == 1);
  const auto p1 = m.parameters_to_host();
  const auto st = m.optimizer_state_to_host();
  CHECK(st.size() == 2 * m.param_count);
  // Continue two ways: directly, and from a fresh model loaded with the checkpointed state.
  ls::train_step(s, m, ls::adam{}, ls::softmax_cross_entropy{}, dist_test::distributed(b, 3));
  auto m2 = s.replicate<dist_test::mlp>(ls::seed{9});
  m2.load_parameters(p1);
  m2.load_optimizer_state(st);
  m2.set_step(1);
  ls::train_step(s, m2, ls::adam{}, ls::softmax_cross_entropy{}, dist_test::distributed(b, 3));
  CHECK(m.parameters_to_host() == m2.parameters_to_host());
  std::vector<float> wrong(3);
  CHECK_THROWS_AS(m.load_parameters(wrong), ls::shape_error);
}

TEST_CASE("replica 0 runs on the caller's thread, every other replica on a thread of its own") {
  for (const std::size_t n : {1u, 2u, 3u, 5u}) {
    CAPTURE(n);
    ls::mirrored<ls::cpus> s(ls::device_selection::first(n));
    for (int round = 0; round < 3; ++round) {  // the same threads job after job
      std::vector<std::thread::id> ids(n);
      s.run_each([&](std::size_t r) { ids[r] = std::this_thread::get_id(); });
      CHECK(ids[0] == std::this_thread::get_id());
      for (std::size_t r = 1; r < n; ++r)
        for (std::size_t q = 0; q < r; ++q) CHECK(ids[r] != ids[q]);
    }
    // A failure of replica 0 (the caller's) still waits for the others and names replica 0.
    std::atomic<std::size_t> finished{0};
    try {
      s.run_each([&](std::size_t r) {
        if (r == 0) throw std::runtime_error("replica 0 fails");
        finished.fetch_add(1);
      });
      FAIL("no exception");
    } catch (const ls::replica_error& e) {
      CHECK(e.replica() == 0);
      CHECK(finished.load() == n - 1);
    }
  }
}

#if defined(__linux__)
TEST_CASE("pin_replicas pins replica 0's thread to the first allowed CPU for the length of a job only") {
  const std::vector<int> cpus = ls::allowed_cpus();
  cpu_set_t before;
  REQUIRE(pthread_getaffinity_np(pthread_self(), sizeof before, &before) == 0);
  for (const bool pin : {true, false}) {
    for (const std::size_t n : {2u, 3u, 5u}) {
      CAPTURE(pin);
      CAPTURE(n);
      ls::mirrored<ls::cpus> s(ls::device_selection::first(n), ls::strategy_options{.pin_replicas = pin});
      std::vector<cpu_set_t> inside(n);
      s.run_each([&](std::size_t r) { (void)pthread_getaffinity_np(pthread_self(), sizeof inside[r], &inside[r]); });
      cpu_set_t after;
      REQUIRE(pthread_getaffinity_np(pthread_self(), sizeof after, &after) == 0);
      CHECK(CPU_EQUAL(&after, &before));  // the caller's own mask is back
      const bool pinned = pin && cpus.size() >= n;  // pinning needs a CPU per replica
      for (std::size_t r = 0; r < n; ++r) {
        CAPTURE(r);
        if (pinned) {
          CHECK(CPU_COUNT(&inside[r]) == 1);
          CHECK(CPU_ISSET(cpus[r], &inside[r]));
        } else {
          CHECK(CPU_EQUAL(&inside[r], &before));
        }
      }
    }
  }
}
#endif

#if defined(__x86_64__) || defined(__SSE2__)
TEST_CASE("the caller's thread keeps its floating-point mode: replicas flush subnormals only on their own work") {
  const unsigned saved = _mm_getcsr();
  const unsigned ieee = saved & ~0x8040u;  // gradual underflow: no FTZ (bit 15), no DAZ (bit 6)
  const auto mode = [] { return _mm_getcsr() & ~0x3Fu; };  // the control bits (0-5 are exception flags)
  for (const std::size_t n : {1u, 2u, 3u}) {
    CAPTURE(n);
    _mm_setcsr(ieee);
    ls::mirrored<ls::cpus> s(ls::device_selection::first(n));  // flush_denormals: on by default
    auto m = s.replicate<dist_test::mlp>(ls::seed{4});
    CHECK(mode() == (ieee & ~0x3Fu));
    std::vector<unsigned> inside(n);
    s.run_each([&](std::size_t r) {
      m.replica(r).context().activate();
      inside[r] = _mm_getcsr();
    });
    for (std::size_t r = 0; r < n; ++r) CHECK((inside[r] & 0x8040u) == 0x8040u);  // each replica's work flushes
    CHECK(mode() == (ieee & ~0x3Fu));
    const auto b = dist_test::make_batch(12, 1);
    ls::train_step(s, m, ls::adam{}, ls::softmax_cross_entropy{}, dist_test::distributed(b, n));
    CHECK(mode() == (ieee & ~0x3Fu));
    m.load_optimizer_state(m.optimizer_state_to_host());
    CHECK(mode() == (ieee & ~0x3Fu));
    m.load_ema(std::vector<float>(m.stored_count, 0.5f), 3);  // allocates every replica's EMA here
    CHECK(mode() == (ieee & ~0x3Fu));
    // A mixed<bf16> model's weight copy is allocated, and written, at its first pass.
    auto half = s.replicate<dist_test::mlp, ls::mixed<ls::bf16>>(ls::seed{4});
    CHECK(mode() == (ieee & ~0x3Fu));
    ls::train_step(s, half, ls::adam{}, ls::softmax_cross_entropy{}, dist_test::distributed(b, n));
    CHECK(mode() == (ieee & ~0x3Fu));
  }
  _mm_setcsr(saved);
}

TEST_CASE("backend::place_memory places a replica's memory without setting the thread's compute mode") {
  struct only_activate {  // a context without place_memory: activate() does both
    mutable int activated = 0;
    void activate() const noexcept { ++activated; }
  };
  struct both {
    mutable int activated = 0, placed = 0;
    void activate() const noexcept { ++activated; }
    void place_memory() const noexcept { ++placed; }
  };
  const only_activate a;
  ls::backend::place_memory(a);
  CHECK(a.activated == 1);
  const both b;
  ls::backend::place_memory(b);
  CHECK(b.placed == 1);
  CHECK(b.activated == 0);
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved & ~0x8040u);
  const ls::host_context ctx(1, true);
  ls::backend::place_memory(ctx);
  CHECK((_mm_getcsr() & 0x8040u) == 0u);  // placing leaves FTZ and DAZ off
  ctx.activate();
  CHECK((_mm_getcsr() & 0x8040u) == 0x8040u);  // computing for the replica sets them
  _mm_setcsr(saved);
}
#endif

namespace caller_scope_test {
// A context whose caller_scope records the calling thread's "current device" and restores it,
// as cuda_context's does with CUDA's.
struct device_context {
  struct caller_scope {
    int* current;
    int saved;
    explicit caller_scope(int* c = &device) noexcept : current(c), saved(*c) {}
    caller_scope(const caller_scope&) = delete;
    caller_scope& operator=(const caller_scope&) = delete;
    ~caller_scope() { *current = saved; }
  };
  static inline int device = 0;  // this test's stand-in for the thread's current device
};
}  // namespace caller_scope_test

TEST_CASE("backend::caller_scope_t: the context's caller_scope where it has one, which restores what it kept, and nothing on the host") {
  static_assert(std::is_same_v<ls::backend::caller_scope_t<caller_scope_test::device_context>,
                               caller_scope_test::device_context::caller_scope>);
  static_assert(std::is_same_v<ls::backend::caller_scope_t<ls::host_context>, ls::backend::detail::no_caller_scope>);
  static_assert(std::is_empty_v<ls::backend::caller_scope_t<ls::host_context>>);
  caller_scope_test::device_context::device = 3;
  {
    const ls::backend::caller_scope_t<caller_scope_test::device_context> keep;
    caller_scope_test::device_context::device = 1;  // what activate or place_memory would do
  }
  CHECK(caller_scope_test::device_context::device == 3);
}

TEST_CASE("a reduce-to-one strategy aggregates on the FIRST replica of its aggregation device") {
  using std::vector;
  CHECK(ls::detail::aggregation_root<ls::reduce_to_one_device<ls::cpu<1>>, ls::cpus>(vector<std::size_t>{0, 1, 1}) == 1);
  CHECK(ls::detail::aggregation_root<ls::reduce_to_one_device<ls::cpu<0>>, ls::cpus>(vector<std::size_t>{0, 1, 0}) == 0);
  CHECK(ls::detail::aggregation_root<ls::reduce_to_one_device<ls::cpu<2>>, ls::cpus>(vector<std::size_t>{5, 2, 2}) == 1);
  CHECK(ls::detail::aggregation_root<ls::host_allreduce, ls::cpus>(vector<std::size_t>{3, 4}) == 0);
  using absent = ls::reduce_to_one_device<ls::cpu<7>>;
  const auto root_of_absent = [] { return ls::detail::aggregation_root<absent, ls::cpus>(vector<std::size_t>{0, 1}); };
  CHECK_THROWS_AS(root_of_absent(), ls::config_error);
}
