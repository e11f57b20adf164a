# The interop tests (CTest label `interop`), included by tests/CMakeLists.txt: Python's own readers
# check lockstep's files (TensorBoard's EventAccumulator reads the event files, PyTorch loads the
# safetensors weights with load_state_dict(strict=True), and lockstep loads PyTorch's), and
# scripts/plot.py draws a metrics file. interop/setup prepares a virtual environment in
# <build>/interop/venv over Debian's python3-torch and python3-matplotlib, pip-installing only
# tensorboard and safetensors; when something cannot be had, every interop test reports itself
# skipped with the reason. LOCKSTEP_INTEROP: AUTO (the default) or OFF (not registered).
set(LOCKSTEP_INTEROP AUTO CACHE STRING "Register the interop tests (label interop): AUTO or OFF")
set_property(CACHE LOCKSTEP_INTEROP PROPERTY STRINGS AUTO OFF)
if(LOCKSTEP_INTEROP STREQUAL "OFF")
  return()
endif()

add_executable(interop_tool ${CMAKE_CURRENT_SOURCE_DIR}/interop/interop_tool.cpp)
target_link_libraries(interop_tool PRIVATE lockstep::lockstep lockstep_warnings)

set(_interop_dir ${CMAKE_BINARY_DIR}/interop)
set(_interop_run bash ${CMAKE_CURRENT_SOURCE_DIR}/interop/run.sh ${_interop_dir}/status ${_interop_dir}/venv)
add_test(NAME interop/setup
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/interop/setup.sh ${_interop_dir}/venv ${_interop_dir}/status)
set_tests_properties(interop/setup PROPERTIES LABELS interop TIMEOUT 1200 FIXTURES_SETUP lockstep_interop)
foreach(_t tensorboard safetensors)
  add_test(NAME interop/${_t}
           COMMAND ${_interop_run} ${CMAKE_CURRENT_SOURCE_DIR}/interop/test_${_t}.py --tool $<TARGET_FILE:interop_tool>
                   --work ${_interop_dir}/${_t})
  set_tests_properties(interop/${_t} PROPERTIES LABELS interop TIMEOUT 600 SKIP_RETURN_CODE 77
                       FIXTURES_REQUIRED lockstep_interop)
endforeach()
add_test(NAME interop/plot
         COMMAND ${_interop_run} ${CMAKE_CURRENT_SOURCE_DIR}/interop/test_plot.py
                 --script ${PROJECT_SOURCE_DIR}/scripts/plot.py --work ${_interop_dir}/plot)
set_tests_properties(interop/plot PROPERTIES LABELS interop TIMEOUT 300 SKIP_RETURN_CODE 77
                     FIXTURES_REQUIRED lockstep_interop)
