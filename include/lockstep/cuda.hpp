#pragma once
/// @file cuda.hpp
/// Everything lockstep runs on GPUs, for programs compiled with nvcc: the CUDA backend
/// (<lockstep/backend/cuda.hpp>: `cuda_context`, device memory for gpu<I>, the kernels every
/// layer, loss and optimiser runs) and the GPU reducers with their default selections
/// (same-device, NCCL when built with it, aggregation on one GPU or on the host). Include it with
/// <lockstep/lockstep.hpp> in a .cu translation unit and link lockstep::cuda (and lockstep::nccl
/// for several GPUs).

#if !defined(__CUDACC__)
#error "<lockstep/cuda.hpp> contains CUDA kernels: compile this file with nvcc (a .cu file or LANGUAGE CUDA)"
#endif

#include <lockstep/backend/cuda.hpp>
#include <lockstep/distribute/reducers/gpu_selection.cuh>
#include <lockstep/distribute/reducers/host_staged.hpp>
#include <lockstep/distribute/reducers/same_device.cuh>
#include <lockstep/distribute/reducers/to_one_device_gpu.cuh>
#if defined(LOCKSTEP_HAS_NCCL)
#include <lockstep/distribute/reducers/nccl.hpp>
#endif
