// The library's own pipeline stages through the public stage conformance suite (the suite a user
// runs on their own stages). The stages run threads (prefetch, parallel_map): scripts/test.sh runs
// this file under ThreadSanitizer too (target test_threads).
#include <lockstep/testing/stage.hpp>

#include <cstdint>

#include <lockstep/data.hpp>

namespace stages {
namespace ld = lockstep::data;
struct identity {
  int operator()(int x) const { return x; }
};
struct shuffle {
  static auto make(std::uint64_t seed) { return ld::shuffle(64, seed); }
};
struct shuffle_whole {
  static auto make(std::uint64_t seed) { return ld::shuffle(5000, seed); }
};
struct prefetch {
  static auto make(std::uint64_t) { return ld::prefetch(3); }
};
struct parallel_map {
  static auto make(std::uint64_t) { return ld::parallel_map(identity{}, 3); }
};
struct map {
  static auto make(std::uint64_t) { return ld::map(identity{}); }
};
struct filter {
  static auto make(std::uint64_t) { return ld::filter([](int x) { return x % 3 != 1; }); }
  static constexpr bool keeps_all = false;
};
struct skip {
  static auto make(std::uint64_t) { return ld::skip(5); }
  static constexpr bool keeps_all = false;
};
struct take {
  static auto make(std::uint64_t) { return ld::take(5); }
  static constexpr bool keeps_all = false;
  static constexpr bool pulls_all = false;
};
struct chain {
  static auto make(std::uint64_t seed) { return ld::shuffle(100, seed) | ld::parallel_map(identity{}, 2) | ld::prefetch(2); }
};
}  // namespace stages

TEST_CASE_TEMPLATE_INVOKE(lockstep_stage_conformance, stages::shuffle, stages::shuffle_whole, stages::prefetch,
                          stages::parallel_map, stages::map, stages::filter, stages::skip, stages::take, stages::chain);
