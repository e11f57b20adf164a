#pragma once
/// @file distribute.hpp
/// Synchronous data parallelism: strategies (one_device, mirrored, basic_mirrored), replicated
/// models, gradient buckets, the reducer interface and the host reducers, train_step.

#include <lockstep/distribute/buckets.hpp>
#include <lockstep/distribute/host_reducers.hpp>
#include <lockstep/distribute/mirrored.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/replica.hpp>
#include <lockstep/distribute/replicated.hpp>
#include <lockstep/distribute/strategy.hpp>
