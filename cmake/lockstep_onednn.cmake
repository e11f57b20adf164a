# The oneDNN host GEMM of the LOCKSTEP_HOST_GEMM=onednn build: defines the imported target
# lockstep::onednn (oneDNN's headers and libdnnl, plus the OpenMP runtime libdnnl was built with,
# whose per-thread thread count host_context::activate sets). Included by lockstep's
# CMakeLists.txt, by the installed lockstepConfig.cmake and by tests/build_tests.cmake (to know
# what the default picks). With LOCKSTEP_ONEDNN_OPTIONAL set (LOCKSTEP_HOST_GEMM=auto), a missing
# or unusable oneDNN defines nothing instead of failing.
if(NOT DEFINED _lockstep_onednn_fallback)
  set(_lockstep_onednn_fallback "using OpenBLAS")
endif()
if(NOT TARGET lockstep::onednn)
  find_path(LOCKSTEP_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h DOC "Folder holding oneapi/dnnl/dnnl.h")
  find_library(LOCKSTEP_DNNL_LIBRARY NAMES dnnl DOC "oneDNN's library (libdnnl)")
  if((NOT LOCKSTEP_DNNL_INCLUDE_DIR OR NOT LOCKSTEP_DNNL_LIBRARY) AND LOCKSTEP_ONEDNN_OPTIONAL)
    message(STATUS "lockstep: oneDNN not found (install libdnnl-dev for its kernels): ${_lockstep_onednn_fallback}")
    return()
  endif()
  if(NOT LOCKSTEP_DNNL_INCLUDE_DIR OR NOT LOCKSTEP_DNNL_LIBRARY)
    message(FATAL_ERROR "lockstep: LOCKSTEP_HOST_GEMM=onednn needs oneDNN, which was not found "
                        "(oneapi/dnnl/dnnl.h: ${LOCKSTEP_DNNL_INCLUDE_DIR}, libdnnl: ${LOCKSTEP_DNNL_LIBRARY}). "
                        "On Debian or Ubuntu install the package libdnnl-dev; elsewhere add oneDNN's "
                        "prefix to CMAKE_PREFIX_PATH, or configure with -DLOCKSTEP_HOST_GEMM=openblas.")
  endif()
  # lockstep calls oneDNN 2's C API (operation descriptors, which oneDNN 3 removed).
  set(_lockstep_dnnl_major "")
  if(EXISTS "${LOCKSTEP_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h")
    file(STRINGS "${LOCKSTEP_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _lockstep_dnnl_major
         REGEX "^#define DNNL_VERSION_MAJOR ")
    string(REGEX REPLACE "^#define DNNL_VERSION_MAJOR +([0-9]+).*" "\\1" _lockstep_dnnl_major "${_lockstep_dnnl_major}")
  endif()
  if(NOT _lockstep_dnnl_major STREQUAL "2" AND LOCKSTEP_ONEDNN_OPTIONAL)
    message(STATUS "lockstep: oneDNN ${_lockstep_dnnl_major} found, lockstep needs oneDNN 2.x: ${_lockstep_onednn_fallback}")
    return()
  endif()
  if(NOT _lockstep_dnnl_major STREQUAL "2")
    message(FATAL_ERROR "lockstep: LOCKSTEP_HOST_GEMM=onednn needs oneDNN 2.x (its operation-descriptor C API); "
                        "${LOCKSTEP_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h says major version '${_lockstep_dnnl_major}'. "
                        "Install oneDNN 2 (Debian 12: libdnnl-dev), or configure with -DLOCKSTEP_HOST_GEMM=openblas.")
  endif()
  file(STRINGS "${LOCKSTEP_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_config.h" _lockstep_dnnl_runtime
       REGEX "^#define DNNL_CPU_THREADING_RUNTIME ")
  set(_lockstep_dnnl_libs ${LOCKSTEP_DNNL_LIBRARY} ${CMAKE_DL_LIBS})
  if(_lockstep_dnnl_runtime MATCHES "DNNL_RUNTIME_OMP")
    # The GNU OpenMP runtime that Debian's libdnnl uses (libgomp.so.1 is found by its full name
    # too, for systems without the compiler's development link libgomp.so).
    find_library(LOCKSTEP_GOMP_LIBRARY NAMES gomp libgomp.so.1 DOC "The OpenMP runtime oneDNN uses (libgomp)")
    if(NOT LOCKSTEP_GOMP_LIBRARY AND LOCKSTEP_ONEDNN_OPTIONAL)
      message(STATUS "lockstep: oneDNN was built with OpenMP, but libgomp was not found: ${_lockstep_onednn_fallback}")
      return()
    endif()
    if(NOT LOCKSTEP_GOMP_LIBRARY)
      message(FATAL_ERROR "lockstep: oneDNN was built with OpenMP, but libgomp was not found (set LOCKSTEP_GOMP_LIBRARY)")
    endif()
    list(APPEND _lockstep_dnnl_libs ${LOCKSTEP_GOMP_LIBRARY})
  elseif(NOT _lockstep_dnnl_runtime MATCHES "DNNL_RUNTIME_SEQ" AND LOCKSTEP_ONEDNN_OPTIONAL)
    message(STATUS "lockstep: oneDNN's CPU threading is neither OpenMP nor sequential: ${_lockstep_onednn_fallback}")
    return()
  elseif(NOT _lockstep_dnnl_runtime MATCHES "DNNL_RUNTIME_SEQ")
    message(FATAL_ERROR "lockstep: LOCKSTEP_HOST_GEMM=onednn supports oneDNN built with OpenMP or sequential "
                        "CPU threading; ${LOCKSTEP_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_config.h says: ${_lockstep_dnnl_runtime}")
  endif()
  add_library(lockstep::onednn INTERFACE IMPORTED)
  set_target_properties(lockstep::onednn PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${LOCKSTEP_DNNL_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${_lockstep_dnnl_libs}")
endif()
