#pragma once
/// @file layers.hpp
/// All layers, the sequential composition and the model instance.
#include <lockstep/layers/activations.hpp>
#include <lockstep/layers/batch_norm.hpp>
#include <lockstep/layers/conv.hpp>
#include <lockstep/layers/dense.hpp>
#include <lockstep/layers/dropout.hpp>
#include <lockstep/layers/init.hpp>
#include <lockstep/layers/layer.hpp>
#include <lockstep/layers/model.hpp>
#include <lockstep/layers/residual.hpp>
#include <lockstep/layers/sequential.hpp>
#include <lockstep/core/shape.hpp>
