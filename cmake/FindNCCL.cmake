# FindNCCL: NCCL ships no CMake package. Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY and
# the imported target NCCL::NCCL. Looks in, in order: NCCL_ROOT, CUDAToolkit_ROOT, the CUDA
# toolkit's folders, /usr/local/cuda, then the NCCL wheel of NCCL_PYTHON (default: the python3
# on PATH): pip's nvidia-nccl-cu13 / -cu12 install site-packages/nvidia/nccl/{include,lib}, where
# the library is named libnccl.so.2 only.
set(_nccl_hints ${NCCL_ROOT} ${CUDAToolkit_ROOT} ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_DIR}
    /usr/local/cuda)
if(NOT NCCL_PYTHON)
  find_program(NCCL_PYTHON NAMES python3 python)
  mark_as_advanced(NCCL_PYTHON)
endif()
if(NCCL_PYTHON)
  execute_process(
    COMMAND ${NCCL_PYTHON} -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])"
    OUTPUT_VARIABLE _nccl_wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE _nccl_py_rc)
  if(_nccl_py_rc EQUAL 0 AND IS_DIRECTORY "${_nccl_wheel}")
    list(APPEND _nccl_hints "${_nccl_wheel}")
  endif()
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_hints} PATH_SUFFIXES lib64 lib)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR)
if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
