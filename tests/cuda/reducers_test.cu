// The GPU reducers' conformance suite (testing/gpu_reducer.cuh) and their failure and ordering
// contracts: the host-staged broadcast after a sum, NCCL with one replica, NCCL's run-time revoke, a peer that fails before its first NCCL collective,
// and an abort from another thread while replicas are inside NCCL calls.

#include "gpu_test.hpp"

#include <lockstep/distribute/mirrored.hpp>
#include <lockstep/testing/gpu_reducer.cuh>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <exception>
#include <string>
#include <thread>
#include <vector>

using namespace lockstep_test;
using namespace std::chrono_literals;

namespace {

// Another accelerator's kind and its device tags: the GPU reducers and their default selections are
// keyed on the kind type gpus, so they never serve it, whatever it resembles.
struct npus {
  using kind_type = npus;
};
template <std::size_t I>
struct npu {
  static constexpr std::size_t ordinal = I;
  using kind_type = npus;
};
static_assert(!ls::is_gpu_v<npu<0>> && !ls::all_of_kind_v<ls::gpus, npu<0>, npu<1>>);
static_assert(!ls::same_device_allreduce::supports<npu<0>, npu<0>>);
static_assert(!ls::reduce_to_one_device<ls::gpu<0>>::supports<npu<0>, ls::gpu<0>>);
static_assert(!ls::reduce_to_one_device<ls::cpu<0>>::supports<npu<0>, npu<1>>);
static_assert(ls::same_device_allreduce::supports<ls::gpu<0>, ls::gpu<0>>);
#if defined(LOCKSTEP_HAS_NCCL)
static_assert(!ls::nccl_allreduce::supports<npu<0>, npu<1>> && ls::nccl_allreduce::supports<ls::gpu<0>, ls::gpu<1>>);
#endif
static_assert(ls::default_reducers_for<ls::gpus>::value && !ls::default_reducers_for<npus>::value);

// Runs fn(0) and fn(1) on two threads and rethrows the first exception of each, in order.
template <class F>
void on_two_threads(const F& fn) {
  std::exception_ptr errors[2];
  std::thread t1([&] {
    try {
      fn(1);
    } catch (...) {
      errors[1] = std::current_exception();
    }
  });
  try {
    fn(0);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  t1.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

namespace {
// Every replica on gpu<0>.
std::vector<int> all_on_gpu0(std::size_t n) { return std::vector<int>(n, 0); }
// LOCKSTEP_TEST_TIMEOUT_SCALE as a factor (see test_timeout).
double timeout_scale() { return static_cast<double>(test_timeout(1000).count()) / 1000.0; }
}  // namespace

TEST_CASE("gpu: same_device_allreduce passes the GPU reducer conformance suite, 1 to 8 replicas on gpu<0>") {
  LOCKSTEP_REQUIRE_GPUS(1);
  ls::testing::check_gpu_reducer<ls::same_device_allreduce>("same_device_allreduce", all_on_gpu0, 8, timeout_scale());
}

TEST_CASE("gpu: reduce_to_one_device<gpu<0>> passes the GPU reducer conformance suite, 1 to 8 replicas on gpu<0>") {
  LOCKSTEP_REQUIRE_GPUS(1);
  ls::testing::check_gpu_reducer<ls::reduce_to_one_device<ls::gpu<0>>>("reduce_to_one_device<gpu<0>>", all_on_gpu0, 8,
                                                                       timeout_scale());
}

TEST_CASE("gpu: reduce_to_one_device<cpu<0>> over gpu<0> replicas passes the GPU reducer conformance suite") {
  LOCKSTEP_REQUIRE_GPUS(1);
  ls::testing::check_gpu_reducer<ls::reduce_to_one_device<ls::cpu<0>>>("reduce_to_one_device<cpu<0>> over GPUs",
                                                                       all_on_gpu0, 8, timeout_scale());
}

#if defined(LOCKSTEP_HAS_NCCL)
TEST_CASE("multigpu: nccl_allreduce passes the GPU reducer conformance suite, one replica per GPU") {
  LOCKSTEP_REQUIRE_GPUS(2);
  const auto gpus = static_cast<std::size_t>(ls::backend::cuda_device_count());
  const auto one_per_gpu = [](std::size_t n) {  // replica r on GPU r
    std::vector<int> v(n);
    for (std::size_t r = 0; r < n; ++r) v[r] = static_cast<int>(r);
    return v;
  };
  ls::testing::check_gpu_reducer<ls::nccl_allreduce>("nccl_allreduce", one_per_gpu, gpus, timeout_scale());
}
#endif

TEST_CASE("gpu: reduce_to_one_device<cpu<0>>: a broadcast right after a sum waits for the sum's copy back") {
  LOCKSTEP_REQUIRE_GPUS(1);
  // Replica 1's sum is copied back from its pinned staging on its communication stream without a
  // host wait; a broadcast that follows writes the root's data into that same staging. Replica 0
  // holds replica 1's communication stream busy for 300 ms before the copy back is queued, so a
  // broadcast that did not wait for the stream would overwrite the sum before it is copied.
  using R = ls::reduce_to_one_device<ls::cpu<0>>;
  constexpr std::size_t count = 1u << 20;
  R red(ls::reducer_config{2, test_timeout(20'000)});
  ls::cuda_context ctx[2] = {ls::cuda_context(0), ls::cuda_context(0)};
  std::vector<ls::buffer<float, ls::gpu<0>>> grad, param;
  for (int r = 0; r < 2; ++r) {
    grad.push_back(to_device(ctx[r], std::vector<float>(count, float(r + 1))));
    param.push_back(to_device(ctx[r], std::vector<float>(count, float(10 * (r + 1)))));
  }
  on_two_threads([&](std::size_t r) {
    ctx[r].activate();
    if (r == 0) {
      std::this_thread::sleep_for(100ms);  // replica 1 has staged its bucket and waits for replica 0
      spin_then_copy(ctx[1].comm_stream(), 300);
    }
    red.start(r, ctx[r], grad[r].data(), count, 0);
    red.wait(r, ctx[r], 0);
    red.broadcast(r, ctx[r], param[r].data(), count, 0);
  });
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(to_host(ctx[r], grad[r].data(), count) == std::vector<float>(count, 3.0f));
    CHECK(to_host(ctx[r], param[r].data(), count) == std::vector<float>(count, 10.0f));
  }
}

#if defined(LOCKSTEP_HAS_NCCL)

TEST_CASE("host: ncclCommRevoke is used only when the NCCL loaded at run time has it") {
  const int loaded = ls::detail::nccl_runtime_version();
  CAPTURE(loaded);
  CHECK(loaded >= 21400);  // the library this program loaded answers ncclGetVersion
  CHECK((ls::detail::nccl_revoke_function(22705) == nullptr));  // NCCL 2.27: abort instead
  CHECK((ls::detail::nccl_revoke_function(0) == nullptr));
  // The version that decides is the loaded library's, not the headers' NCCL_VERSION_CODE.
  CHECK((ls::detail::nccl_revoke_function() != nullptr) == (loaded >= 22800));
  std::vector<ncclComm_t> none(3, nullptr);
  ls::detail::nccl_stop_all(none, nullptr);  // null communicators are skipped
  ls::detail::nccl_stop_all(none, ls::detail::nccl_revoke_function(22800));
  ls::detail::nccl_abort_all(none);
  CHECK(ls::detail::nccl_finalize_destroy(none, 10ms));
}

TEST_CASE("gpu: mirrored<gpus> with one replica trains without making an NCCL communicator") {
  static_assert(std::is_same_v<ls::select_kind_reducer_t<ls::gpus>, ls::nccl_allreduce>);
  LOCKSTEP_REQUIRE_GPUS(1);
  ls::mirrored<ls::gpus> s(ls::device_selection{0});
  REQUIRE(s.num_replicas() == 1);
  using net = ls::sequential<ls::dense<6, 4>, ls::tanh, ls::dense<4, 3>>;
  auto m = s.replicate<net>(ls::seed{5});  // broadcasts from replica 0: nothing to do
  auto b = std::make_shared<ls::data::batch>();
  b->width = 6;
  b->features = random_vector(5 * 6, 70);
  b->labels = {0, 1, 2, 1, 0};
  b->indices = {0, 1, 2, 3, 4};
  const auto st = ls::train_step(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{},
                                 ls::data::distributed_batch{b, ls::data::split(*b, 1)});
  CHECK(st.count == 5);
  CHECK(std::isfinite(st.loss_sum));
  CHECK_FALSE(s.reducer().has_communicators());
}

TEST_CASE("multigpu: NCCL: a peer that fails before its first collective releases the other") {
  LOCKSTEP_REQUIRE_GPUS(2);
  // Replica 0 enters its first ncclAllReduce (NCCL connects the peers then); replica 1 fails
  // before calling NCCL (its bucket length disagrees) and the strategy's abort follows. Replica 0
  // must leave within the timeout, and the reducer works again after reset().
  ls::nccl_allreduce red(ls::reducer_config{2, test_timeout(20'000)});
  ls::cuda_context ctx[2] = {ls::cuda_context(0), ls::cuda_context(1)};
  std::vector<ls::buffer<float, ls::gpu<0>>> data;
  for (int r = 0; r < 2; ++r) {
    ctx[r].activate();  // each buffer on its replica's device
    data.push_back(to_device(ctx[r], std::vector<float>(1000, float(r + 1))));
  }
  const auto started = std::chrono::steady_clock::now();
  std::atomic<int> released{0};
  CHECK_THROWS(on_two_threads([&](std::size_t r) {
    ctx[r].activate();
    try {
      // replica 1 arrives late and with another length: replica 0 waits for it (in the setup
      // rendezvous on a first use), then the mismatch fails one replica and releases the other
      if (r == 1) std::this_thread::sleep_for(200ms);
      red.start(r, ctx[r], data[r].data(), r == 1 ? 999 : 1000, 0);
      red.wait(r, ctx[r], 0);
      ctx[r].synchronize();
    } catch (const ls::detail::collective_aborted&) {
      ++released;
      throw;
    } catch (...) {
      red.abort();  // what the strategy does when a replica fails
      throw;
    }
  }));
  CHECK(released.load() == 1);
  CHECK(std::chrono::steady_clock::now() - started < test_timeout(15'000));
  red.reset();
  on_two_threads([&](std::size_t r) {
    ctx[r].activate();
    red.start(r, ctx[r], data[r].data(), 1000, 1);
    red.wait(r, ctx[r], 1);
  });
  for (int r = 0; r < 2; ++r) {
    ctx[r].activate();
    CHECK(to_host(ctx[r], data[r].data(), 1000) == std::vector<float>(1000, 3.0f));
  }
}

TEST_CASE("multigpu: NCCL: an abort from another thread while replicas are inside NCCL calls is safe") {
  LOCKSTEP_REQUIRE_GPUS(2);
  // abort() takes the communicators exclusively (no NCCL call blocks), so it never revokes or
  // frees one under a replica's NCCL call; every replica leaves with the sum or collective_aborted.
  ls::nccl_allreduce red(ls::reducer_config{2, test_timeout(20'000)});
  ls::cuda_context ctx[2] = {ls::cuda_context(0), ls::cuda_context(1)};
  std::vector<ls::buffer<float, ls::gpu<0>>> data;
  for (int r = 0; r < 2; ++r) {
    ctx[r].activate();
    data.push_back(to_device(ctx[r], std::vector<float>(1u << 18, 1.0f)));
  }
  // Rounds 0-4 abort while the communicators are made (each round makes them again after
  // reset()); rounds 5-19 once a first bucket was summed, so the abort lands among the buckets.
  for (int round = 0; round < 20; ++round) {
    CAPTURE(round);
    std::atomic<bool> summed{false};
    std::thread aborter([&] {
      if (round >= 5) {
        const auto give_up = std::chrono::steady_clock::now() + test_timeout(20'000);
        while (!summed.load() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
      }
      std::this_thread::sleep_for(std::chrono::microseconds(round >= 5 ? 100 * (round - 5) : 500 * round));
      red.abort();
    });
    try {
      on_two_threads([&](std::size_t r) {
        ctx[r].activate();
        for (std::size_t b = 0; b < 50; ++b) {
          red.start(r, ctx[r], data[r].data(), data[r].size(), b % 8);
          red.wait(r, ctx[r], b % 8);
          summed.store(true);
        }
      });
    } catch (const ls::detail::collective_aborted&) {
    } catch (const ls::device_error& e) {
      FAIL("an NCCL call failed instead of being released: " << e.what());
    }
    aborter.join();
    red.reset();
    for (int r = 0; r < 2; ++r) {
      ctx[r].activate();
      ctx[r].synchronize();
      fill(ctx[r], data[r].data(), data[r].size(), 1.0f);
    }
  }
  on_two_threads([&](std::size_t r) {
    ctx[r].activate();
    red.start(r, ctx[r], data[r].data(), data[r].size(), 0);
    red.wait(r, ctx[r], 0);
  });
  for (int r = 0; r < 2; ++r) {
    ctx[r].activate();
    CHECK(to_host(ctx[r], data[r].data(), 16) == std::vector<float>(16, 2.0f));
  }
}

#endif  // LOCKSTEP_HAS_NCCL
