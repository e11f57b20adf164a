#pragma once
// The reducer archetype (lockstep/testing/archetypes/reducer.hpp), as the tests name it.

#include <lockstep/testing/archetypes/reducer.hpp>

namespace user {
using rendezvous_reducer = lockstep_archetypes::rendezvous_reducer;
}  // namespace user
