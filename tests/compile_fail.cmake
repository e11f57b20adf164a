# Compile-fail checks, included by tests/CMakeLists.txt: each tests/compile_fail/*.cpp must NOT
# compile, and the compiler's output must match the regular expression on its `// expect:` line
# (the message that tells the user what is wrong); with an `// errors: N` line, the output must
# also hold exactly N lines containing `error:` (compile_fail_check.cmake). Each is one small
# translation unit, built only by its CTest test; they carry the CTest label `build`.
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
  add_test(NAME compile_fail/${_name}
           COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR} -DTARGET=compile_fail_${_name} -DSOURCE=${_src}
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail_check.cmake)
  set_tests_properties(compile_fail/${_name} PROPERTIES LABELS "build" TIMEOUT 300 RESOURCE_LOCK lockstep_build_tree)
endforeach()
