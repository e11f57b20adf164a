# Runs a program twice, with two argument lists, each exporting its trained weights and writing its
# metrics, and checks that both runs end with the same bits: the exported weights byte for byte,
# and the same training loss in every epoch's metrics line. Exits with 77 (a skip) when the data
# directory is missing.
#   cmake -DPROGRAM=<exe> -DARGS_A=a|b -DARGS_B=a|b -DWORK_DIR=<dir> [-DDATA_DIR=<dir>] -P check_same_run.cmake
cmake_minimum_required(VERSION 3.25)
if(DEFINED DATA_DIR AND NOT EXISTS "${DATA_DIR}")
  message("${DATA_DIR} is missing (apt-get install dataset-fashion-mnist): skipped")
  cmake_language(EXIT 77)
endif()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
foreach(_run A B)
  string(REPLACE "|" ";" _args "${ARGS_${_run}}")
  execute_process(COMMAND ${PROGRAM} ${_args} --quiet --export ${WORK_DIR}/${_run}.safetensors
                          --metrics-file ${WORK_DIR}/${_run}.jsonl
                  RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} ${ARGS_${_run}}: exit code ${_rc}\n${_out}${_err}")
  endif()
  message("run ${_run} (${ARGS_${_run}}): ${_out}")
  file(STRINGS ${WORK_DIR}/${_run}.jsonl _lines)
  set(_losses_${_run})
  foreach(_line IN LISTS _lines)
    string(REGEX MATCH "\"train_loss\":[^,]*" _loss "${_line}")
    list(APPEND _losses_${_run} "${_loss}")
  endforeach()
endforeach()
if(NOT "${_losses_A}" STREQUAL "${_losses_B}" OR "${_losses_A}" STREQUAL "")
  message(FATAL_ERROR "the training losses differ:\n  ${ARGS_A}: ${_losses_A}\n  ${ARGS_B}: ${_losses_B}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -E compare_files ${WORK_DIR}/A.safetensors ${WORK_DIR}/B.safetensors
                RESULT_VARIABLE _same)
if(NOT _same EQUAL 0)
  message(FATAL_ERROR "the exported weights differ: ${ARGS_A} against ${ARGS_B}")
endif()
message("same weights and losses (${_losses_A})")
file(REMOVE_RECURSE "${WORK_DIR}")
