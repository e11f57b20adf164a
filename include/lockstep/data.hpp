#pragma once
/// @file data.hpp
/// The input pipeline (namespace lockstep::data): generator, datasets and stages, sources (memory,
/// IDX, CSV, and index-first: tables, .npy, tar shards' members), prefetch and parallel_map, image
/// stages, interleave, and distribution of global batches into shards. The image decoders (PNG,
/// JPEG) and the image-folder and WebDataset sources are the optional component
/// <lockstep/data/images.hpp> (CMake target lockstep::images).

#include <lockstep/data/augment.hpp>
#include <lockstep/data/batch.hpp>
#include <lockstep/data/batch_pool.hpp>
#include <lockstep/data/csv.hpp>
#include <lockstep/data/dataset.hpp>
#include <lockstep/data/shard_batches.hpp>
#include <lockstep/data/generator.hpp>
#include <lockstep/data/idx.hpp>
#include <lockstep/data/indexed.hpp>
#include <lockstep/data/interleave.hpp>
#include <lockstep/data/memory.hpp>
#include <lockstep/data/npy.hpp>
#include <lockstep/data/parallel_map.hpp>
#include <lockstep/data/prefetch.hpp>
#include <lockstep/data/sample.hpp>
#include <lockstep/data/stages.hpp>
#include <lockstep/data/tar.hpp>
