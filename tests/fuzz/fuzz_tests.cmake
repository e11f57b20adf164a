# Registers a short run of each fuzz harness with CTest (label `fuzz`), included by
# tests/CMakeLists.txt. LOCKSTEP_FUZZ: AUTO (when a clang++ that links libFuzzer with ASan and
# UBSan is found), ON (required) or OFF. The harnesses are built by scripts/fuzz.sh into
# <build>/fuzz, a clang build of its own, by the test fuzz/build; each fuzz/<harness> test then
# runs its harness for LOCKSTEP_FUZZ_SECONDS (10) seconds.
set(LOCKSTEP_FUZZ AUTO CACHE STRING "Build and briefly run the libFuzzer harnesses of tests/fuzz: AUTO, ON or OFF")
set_property(CACHE LOCKSTEP_FUZZ PROPERTY STRINGS AUTO ON OFF)
set(LOCKSTEP_FUZZ_SECONDS 10 CACHE STRING "Seconds each fuzz harness runs under CTest")
if(LOCKSTEP_FUZZ STREQUAL "OFF")
  return()
endif()

find_program(LOCKSTEP_FUZZ_CXX NAMES clang++ clang++-14 clang++-15 clang++-16 DOC "clang++ for the fuzz harnesses")
set(_lockstep_fuzz_ok FALSE)
if(LOCKSTEP_FUZZ_CXX)
  set(_probe_dir ${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe)
  file(WRITE ${_probe_dir}/probe.cpp
       "#include <cstddef>\n#include <cstdint>\nextern \"C\" int LLVMFuzzerTestOneInput(const std::uint8_t*, std::size_t) { return 0; }\n")
  execute_process(COMMAND ${LOCKSTEP_FUZZ_CXX} -std=c++20 -fsanitize=fuzzer,address,undefined probe.cpp -o probe
                  WORKING_DIRECTORY ${_probe_dir} RESULT_VARIABLE _probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(_probe_rc EQUAL 0)
    set(_lockstep_fuzz_ok TRUE)
  endif()
endif()
if(NOT _lockstep_fuzz_ok)
  if(LOCKSTEP_FUZZ STREQUAL "ON")
    message(FATAL_ERROR "lockstep: LOCKSTEP_FUZZ=ON needs a clang++ that links -fsanitize=fuzzer,address,undefined "
                        "(Debian: clang and libclang-rt-14-dev)")
  endif()
  message(STATUS "lockstep: fuzz tests off (no clang++ with libFuzzer found)")
  return()
endif()
message(STATUS "lockstep: fuzz tests with ${LOCKSTEP_FUZZ_CXX}")

set(_fuzz_env LOCKSTEP_FUZZ_DIR=${CMAKE_BINARY_DIR}/fuzz LOCKSTEP_FUZZ_CXX=${LOCKSTEP_FUZZ_CXX})
add_test(NAME fuzz/build COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh --build-only)
set_tests_properties(fuzz/build PROPERTIES LABELS fuzz TIMEOUT 900 ENVIRONMENT "${_fuzz_env}"
                     FIXTURES_SETUP lockstep_fuzz_harnesses)
set(_lockstep_fuzz_harnesses idx csv checkpoint checkpoint_crc safetensors tar npy)
if(LOCKSTEP_HAS_IMAGES)
  list(APPEND _lockstep_fuzz_harnesses png jpeg)
endif()
foreach(_h ${_lockstep_fuzz_harnesses})
  add_test(NAME fuzz/${_h} COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh --no-build ${LOCKSTEP_FUZZ_SECONDS} ${_h})
  set_tests_properties(fuzz/${_h} PROPERTIES LABELS fuzz TIMEOUT 300 ENVIRONMENT "${_fuzz_env}"
                       FIXTURES_REQUIRED lockstep_fuzz_harnesses)
endforeach()
