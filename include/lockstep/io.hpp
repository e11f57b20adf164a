#pragma once
/// @file io.hpp
/// Serialization and checkpoints (namespace lockstep::io).

#include <lockstep/io/checkpoint.hpp>
#include <lockstep/io/serialization.hpp>
