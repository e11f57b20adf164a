# Fails when a header outside distribute/collective_ids.hpp computes a collective id from a bucket
# count (`max_buckets - 1`, `max_buckets + 1`, `ids_ - 1`, ...): every collective names its
# constant in lockstep::collective_ids instead.
# Usage: cmake -DINCLUDE_DIR=<include> -P check_collective_ids.cmake
file(GLOB_RECURSE _headers "${INCLUDE_DIR}/lockstep/*.hpp" "${INCLUDE_DIR}/lockstep/*.cuh")
set(_bad "")
foreach(_h IN LISTS _headers)
  if(_h MATCHES "collective_ids\\.hpp$")
    continue()
  endif()
  file(STRINGS "${_h}" _lines REGEX "(max_buckets_?|ids_?)[ \t]*[-+][ \t]*[0-9]")
  foreach(_l IN LISTS _lines)
    string(STRIP "${_l}" _l)
    string(APPEND _bad "\n  ${_h}: ${_l}")
  endforeach()
endforeach()
if(_bad)
  message(FATAL_ERROR "collective ids computed outside lockstep/distribute/collective_ids.hpp "
                      "(name the constant of lockstep::collective_ids instead):${_bad}")
endif()
message(STATUS "every collective id is named through lockstep::collective_ids")
