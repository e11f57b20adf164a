#pragma once
/// @file config.hpp
/// Compiler portability macros shared by host and CUDA code.

/// Marks a function callable from host and device code when compiled by nvcc; empty under g++.
#if defined(__CUDACC__)
#define LOCKSTEP_HD __host__ __device__
#else
#define LOCKSTEP_HD
#endif

/// 1 where host loops carry a copy compiled for AVX2 and pick it at run time on CPUs that have it
/// (for_each_index over the functors that declare `avx2_copy`, the epilogue's
/// chunk_sum_of_squares): x86-64 under g++ or clang++ (not nvcc), when the translation unit does
/// not already target AVX2 (-mavx2, -march=native) and LOCKSTEP_NO_AVX2_LOOPS is not defined.
#if !defined(LOCKSTEP_HOST_AVX2_LOOPS)
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__) && !defined(__AVX2__) && \
    !defined(LOCKSTEP_NO_AVX2_LOOPS)
#define LOCKSTEP_HOST_AVX2_LOOPS 1
#else
#define LOCKSTEP_HOST_AVX2_LOOPS 0
#endif
#endif
