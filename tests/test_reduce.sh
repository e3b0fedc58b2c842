#!/bin/sh
# cohort-reduce against numpy, exact arithmetic (fractions.Fraction), world
# sizes 1/2/4, bad input and resume: tests/test_reduce.py (TAP).
: "${COHORT_BUILDDIR:=.}" "${COHORT_SRCDIR:=.}" "${PYTHON3:=/usr/bin/python3}" "${MPIEXEC:=mpiexec}"
if ! "$PYTHON3" -c 'import numpy' 2>/dev/null; then
  echo "1..0 # SKIP numpy not found for $PYTHON3"
  exit 0
fi
REDUCE_BIN="$COHORT_BUILDDIR/jobs/cohort-reduce" MPIEXEC="$MPIEXEC" \
  exec "$PYTHON3" "$COHORT_SRCDIR/tests/test_reduce.py"
