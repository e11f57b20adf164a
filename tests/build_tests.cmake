# Build checks, included by tests/CMakeLists.txt:
#  - every public header compiles on its own (one generated translation unit per header);
#  - the installed package works with find_package(lockstep) in a separate project;
#  - the source tree works with add_subdirectory in a separate project.
# All carry the CTest label `build`.

# --- every public header alone ------------------------------------------------------------------
# Where nvcc exists, tests/cuda/header_tests.cmake compiles every public header under nvcc, whose
# host pass is this g++ with the same warnings (less -Wpedantic, which nvcc's generated code does
# not meet): this check of each header alone is then left to the clang++ build (scripts/test.sh),
# which runs it with -Wpedantic, so that a CUDA build does not parse every header once more.
if(NOT LOCKSTEP_HAS_CUDA)
  # Headers under detail/ are private; .cuh files, backend/cuda/ and headers that include CUDA
  # headers need nvcc and are checked by the CUDA build.
  set(_lockstep_include_dir ${PROJECT_SOURCE_DIR}/include)
  file(GLOB_RECURSE _lockstep_headers CONFIGURE_DEPENDS RELATIVE ${_lockstep_include_dir}
       ${_lockstep_include_dir}/lockstep/*.hpp)
  set(_lockstep_header_tus)
  set(_lockstep_image_headers)
  foreach(_header IN LISTS _lockstep_headers)
    if(_header MATCHES "(^|/)detail/" OR _header MATCHES "^lockstep/backend/cuda(/|\\.hpp$)")
      continue()
    endif()
    file(STRINGS ${_lockstep_include_dir}/${_header} _cuda_includes
         REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](cuda|cublas|nccl|cub/|thrust/|lockstep/backend/cuda|mpi\\.h|lockstep/distribute/mpi)")
    if(_cuda_includes)
      continue()
    endif()
    # The image component's headers need libpng and libjpeg-turbo: checked below, with lockstep::images.
    file(STRINGS ${_lockstep_include_dir}/${_header} _image_includes
         REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"](png\\.h|jpeglib\\.h|lockstep/data/(png|jpeg|image_decode|image_folder|webdataset)\\.hpp)")
    if(_image_includes)
      list(APPEND _lockstep_image_headers ${_header})
      continue()
    endif()
    # oneDNN's headers are needed only by the LOCKSTEP_HOST_GEMM=onednn build.
    file(STRINGS ${_lockstep_include_dir}/${_header} _onednn_includes REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]oneapi/dnnl")
    if(_onednn_includes AND NOT LOCKSTEP_HOST_GEMM STREQUAL "onednn")
      continue()
    endif()
    string(REGEX REPLACE "[/.]" "_" _tu_name "${_header}")
    set(_tu ${CMAKE_CURRENT_BINARY_DIR}/header_check/${_tu_name}.cpp)
    # Included twice: the second inclusion checks the include guard. Rewritten only when changed.
    file(CONFIGURE OUTPUT ${_tu}
         CONTENT "// Generated: checks that <${_header}> compiles on its own.\n#include <${_header}>\n#include <${_header}>\n"
         @ONLY)
    list(APPEND _lockstep_header_tus ${_tu})
  endforeach()

  add_library(lockstep_header_check OBJECT ${_lockstep_header_tus})
  target_link_libraries(lockstep_header_check PRIVATE lockstep::lockstep lockstep_warnings)
  add_test(NAME build/headers_compile_alone
           COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target lockstep_header_check)
  set_tests_properties(build/headers_compile_alone PROPERTIES LABELS "build" TIMEOUT 900
                       RESOURCE_LOCK lockstep_build_tree)  # one cmake --build of this tree at a time
  if(LOCKSTEP_HAS_IMAGES AND _lockstep_image_headers)
    set(_image_tus)
    foreach(_header IN LISTS _lockstep_image_headers)
      string(REGEX REPLACE "[/.]" "_" _tu_name "${_header}")
      set(_tu ${CMAKE_CURRENT_BINARY_DIR}/header_check_images/${_tu_name}.cpp)
      file(CONFIGURE OUTPUT ${_tu} CONTENT "#include <${_header}>\n#include <${_header}>\n" @ONLY)
      list(APPEND _image_tus ${_tu})
    endforeach()
    add_library(lockstep_images_header_check OBJECT ${_image_tus})
    target_link_libraries(lockstep_images_header_check PRIVATE lockstep::images lockstep_warnings)
    add_test(NAME build/image_headers_compile_alone
             COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target lockstep_images_header_check)
    set_tests_properties(build/image_headers_compile_alone PROPERTIES LABELS "build" TIMEOUT 900
                         RESOURCE_LOCK lockstep_build_tree)
  endif()
endif()

# --- consumers: find_package after install, and add_subdirectory -------------------------------
set(_consumer_args
    -DLOCKSTEP_SOURCE_DIR=${PROJECT_SOURCE_DIR}
    -DCONSUMER_DIR=${CMAKE_CURRENT_SOURCE_DIR}/build/consumer
    -DGENERATOR=${CMAKE_GENERATOR}
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DLOCKSTEP_CUDA=${LOCKSTEP_CUDA}
    -DLOCKSTEP_HOST_GEMM=${LOCKSTEP_HOST_GEMM})
add_test(NAME build/install_and_find_package
         COMMAND ${CMAKE_COMMAND} ${_consumer_args} -DMODE=install
                 -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer_install
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/build/check_consumer.cmake)
add_test(NAME build/add_subdirectory
         COMMAND ${CMAKE_COMMAND} ${_consumer_args} -DMODE=subdirectory
                 -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer_subdirectory
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/build/check_consumer.cmake)
# The host GEMM lockstep's default (LOCKSTEP_HOST_GEMM=auto) chooses here: oneDNN where it is
# installed and usable, as the same search decides.
set(LOCKSTEP_ONEDNN_OPTIONAL ON)
include(${PROJECT_SOURCE_DIR}/cmake/lockstep_onednn.cmake)
unset(LOCKSTEP_ONEDNN_OPTIONAL)
set(_default_gemm openblas)
if(TARGET lockstep::onednn)
  set(_default_gemm onednn)
endif()
add_test(NAME build/getting_started_cmake_defaults
         COMMAND ${CMAKE_COMMAND} ${_consumer_args} -DMODE=defaults -DEXPECTED_DEFAULT_GEMM=${_default_gemm}
                 -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/consumer_defaults
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/build/check_consumer.cmake)
set_tests_properties(build/install_and_find_package build/add_subdirectory build/getting_started_cmake_defaults
                     PROPERTIES LABELS "build" TIMEOUT 900)

# --- collective ids have one owner ---------------------------------------------------------------
add_test(NAME build/collective_ids_one_owner
         COMMAND ${CMAKE_COMMAND} -DINCLUDE_DIR=${PROJECT_SOURCE_DIR}/include
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/build/check_collective_ids.cmake)
set_tests_properties(build/collective_ids_one_owner PROPERTIES LABELS "build")

# --- every header includes only what docs/architecture.md's layering table allows ----------------
add_test(NAME build/layering
         COMMAND ${CMAKE_COMMAND} -DINCLUDE_DIR=${PROJECT_SOURCE_DIR}/include
                 -DDOC=${PROJECT_SOURCE_DIR}/docs/architecture.md
                 -P ${CMAKE_CURRENT_SOURCE_DIR}/build/check_layering.cmake)
set_tests_properties(build/layering PROPERTIES LABELS "build")
