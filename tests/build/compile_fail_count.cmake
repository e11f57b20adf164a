# Builds compile-fail target TARGET in BUILD_DIR, prints the compiler's output, and prints
# "error-count: MISMATCH" unless exactly ERRORS of its lines contain `error:` (what g++ and clang
# print for each error), "error-count: OK" otherwise. Run by the compile-fail tests whose source
# says `// errors: N`.
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                OUTPUT_VARIABLE _out ERROR_VARIABLE _err RESULT_VARIABLE _rc)
set(_all "${_out}${_err}")
# a list separator inside a message would split one line in two
string(REPLACE ";" "," _all "${_all}")
message("${_all}")
string(REGEX MATCHALL "[^\n]*error:[^\n]*" _errors "${_all}")
list(LENGTH _errors _n)
if(_rc EQUAL 0)
  message("error-count: MISMATCH (the code compiled)")
elseif(NOT _n EQUAL ERRORS)
  message("error-count: MISMATCH (${_n} lines with `error:`, expected ${ERRORS})")
else()
  message("error-count: OK (${_n})")
endif()
