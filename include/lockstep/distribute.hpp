#pragma once
/// @file distribute.hpp
/// Synchronous data parallelism: strategies (mirrored, basic_mirrored, one_device and the
/// mirrored_strategy they are made of), worlds, run-time device lists, the executor, the step
/// policies, replicated models and their (sharded) update, the update recipe (clipping, the
/// non-finite guard, the EMA) and its epilogue, gradient buckets, collective ids, the reducer
/// interface and the host reducers, train_step and accumulate. (Several processes: <lockstep/distribute/multi_worker.hpp>, link
/// lockstep::mpi.)

#include <lockstep/distribute/buckets.hpp>
#include <lockstep/distribute/checkpoint.hpp>
#include <lockstep/distribute/collective_ids.hpp>
#include <lockstep/distribute/concepts.hpp>
#include <lockstep/distribute/device_set.hpp>
#include <lockstep/distribute/epilogue.hpp>
#include <lockstep/distribute/executor.hpp>
#include <lockstep/distribute/mirrored.hpp>
#include <lockstep/distribute/reducer.hpp>
#include <lockstep/distribute/reducers/host.hpp>
#include <lockstep/distribute/reducers/select.hpp>
#include <lockstep/distribute/replica.hpp>
#include <lockstep/distribute/replicated.hpp>
#include <lockstep/distribute/sharded_update.hpp>
#include <lockstep/distribute/steps/micro_shard_step.hpp>
#include <lockstep/distribute/steps/overlapped_step.hpp>
#include <lockstep/distribute/steps/step_policy.hpp>
#include <lockstep/distribute/strategy.hpp>
#include <lockstep/distribute/world.hpp>
