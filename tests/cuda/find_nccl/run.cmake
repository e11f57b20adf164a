# cmake -DLOCKSTEP_SOURCE_DIR=... -DWORK=... -P run.cmake: builds a fake pip NCCL wheel under WORK,
# then configures find_nccl/ with that site-packages first on PYTHONPATH and the CUDA toolkit's
# NCCL and the system folders hidden.
find_program(_python NAMES python3 python)
if(NOT _python)
  message(FATAL_ERROR "skipped: python3 not found (FindNCCL looks for pip's NCCL through it)")
endif()
file(REMOVE_RECURSE ${WORK})
set(_wheel ${WORK}/site-packages/nvidia/nccl)
file(WRITE ${_wheel}/include/nccl.h "/* stand-in */\n")
file(WRITE ${_wheel}/lib/libnccl.so.2 "stand-in\n")
file(WRITE ${WORK}/site-packages/nvidia/nccl/__init__.py "")
set(ENV{PYTHONPATH} ${WORK}/site-packages)
execute_process(
  COMMAND ${CMAKE_COMMAND} -S ${LOCKSTEP_SOURCE_DIR}/tests/cuda/find_nccl -B ${WORK}/build
          -DLOCKSTEP_SOURCE_DIR=${LOCKSTEP_SOURCE_DIR} -DEXPECTED_DIR=${_wheel}
          "-DCMAKE_IGNORE_PATH=/usr/local/cuda/include;/usr/local/cuda/lib64;/usr/local/cuda/lib;/usr/local/cuda/targets/x86_64-linux/include;/usr/local/cuda/targets/x86_64-linux/lib;/usr/include;/usr/lib/x86_64-linux-gnu"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "FindNCCL did not find the pip layout (exit ${rc})")
endif()
