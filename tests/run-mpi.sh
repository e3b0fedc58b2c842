#!/bin/sh
# Run an MPI test program under mpiexec (automake LOG_COMPILER for .np2/.np4).
# Usage: run-mpi.sh NPROCS PATH/PROGRAM.npN [args...]
# Oversubscription is fine: MPI tests run 4 ranks on a 2-core machine.
n="$1"; t="$2"; shift 2
prog="${t%.np*}"
case "$prog" in */*) ;; *) prog="./$prog" ;; esac
exec "/usr/bin/mpiexec" -n "$n" "$prog" "$@"
