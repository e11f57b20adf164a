// A reducer written outside the library's namespace against the reducer concept — a mutex and a
// condition variable, summing the replicas' buckets in replica order — run through the public
// reducer conformance suite, next to the library's own host reducers, and used by a strategy.
#include <lockstep/testing/reducer.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include <lockstep/lockstep.hpp>

#include "support/user_reducer.hpp"


namespace ls = lockstep;

static_assert(ls::reducer<user::rendezvous_reducer>);

TEST_CASE_TEMPLATE_INVOKE(lockstep_reducer_conformance, ls::host_allreduce, ls::reduce_to_one_device<ls::cpu<0>>,
                          user::rendezvous_reducer);

TEST_CASE("a user-defined reducer trains through a strategy exactly as the library's does") {
  using net = ls::sequential<ls::dense<6, 8>, ls::tanh, ls::dense<8, 3>>;
  std::vector<float> x(40 * 6);
  std::vector<std::int32_t> y(40);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.3f * static_cast<float>(i));
  for (std::size_t r = 0; r < y.size(); ++r) y[r] = static_cast<std::int32_t>(r % 3);
  const auto data = ls::data::from_memory(std::move(x), 6, std::move(y)) | ls::data::batched(9);
  const auto train = [&](auto& s) {
    auto m = s.template replicate<net>(ls::seed{2});
    (void)ls::fit(s, m, ls::sgd{.lr = 0.1f}, ls::softmax_cross_entropy{}, data, {.epochs = 2, .quiet = true});
    return m.parameters_to_host();
  };
  ls::basic_mirrored<user::rendezvous_reducer, ls::determinism::run_to_run, ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> mine;
  ls::mirrored<ls::cpu<0>, ls::cpu<1>, ls::cpu<2>> library;
  CHECK(train(mine) == train(library));  // both sum in replica order: bitwise the same
}
