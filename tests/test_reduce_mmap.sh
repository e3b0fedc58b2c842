#!/bin/sh
# cohort-reduce's memory-mapped read path (reduce.mmap): the same bits as
# pread, resume across the two, bounded memory: tests/test_reduce_mmap.py (TAP).
: "${COHORT_BUILDDIR:=.}" "${COHORT_SRCDIR:=.}" "${PYTHON3:=/usr/bin/python3}" "${MPIEXEC:=mpiexec}"
if ! "$PYTHON3" -c 'import numpy' 2>/dev/null; then
  echo "1..0 # SKIP numpy not found for $PYTHON3"
  exit 0
fi
REDUCE_BIN="$COHORT_BUILDDIR/jobs/cohort-reduce" MPIEXEC="$MPIEXEC" \
  exec "$PYTHON3" "$COHORT_SRCDIR/tests/test_reduce_mmap.py"
