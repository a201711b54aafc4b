"""What zo-train's multi-rank tests share: mpirun's environment and flags
(root allowed, oversubscribed, unbound, as CI runs them), and failures
collected by check() and reported by finish().
"""
import json
import os
import struct
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


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes)"""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, v in head.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[name] = (v["dtype"], v["shape"], data[a:b])
    return out


def latest(d):
    """The checkpoint directory d/latest names."""
    with open(os.path.join(d, "latest")) as f:
        return os.path.join(d, f.read().strip())
