#pragma once
/// @file train.hpp
/// The training front end: fit, evaluate, predict, metrics, callbacks (TensorBoard scalars among
/// them) and progress.

#include <lockstep/train/callbacks.hpp>
#include <lockstep/train/checkpoint.hpp>
#include <lockstep/train/fit.hpp>
#include <lockstep/train/metrics.hpp>
#include <lockstep/train/progress.hpp>
#include <lockstep/train/tensorboard.hpp>
