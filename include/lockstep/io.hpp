#pragma once
/// @file io.hpp
/// Serialization and checkpoints, and what else leaves a run: safetensors weights, TensorBoard
/// event files, timeline traces (namespace lockstep::io).

#include <lockstep/io/checkpoint.hpp>
#include <lockstep/train/checkpoint.hpp>  // the training checkpoint (checkpoint_state, save/load_checkpoint)
#include <lockstep/io/safetensors.hpp>
#include <lockstep/io/serialization.hpp>
#include <lockstep/io/tensorboard.hpp>
#include <lockstep/io/trace.hpp>
