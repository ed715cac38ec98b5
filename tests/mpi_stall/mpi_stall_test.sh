#!/bin/sh
# mpi_stall_test.sh MPIEXEC PROGRAM MODE -- runs `PROGRAM MODE` on 3 ranks (rank 1 misbehaves, see
# mpi_stall.cpp) and checks that the job ends non-zero within the 2 s timeout plus a few seconds, with
# rank 0's message naming the call, the timeout and the missing rank. The outer `timeout` only keeps
# a regression from hanging CI; reaching it is a failure.
set -u
MPIEXEC=$1 PROGRAM=$2 MODE=$3
LIMIT_S=${CAD_STALL_LIMIT_S:-12}  # 2 s timeout + exit guard + mpirun's teardown on a loaded 2-core machine
OUT=$(mktemp) || exit 1
trap 'rm -f "$OUT"' EXIT
start=$(date +%s%N)
timeout -s KILL 60 "$MPIEXEC" --allow-run-as-root --oversubscribe --mca btl self,vader \
  --mca btl_vader_single_copy_mechanism none -np 3 "$PROGRAM" "$MODE" >"$OUT" 2>&1
status=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
sed 's/^/    /' "$OUT"
echo "exit status $status after $elapsed_ms ms"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
contains() { grep -qF -- "$1" "$OUT" || fail "output lacks '$1'"; }
[ "$status" -ne 0 ] || fail "the job exited 0"
[ "$status" -ne 137 ] || fail "the job hung until the outer 60 s limit"
[ "$elapsed_ms" -le $((LIMIT_S * 1000)) ] || fail "the job took $elapsed_ms ms, more than $LIMIT_S s"
case "$MODE" in
  stop)
    contains "rank 0: barrier failed"
    contains "timed out after 2000 ms"
    contains "not yet completed: 1" ;;
  late-create)
    contains "rank 0: create failed"
    contains "timed out after 2000 ms"
    grep -q "MPI_ERR_REQUEST" "$OUT" && fail "the pending MPI_Comm_idup request aborted the job" ;;
  exit-before-create)
    # Either the others' bounded MPI_Init ends them, or mpirun sees first that rank 1 exited without
    # initialising MPI while the others did, and ends the job naming it; both name the missing rank.
    # A third outcome, seen once under load (CI, 2026-11-25): mpirun ended the job non-zero at about
    # the 2 s mark, before rank 0's own timer printed anything, and printed nothing itself. The job still
    # ended bounded and non-zero (checked above); there is no message of ours to check.
    if grep -qF "due to process rank 1" "$OUT"; then
      contains "exiting improperly"
    elif [ ! -s "$OUT" ]; then
      echo "note: mpirun ended the job silently (status $status) before rank 0's timeout reported"
    else
      contains "rank 0: create failed"
      contains "MPI_Init did not complete within 2000 ms"
    fi ;;
esac
[ "$failures" -eq 0 ] && echo "mpi stall '$MODE': OK"
[ "$failures" -eq 0 ]
