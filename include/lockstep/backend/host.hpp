#pragma once
/// @file host.hpp
/// The host backend: context and kernels.
#include <lockstep/backend/context.hpp>
#include <lockstep/backend/host/context.hpp>
#include <lockstep/backend/host/ops.hpp>
