#pragma once
/// @file reducer_verdicts.hpp
/// Internal: checks shared by the host and GPU reducer conformance suites (testing/reducer.hpp,
/// testing/gpu_reducer.cuh), for doctest.

#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <vector>

namespace lockstep::testing::detail {

/// True when `message` names `replica(s) 1` (followed by anything but another digit).
inline bool names_replica_1(const std::string& message) {
  const std::string name = "replica(s) 1";
  for (std::size_t pos = message.find(name); pos != std::string::npos; pos = message.find(name, pos + 1)) {
    const std::size_t next = pos + name.size();
    if (next == message.size() || message[next] < '0' || message[next] > '9') return true;
  }
  return false;
}

/// The verdict of the suites' "a replica that never arrives" case, from what each of 3 replicas
/// threw ("!" + message, "" for nothing; replica 1 never arrived and rethrew a timeout_error as
/// "timeout: " + its message): replicas 0 and 2 failed, at least one with a timeout naming
/// `replica(s) 1`, and replica 1 did not fail.
inline void check_missing_replica_named(const std::vector<std::string>& errors) {
  REQUIRE(errors.size() == 3);
  // The first waiter to give up names the missing replica; it may release the other waiter,
  // which then fails too (with a timeout_error or another lockstep::error).
  std::size_t named = 0;
  for (const std::size_t r : {std::size_t{0}, std::size_t{2}}) {
    CAPTURE(errors[r]);
    CHECK(errors[r] != "");
    if (errors[r].find("!timeout: ") == 0 && names_replica_1(errors[r])) ++named;
  }
  CHECK(named >= 1);
  CHECK(errors[1] == "");
}

}  // namespace lockstep::testing::detail
