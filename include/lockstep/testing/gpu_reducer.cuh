#pragma once
/// @file gpu_reducer.cuh
/// The conformance suite of GPU reducers (the reducer concept with `cuda_context` and float data
/// in device memory), for doctest under nvcc: call
///
///     lockstep::testing::check_gpu_reducer<my_reducer>("my_reducer", ordinals, max_replicas);
///
/// from a TEST_CASE, with `ordinals(n)` the CUDA device of each of n replicas (all 0 for replicas
/// sharing one GPU; 0, 1, ... for one per GPU). Each replica drives the reducer from its own
/// thread with its own context on its device, as a strategy does (device workspace sized by
/// `workspace_bytes` and bound per replica first). It checks what the host suite
/// (testing/reducer.hpp) checks: the all-reduce over 1 to max_replicas replicas and lengths 0, 1,
/// primes and 65537, split in two buckets, gives every replica the same sum, within float
/// rounding of the exact sum, and bitwise the same on a second run (a fixed summation order);
/// 10^7 elements over 1 to 3 replicas; broadcast from every root; with 3 replicas or more, a
/// replica that never arrives makes the others fail within the timeout, at least one with a
/// `timeout_error` naming it as `replica(s) I`; `abort()` from another thread releases every
/// waiter; after `reset()` the reducer works again; and, for a reducer that reduces a sharded
/// update onto the slices (reduces_to_slices_v), each slice's sums, the chunk sums and the gather
/// (detail::check_gpu_slices). Replica 0 is the reducer's root. Plain
/// checks, no SUBCASE or TEST_CASE_TEMPLATE (which misbehave under nvcc); `timeout_scale`
/// lengthens the timeouts (a sanitizer slows every call).

#if !defined(__CUDACC__)
#error "lockstep/testing/gpu_reducer.cuh drives GPU reducers: compile this translation unit with nvcc"
#endif

#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <lockstep/backend/cuda.hpp>
#include <lockstep/backend/epilogue.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/testing/detail/reducer_verdicts.hpp>

namespace lockstep::testing {

/// The CUDA device of each of n replicas.
using gpu_ordinals = std::function<std::vector<int>(std::size_t)>;

namespace detail {

/// Element i of replica r's gradient in the suite: a value in [-0.5, 0.5) on a grid of 1e-3.
inline float gpu_reducer_value(std::size_t i, std::size_t r) {
  return static_cast<float>((i * 40503u + r * 131u) % 1000u) * 1e-3f - 0.5f;
}

/// Runs f(replica, ctx) on one thread per replica, each with a context on its device and its
/// device workspace bound first; returns what each threw ("" when nothing).
template <class R>
std::vector<std::string> on_gpu_replicas(R& red, const std::vector<int>& ordinals, std::size_t max_bucket_bytes,
                                         const std::function<void(std::size_t, cuda_context&)>& f) {
  const std::size_t n = ordinals.size();
  std::vector<std::string> errors(n);
  const std::size_t ws = red.workspace_bytes(max_bucket_bytes);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        cuda_context ctx(ordinals[r]);
        backend::detail::device_bytes workspace(ws);
        red.bind(r, workspace.get(), ws);
        f(r, ctx);
        ctx.synchronize();  // the workspace outlives every operation that uses it
      } catch (const std::exception& e) {
        errors[r] = std::string("!") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

/// Device copy of a host vector (on the context's device).
inline backend::detail::device_bytes to_gpu(const cuda_context& ctx, const std::vector<float>& h) {
  backend::detail::device_bytes d(h.size() * sizeof(float));
  copy_from_host(ctx, static_cast<float*>(d.get()), h.data(), h.size());
  return d;
}

/// All-reduces `length` elements over the replicas of `ordinals` in two buckets; returns every
/// replica's result.
template <class R>
std::vector<std::vector<float>> gpu_reducer_sums(const std::vector<int>& ordinals, std::size_t length,
                                                 std::chrono::milliseconds timeout) {
  const std::size_t n = ordinals.size();
  std::vector<std::vector<float>> data(n, std::vector<float>(length));
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < length; ++i) data[r][i] = gpu_reducer_value(i, r);
  R red(reducer_config{n, timeout, collective_ids::count, 0});
  const auto errors = on_gpu_replicas(red, ordinals, length * sizeof(float), [&](std::size_t r, cuda_context& ctx) {
    auto d = to_gpu(ctx, data[r]);
    auto* p = static_cast<float*>(d.get());
    const std::size_t half = length / 2;
    red.start(r, ctx, p, half, 0);
    red.start(r, ctx, p + half, length - half, 1);
    red.wait(r, ctx, 0);
    red.wait(r, ctx, 1);
    copy_to_host(ctx, data[r].data(), p, length);
  });
  for (const auto& e : errors) CHECK(e == "");
  return data;
}

/// Counts elements of `got` farther than 1e-5 (1 + |exact|) from the exact sum over `replicas`
/// (every `step`-th element).
inline std::size_t gpu_reducer_misses(const std::vector<float>& got, std::size_t replicas, std::size_t step) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); i += step) {
    double exact = 0;
    for (std::size_t r = 0; r < replicas; ++r) exact += gpu_reducer_value(i, r);
    if (!(std::abs(static_cast<double>(got[i]) - exact) <= 1e-5 * (1.0 + std::abs(exact)))) ++bad;
  }
  return bad;
}

/// The optional members of a reducer that reduces onto the slices (reduces_to_slices_v) over the
/// replicas of `ordinals`, `length` elements in two buckets cut on the epilogue's grid
/// (grid_slice): after reduce_to_slices and wait, each replica's own slice holds the sums (within
/// float rounding of the exact sums, bitwise the same on a second run); sum_chunks of chunk sums
/// that only their owner fills gives every replica all of them exactly; gather_slices gives every
/// replica every slice of the parameters, whatever it held outside its own.
template <class R>
void check_gpu_slices(const std::vector<int>& ordinals, std::size_t length, std::chrono::milliseconds timeout,
                      std::vector<std::vector<float>>* sums_out = nullptr) {
  const std::size_t n = ordinals.size();
  const std::size_t chunks = epilogue_chunks(length);
  std::vector<std::pair<std::size_t, std::size_t>> slices(n);
  for (std::size_t r = 0; r < n; ++r) slices[r] = grid_slice(length, r, n);
  std::vector<std::vector<float>> grads(n, std::vector<float>(length)), params(n, std::vector<float>(length, -1e30f));
  std::vector<std::vector<double>> sums(n, std::vector<double>(chunks, 0.0));
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < length; ++i) grads[r][i] = gpu_reducer_value(i, r);
    for (std::size_t i = slices[r].first; i < slices[r].second; ++i) params[r][i] = gpu_reducer_value(i, 7);
    const auto [first, last] = grid_slice_chunks(length, r, n);
    for (std::size_t c = first; c < last; ++c) sums[r][c] = 1.0 + 0.1 * static_cast<double>(c);
  }
  R red(reducer_config{n, timeout, collective_ids::count, 0});
  const auto errors = on_gpu_replicas(red, ordinals, length * sizeof(float), [&](std::size_t r, cuda_context& ctx) {
    auto g = to_gpu(ctx, grads[r]);
    auto p = to_gpu(ctx, params[r]);
    backend::detail::device_bytes c(chunks * sizeof(double));
    auto* gp = static_cast<float*>(g.get());
    auto* pp = static_cast<float*>(p.get());
    auto* cp = static_cast<double*>(c.get());
    if (chunks) copy_from_host(ctx, cp, sums[r].data(), chunks);
    const std::size_t half = length / 2;
    red.reduce_to_slices(r, ctx, gp, 0, half, 0, std::span<const std::pair<std::size_t, std::size_t>>(slices));
    red.reduce_to_slices(r, ctx, gp, half, length - half, 1, std::span<const std::pair<std::size_t, std::size_t>>(slices));
    red.wait(r, ctx, 0);
    red.wait(r, ctx, 1);
    red.sum_chunks(r, ctx, cp, chunks);
    red.gather_slices(r, ctx, pp, std::span<const std::pair<std::size_t, std::size_t>>(slices));
    copy_to_host(ctx, grads[r].data(), gp, length);
    copy_to_host(ctx, params[r].data(), pp, length);
    if (chunks) copy_to_host(ctx, sums[r].data(), cp, chunks);
  });
  for (const auto& e : errors) CHECK(e == "");
  std::size_t bad = 0, wrong_params = 0, wrong_sums = 0;
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t i = slices[r].first; i < slices[r].second; ++i) {
      double exact = 0;
      for (std::size_t k = 0; k < n; ++k) exact += gpu_reducer_value(i, k);
      if (!(std::abs(static_cast<double>(grads[r][i]) - exact) <= 1e-5 * (1.0 + std::abs(exact)))) ++bad;
    }
    for (std::size_t i = 0; i < length; ++i) wrong_params += params[r][i] != gpu_reducer_value(i, 7) ? 1 : 0;
    for (std::size_t c = 0; c < chunks; ++c) wrong_sums += sums[r][c] != 1.0 + 0.1 * static_cast<double>(c) ? 1 : 0;
  }
  CHECK(bad == 0);           // each slice holds the sums
  CHECK(wrong_sums == 0);    // every chunk sum, exactly, on every replica
  CHECK(wrong_params == 0);  // every slice gathered to every replica
  if (sums_out) {  // the slices' sums (the rest of each replica's gradients is unspecified)
    sums_out->assign(n, std::vector<float>());
    for (std::size_t r = 0; r < n; ++r)
      (*sums_out)[r].assign(grads[r].begin() + static_cast<std::ptrdiff_t>(slices[r].first),
                            grads[r].begin() + static_cast<std::ptrdiff_t>(slices[r].second));
  }
}

}  // namespace detail

/// The GPU reducer conformance suite (see this file's comment) for reducer R named `name`.
template <class R>
void check_gpu_reducer(const char* name, const gpu_ordinals& ordinals, std::size_t max_replicas,
                       double timeout_scale = 1.0) {
  namespace lt = detail;
  using ms = std::chrono::milliseconds;
  const auto scaled = [&](long v) { return ms(static_cast<long>(static_cast<double>(v) * timeout_scale)); };
  static_assert(lockstep::detail::check_reducer<R>());  // names a missing member
  INFO("GPU reducer " << name);

  // Every replica gets the same sum, bitwise repeatable, over 1..max_replicas and lengths 0, 1, primes.
  for (std::size_t replicas = 1; replicas <= max_replicas; ++replicas)
    for (const std::size_t length : {0u, 1u, 2u, 3u, 7u, 13u, 31u, 1009u, 65537u}) {
      CAPTURE(replicas);
      CAPTURE(length);
      const auto a = lt::gpu_reducer_sums<R>(ordinals(replicas), length, scaled(60'000));
      const auto b = lt::gpu_reducer_sums<R>(ordinals(replicas), length, scaled(60'000));
      for (std::size_t r = 0; r < replicas; ++r) {
        CHECK(std::memcmp(a[r].data(), a[0].data(), length * sizeof(float)) == 0);  // the same on every replica
        CHECK(std::memcmp(a[r].data(), b[r].data(), length * sizeof(float)) == 0);  // a fixed order
      }
      CHECK(lt::gpu_reducer_misses(a[0], replicas, 1) == 0);
    }

  // 10^7 elements over 1..3 replicas.
  for (std::size_t replicas = 1; replicas <= std::min<std::size_t>(3, max_replicas); ++replicas) {
    CAPTURE(replicas);
    const auto a = lt::gpu_reducer_sums<R>(ordinals(replicas), 10'000'000, scaled(60'000));
    CHECK(lt::gpu_reducer_misses(a[replicas - 1], replicas, 997) == 0);
  }

  // Broadcast copies the root's data to every replica.
  for (std::size_t replicas = 1; replicas <= std::min<std::size_t>(4, max_replicas); ++replicas)
    for (std::size_t root = 0; root < replicas; ++root) {
      CAPTURE(replicas);
      CAPTURE(root);
      std::vector<std::vector<float>> data(replicas, std::vector<float>(101));
      for (std::size_t r = 0; r < replicas; ++r)
        for (std::size_t i = 0; i < 101; ++i) data[r][i] = lt::gpu_reducer_value(i, r);
      R red(reducer_config{replicas, scaled(60'000), collective_ids::count, 0});
      const auto errors = lt::on_gpu_replicas(red, ordinals(replicas), 101 * sizeof(float), [&](std::size_t r, cuda_context& ctx) {
        auto d = lt::to_gpu(ctx, data[r]);
        red.broadcast(r, ctx, static_cast<float*>(d.get()), 101, root);
        copy_to_host(ctx, data[r].data(), static_cast<const float*>(d.get()), 101);
      });
      std::size_t wrong = 0;  // elements that are not the root's values as they were
      for (std::size_t r = 0; r < replicas; ++r) {
        CHECK(errors[r] == "");
        for (std::size_t i = 0; i < 101; ++i) wrong += data[r][i] != lt::gpu_reducer_value(i, root);
      }
      CHECK(wrong == 0);
    }
  // A reducer that reduces a sharded update onto the slices: the slices' sums, the chunk sums and
  // the gather, over 1..max_replicas and lengths around the grid's chunks (slices of 0 chunks too).
  if constexpr (reduces_to_slices_v<R>) {
    for (std::size_t replicas = 1; replicas <= max_replicas; ++replicas)
      for (const std::size_t length : {1u, 1023u, 1025u, 4099u, 65537u}) {
        CAPTURE(replicas);
        CAPTURE(length);
        std::vector<std::vector<float>> a, b;
        lt::check_gpu_slices<R>(ordinals(replicas), length, scaled(60'000), &a);
        lt::check_gpu_slices<R>(ordinals(replicas), length, scaled(60'000), &b);
        CHECK(a == b);  // a fixed order
      }
  }
  if (max_replicas < 3) return;

  {  // A replica that never arrives: the others time out, and the message names it.
    R red(reducer_config{3, scaled(150), collective_ids::count, 0});
    const auto t0 = std::chrono::steady_clock::now();
    const auto errors = lt::on_gpu_replicas(red, ordinals(3), 17 * sizeof(float), [&](std::size_t r, cuda_context& ctx) {
      if (r == 1) return;  // never arrives
      auto d = lt::to_gpu(ctx, std::vector<float>(17, 1.0f));
      try {
        red.start(r, ctx, static_cast<float*>(d.get()), 17, 0);
        red.wait(r, ctx, 0);
      } catch (const timeout_error& e) {
        throw timeout_error(std::string("timeout: ") + e.what());
      }
    });
    CHECK(std::chrono::steady_clock::now() - t0 < scaled(5'000) + std::chrono::seconds(5));
    lt::check_missing_replica_named(errors);
  }

  {  // abort releases every waiter at once; after reset the reducer works again.
    R red(reducer_config{3, scaled(30'000), collective_ids::count, 0});
    std::thread aborter([&] {
      std::this_thread::sleep_for(scaled(300));
      red.abort();
    });
    const auto t0 = std::chrono::steady_clock::now();
    const auto errors = lt::on_gpu_replicas(red, ordinals(3), 5 * sizeof(float), [&](std::size_t r, cuda_context& ctx) {
      if (r == 2) return;  // never arrives: 0 and 1 wait until the abort
      auto d = lt::to_gpu(ctx, std::vector<float>(5, 1.0f));
      try {
        red.start(r, ctx, static_cast<float*>(d.get()), 5, 0);
        red.wait(r, ctx, 0);
      } catch (const error& e) {
        throw error(std::string("lockstep error: ") + e.what());
      }
    });
    aborter.join();
    CHECK(std::chrono::steady_clock::now() - t0 < scaled(10'000) + std::chrono::seconds(10));
    CHECK(errors[0].find("!lockstep error: ") == 0);
    CHECK(errors[1].find("!lockstep error: ") == 0);
    red.reset();
    std::vector<std::vector<float>> data(3, std::vector<float>(9, 2.0f));
    const auto again = lt::on_gpu_replicas(red, ordinals(3), 9 * sizeof(float), [&](std::size_t r, cuda_context& ctx) {
      auto d = lt::to_gpu(ctx, data[r]);
      red.start(r, ctx, static_cast<float*>(d.get()), 9, 1);
      red.wait(r, ctx, 1);
      copy_to_host(ctx, data[r].data(), static_cast<const float*>(d.get()), 9);
    });
    for (std::size_t r = 0; r < 3; ++r) {
      CHECK(again[r] == "");
      for (float x : data[r]) CHECK(x == 6.0f);
    }
  }
}

}  // namespace lockstep::testing
