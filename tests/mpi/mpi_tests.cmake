# The MPI tests, included by tests/CMakeLists.txt when MPI is found. Every test launches its
# processes with mpirun; the environment below keeps Open MPI working in a container (as root,
# more processes than cores, shared memory without ptrace-based single copy).
add_executable(test_mpi ${CMAKE_CURRENT_SOURCE_DIR}/mpi/main.cpp ${CMAKE_CURRENT_SOURCE_DIR}/mpi/multi_worker_test.cpp)
target_link_libraries(test_mpi PRIVATE lockstep::mpi doctest::doctest lockstep_warnings)
target_include_directories(test_mpi PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})  # distribute/common.hpp
add_executable(mpi_failure_probe ${CMAKE_CURRENT_SOURCE_DIR}/mpi/failure_probe.cpp)
target_link_libraries(mpi_failure_probe PRIVATE lockstep::mpi lockstep_warnings)

set(LOCKSTEP_MPIEXEC_FLAGS --allow-run-as-root --oversubscribe CACHE STRING "Flags of mpirun in lockstep's MPI tests")
set(_lockstep_mpi_env
    "OMPI_MCA_btl=self,vader,tcp"
    "OMPI_MCA_btl_vader_single_copy_mechanism=none"
    "OMPI_MCA_rmaps_base_oversubscribe=1"
    "OMPI_MCA_btl_tcp_if_include=lo"
    "OMPI_MCA_oob_tcp_if_include=lo"
    "OMPI_ALLOW_RUN_AS_ROOT=1"
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
foreach(np 2 3)
  add_test(NAME mpi/multi_worker_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${LOCKSTEP_MPIEXEC_FLAGS} ${MPIEXEC_NUMPROC_FLAG} ${np} $<TARGET_FILE:test_mpi>)
  set_tests_properties(mpi/multi_worker_np${np} PROPERTIES LABELS "mpi" TIMEOUT 120 ENVIRONMENT "${_lockstep_mpi_env}")
endforeach()
# A broadcast past MPI's int count of bytes (2 GiB per worker).
add_test(NAME mpi/broadcast_over_2gib
         COMMAND ${MPIEXEC_EXECUTABLE} ${LOCKSTEP_MPIEXEC_FLAGS} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:test_mpi>
                 --no-skip --no-colors "--test-case=*more than 2 GiB*")
set_tests_properties(mpi/broadcast_over_2gib PROPERTIES LABELS "mpi" TIMEOUT 300 ENVIRONMENT "${_lockstep_mpi_env}"
                     PASS_REGULAR_EXPRESSION "test cases: +1 \\| +1 passed" FAIL_REGULAR_EXPRESSION "[1-9][0-9]* failed|ERROR")
# The MPI path that workers on different machines take (here forced on one machine).
add_test(NAME mpi/multi_worker_np2_mpi_path
         COMMAND ${MPIEXEC_EXECUTABLE} ${LOCKSTEP_MPIEXEC_FLAGS} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:test_mpi>)
set_tests_properties(mpi/multi_worker_np2_mpi_path PROPERTIES LABELS "mpi" TIMEOUT 120
                     ENVIRONMENT "${_lockstep_mpi_env};LOCKSTEP_MPI_NO_SHM=1")
add_test(NAME mpi/failure_stall_mpi_path
         COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/mpi/check_failure.sh ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:mpi_failure_probe> stall)
set_tests_properties(mpi/failure_stall_mpi_path PROPERTIES LABELS "mpi" TIMEOUT 60
                     ENVIRONMENT "${_lockstep_mpi_env};LOCKSTEP_MPI_NO_SHM=1")
# 4 x 1 workers x replicas, bitwise equal to one process (the other splits run in the tests above).
add_test(NAME mpi/replica_count_invariant_np4
         COMMAND ${MPIEXEC_EXECUTABLE} ${LOCKSTEP_MPIEXEC_FLAGS} ${MPIEXEC_NUMPROC_FLAG} 4 $<TARGET_FILE:test_mpi>
                 --test-case=*replica_count_invariant*)
set_tests_properties(mpi/replica_count_invariant_np4 PROPERTIES LABELS "mpi" TIMEOUT 120 ENVIRONMENT "${_lockstep_mpi_env}")
foreach(mode throw outside alloutside afterlast lateend stall kill diverge world nompirun)
  add_test(NAME mpi/failure_${mode}
           COMMAND sh ${CMAKE_CURRENT_SOURCE_DIR}/mpi/check_failure.sh ${MPIEXEC_EXECUTABLE} $<TARGET_FILE:mpi_failure_probe> ${mode})
  set_tests_properties(mpi/failure_${mode} PROPERTIES LABELS "mpi" TIMEOUT 60 ENVIRONMENT "${_lockstep_mpi_env}")
endforeach()

# The index-first input pipeline across 2 workers: Fashion-MNIST as a PNG folder and as tar shards,
# each worker decoding only its rows (needs the image component).
if(LOCKSTEP_HAS_IMAGES)
  add_executable(test_mpi_data ${CMAKE_CURRENT_SOURCE_DIR}/mpi/main.cpp ${CMAKE_CURRENT_SOURCE_DIR}/mpi/data_mpi_test.cpp)
  target_link_libraries(test_mpi_data PRIVATE lockstep::mpi lockstep::images doctest::doctest lockstep_warnings)
  target_include_directories(test_mpi_data PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})  # data/images/fashion.hpp
  add_test(NAME mpi/data_np2
           COMMAND ${MPIEXEC_EXECUTABLE} ${LOCKSTEP_MPIEXEC_FLAGS} ${MPIEXEC_NUMPROC_FLAG} 2 $<TARGET_FILE:test_mpi_data>)
  set_tests_properties(mpi/data_np2 PROPERTIES LABELS "mpi" TIMEOUT 600 ENVIRONMENT "${_lockstep_mpi_env}")
endif()

# Each test runs two or more processes: under ctest -j, each takes the cores of its processes
# (at most what -j gives), so that a worker is not starved into a straggler diagnosis.
set(_lockstep_mpi_process_tests mpi/multi_worker_np2 mpi/multi_worker_np3 mpi/multi_worker_np2_mpi_path
    mpi/failure_stall_mpi_path mpi/replica_count_invariant_np4)
foreach(mode throw outside alloutside afterlast lateend stall kill diverge world nompirun)
  list(APPEND _lockstep_mpi_process_tests mpi/failure_${mode})
endforeach()
if(LOCKSTEP_HAS_IMAGES)
  list(APPEND _lockstep_mpi_process_tests mpi/data_np2)
endif()
set_tests_properties(${_lockstep_mpi_process_tests} PROPERTIES PROCESSORS 2)

# The MPI headers compile on their own (the generic header check skips them: they need <mpi.h>).
set(_mpi_header_tus)
foreach(_header lockstep/distribute/mpi.hpp lockstep/distribute/mpi_world.hpp lockstep/distribute/multi_worker.hpp
                lockstep/distribute/reducers/mpi_host.hpp lockstep/distribute/reducers/over_workers.hpp)
  string(REGEX REPLACE "[/.]" "_" _tu_name "${_header}")
  set(_tu ${CMAKE_CURRENT_BINARY_DIR}/header_check_mpi/${_tu_name}.cpp)
  file(CONFIGURE OUTPUT ${_tu} CONTENT "#include <${_header}>\n#include <${_header}>\n" @ONLY)
  list(APPEND _mpi_header_tus ${_tu})
endforeach()
add_library(lockstep_mpi_header_check OBJECT ${_mpi_header_tus})
target_link_libraries(lockstep_mpi_header_check PRIVATE lockstep::mpi lockstep_warnings)
add_test(NAME mpi/headers_compile_alone
         COMMAND ${CMAKE_COMMAND} --build ${CMAKE_BINARY_DIR} --target lockstep_mpi_header_check)
set_tests_properties(mpi/headers_compile_alone PROPERTIES LABELS "mpi;build" TIMEOUT 900 RESOURCE_LOCK lockstep_build_tree)

# The program docs/multi-node.md shows, compiled as shown (the docs_multi-node test compares the
# page with it; the tests above run the same calls under mpirun).
add_executable(docs_multi_node ${CMAKE_CURRENT_SOURCE_DIR}/mpi/docs_multi_node.cpp)
target_link_libraries(docs_multi_node PRIVATE lockstep::mpi lockstep_warnings)
