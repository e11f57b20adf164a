# Optional CUDA parts of lockstep: defines lockstep::cuda (CUDA runtime, cuBLAS and cuBLASLt) and
# lockstep::nccl (NCCL) when the toolkit is found and LOCKSTEP_CUDA is not OFF.
set(LOCKSTEP_HAS_CUDA OFF)
set(LOCKSTEP_HAS_NCCL OFF)
if(NOT LOCKSTEP_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(LOCKSTEP_HAS_CUDA ON)
  elseif(LOCKSTEP_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LOCKSTEP_CUDA=ON but the CUDA toolkit was not found (set CUDAToolkit_ROOT)")
  endif()
endif()
# LOCKSTEP_CUDA_STATIC_RUNTIME: link the CUDA runtime statically (libcudart_static.a) into programs
# using lockstep::cuda, so that they need only the driver, cuBLAS and NCCL at run time.
# The installed package sets it to the value lockstep was installed with, unless the consumer does.
if(NOT DEFINED LOCKSTEP_CUDA_STATIC_RUNTIME)
  option(LOCKSTEP_CUDA_STATIC_RUNTIME "Link lockstep::cuda programs with the static CUDA runtime" OFF)
endif()
# Both components are global imported targets, in lockstep's build tree as in the installed
# package: a consumer's own install(EXPORT) of a target linking them is accepted, and a project
# that adds lockstep with add_subdirectory sees them in its own directories.
if(LOCKSTEP_HAS_CUDA AND NOT TARGET lockstep::cuda)
  add_library(lockstep::cuda INTERFACE IMPORTED GLOBAL)
  if(LOCKSTEP_CUDA_STATIC_RUNTIME)
    target_link_libraries(lockstep::cuda INTERFACE lockstep::lockstep CUDA::cudart_static CUDA::cublas CUDA::cublasLt)
  else()
    target_link_libraries(lockstep::cuda INTERFACE lockstep::lockstep CUDA::cudart CUDA::cublas CUDA::cublasLt)
  endif()
  target_compile_definitions(lockstep::cuda INTERFACE LOCKSTEP_HAS_CUDA=1)
  # Flags every CUDA translation unit that uses lockstep needs: C++20 (passed directly, since
  # CMake 3.25 does not know nvcc 13's C++20 dialect), constexpr functions and lambdas in device code.
  target_compile_options(lockstep::cuda INTERFACE
    $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr --extended-lambda>)
  find_package(NCCL QUIET)
  if(NCCL_FOUND)
    set(LOCKSTEP_HAS_NCCL ON)
    add_library(lockstep::nccl INTERFACE IMPORTED GLOBAL)
    target_link_libraries(lockstep::nccl INTERFACE lockstep::cuda NCCL::NCCL)
    target_compile_definitions(lockstep::nccl INTERFACE LOCKSTEP_HAS_NCCL=1)
  endif()
endif()

# lockstep_enable_cuda_language(): enables the CUDA language for the directory that calls it (only
# the GPU tests, benchmarks and examples need it). Uses /usr/local/cuda/bin/nvcc or the toolkit's
# nvcc when none is on PATH, and builds for compute capability 90 (sm_90 code plus compute_90 PTX,
# which newer GPUs compile at load time) unless CMAKE_CUDA_ARCHITECTURES says otherwise ("native"
# needs a GPU at configure time).
macro(lockstep_enable_cuda_language)
  if(NOT CMAKE_CUDA_COMPILER)
    find_program(_lockstep_nvcc nvcc HINTS ${CUDAToolkit_BIN_DIR} /usr/local/cuda/bin)
    if(_lockstep_nvcc)
      set(CMAKE_CUDA_COMPILER ${_lockstep_nvcc})
    endif()
  endif()
  if(NOT CMAKE_CUDA_HOST_COMPILER AND CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  enable_language(CUDA)
endmacro()
