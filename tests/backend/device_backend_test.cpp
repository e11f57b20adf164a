// The device-backend concept and its archetype: a device kind defined outside the library's
// namespace, registered through backend_traits and device_memory, with exactly the kernels the
// concept lists (naive loops) and memory the library must treat as device memory (staged through
// the context, read back with copy_to_host). Training through a run-time strategy over it proves
// that the library's replica, strategy, fit and evaluate use nothing beyond the concept.

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include <lockstep/lockstep.hpp>

#include <lockstep/testing/archetypes/kind.hpp>

namespace archetype = lockstep_archetypes;

namespace ls = lockstep;

static_assert(ls::device_backend<archetype::cells>);
static_assert(ls::device_backend<ls::cpus>);
static_assert(!ls::device_backend<ls::gpus>);  // not registered in a host build
static_assert(!ls::device_backend<int>);

namespace {

using net = ls::sequential<ls::dense<12, 16>, ls::tanh, ls::dropout<1, 4>, ls::dense<16, 4>>;
using on_cells = ls::mirrored<archetype::cells>;  // its default reducer: archetype::cells_reducer

auto samples() {
  std::vector<float> x(60 * 12);
  std::vector<std::int32_t> y(60);
  const ls::counter_rng rng(5, 6);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = rng.uniform(i) * 2 - 1;
  for (std::size_t r = 0; r < y.size(); ++r) y[r] = static_cast<std::int32_t>(rng.u32(x.size() + r) % 4);
  return ls::data::from_memory(std::move(x), 12, std::move(y)) | ls::data::batched(13);
}

template <class S>
std::pair<std::vector<float>, ls::evaluation> train_on(S& s) {
  auto m = s.template replicate<net>(ls::seed{3});
  const auto data = samples();
  (void)ls::fit(s, m, ls::adam{.lr = 1e-2f}, ls::softmax_cross_entropy{}, data, {.epochs = 3, .quiet = true});
  return {m.parameters_to_host(), ls::evaluate(s, m, ls::softmax_cross_entropy{}, data)};
}

}  // namespace

TEST_CASE("device_backend archetype: fit and evaluate through a strategy over an archetype kind match the host") {
  on_cells cells(ls::device_selection::first(2));
  ls::mirrored<ls::cpus> host(ls::device_selection::first(2));
  const auto [p_cells, e_cells] = train_on(cells);
  const auto [p_host, e_host] = train_on(host);
  REQUIRE(p_cells.size() == p_host.size());
  double diff = 0;
  for (std::size_t i = 0; i < p_host.size(); ++i) diff = std::max(diff, std::abs(double(p_cells[i]) - p_host[i]));
  CHECK(diff < 1e-4);
  CHECK(e_cells.samples == 60);
  CHECK(e_cells.accuracy == doctest::Approx(e_host.accuracy));
  CHECK(e_cells.loss == doctest::Approx(e_host.loss).epsilon(1e-4));
  // The archetype's ordinals are bounded: a fourth device does not exist.
  CHECK_THROWS_AS(on_cells(ls::device_selection{0, 3}), ls::config_error);
}

#include <lockstep/testing/backend.hpp>

// The public backend suite on the archetype kind (and on the host kind itself).
TEST_CASE_TEMPLATE_INVOKE(lockstep_backend_conformance, archetype::cells, ls::cpus);
