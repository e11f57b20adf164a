#pragma once
/// @file reducer.hpp
/// The public conformance suite of host reducers (the reducer concept with `host_context` and
/// float data), for doctest. Instantiate it for your own reducer from your own test binary:
///
///     TEST_CASE_TEMPLATE_INVOKE(lockstep_reducer_conformance, my_reducer);
///
/// Each replica drives the reducer from its own thread, as a strategy does (workspace sized by
/// `workspace_bytes` and bound per replica first). It checks: the all-reduce over 1 to 8 replicas
/// and lengths 0, 1, primes and 65537, split in two buckets, gives every replica the same sum,
/// equal to the exact sum within float rounding, and bitwise the same on later rounds of the same
/// reducer and buckets and on a second reducer (a fixed summation order, buckets re-armed); 10^7
/// elements over 1 to 3 replicas; every replica's sum intact when each overwrites its data as soon
/// as its own wait returns while the others arrive late; broadcast of the root's values from every
/// root (synchronous: the root reuses its data once its call returns); a replica that never
/// arrives makes the others fail within the configured timeout (a replica still inside the
/// reducer long after it fails the check, abort() releasing it), at least one of them with a
/// `timeout_error` whose message names it as `replica(s) I`; `abort()` from another thread releases
/// every waiter (each throws a `lockstep::error`) at once; after `reset()` the reducer works again,
/// the aborted bucket too; and, for a reducer that reduces a sharded update onto the slices
/// (reduces_to_slices_v), each slice's sums, the chunk sums and the gather over 1 to 8 replicas.
/// Include it from a doctest test file compiled by a host compiler.

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <lockstep/backend/epilogue.hpp>
#include <lockstep/backend/host.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/testing/detail/reducer_verdicts.hpp>
#include <lockstep/testing/report.hpp>

namespace lockstep::testing::detail {

/// Runs f(replica, ctx) on one thread per replica after binding each replica's workspace; returns
/// what each threw ("" when nothing). A replica still inside 4 x `timeout` + 10 s after the start
/// (`timeout`: the one the caller built the reducer with, or a longer one; the reducer should
/// have given up long before) fails the check,
/// and the reducer is aborted to release it; one that even abort() does not release ends the
/// program with a message naming it, rather than a suite that hangs.
template <class R>
std::vector<std::string> on_replicas(R& red, std::size_t replicas, std::size_t max_bucket_bytes,
                                     const std::function<void(std::size_t, host_context&)>& f,
                                     std::chrono::milliseconds timeout = std::chrono::milliseconds(60'000)) {
  const std::chrono::milliseconds deadline = 4 * timeout + std::chrono::milliseconds(10'000);
  std::vector<std::string> errors(replicas);
  const std::size_t ws = red.workspace_bytes(max_bucket_bytes);
  std::vector<std::unique_ptr<unsigned char[]>> workspaces(replicas);
  std::mutex m;
  std::condition_variable finished;
  std::vector<char> done(replicas, 0);
  std::vector<std::thread> threads;
  for (std::size_t r = 0; r < replicas; ++r)
    threads.emplace_back([&, r] {
      host_context ctx{1};
      try {
        workspaces[r].reset(ws ? new unsigned char[ws] : nullptr);
        red.bind(r, workspaces[r].get(), ws);
        f(r, ctx);
      } catch (const std::exception& e) {
        errors[r] = std::string("!") + e.what();
      }
      std::lock_guard<std::mutex> lock(m);
      done[r] = 1;
      finished.notify_all();
    });
  const auto all_done = [&] { return std::count(done.begin(), done.end(), char{1}) == static_cast<std::ptrdiff_t>(replicas); };
  const auto inside = [&] {
    std::string list;
    for (std::size_t r = 0; r < replicas; ++r)
      if (!done[r]) list += (list.empty() ? "" : ", ") + std::to_string(r);
    return list;
  };
  std::string stuck;
  {
    std::unique_lock<std::mutex> lock(m);
    if (!finished.wait_for(lock, deadline, all_done)) {
      stuck = inside();
      lock.unlock();
      red.abort();
      lock.lock();
      if (!finished.wait_for(lock, std::chrono::seconds(10), all_done)) {
        std::fprintf(stderr,
                     "lockstep reducer conformance: replica(s) %s still inside the reducer %.1f s after the collective "
                     "began, and abort() did not release them: the reducer honours neither its timeout nor abort()\n",
                     inside().c_str(), static_cast<double>(deadline.count()) / 1000.0);
        std::fflush(stderr);
        std::abort();
      }
    }
  }
  for (auto& t : threads) t.join();
  CHECK_MESSAGE(stuck.empty(), "replica(s) " << stuck << " still inside the reducer "
                                             << static_cast<double>(deadline.count()) / 1000.0
                                             << " s after the collective began (far beyond its timeout of " << timeout.count()
                                             << " ms); abort() released them");
  return errors;
}

inline float reducer_value(std::size_t i, std::size_t r) {
  return static_cast<float>((i * 2654435761u + r * 97u) % 1000u) * 1e-3f - 0.5f;
}

/// The exact sum of element i over `replicas` replicas' reducer_value.
inline double reducer_exact(std::size_t i, std::size_t replicas) {
  double exact = 0;
  for (std::size_t r = 0; r < replicas; ++r) exact += reducer_value(i, r);
  return exact;
}

/// How far a float sum of `exact` may be from it (float rounding of a short sum).
inline double reducer_tolerance(double exact) { return 1e-5 * (1.0 + std::abs(exact)); }

/// All-reduces `length` elements over `replicas` replicas in two buckets, `rounds` times on one
/// reducer (as the steps of a training run reuse its buckets: a reducer that does not re-arm a
/// bucket after its sum fails the later rounds); checks that every round gives the first round's
/// bits and returns every replica's result.
template <class R>
std::vector<std::vector<float>> reducer_sums(std::size_t replicas, std::size_t length, std::size_t rounds = 3) {
  R red(reducer_config{replicas, std::chrono::milliseconds(60'000), collective_ids::count, 0});
  std::vector<std::vector<float>> first;
  for (std::size_t round = 0; round < rounds; ++round) {
    std::vector<std::vector<float>> data(replicas, std::vector<float>(length));
    for (std::size_t r = 0; r < replicas; ++r)
      for (std::size_t i = 0; i < length; ++i) data[r][i] = reducer_value(i, r);
    const auto errors = on_replicas(red, replicas, length * sizeof(float), [&](std::size_t r, host_context& ctx) {
      const std::size_t half = length / 2;
      red.start(r, ctx, data[r].data(), half, 0);
      red.start(r, ctx, data[r].data() + half, length - half, 1);
      red.wait(r, ctx, 0);
      red.wait(r, ctx, 1);
    });
    CAPTURE(round);
    for (const auto& e : errors) CHECK(e == "");
    if (round == 0) {
      first = std::move(data);
    } else {
      std::size_t differ = 0;
      for (std::size_t r = 0; r < replicas; ++r)
        differ += length != 0 && std::memcmp(data[r].data(), first[r].data(), length * sizeof(float)) != 0;
      CHECK_MESSAGE(differ == 0, "a later round on the same reducer and buckets differs from the first on " << differ
                                                                                                          << " replica(s)");
    }
  }
  return first;
}

}  // namespace lockstep::testing::detail

/// The conformance suite of a host reducer R (see this file's comment).
TEST_CASE_TEMPLATE_DEFINE("lockstep reducer conformance", R, lockstep_reducer_conformance) {
  namespace lt = lockstep::testing::detail;
  static_assert(lockstep::detail::check_reducer<R>());  // names a missing member
  using ms = std::chrono::milliseconds;

  SUBCASE("every replica gets the same sum, bitwise repeatable, over 1..8 replicas and lengths 0, 1, primes") {
    lockstep::testing::element_report sums("replica 0's sum vs the exact sum", "sum", "exact");
    for (std::size_t replicas = 1; replicas <= 8; ++replicas)
      for (const std::size_t length : {0u, 1u, 2u, 3u, 7u, 13u, 31u, 1009u, 65537u}) {
        CAPTURE(replicas);
        CAPTURE(length);
        const auto a = lt::reducer_sums<R>(replicas, length);
        const auto b = lt::reducer_sums<R>(replicas, length);
        for (std::size_t r = 0; r < replicas; ++r) {
          // The same on every replica, in a fixed order (an empty sum has no bytes to compare).
          CHECK((length == 0 || std::memcmp(a[r].data(), a[0].data(), length * sizeof(float)) == 0));
          CHECK((length == 0 || std::memcmp(a[r].data(), b[r].data(), length * sizeof(float)) == 0));
        }
        sums.context(std::to_string(replicas) + " replicas, length " + std::to_string(length));
        for (std::size_t i = 0; i < length; ++i) {
          const double exact = lt::reducer_exact(i, replicas);
          sums.close(i, a[0][i], exact, lt::reducer_tolerance(exact));
        }
      }
    CHECK_MESSAGE(sums.ok(), sums.text());
  }

  SUBCASE("10^7 elements over 1..3 replicas") {
    lockstep::testing::element_report sums("the last replica's sum vs the exact sum (every 997th element)", "sum", "exact");
    for (std::size_t replicas = 1; replicas <= 3; ++replicas) {
      CAPTURE(replicas);
      sums.context(std::to_string(replicas) + " replicas");
      const auto a = lt::reducer_sums<R>(replicas, 10'000'000, 1);
      for (std::size_t i = 0; i < a[0].size(); i += 997) {
        const double exact = lt::reducer_exact(i, replicas);
        sums.close(i, a[replicas - 1][i], exact, lt::reducer_tolerance(exact));
      }
    }
    CHECK_MESSAGE(sums.ok(), sums.text());
  }

  SUBCASE("a replica may reuse its data as soon as its wait returns: late replicas still get the sum") {
    // As a strategy does: replica 0 clamps its sums in place, or starts the next step's backward
    // pass, the moment its wait returns. Replicas 1.. arrive late (before start and before wait),
    // so a reducer whose wait returns while others still read that replica's data hands them
    // what it wrote next.
    constexpr std::size_t length = 4099;
    lockstep::testing::element_report sums("each replica's sum vs the exact sum, each replica reusing its data once its wait returns",
                                           "sum", "exact");
    for (std::size_t replicas = 2; replicas <= 4; ++replicas) {
      CAPTURE(replicas);
      std::vector<std::vector<float>> data(replicas, std::vector<float>(length)), got(replicas);
      for (std::size_t r = 0; r < replicas; ++r)
        for (std::size_t i = 0; i < length; ++i) data[r][i] = lt::reducer_value(i, r);
      R red(lockstep::reducer_config{replicas, ms(60'000), lockstep::collective_ids::count, 0});
      const auto errors = lt::on_replicas(red, replicas, length * sizeof(float), [&](std::size_t r, lockstep::host_context& ctx) {
        if (r != 0) std::this_thread::sleep_for(ms(10));
        red.start(r, ctx, data[r].data(), length, 0);
        if (r != 0) std::this_thread::sleep_for(ms(10));
        red.wait(r, ctx, 0);
        got[r] = data[r];
        std::fill(data[r].begin(), data[r].end(), 1e30f);  // this replica's next use of its buffer
      });
      for (std::size_t r = 0; r < replicas; ++r) {
        CHECK(errors[r] == "");
        if (got[r].size() != length) continue;
        sums.context(std::to_string(replicas) + " replicas, replica " + std::to_string(r));
        for (std::size_t i = 0; i < length; ++i) {
          const double exact = lt::reducer_exact(i, replicas);
          sums.close(i, got[r][i], exact, lt::reducer_tolerance(exact));
        }
      }
    }
    // A failure here: the reducer read a replica's data after that replica's wait returned.
    CHECK_MESSAGE(sums.ok(), sums.text());
  }

  SUBCASE("broadcast copies the root's data to every replica") {
    // Synchronous: the root may reuse its data as soon as its broadcast returns, so the replicas
    // arrive late (the root first) and each overwrites its data once it has its copy.
    for (std::size_t replicas = 1; replicas <= 4; ++replicas)
      for (std::size_t root = 0; root < replicas; ++root) {
        CAPTURE(replicas);
        CAPTURE(root);
        std::vector<std::vector<float>> data(replicas, std::vector<float>(101)), got(replicas);
        for (std::size_t r = 0; r < replicas; ++r)
          for (std::size_t i = 0; i < 101; ++i) data[r][i] = lt::reducer_value(i, r);
        R red(lockstep::reducer_config{replicas, ms(60'000), lockstep::collective_ids::count, 0});
        const auto errors = lt::on_replicas(red, replicas, 101 * sizeof(float), [&](std::size_t r, lockstep::host_context& ctx) {
          if (r != root) std::this_thread::sleep_for(ms(5));
          red.broadcast(r, ctx, data[r].data(), 101, root);
          got[r] = data[r];
          std::fill(data[r].begin(), data[r].end(), 1e30f);
        });
        std::size_t wrong = 0;  // elements that are not the root's values as they were
        for (std::size_t r = 0; r < replicas; ++r) {
          CHECK(errors[r] == "");
          if (got[r].size() != 101) continue;
          for (std::size_t i = 0; i < 101; ++i) wrong += got[r][i] != lt::reducer_value(i, root);
        }
        CHECK(wrong == 0);
      }
  }

  if constexpr (lockstep::reduces_to_slices_v<R>) {
    SUBCASE("reduces_to_slices: each slice's sums, every chunk sum exactly, every slice gathered, over 1..8 replicas") {
      using slice = std::pair<std::size_t, std::size_t>;
      for (std::size_t replicas = 1; replicas <= 8; ++replicas)
        for (const std::size_t length : {1u, 1023u, 1025u, 4099u, 65537u}) {
          CAPTURE(replicas);
          CAPTURE(length);
          const std::size_t chunks = lockstep::epilogue_chunks(length);
          std::vector<slice> slices(replicas);
          for (std::size_t r = 0; r < replicas; ++r) slices[r] = lockstep::grid_slice(length, r, replicas);
          std::vector<std::vector<float>> first;
          for (int run = 0; run < 2; ++run) {
            std::vector<std::vector<float>> grads(replicas, std::vector<float>(length));
            std::vector<std::vector<float>> params(replicas, std::vector<float>(length, -1e30f));
            std::vector<std::vector<double>> sums(replicas, std::vector<double>(chunks, 0.0));
            for (std::size_t r = 0; r < replicas; ++r) {
              for (std::size_t i = 0; i < length; ++i) grads[r][i] = lt::reducer_value(i, r);
              for (std::size_t i = slices[r].first; i < slices[r].second; ++i) params[r][i] = lt::reducer_value(i, 7);
              const auto [lo, hi] = lockstep::grid_slice_chunks(length, r, replicas);
              for (std::size_t c = lo; c < hi; ++c) sums[r][c] = 1.0 + 0.1 * static_cast<double>(c);
            }
            R red(lockstep::reducer_config{replicas, ms(60'000), lockstep::collective_ids::count, 0});
            const auto errors =
                lt::on_replicas(red, replicas, length * sizeof(float), [&](std::size_t r, lockstep::host_context& ctx) {
                  const std::span<const slice> view(slices);
                  const std::size_t half = length / 2;
                  red.reduce_to_slices(r, ctx, grads[r].data(), 0, half, 0, view);
                  red.reduce_to_slices(r, ctx, grads[r].data(), half, length - half, 1, view);
                  red.wait(r, ctx, 0);
                  red.wait(r, ctx, 1);
                  red.sum_chunks(r, ctx, sums[r].data(), chunks);
                  red.gather_slices(r, ctx, params[r].data(), view);
                });
            std::vector<std::vector<float>> own(replicas);
            std::size_t bad = 0, wrong_sums = 0, wrong_params = 0;
            for (std::size_t r = 0; r < replicas; ++r) {
              CHECK(errors[r] == "");
              for (std::size_t i = slices[r].first; i < slices[r].second; ++i) {
                const double exact = lt::reducer_exact(i, replicas);
                if (!(std::abs(static_cast<double>(grads[r][i]) - exact) <= lt::reducer_tolerance(exact))) ++bad;
                own[r].push_back(grads[r][i]);
              }
              for (std::size_t c = 0; c < chunks; ++c) wrong_sums += sums[r][c] != 1.0 + 0.1 * static_cast<double>(c);
              for (std::size_t i = 0; i < length; ++i) wrong_params += params[r][i] != lt::reducer_value(i, 7);
            }
            CHECK(bad == 0);           // each slice holds the sums
            CHECK(wrong_sums == 0);    // every chunk sum, exactly, on every replica
            CHECK(wrong_params == 0);  // every slice gathered to every replica
            if (run == 0) first = own;
            else CHECK(own == first);  // a fixed order
          }
        }
    }
  }

  SUBCASE("a replica that never arrives: the others time out, and the message names it") {
    constexpr ms timeout(150);
    R red(lockstep::reducer_config{3, timeout, lockstep::collective_ids::count, 0});
    std::vector<float> v(3 * 17, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    const auto errors = lt::on_replicas(
        red, 3, 17 * sizeof(float),
        [&](std::size_t r, lockstep::host_context& ctx) {
          if (r == 1) return;  // never arrives
          try {
            red.start(r, ctx, v.data() + r * 17, 17, 0);
            red.wait(r, ctx, 0);
          } catch (const lockstep::timeout_error& e) {
            throw lockstep::timeout_error(std::string("timeout: ") + e.what());
          }
        },
        timeout);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    lt::check_missing_replica_named(errors);
  }

  SUBCASE("abort releases every waiter at once; after reset the reducer works again") {
    R red(lockstep::reducer_config{3, ms(30'000), lockstep::collective_ids::count, 0});
    std::vector<float> v(3 * 5, 1.0f);
    std::thread aborter([&] {
      std::this_thread::sleep_for(ms(200));
      red.abort();
    });
    const auto t0 = std::chrono::steady_clock::now();
    const auto errors = lt::on_replicas(red, 3, 5 * sizeof(float), [&](std::size_t r, lockstep::host_context& ctx) {
      if (r == 2) return;  // never arrives: 0 and 1 wait until the abort
      try {
        red.start(r, ctx, v.data() + r * 5, 5, 0);
        red.wait(r, ctx, 0);
      } catch (const lockstep::error& e) {
        throw lockstep::error(std::string("lockstep error: ") + e.what());
      }
    });
    aborter.join();
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    CHECK(errors[0].find("!lockstep error: ") == 0);
    CHECK(errors[1].find("!lockstep error: ") == 0);
    red.reset();
    std::vector<std::vector<float>> data(3, std::vector<float>(9, 2.0f));
    // the aborted bucket 0 as well as bucket 1, twice
    for (int round = 0; round < 2; ++round) {
      CAPTURE(round);
      for (auto& d : data) std::fill(d.begin(), d.end(), 2.0f);
      const auto again = lt::on_replicas(red, 3, 9 * sizeof(float), [&](std::size_t r, lockstep::host_context& ctx) {
        red.start(r, ctx, data[r].data(), 4, 0);
        red.start(r, ctx, data[r].data() + 4, 5, 1);
        red.wait(r, ctx, 0);
        red.wait(r, ctx, 1);
      });
      for (std::size_t r = 0; r < 3; ++r) {
        CHECK(again[r] == "");
        for (float x : data[r]) CHECK(x == 6.0f);
      }
    }
  }
}
