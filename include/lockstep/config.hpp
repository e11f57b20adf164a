#pragma once
/// @file config.hpp
/// Compiler portability macros shared by host and CUDA code.

/// Marks a function callable from host and device code when compiled by nvcc; empty under g++.
#if defined(__CUDACC__)
#define LOCKSTEP_HD __host__ __device__
#else
#define LOCKSTEP_HD
#endif
