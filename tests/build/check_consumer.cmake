# Builds and runs the consumer project in tests/build/consumer against lockstep.
#   cmake -DMODE=install|subdirectory -DLOCKSTEP_SOURCE_DIR=... -DCONSUMER_DIR=... -DWORK_DIR=...
#         [-DGENERATOR=...] [-DCXX_COMPILER=...] [-DLOCKSTEP_CUDA=AUTO|ON|OFF]
#         [-DLOCKSTEP_HOST_GEMM=openblas|onednn] [-DEXPECTED_DEFAULT_GEMM=openblas|onednn]
#         -P check_consumer.cmake
# MODE=install: configures lockstep with its tests, examples and benchmarks off and the static CUDA
# runtime, installs it into WORK_DIR/prefix, checks that the package records that runtime, and
# builds the consumer with find_package(lockstep) (which, with the CUDA toolkit, exports a target
# linking lockstep::cuda).
# MODE=subdirectory: builds the consumer with add_subdirectory(<lockstep source>).
# MODE=defaults: installs lockstep as MODE=install does, then configures the CMakeLists.txt that
# docs/getting-started.md shows (tests/build/getting_started, around examples/getting_started.cpp)
# WITHOUT a build type: it must choose Release, draw no warning, and build a program that does not
# print the -O0 warning; and the consumer configured without a build type draws lockstep's warning
# (single-configuration generators). lockstep itself is configured with its defaults too, and the
# installed package must record EXPECTED_DEFAULT_GEMM, the host GEMM the default
# (LOCKSTEP_HOST_GEMM=auto) chooses on this machine.
cmake_minimum_required(VERSION 3.25)
foreach(_var MODE LOCKSTEP_SOURCE_DIR CONSUMER_DIR WORK_DIR)
  if(NOT DEFINED ${_var})
    message(FATAL_ERROR "check_consumer.cmake: -D${_var}=... is required")
  endif()
endforeach()
if(NOT MODE MATCHES "^(install|subdirectory|defaults)$")
  message(FATAL_ERROR "check_consumer.cmake: MODE must be install, subdirectory or defaults, got '${MODE}'")
endif()
if(NOT DEFINED LOCKSTEP_CUDA OR LOCKSTEP_CUDA STREQUAL "")
  set(LOCKSTEP_CUDA AUTO)
endif()

if(NOT DEFINED LOCKSTEP_HOST_GEMM OR LOCKSTEP_HOST_GEMM STREQUAL "")
  set(LOCKSTEP_HOST_GEMM openblas)
endif()

set(_tools)
if(GENERATOR)
  list(APPEND _tools -G ${GENERATOR})
endif()
if(CXX_COMPILER)
  list(APPEND _tools -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
endif()
# The host GEMM lockstep is configured with, and the one its installed package must record.
set(_gemm_option -DLOCKSTEP_HOST_GEMM=${LOCKSTEP_HOST_GEMM})
set(_recorded_gemm ${LOCKSTEP_HOST_GEMM})
if(MODE STREQUAL "defaults")
  if(NOT DEFINED EXPECTED_DEFAULT_GEMM)
    message(FATAL_ERROR "check_consumer.cmake: MODE=defaults needs -DEXPECTED_DEFAULT_GEMM=openblas|onednn")
  endif()
  set(_gemm_option)  # lockstep's default
  set(_recorded_gemm ${EXPECTED_DEFAULT_GEMM})
endif()
set(_common -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_CUDA=${LOCKSTEP_CUDA} ${_gemm_option} ${_tools})

function(run_step what)
  message(STATUS "${what}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${_rc}):\n${_out}")
  endif()
  message(STATUS "${_out}")
  set(_last_output "${_out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

if(MODE STREQUAL "install" OR MODE STREQUAL "defaults")
  set(_prefix ${WORK_DIR}/prefix)
  set(_runtime_option)
  if(MODE STREQUAL "install")
    set(_runtime_option -DLOCKSTEP_CUDA_STATIC_RUNTIME=ON)
  endif()
  run_step("configure lockstep" ${CMAKE_COMMAND} -S ${LOCKSTEP_SOURCE_DIR} -B ${WORK_DIR}/lockstep ${_common}
           -DLOCKSTEP_BUILD_TESTS=OFF -DLOCKSTEP_BUILD_EXAMPLES=OFF -DLOCKSTEP_BUILD_BENCHMARKS=OFF
           -DCMAKE_INSTALL_PREFIX=${_prefix} ${_runtime_option})
  run_step("build lockstep" ${CMAKE_COMMAND} --build ${WORK_DIR}/lockstep)
  run_step("install lockstep" ${CMAKE_COMMAND} --install ${WORK_DIR}/lockstep --prefix ${_prefix})
  foreach(_file include/lockstep/lockstep.hpp share/cmake/lockstep/lockstepConfig.cmake
                share/cmake/lockstep/lockstepConfigVersion.cmake share/cmake/lockstep/lockstepTargets.cmake)
    if(NOT EXISTS ${_prefix}/${_file})
      message(FATAL_ERROR "install did not produce ${_prefix}/${_file}")
    endif()
  endforeach()
  # The package records the host GEMM chosen at configure time, so consumers get the same kernels.
  file(STRINGS ${_prefix}/share/cmake/lockstep/lockstepConfig.cmake _recorded REGEX "^set\\(_lockstep_host_gemm ")
  if(NOT _recorded STREQUAL "set(_lockstep_host_gemm \"${_recorded_gemm}\")")
    message(FATAL_ERROR "the installed lockstepConfig.cmake records '${_recorded}', expected the host GEMM ${_recorded_gemm}")
  endif()
  # The package records the CUDA runtime too (installed here with the static one, not the default).
  if(MODE STREQUAL "install")
    file(STRINGS ${_prefix}/share/cmake/lockstep/lockstepConfig.cmake _recorded REGEX "^  set\\(LOCKSTEP_CUDA_STATIC_RUNTIME ")
    if(NOT _recorded STREQUAL "  set(LOCKSTEP_CUDA_STATIC_RUNTIME ON)")
      message(FATAL_ERROR "the installed lockstepConfig.cmake records '${_recorded}', expected LOCKSTEP_CUDA_STATIC_RUNTIME ON")
    endif()
  endif()
  set(_consumer_options -DCMAKE_PREFIX_PATH=${_prefix} -DEXPECT_CUDA_STATIC_RUNTIME=ON)
  if(MODE STREQUAL "defaults")
    include(${CMAKE_CURRENT_LIST_DIR}/check_defaults.cmake)
    return()
  endif()
else()
  set(_consumer_options -DLOCKSTEP_CONSUMER_SOURCE=${LOCKSTEP_SOURCE_DIR})
endif()

run_step("configure consumer" ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/consumer ${_common}
         ${_consumer_options})
run_step("build consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/consumer)
find_program(_consumer_exe NAMES consumer PATHS ${WORK_DIR}/consumer ${WORK_DIR}/consumer/Release NO_DEFAULT_PATH)
if(NOT _consumer_exe)
  message(FATAL_ERROR "the consumer executable was not built in ${WORK_DIR}/consumer")
endif()
run_step("run consumer" ${_consumer_exe})
# The consumer prints the host GEMM it was built with: the configured one must reach it.
if(LOCKSTEP_HOST_GEMM STREQUAL "onednn")
  set(_expected_gemm "host GEMM: oneDNN")
else()
  set(_expected_gemm "host GEMM: OpenBLAS")
endif()
string(FIND "${_last_output}" "${_expected_gemm}" _found)
if(_found EQUAL -1)
  message(FATAL_ERROR "the consumer (LOCKSTEP_HOST_GEMM=${LOCKSTEP_HOST_GEMM}) did not print '${_expected_gemm}':\n${_last_output}")
endif()
