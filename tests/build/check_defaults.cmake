# MODE=defaults of check_consumer.cmake (included by it after lockstep is installed in _prefix):
# the build type a first program gets, and the warning a project without one gets.
set(_first ${WORK_DIR}/first)
file(MAKE_DIRECTORY ${_first})
configure_file(${CMAKE_CURRENT_LIST_DIR}/getting_started/CMakeLists.txt ${_first}/CMakeLists.txt COPYONLY)
configure_file(${LOCKSTEP_SOURCE_DIR}/examples/getting_started.cpp ${_first}/main.cpp COPYONLY)
run_step("configure the getting-started project (no build type given)" ${CMAKE_COMMAND} -S ${_first}
         -B ${_first}/build ${_tools} -DLOCKSTEP_CUDA=${LOCKSTEP_CUDA} -DCMAKE_PREFIX_PATH=${_prefix})
if(_last_output MATCHES "lockstep: CMAKE_BUILD_TYPE is not set")
  message(FATAL_ERROR "the getting-started project drew lockstep's build-type warning:\n${_last_output}")
endif()
file(STRINGS ${_first}/build/CMakeCache.txt _type REGEX "^CMAKE_BUILD_TYPE:")
if(NOT _type STREQUAL "CMAKE_BUILD_TYPE:STRING=Release")
  message(FATAL_ERROR "the getting-started project's build type is '${_type}', not Release")
endif()
run_step("build the getting-started project" ${CMAKE_COMMAND} --build ${_first}/build)
find_program(_first_exe NAMES first PATHS ${_first}/build ${_first}/build/Release NO_DEFAULT_PATH)
# Run without data: the strategy is made first (it would warn at -O0), then the data is missing.
execute_process(COMMAND ${_first_exe} ${WORK_DIR}/no-data RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
if(NOT _rc EQUAL 2 OR _err MATCHES "compiled without optimisation" OR NOT _err MATCHES "^error: lockstep::data::idx: ")
  message(FATAL_ERROR "the getting-started program built as documented did not end as an optimised build "
                      "without data must (exit 2, no -O0 warning):\nexit ${_rc}\n${_err}")
endif()
message(STATUS "the getting-started project builds Release by default")

# A project that chooses no build type, with a single-configuration generator: lockstep warns.
if(NOT GENERATOR MATCHES "Multi-Config|Visual Studio|Xcode")
  run_step("configure the consumer without a build type" ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${WORK_DIR}/plain
           ${_tools} -DLOCKSTEP_CUDA=${LOCKSTEP_CUDA} -DCMAKE_PREFIX_PATH=${_prefix})
  string(REGEX MATCHALL "lockstep: CMAKE_BUILD_TYPE is not set" _warnings "${_last_output}")
  list(LENGTH _warnings _count)
  if(NOT _count EQUAL 1)
    message(FATAL_ERROR "configuring without a build type drew ${_count} lockstep warnings, expected 1:\n${_last_output}")
  endif()
  message(STATUS "a project without a build type is told, once")
endif()
