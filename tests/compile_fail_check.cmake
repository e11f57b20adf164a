# Runs one compile-fail check (see compile_fail.cmake): builds TARGET in BUILD_DIR, which must
# fail; its output must match the regular expression of SOURCE's `// expect: <regex>` line and,
# when SOURCE has an `// errors: N` line, contain exactly N lines with `error:` (one mistake, one
# error: nothing cascades from it).
# Usage: cmake -DBUILD_DIR=<dir> -DTARGET=<target> -DSOURCE=<file.cpp> -P compile_fail_check.cmake
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _out)
if(_rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must not")
endif()
file(STRINGS ${SOURCE} _expect REGEX "^// expect: " LIMIT_COUNT 1)
string(REPLACE "// expect: " "" _expect "${_expect}")
if(NOT _out MATCHES "${_expect}")
  message(FATAL_ERROR "the compiler's output for ${SOURCE} does not match `${_expect}`:\n${_out}")
endif()
file(STRINGS ${SOURCE} _errors REGEX "^// errors: [0-9]+$" LIMIT_COUNT 1)
if(_errors)
  string(REPLACE "// errors: " "" _errors "${_errors}")
  string(REPLACE ";" "," _flat "${_out}")  # a `;` would split a line into two list elements
  string(REGEX MATCHALL "[^\n]*error:[^\n]*" _lines "${_flat}")
  list(LENGTH _lines _count)
  if(NOT _count EQUAL _errors)
    message(FATAL_ERROR "the compiler printed ${_count} lines with `error:` for ${SOURCE}, expected ${_errors} "
                        "(one mistake, one error):\n${_out}")
  endif()
endif()
message(STATUS "${SOURCE}: the compiler says what it must")
