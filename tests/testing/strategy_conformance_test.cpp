// The public strategy suite (lockstep/testing/strategy.hpp) on the library's strategies — every
// host reducer, both determinism levels — and on the strategy archetype
// (lockstep/testing/archetypes/strategy.hpp), which is made through a strategy_maker.
#include <lockstep/testing/strategy.hpp>

#include <cstddef>
#include <vector>

#include <lockstep/lockstep.hpp>
#include <lockstep/testing/archetypes/reducer.hpp>
#include <lockstep/testing/archetypes/strategy.hpp>

namespace ls = lockstep;

/// The strategy archetype is made from a replica count, and its models by make_replicas.
template <>
struct lockstep::testing::strategy_maker<lockstep_archetypes::strategy> {
  static std::vector<std::size_t> replica_counts() { return {1, 2, 3}; }
  static lockstep_archetypes::strategy make(std::size_t n) { return lockstep_archetypes::strategy(n); }
  template <class Net>
  static auto replicate(lockstep_archetypes::strategy& s, ls::seed k) {
    return lockstep_archetypes::make_replicas<Net>(s.num_replicas(), k);
  }
  static constexpr bool invariant = false;
};

using invariant = ls::basic_mirrored<ls::host_allreduce, ls::determinism::replica_count_invariant, ls::cpus>;
using to_one = ls::basic_mirrored<ls::reduce_to_one_device<ls::cpu<0>>, ls::determinism::run_to_run, ls::cpus>;
using user_reducer = ls::basic_mirrored<lockstep_archetypes::rendezvous_reducer, ls::determinism::run_to_run, ls::cpus>;

TEST_CASE_TEMPLATE_INVOKE(lockstep_strategy_conformance, ls::mirrored<ls::cpus>, invariant, to_one, user_reducer,
                          lockstep_archetypes::strategy);
