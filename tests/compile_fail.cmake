# Compile-fail checks, included by tests/CMakeLists.txt: each tests/compile_fail/*.cpp must NOT
# compile, and the compiler's output must match the regular expression on its `// expect:` line
# (the message that tells the user what is wrong). Each is one small translation unit, built only
# by its CTest test; they carry the CTest label `build`. A source that also says `// errors: N`
# must produce exactly N lines with `error:` (tests/build/compile_fail_count.cmake).
file(GLOB _lockstep_cf_sources CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/*.cpp)
foreach(_src IN LISTS _lockstep_cf_sources)
  get_filename_component(_name ${_src} NAME_WE)
  file(STRINGS ${_src} _expect REGEX "^// expect: " LIMIT_COUNT 1)
  string(REPLACE "// expect: " "" _expect "${_expect}")
  if(_expect STREQUAL "")
    message(FATAL_ERROR "${_src} has no `// expect: <regex>` line")
  endif()
  add_library(compile_fail_${_name} OBJECT EXCLUDE_FROM_ALL ${_src})
  target_link_libraries(compile_fail_${_name} PRIVATE lockstep::lockstep)
  # `// errors: N`: the compiler must also print exactly N lines with `error:` (one error, not a cascade).
  file(STRINGS ${_src} _errors REGEX "^// errors: [0-9]+" LIMIT_COUNT 1)
  string(REGEX REPLACE "^// errors: ([0-9]+).*" "\\1" _errors "${_errors}")
  if(_errors STREQUAL "")
    add_test(NAME compile_fail/${_name}
             COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target compile_fail_${_name})
  else()
    add_test(NAME compile_fail/${_name}
             COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR} -DTARGET=compile_fail_${_name} -DERRORS=${_errors}
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/build/compile_fail_count.cmake)
    set_tests_properties(compile_fail/${_name} PROPERTIES FAIL_REGULAR_EXPRESSION "error-count: MISMATCH")
  endif()
  set_tests_properties(compile_fail/${_name} PROPERTIES PASS_REGULAR_EXPRESSION "${_expect}" LABELS "build"
                       TIMEOUT 300 RESOURCE_LOCK lockstep_build_tree)
endforeach()
