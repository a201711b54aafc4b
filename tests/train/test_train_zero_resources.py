#!/usr/bin/env python3
"""zo-train's per-rank resources across 4 ranks on one node, under mpirun.

The node's host budget (--host-mem) is split over its local ranks
(OMPI_COMM_WORLD_LOCAL_SIZE): the shares each rank reports at -v sum to the
budget byte for byte (an odd budget: the first ranks one byte more), each
rank's measured host peak (the engine's pinned and pageable high-water marks)
stays within its share at a budget just above the ranks' needs, and a budget
too small is refused by every rank naming its share. The optimizer threads'
NUMA node: on a one-node machine a no-op, said at -v.

usage: test_train_zero_resources.py MPIEXEC ZO_TRAIN
"""
import os
import re
import subprocess
import sys
import tempfile

from mpi_test_util import ENV, check, failures, finish, mpi

MPIEXEC, EXE = sys.argv[1], sys.argv[2]
MPI = mpi(MPIEXEC) + ["-np", "4"]
TINY = ["--steps", "2", "--micro-batch", "2", "--seq", "32", "--val-batches", "1",
        "--offload-param", "cpu", "--offload-optimizer", "cpu", "--json", "-v"]
MIB = 1 << 20


def run(budget, swap):
    cmd = MPI + [EXE] + TINY + ["--nvme-path", swap, "--host-mem", str(budget)]
    p = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stderr


def per_rank(pattern, text):
    return {int(m.group(1)): m for m in re.finditer(pattern, text)}


NODES = len([n for n in os.listdir("/sys/devices/system/node") if re.fullmatch(r"node\d+", n)]) \
    if os.path.isdir("/sys/devices/system/node") else 1

with tempfile.TemporaryDirectory() as d:
    budget = 4 * 60 * MIB + 3  # each rank needs about 59 MiB here (the refusal below says)
    rc, err = run(budget, d)
    check(rc == 0, "--host-mem %d over 4 ranks: exit %d\n%s" % (budget, rc, err[-3000:]))
    shares = per_rank(r"\[rank (\d)\] zo-train: resources of rank \d \(local rank (\d) of 4\): "
                      r"host share [^(]*\((\d+) bytes; local rank \d's share, 1/4", err)
    check(sorted(shares) == [0, 1, 2, 3], "shares reported by ranks %r:\n%s" %
          (sorted(shares), err[-3000:]))
    sizes = {r: int(m.group(3)) for r, m in shares.items()}
    check(sum(sizes.values()) == budget, "the shares %r sum to %d, not the budget %d" %
          (sizes, sum(sizes.values()), budget))
    check(max(sizes.values()) - min(sizes.values()) <= 1, "uneven shares %r" % sizes)
    peaks = per_rank(r"\[rank (\d)\] zo-train: host peak of rank \d: engine (\d+) bytes "
                     r"\(pinned \d+, host \d+\) of its share (\d+)", err)
    check(sorted(peaks) == [0, 1, 2, 3], "peaks reported by ranks %r" % sorted(peaks))
    for r, m in sorted(peaks.items()):
        engine, share = int(m.group(2)), int(m.group(3))
        print("rank %d: host peak %d bytes of its share %d" % (r, engine, share))
        check(share == sizes.get(r) and 0 < engine <= share,
              "rank %d: host peak %d, share %d (reported %r)" % (r, engine, share, sizes.get(r)))
    nodes = per_rank(r"\[rank (\d)\] zo-train: resources .*optimizer threads: NUMA node (-?\d+) "
                     r"\(([^)]*)\)", err)
    for r, m in sorted(nodes.items()):
        if NODES == 1:
            check(m.group(3) == "one NUMA node on this machine: nothing to bind",
                  "rank %d on one node: %r" % (r, m.group(3)))
        else:
            check(int(m.group(2)) >= 0, "rank %d on %d nodes: node %s" % (r, NODES, m.group(2)))
    check(len(nodes) == 4, "NUMA lines from ranks %r" % sorted(nodes))

    rc, err = run(100 * MIB, d)  # 25 MiB a rank: too little for each
    check(rc != 0, "--host-mem 100MiB over 4 ranks: exit 0")
    refusals = per_rank(r"\[rank (\d)\] zo-train: host memory: the plan needs .* but the host "
                        r"limit is 25\.00 MiB \(local rank \d's share, 1/4 of the node's "
                        r"100\.00 MiB \(--host-mem; OMPI_COMM_WORLD_LOCAL_SIZE\)\)", err)
    check(len(refusals) >= 1, "no rank's refusal names its share:\n%s" % err[-3000:])

finish("test_train_zero_resources")
