#pragma once
/// @file losses.hpp
/// All losses.
#include <lockstep/losses/loss.hpp>
#include <lockstep/losses/mse.hpp>
#include <lockstep/losses/softmax_cross_entropy.hpp>
