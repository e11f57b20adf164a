# Every public header compiled by nvcc (included by tests/cuda/CMakeLists.txt): each CUDA header
# (.cuh, and the .hpp that hold CUDA code, see below) of include/lockstep (detail/ folders are
# private and reached through them) gets a generated .cu translation unit that includes it twice
# (the second inclusion checks the include guard) and its own OBJECT library; the host headers
# of each folder share one. They are built with the main build (-j) and re-checked by a CTest
# named after each header, `build/nvcc_header/<header>` (label `build`). Then every header object is
# linked TWICE into one program (`build/nvcc_headers_link_twice`): a header that defines a
# non-inline function or variable would define it twice, which the linker refuses. The model is
# cuCollections' cmake/header_testing.cmake.
#
# A header that needs MPI (mpi.h, distribute/mpi.hpp, multi_worker.hpp), NCCL (nccl.h,
# reducers/nccl.hpp, multi_worker_nccl.cuh), oneDNN (oneapi/dnnl) or the image libraries (png.h,
# jpeglib.h, the data/ headers built on them) is compiled only where that library was found. The
# translation units are compiled for PTX only (compute_90, no ptxas) and the host compiler runs at
# -O0: what is checked is that nvcc's front ends (host and device side, so every LOCKSTEP_HD
# function compiles for the device) and the host compiler accept each header, warning-free, not
# machine code.
set(_lockstep_include_dir ${PROJECT_SOURCE_DIR}/include)
file(GLOB_RECURSE _lockstep_nvcc_headers CONFIGURE_DEPENDS RELATIVE ${_lockstep_include_dir}
     ${_lockstep_include_dir}/lockstep/*.hpp ${_lockstep_include_dir}/lockstep/*.cuh)
list(SORT _lockstep_nvcc_headers)
# The headers that include MPI's or NCCL's header, directly or through other lockstep headers
# (a fixed point over the include graph).
set(_lockstep_all_headers ${_lockstep_nvcc_headers})
set(_lockstep_needs_mpi)
set(_lockstep_needs_nccl)
foreach(_header IN LISTS _lockstep_all_headers)
  file(STRINGS ${_lockstep_include_dir}/${_header} _incs REGEX "^[ \t]*#[ \t]*include[ \t]*<")
  set(_lockstep_incs_${_header} "")
  foreach(_line IN LISTS _incs)
    if(_line MATCHES "<([^>]+)>")
      list(APPEND _lockstep_incs_${_header} "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  if("mpi.h" IN_LIST _lockstep_incs_${_header})
    list(APPEND _lockstep_needs_mpi ${_header})
  endif()
  if("nccl.h" IN_LIST _lockstep_incs_${_header})
    list(APPEND _lockstep_needs_nccl ${_header})
  endif()
endforeach()
foreach(_lib mpi nccl)
  set(_changed TRUE)
  while(_changed)
    set(_changed FALSE)
    foreach(_header IN LISTS _lockstep_all_headers)
      if(_header IN_LIST _lockstep_needs_${_lib})
        continue()
      endif()
      foreach(_inc IN LISTS _lockstep_incs_${_header})
        if(_inc IN_LIST _lockstep_needs_${_lib})
          list(APPEND _lockstep_needs_${_lib} ${_header})
          set(_changed TRUE)
          break()
        endif()
      endforeach()
    endforeach()
  endwhile()
endforeach()

# A CUDA header (a .cuh, or a .hpp that includes CUDA's headers, a backend/cuda header, or
# declares LOCKSTEP_HD or __device__ code) is compiled alone, one translation unit each. The host
# headers share one translation unit (each included twice, in order): nvcc's front ends and its
# host pass see every one of them, and each is compiled alone with -Wpedantic by the host
# compilers' build/headers_compile_alone (tests/build_tests.cmake, the clang++ build of
# scripts/test.sh), so a CUDA build does not parse the host headers once more per header or folder.
set(_lockstep_nvcc_header_targets)
set(_lockstep_nvcc_groups)
foreach(_header IN LISTS _lockstep_nvcc_headers)
  if(_header MATCHES "(^|/)detail/")
    continue()
  endif()
  file(READ ${_lockstep_include_dir}/${_header} _text)
  set(_libs lockstep::cuda)
  if(_header IN_LIST _lockstep_needs_mpi)
    if(NOT LOCKSTEP_HAS_MPI)
      continue()
    endif()
    list(APPEND _libs lockstep::mpi)
  endif()
  if(_header IN_LIST _lockstep_needs_nccl)
    if(NOT TARGET lockstep::nccl)
      continue()
    endif()
    list(APPEND _libs lockstep::nccl)
  endif()
  if(_text MATCHES "#[ \t]*include[ \t]*<oneapi/dnnl" AND NOT LOCKSTEP_HOST_GEMM STREQUAL "onednn")
    continue()
  endif()
  # The image component's headers (libpng, libjpeg-turbo) only where it was found.
  if(_text MATCHES "#[ \t]*include[ \t]*<(png\\.h|jpeglib\\.h|lockstep/data/(png|jpeg|image_decode|image_folder|webdataset)\\.hpp)>")
    if(NOT LOCKSTEP_HAS_IMAGES)
      continue()
    endif()
    list(APPEND _libs lockstep::images)
  endif()
  if(_header MATCHES "\\.cuh$" OR _header MATCHES "^lockstep/backend/cuda" OR _header STREQUAL "lockstep/cuda.hpp" OR
     _text MATCHES "#[ \t]*include[ \t]*<(cuda|cublas|nccl|cub/|thrust/|lockstep/backend/cuda)" OR
     _text MATCHES "LOCKSTEP_HD|__device__|__global__")
    string(REGEX REPLACE "[/.]" "_" _name "${_header}")
    set(_tu ${CMAKE_CURRENT_BINARY_DIR}/nvcc_header_check/${_name}.cu)
    file(CONFIGURE OUTPUT ${_tu}
         CONTENT "// Generated: checks that <${_header}> compiles on its own under nvcc.\n#include <${_header}>\n#include <${_header}>\n"
         @ONLY)
    set(_target nvcc_header_${_name})
    add_library(${_target} OBJECT ${_tu})
    target_link_libraries(${_target} PRIVATE ${_libs} lockstep_warnings)
    list(APPEND _lockstep_nvcc_header_targets ${_target})
  else()
    set(_group host)
    if(NOT _group IN_LIST _lockstep_nvcc_groups)
      list(APPEND _lockstep_nvcc_groups ${_group})
      set(_group_headers_${_group})
      set(_group_libs_${_group})
    endif()
    list(APPEND _group_headers_${_group} ${_header})
    list(APPEND _group_libs_${_group} ${_libs})
    set(_target nvcc_headers_${_group})
  endif()
  add_test(NAME build/nvcc_header/${_header} COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target ${_target})
  set_tests_properties(build/nvcc_header/${_header} PROPERTIES LABELS "build" TIMEOUT 300
                       RESOURCE_LOCK lockstep_build_tree)  # one cmake --build of this tree at a time
endforeach()
foreach(_group IN LISTS _lockstep_nvcc_groups)
  set(_content "// Generated: lockstep's host headers under nvcc, each included twice.\n")
  foreach(_header IN LISTS _group_headers_${_group})
    string(APPEND _content "#include <${_header}>\n#include <${_header}>\n")
  endforeach()
  set(_tu ${CMAKE_CURRENT_BINARY_DIR}/nvcc_header_check/group_${_group}.cu)
  file(CONFIGURE OUTPUT ${_tu} CONTENT "${_content}" @ONLY)
  list(REMOVE_DUPLICATES _group_libs_${_group})
  set(_target nvcc_headers_${_group})
  add_library(${_target} OBJECT ${_tu})
  target_link_libraries(${_target} PRIVATE ${_group_libs_${_group}} lockstep_warnings)
  list(APPEND _lockstep_nvcc_header_targets ${_target})
endforeach()
foreach(_target IN LISTS _lockstep_nvcc_header_targets)
  set_target_properties(${_target} PROPERTIES CUDA_ARCHITECTURES 90-virtual)
  target_compile_options(${_target} PRIVATE -Xcompiler=-O0)  # the host pass only parses and type-checks
endforeach()

# Every header object twice in one program: non-inline definitions collide.
# (main and doctest's implementation, which the testing/ headers call, come from lockstep_doctest_main.)
set(_main ${CMAKE_CURRENT_BINARY_DIR}/nvcc_header_check/link_twice.cu)
file(CONFIGURE OUTPUT ${_main} CONTENT "// Generated: the program that links every header object twice.\n" @ONLY)
set(_objects)
foreach(_target IN LISTS _lockstep_nvcc_header_targets)
  list(APPEND _objects $<TARGET_OBJECTS:${_target}>)
endforeach()
add_library(lockstep_nvcc_headers_a STATIC ${_objects})
set_target_properties(lockstep_nvcc_headers_a PROPERTIES LINKER_LANGUAGE CUDA)
add_executable(lockstep_nvcc_headers_link_twice ${_main})
set_target_properties(lockstep_nvcc_headers_link_twice PROPERTIES CUDA_ARCHITECTURES 90-virtual)
target_link_libraries(lockstep_nvcc_headers_link_twice PRIVATE lockstep::cuda lockstep_doctest_main)
if(TARGET lockstep::nccl)
  target_link_libraries(lockstep_nvcc_headers_link_twice PRIVATE lockstep::nccl)
endif()
if(LOCKSTEP_HAS_MPI)
  target_link_libraries(lockstep_nvcc_headers_link_twice PRIVATE lockstep::mpi)
endif()
add_dependencies(lockstep_nvcc_headers_link_twice lockstep_nvcc_headers_a)
# One SHELL: group, so that CMake does not fold the repeated archive into one.
target_link_options(lockstep_nvcc_headers_link_twice PRIVATE
  "SHELL:-Wl,--whole-archive $<TARGET_FILE:lockstep_nvcc_headers_a> $<TARGET_FILE:lockstep_nvcc_headers_a> -Wl,--no-whole-archive")
add_test(NAME build/nvcc_headers_link_twice
         COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target lockstep_nvcc_headers_link_twice)
set_tests_properties(build/nvcc_headers_link_twice PROPERTIES LABELS "build" TIMEOUT 600
                     RESOURCE_LOCK lockstep_build_tree)

# The mechanism itself: an object with a non-inline definition, linked twice the same way, must
# fail with the linker's "multiple definition".
set(_probe ${CMAKE_CURRENT_BINARY_DIR}/nvcc_header_check/odr_probe.cu)
file(CONFIGURE OUTPUT ${_probe} CONTENT "// Generated: a non-inline definition, as a faulty header would hold.\nint lockstep_odr_probe() { return 1; }\n" @ONLY)
add_library(lockstep_nvcc_odr_probe STATIC EXCLUDE_FROM_ALL ${_probe})
set_target_properties(lockstep_nvcc_odr_probe PROPERTIES CUDA_ARCHITECTURES 90-virtual)
add_executable(lockstep_nvcc_odr_probe_twice EXCLUDE_FROM_ALL ${_main})
set_target_properties(lockstep_nvcc_odr_probe_twice PROPERTIES CUDA_ARCHITECTURES 90-virtual)
target_link_libraries(lockstep_nvcc_odr_probe_twice PRIVATE lockstep::cuda lockstep_doctest_main)
add_dependencies(lockstep_nvcc_odr_probe_twice lockstep_nvcc_odr_probe)
target_link_options(lockstep_nvcc_odr_probe_twice PRIVATE
  "SHELL:-Wl,--whole-archive $<TARGET_FILE:lockstep_nvcc_odr_probe> $<TARGET_FILE:lockstep_nvcc_odr_probe> -Wl,--no-whole-archive")
add_test(NAME build/nvcc_headers_link_twice_catches_a_definition
         COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target lockstep_nvcc_odr_probe_twice)
set_tests_properties(build/nvcc_headers_link_twice_catches_a_definition PROPERTIES LABELS "build" TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "multiple definition of .lockstep_odr_probe"
                     RESOURCE_LOCK lockstep_build_tree)
