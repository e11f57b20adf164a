#pragma once
/// @file kind.hpp (testing/archetypes)
/// The archetype device kind `cells`, whole (see kind/context.hpp for how it is built).

#include <lockstep/testing/archetypes/kind/backend.hpp>
#include <lockstep/testing/archetypes/kind/context.hpp>
#include <lockstep/testing/archetypes/kind/kernels.hpp>
#include <lockstep/testing/archetypes/kind/memory.hpp>
#include <lockstep/testing/archetypes/kind/reducer.hpp>
