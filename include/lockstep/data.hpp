#pragma once
/// @file data.hpp
/// The input pipeline (namespace lockstep::data): generator, datasets and stages, sources (memory,
/// IDX, CSV), prefetch and parallel_map, and distribution of global batches into shards.

#include <lockstep/data/batch.hpp>
#include <lockstep/data/batch_pool.hpp>
#include <lockstep/data/csv.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/shard_batches.hpp>
#include <lockstep/data/generator.hpp>
#include <lockstep/data/idx.hpp>
#include <lockstep/data/memory.hpp>
#include <lockstep/data/parallel_map.hpp>
#include <lockstep/data/prefetch.hpp>
#include <lockstep/data/sample.hpp>
#include <lockstep/data/stages.hpp>
