# Whole programs, run as a user runs them, and how they end (label `programs`; check_output.cmake):
#  - a first program's uncaught label error through lockstep::run_main: exit code 2, `error:`, the
#    nested cause, and stdout kept;
#  - getting_started built without optimisation warns once on stderr (LOCKSTEP_NO_O0_WARNING
#    silences it), and a missing data directory ends it with the OS reason and exit code 2;
#  - the layer conformance suite on a layer with a planted bug: a report of at most 60 lines that
#    gives the failing elements' numbers;
#  - the reducer, layer and optimiser suites on types with one planted defect each: each fails in
#    the check made for it;
#  - the Fashion-MNIST example's command-line errors: one line naming the option and the value,
#    then `run with --help for usage`, exit code 2.
# Included by tests/CMakeLists.txt.
set(_check ${CMAKE_CURRENT_SOURCE_DIR}/programs/check_output.cmake)

add_executable(program_label_error ${CMAKE_CURRENT_SOURCE_DIR}/programs/label_error.cpp)
target_link_libraries(program_label_error PRIVATE lockstep::lockstep lockstep_warnings)
add_test(NAME programs/label_error_ends_cleanly
         COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:program_label_error> -DEXIT=2
                 "-DSTDOUT=training a 5-output model on 10 classes"
                 "-DSTDERR=error: lockstep: replica 0 at step 0 failed|  caused by: lockstep::softmax_cross_entropy: label 9 of sample 5 (row 5 of replica 0's shard at step 0) is outside [0, 5): the model has 5 outputs"
                 -P ${_check})

add_executable(program_planted_bug_layer ${CMAKE_CURRENT_SOURCE_DIR}/programs/planted_bug_layer.cpp)
target_link_libraries(program_planted_bug_layer PRIVATE lockstep::lockstep lockstep_doctest_main lockstep_warnings)
target_include_directories(program_planted_bug_layer PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})  # support/scale_shift.hpp
add_test(NAME programs/planted_bug_layer_report
         COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:program_planted_bug_layer> -DEXIT=1 -DMAX_LINES=60
                 "-DSTDOUT_REGEX=input gradient vs central finite differences: [0-9]+ of [0-9]+ elements differ\n  \\[evaluation, 1 rows\\] element 0: analytic -?[0-9.e+-]+, numeric -?[0-9.e+-]+, \\|difference\\| [0-9.e+-]+ > tolerance [0-9.e+-]+\n.*\n  … and [0-9]+ more"
                 -P ${_check})
set_tests_properties(programs/planted_bug_layer_report PROPERTIES LABELS "programs" TIMEOUT 120)

# The conformance suites on types with one planted defect each: every run fails, in its check.
add_executable(program_suite_mutants ${CMAKE_CURRENT_SOURCE_DIR}/programs/suite_mutants.cpp)
target_link_libraries(program_suite_mutants PRIVATE lockstep::lockstep lockstep_doctest_main lockstep_warnings)
target_include_directories(program_suite_mutants PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})  # support/scale_shift.hpp
foreach(_mutant
    "broadcast_from_zero{;}broadcast copies*{;}CHECK\\( wrong == 0 \\) is NOT correct"
    "stale_bucket{;}every replica gets*{;}a later round on the same reducer and buckets differs from the first"
    "copies_after_return{;}a replica may reuse*{;}each replica's sum vs the exact sum, each replica reusing its data once its wait returns: [0-9]+ of [0-9]+ elements differ\n  \\[[2-4] replicas, replica [0-3]\\] element"
    "ignores_timeout{;}a replica that never arrives*{;}replica\\(s\\) 0, 2 still inside the reducer 10.6 s after the collective began"
    "row_mask_layer{;}gradients of inputs*{;}input gradient vs central finite differences: [0-9]+ of [0-9]+ elements differ\n  \\[training, a shard at offsets"
    "accumulating_layer{;}accumulates_gradients*{;}dparams after an accumulating backward vs what it held \\+ the batch's gradient: [0-9]+ of"
    "update_blind_layer{;}a row's randomness*{;}a shard's output vs the same rows of one pass over the update: [0-9]+ of [0-9]+ elements differ"
    "forgets_momentum{;}state save/load*{;}CHECK\\( a.p == b.p \\) is NOT correct"
    "ascends{;}updates descend*{;}the updates do not descend")
  string(REPLACE "{;}" ";" _parts "${_mutant}")
  list(GET _parts 0 _type)
  list(GET _parts 1 _subcase)
  list(GET _parts 2 _regex)
  add_test(NAME programs/suite_catches_${_type}
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:program_suite_mutants> "-DARGS=-tc=*<mutant::${_type}>|-sc=${_subcase}"
                   -DEXIT=1 "-DSTDOUT_REGEX=${_regex}" -P ${_check})
  set_tests_properties(programs/suite_catches_${_type} PROPERTIES LABELS "programs" TIMEOUT 120)
endforeach()

# getting_started at -O0: the warning comes from the strategy, made before the data is read.
add_executable(getting_started_O0 ${PROJECT_SOURCE_DIR}/examples/getting_started.cpp)
target_link_libraries(getting_started_O0 PRIVATE lockstep::lockstep lockstep_warnings)
target_compile_options(getting_started_O0 PRIVATE -O0)
set(_missing ${CMAKE_CURRENT_BINARY_DIR}/no-such-directory)
set(_no_data "error: lockstep::data::idx: ${_missing}/train-images-idx3-ubyte.gz: cannot open file: No such file or directory")
add_test(NAME programs/getting_started_O0_warns
         COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:getting_started_O0> -DARGS=${_missing} -DEXIT=2
                 "-DSTDERR=lockstep: warning: compiled without optimisation (-O0): training runs several times slower{;} build with -O2 or CMAKE_BUILD_TYPE=Release|${_no_data}"
                 -P ${_check})
add_test(NAME programs/getting_started_O0_warning_silenced
         COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:getting_started_O0> -DARGS=${_missing} -DEXIT=2
                 -DENV=LOCKSTEP_NO_O0_WARNING=1 "-DSTDERR=${_no_data}" -P ${_check})
set_tests_properties(programs/label_error_ends_cleanly programs/getting_started_O0_warns
                     programs/getting_started_O0_warning_silenced PROPERTIES LABELS "programs" TIMEOUT 120)

# The example's command line (fashion_mnist is defined by examples/, configured after tests/).
if(LOCKSTEP_BUILD_EXAMPLES AND EXISTS ${PROJECT_SOURCE_DIR}/examples/fashion_mnist/main.cpp)
  set(_usage "run with --help for usage")
  set(_cli_cases
      "batch_not_a_number|--batch|abc|error: --batch: 'abc' is not a number (an integer from 1 to 60000)"
      "batch_out_of_range|--batch|0|error: --batch: must be an integer from 1 to 60000, got '0'"
      "batch_too_large|--batch|99999999999999999999999|error: --batch: must be an integer from 1 to 60000, got '99999999999999999999999'"
      "lr_zero|--lr|0|error: --lr: must be > 0, got 0"
      "accumulate_zero|--accumulate|0|error: --accumulate: must be an integer from 1 to 60000, got '0'"
      "ema_one|--ema|1|error: --ema: must be a number between 0 and 1 (exclusive), got '1'"
      "label_smoothing_negative|--label-smoothing|-0.1|error: --label-smoothing: must be a number from 0 up to, not including, 1, got '-0.1'"
      "trace_steps_no_colon|--trace|t.json|--trace-steps|5|error: --trace-steps: must be A:B (the steps A to B - 1, B > A) or A: (every step from A), got '5'"
      "trace_steps_empty_window|--trace|t.json|--trace-steps|7:7|error: --trace-steps: must be A:B (the steps A to B - 1, B > A) or A: (every step from A), got '7:7'"
      "lr_negative|--lr|-0.5|error: --lr: must be > 0, got -0.5"
      "lr_not_finite|--lr|1e400|error: --lr: must be a finite number > 0 (at most 3.4e38), got '1e400'"
      "lr_not_a_number|--lr|fast|error: --lr: 'fast' is not a number (a number > 0)"
      "weight_decay_negative|--weight-decay|-1|error: --weight-decay: must be >= 0, got -1"
      "epochs_zero|--epochs|0|error: --epochs: must be an integer from 1 to 100000, got '0'"
      "replicas_not_a_number|--replicas|two|error: --replicas: 'two' is not a number (an integer from 1 to 4096)"
      "seed_not_a_number|--seed|x1|error: --seed: 'x1' is not a number (an integer from 0 to 18446744073709551615)"
      "unknown_flag|--bogus|error: The following argument was not expected: --bogus"
      "resume_without_dir|--resume|error: --resume requires --checkpoint-dir"
      "lr_rounds_to_zero|--lr|1e-46|error: --lr: must be > 0 as a float (at least 1.4e-45), got '1e-46'"
      "clip_value_rounds_to_zero|--clip-value|1e-50|error: --clip-value: must be > 0 as a float (at least 1.4e-45), got '1e-50'"
      "label_smoothing_rounds_to_one|--label-smoothing|0.99999999|error: --label-smoothing: must be a number from 0 up to, not including, 1 as a float, got '0.99999999', which rounds to 1.000000"
      "export_dtype_without_export|--export-dtype|bf16|error: --export-dtype requires --export")
  foreach(_case IN LISTS _cli_cases)
    string(REPLACE "|" ";" _parts "${_case}")
    list(POP_FRONT _parts _name)
    list(POP_BACK _parts _message)
    string(REPLACE ";" "|" _args "${_parts}")
    add_test(NAME programs/fashion_mnist_cli_${_name}
             COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:fashion_mnist> "-DARGS=${_args}" -DEXIT=2
                     "-DSTDERR=${_message}|${_usage}" -DMAX_LINE=200 -P ${_check})
    set_tests_properties(programs/fashion_mnist_cli_${_name} PROPERTIES LABELS "programs" TIMEOUT 60)
  endforeach()
  # A model name that is not one: one line too, at most 200 characters.
  add_test(NAME programs/fashion_mnist_cli_bad_model
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:fashion_mnist> -DARGS=--model|resnet9000 -DEXIT=2
                   "-DSTDERR_REGEX=^error: --model: [^\n]*resnet9000[^\n]*\n${_usage}\n$" -DMAX_LINE=200 -P ${_check})
  # A missing data directory: the OS reason, exit code 2 (through lockstep::run_main).
  add_test(NAME programs/fashion_mnist_missing_data
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:fashion_mnist> "-DARGS=--data|${_missing}|--quiet" -DEXIT=2
                   "-DSTDERR=${_no_data}" -P ${_check})
  # --accumulate that does not divide --batch: one line naming both, exit 2, before any data is read.
  add_test(NAME programs/fashion_mnist_accumulate_not_a_divisor
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:fashion_mnist> "-DARGS=--accumulate|3|--data|${_missing}|--quiet"
                   -DEXIT=2
                   "-DSTDERR=error: --accumulate 3: --batch 128 is not a multiple of it (each update's batch is cut into --accumulate equal batches)"
                   -P ${_check})
  # --export into a directory that does not exist: refused before any data is read (the file is
  # written after training).
  add_test(NAME programs/fashion_mnist_export_directory_missing
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:fashion_mnist>
                   "-DARGS=--export|${_missing}/w.safetensors|--data|${_missing}|--quiet" -DEXIT=2
                   "-DSTDERR=error: --export ${_missing}/w.safetensors: the directory ${_missing} does not exist"
                   -P ${_check})
  set_tests_properties(programs/fashion_mnist_cli_bad_model programs/fashion_mnist_missing_data
                       programs/fashion_mnist_accumulate_not_a_divisor programs/fashion_mnist_export_directory_missing
                       PROPERTIES LABELS "programs" TIMEOUT 60)
  if(NOT LOCKSTEP_HAS_MPI)
    # A build without MPI started by mpirun would train once per process: refused, exit 2.
    add_test(NAME programs/fashion_mnist_mpirun_without_mpi
             COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:fashion_mnist> "-DARGS=--data|${_missing}|--quiet"
                     -DEXIT=2 -DENV=OMPI_COMM_WORLD_SIZE=2
                     "-DSTDERR=error: started by an MPI launcher, but this build has no MPI support: every process would train on its own (install libopenmpi-dev and reconfigure with -DLOCKSTEP_MPI=ON, or run it without mpirun)"
                     -P ${_check})
    set_tests_properties(programs/fashion_mnist_mpirun_without_mpi PROPERTIES LABELS "programs" TIMEOUT 60)
  endif()
  # --accumulate 4 under replica_count_invariant: bitwise the run without it (the same update
  # batches of 128 rows, cut into 4 batches of 32), on 2 epochs of Fashion-MNIST.
  set(_fashion_dir /usr/share/datasets/fashion-mnist)
  add_test(NAME programs/fashion_mnist_accumulate_bitwise
           COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:fashion_mnist> -DDATA_DIR=${_fashion_dir}
                   "-DARGS_A=--epochs|2|--replicas|2|--replica-count-invariant"
                   "-DARGS_B=--epochs|2|--replicas|2|--replica-count-invariant|--accumulate|4"
                   -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/accumulate_bitwise -P ${CMAKE_CURRENT_SOURCE_DIR}/programs/check_same_run.cmake)
  set_tests_properties(programs/fashion_mnist_accumulate_bitwise PROPERTIES LABELS "programs" TIMEOUT 300
                       SKIP_RETURN_CODE 77 PROCESSORS 2)
endif()
