#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "train/helpers.hpp"

using namespace train_test;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t samples = 45, batch = 8;  // 6 steps per epoch, the last one uneven
const ls::adamw optimizer{.lr = 5e-3f, .weight_decay = 0.01f};

/// Trains (with checkpoints in `dir` when given) until `steps` updates are done in total.
template <class Strategy>
std::vector<float> train_to(std::uint64_t steps, const fs::path& dir = {}, bool resume = false,
                            std::uint64_t* start = nullptr) {
  Strategy s;
  auto m = s.template replicate<net>(ls::seed{21});
  const auto h = ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                         {.epochs = 1000,
                          .callbacks = {ls::lr_schedule(ls::cosine_schedule{.total = 40, .min_lr = 1e-4f})},
                          .quiet = true,
                          .checkpoint_dir = dir.string(),
                          .checkpoint_every = dir.empty() ? 0u : 1u,
                          .keep_checkpoints = 2,
                          .resume = resume,
                          .max_steps = steps});
  if (start) *start = h.resumed_from_step;
  REQUIRE(m.step() == steps);
  return params_of(m);
}

using two = ls::mirrored<ls::cpu<0>, ls::cpu<1>>;
template <class... Ds>
using invariant = ls::basic_mirrored<ls::select_reducer_t<Ds...>, ls::determinism::replica_count_invariant, Ds...>;

}  // namespace

TEST_CASE("resume: K steps, stop, M more steps is bitwise K+M uninterrupted steps") {
  for (auto [k, more] : std::vector<std::pair<std::uint64_t, std::uint64_t>>{{1, 2}, {3, 4}, {6, 1}, {7, 6}, {5, 8}}) {
    CAPTURE(k);
    CAPTURE(more);
    const auto dir = temp_dir("km");
    (void)train_to<two>(k, dir);
    std::uint64_t from = 0;
    const auto resumed = train_to<two>(k + more, dir, true, &from);
    CHECK(from == k);
    const auto straight = train_to<two>(k + more);
    CHECK(resumed == straight);
    fs::remove_all(dir);
  }
}

TEST_CASE("resume: with replica_count_invariant the replica count may change at the restart") {
  const auto straight = train_to<invariant<ls::cpu<0>>>(9);
  const auto dir = temp_dir("inv");
  (void)train_to<invariant<ls::cpu<0>, ls::cpu<1>>>(4, dir);
  const auto resumed = train_to<invariant<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>>>(9, dir, true);
  CHECK(resumed == straight);
  fs::remove_all(dir);
}

TEST_CASE("resume: a checkpoint of another model or seed is refused") {
  const auto dir = temp_dir("other");
  (void)train_to<two>(2, dir);
  using other = ls::sequential<ls::dense<width, 12>, ls::relu, ls::dense<12, classes>>;
  two s;
  auto m = s.replicate<other>(ls::seed{21});
  CHECK_THROWS_AS(ls::fit(s, m, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                          {.quiet = true, .checkpoint_dir = dir.string(), .resume = true}),
                  ls::checkpoint_error);
  auto wrong_seed = s.replicate<net>(ls::seed{22});
  CHECK_THROWS_AS(ls::fit(s, wrong_seed, optimizer, ls::softmax_cross_entropy{}, pipeline(samples, batch),
                          {.quiet = true, .checkpoint_dir = dir.string(), .resume = true}),
                  ls::checkpoint_error);
  fs::remove_all(dir);
}

TEST_CASE("resume: SIGKILL while checkpointing every step leaves a loadable checkpoint to resume from") {
  const ls::counter_rng rng(static_cast<std::uint64_t>(::getpid()), 3);
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    const auto dir = temp_dir("kill" + std::to_string(round));
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      try {
        (void)train_to<two>(1'000'000, dir);  // checkpoints after every step until killed
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(4);
    }
    // wait for a first checkpoint, then kill at a random moment
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (ls::checkpoint_manager(dir, 2).list().empty() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(std::chrono::microseconds(rng.u32(static_cast<std::uint64_t>(round)) % 200'000));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);

    ls::checkpoint_manager mgr(dir, 2);
    const auto latest = mgr.load_latest(ls::model_signature<net>());  // never a torn file
    REQUIRE(latest.has_value());
    const std::uint64_t k = latest->step;
    INFO("killed after checkpoint step ", k);
    CHECK(k >= 1);
    std::uint64_t from = 0;
    const auto resumed = train_to<two>(k + 3, dir, true, &from);
    CHECK(from == k);
    CHECK(resumed == train_to<two>(k + 3));
    fs::remove_all(dir);
  }
}
