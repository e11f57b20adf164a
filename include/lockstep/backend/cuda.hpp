#pragma once
/// @file cuda.hpp
/// The CUDA backend for programs compiled with nvcc: `cuda_context`, device memory for gpu<I>, and
/// the kernels every layer, loss and optimiser runs on gpu<I>. The GPU reducers (and mirrored
/// strategies over GPUs) come with the umbrella <lockstep/cuda.hpp>, which includes this file.

#if !defined(__CUDACC__)
#error "<lockstep/backend/cuda.hpp> contains CUDA kernels: compile this file with nvcc (a .cu file or LANGUAGE CUDA)"
#endif

#include <lockstep/backend/cuda/context.hpp>
#include <lockstep/backend/cuda/device.hpp>
#include <lockstep/backend/cuda/error.hpp>
#include <lockstep/backend/cuda/epilogue.cuh>
#include <lockstep/backend/cuda/ops.cuh>
