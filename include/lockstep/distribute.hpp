#pragma once
/// @file distribute.hpp
/// Synchronous data parallelism: strategies (mirrored, basic_mirrored, one_device and the
/// mirrored_strategy they are made of), run-time device lists, the executor, the step policies,
/// replicated models, gradient buckets, the reducer interface and the host reducers, train_step.

#include <lockstep/distribute/buckets.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/device_set.hpp>
#include <lockstep/distribute/executor.hpp>
#include <lockstep/distribute/mirrored.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/host.hpp>
#include <lockstep/distribute/replica.hpp>
#include <lockstep/distribute/replicated.hpp>
#include <lockstep/distribute/steps/micro_shard_step.hpp>
#include <lockstep/distribute/steps/overlapped_step.hpp>
#include <lockstep/distribute/strategy.hpp>
