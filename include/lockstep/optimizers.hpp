#pragma once
/// @file optimizers.hpp
/// All optimisers and learning-rate schedules.
#include <lockstep/optimizers/adam.hpp>
#include <lockstep/optimizers/optimizer.hpp>
#include <lockstep/optimizers/schedule.hpp>
#include <lockstep/optimizers/sgd.hpp>
