#!/bin/sh
# Run an MPI test program under mpiexec (automake LOG_COMPILER for .mpi tests).
# Usage: run-mpi.sh PATH/PROGRAM-npN.mpi [args...]  -> mpiexec -n N PATH/PROGRAM
# Oversubscription is fine: MPI tests run 4 ranks on a 2-core machine.
t="$1"; shift
stem="${t%.mpi}"
n="${stem##*-np}"
prog="${stem%-np*}"
case "$prog" in */*) ;; *) prog="./$prog" ;; esac
exec "/usr/bin/mpiexec" -n "$n" "$prog" "$@"
