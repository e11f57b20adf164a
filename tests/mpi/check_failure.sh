#!/bin/sh
# check_failure.sh MPIRUN PROBE MODE: runs the failure probe and checks that the job ends
# non-zero in time, with the expected error printed exactly once (at least once for diverge), and
# that the probe did not finish (but for afterlast, where rank 0 finishes before rank 1 fails);
# lateend has no failure: the job must end with 0 in time.
mpirun=$1 probe=$2 mode=$3
out=$(mktemp)
start=$(date +%s)
case $mode in
  throw) timeout 30 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$probe" throw >"$out" 2>&1; rc=$?
         limit=10; want='rank 1: error: .*worker rank 1 of 2.*injected failure' ;;
  outside) timeout 30 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$probe" outside >"$out" 2>&1; rc=$?
         limit=10; want='rank 1: error: rank 1.s injected input failure, outside the strategy' ;;
  alloutside) timeout 30 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$probe" alloutside >"$out" 2>&1; rc=$?
         limit=10; want='^error: every worker.s injected configuration error' ;;
  afterlast) timeout 30 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$probe" afterlast >"$out" 2>&1; rc=$?
         limit=10; finishes=1; want='^error: rank 1.s injected failure after the last step' ;;
  lateend) timeout 30 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$probe" lateend >"$out" 2>&1; rc=$?
         limit=15; succeeds=1; want='^probe finished' ;;
  stall) timeout 30 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$probe" stall >"$out" 2>&1; rc=$?
         limit=12; want='rank 0: error: .*timed out.*bucket [0-9].*rank\(s\) 1 did not arrive' ;;
  diverge) timeout 30 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$probe" diverge >"$out" 2>&1; rc=$?
         # both ranks time out at about the same moment: either may report before MPI_Abort ends the other
         limit=12; at_least=1
         want='rank [01]: error: .*timed out: rank [01] waited [0-9]+ ms in (bucket [0-9]+|an all-gather); .*at this collective \(the job numbered [0-9]+ on every worker\) rank [01] is in (an all-gather|bucket [0-9]+), not (bucket [0-9]+|an all-gather): the workers called different collectives, as when one worker.s input pipeline gives more batches' ;;
  kill)  timeout 30 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$probe" kill >"$out" 2>&1; rc=$?
         limit=12; want='' ;;
  world) timeout 30 "$mpirun" --allow-run-as-root --oversubscribe -np 2 "$probe" world >"$out" 2>&1; rc=$?
         limit=10; want='asked for 3 workers, but the MPI job has 2 processes' ;;
  nompirun) env -u OMPI_COMM_WORLD_SIZE "$probe" nompirun >"$out" 2>&1; rc=$?
         limit=5; want='2 workers need one process each, started by MPI: run .mpirun -np 2' ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
elapsed=$(( $(date +%s) - start ))
cat "$out"
echo "--- mode=$mode exit=$rc elapsed=${elapsed}s (limit ${limit}s)"
fail=0
if [ -n "${succeeds:-}" ]; then
  if [ "$rc" -ne 0 ]; then echo "FAIL: the job ended with $rc"; fail=1; fi
elif [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then echo "FAIL: the job did not end with an error"; fail=1; fi
if [ "$elapsed" -gt "$limit" ]; then echo "FAIL: took ${elapsed}s"; fail=1; fi
if [ -n "$want" ]; then
  n=$(grep -cE "$want" "$out")
  if [ -n "${at_least:-}" ]; then
    if [ "$n" -lt "$at_least" ]; then echo "FAIL: expected the error /$want/, found it $n times"; fail=1; fi
  elif [ "$n" -ne 1 ]; then echo "FAIL: expected the error /$want/ exactly once, found it $n times"; fail=1; fi
fi
if [ -z "${finishes:-}${succeeds:-}" ] && grep -q "probe finished" "$out"; then echo "FAIL: the probe finished"; fail=1; fi
rm -f "$out"
exit $fail
