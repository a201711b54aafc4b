"""What zo-train's multi-rank tests share: mpirun's environment and flags
(root allowed, oversubscribed, unbound, as CI runs them), and failures
collected by check() and reported by finish().
"""
import os
import sys

ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMPI_MCA_rmaps_base_oversubscribe="1")
failures = []


def mpi(mpiexec):
    """mpirun's command line before -np."""
    return [mpiexec, "--oversubscribe", "--bind-to", "none"]


def check(cond, what):
    if not cond:
        failures.append(what)


def finish(name):
    """Prints the failures and exits 1 if there were any."""
    for f in failures:
        print("FAIL:", f)
    print("%s: %d failure(s)" % (name, len(failures)))
    sys.exit(1 if failures else 0)
