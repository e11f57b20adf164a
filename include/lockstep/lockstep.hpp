#pragma once
/// @file lockstep.hpp
/// The umbrella header: everything a host program needs, the input pipeline included. The GPU
/// parts come from <lockstep/cuda.hpp> (nvcc, LOCKSTEP_HAS_CUDA).
#include <lockstep/backend/context.hpp>
#include <lockstep/backend/host.hpp>
#include <lockstep/config.hpp>
#include <lockstep/core/device.hpp>
#include <lockstep/core/error.hpp>
#include <lockstep/core/random.hpp>
#include <lockstep/core/run_main.hpp>
#include <lockstep/data.hpp>
#include <lockstep/distribute.hpp>
#include <lockstep/distribute/replica.hpp>
#include <lockstep/io.hpp>
#include <lockstep/layers.hpp>
#include <lockstep/losses.hpp>
#include <lockstep/memory/buffer.hpp>
#include <lockstep/optimizers.hpp>
#include <lockstep/train.hpp>
#include <lockstep/version.hpp>
