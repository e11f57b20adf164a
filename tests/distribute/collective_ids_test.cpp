// The one owner of collective ids: bucket ids and reserved ids never overlap, every reserved id
// has its own name, reducers serve every id, and a strategy refuses a model with more buckets
// than there are bucket ids.

#include <doctest/doctest.h>

#include <cstddef>
#include <set>
#include <string>

#include "distribute/common.hpp"

namespace ls = lockstep;
using ids = ls::collective_ids;

TEST_CASE("collective ids: buckets and reserved ids partition the ids below count") {
  constexpr std::size_t reserved[] = {ids::all_reduce,    ids::barrier,       ids::broadcast, ids::broadcast_done,
                                      ids::epilogue_sums, ids::gather_slices, ids::setup};
  std::set<std::size_t> distinct(std::begin(reserved), std::end(reserved));
  CHECK(distinct.size() == std::size(reserved));
  for (const std::size_t r : reserved) {
    CAPTURE(r);
    CHECK_FALSE(ids::is_bucket(r));
    CHECK(ids::is_reserved(r));
    CHECK(r < ids::count);
  }
  std::size_t buckets = 0, reserved_count = 0;
  std::set<std::string> names;
  for (std::size_t id = 0; id < ids::count + 3; ++id) {
    CAPTURE(id);
    CHECK_FALSE((ids::is_bucket(id) && ids::is_reserved(id)));
    if (id < ids::count) CHECK((ids::is_bucket(id) || ids::is_reserved(id)));
    buckets += ids::is_bucket(id) ? 1 : 0;
    reserved_count += ids::is_reserved(id) ? 1 : 0;
    CHECK(names.insert(ids::name(id)).second);  // every id is told apart in messages
  }
  CHECK(buckets == ids::max_buckets);
  CHECK(reserved_count == std::size(reserved));
  CHECK(ids::is_sum(ids::all_reduce));
  CHECK(ids::is_sum(ids::max_buckets - 1));
  CHECK_FALSE(ids::is_sum(ids::barrier));
  CHECK_FALSE(ids::is_sum(ids::broadcast));
  CHECK(ls::reducer_config{}.ids == ids::count);
}

TEST_CASE("collective ids: the host engine serves every id and refuses fewer") {
  ls::detail::host_comm ok(2, std::chrono::milliseconds(1000));
  CHECK(ok.replicas() == 2);
  CHECK_THROWS_AS(ls::detail::host_comm(2, std::chrono::milliseconds(1000), ids::count - 1), ls::config_error);
}

TEST_CASE("collective ids: a strategy refuses a model with more buckets than bucket ids") {
  CHECK_NOTHROW(ids::check_buckets(0, "lockstep::mirrored"));
  CHECK_NOTHROW(ids::check_buckets(ids::max_buckets, "lockstep::mirrored"));
  try {
    ids::check_buckets(ids::max_buckets + 1, "lockstep::mirrored");
    FAIL("a model with too many buckets was accepted");
  } catch (const ls::config_error& e) {
    const std::string what = e.what();
    CHECK(what.find("lockstep::mirrored: the model has " + std::to_string(ids::max_buckets + 1) + " gradient buckets") !=
          std::string::npos);
    CHECK(what.find("bucket_bytes") != std::string::npos);
  }
  // A model with one bucket per layer (bucket_bytes = 0) uses one id per layer.
  ls::strategy_options o;
  o.bucket_bytes = 0;
  ls::mirrored<ls::cpus> s(ls::device_selection::first(1), o);
  auto m = s.replicate<dist_test::mlp>(ls::seed{1});
  CHECK(m.buckets().size == 2);
}
