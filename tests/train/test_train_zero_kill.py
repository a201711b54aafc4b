#!/usr/bin/env python3
"""zo-train across 3 ranks with one rank killed (SIGKILL) or stopped (SIGSTOP)
in the middle of training: the other two exit non-zero within 60 s, each
naming the lost rank, and never hang.

mpirun itself kills the job when a rank exits non-zero; run with
`--mca orte_abort_on_non_zero_status 0` it leaves the survivors alone, so what
stops them here is zo-train's own watchdog (the communicator's heartbeat: a
rank silent for half the timeout, at most 30 s, is lost). A survivor's "step N
failed" line is the run's failure (zo-train exits 1 after it; mpirun 4.1,
left with a rank that never finalized, does not end by itself and is ended
here once the survivors are gone). The SIGSTOP case runs with --comm-timeout 20 (lost
after 10 s of silence). The SIGKILL case runs with the default timeout (300 s: lost after
30 s of silence) when no flags are given (test_train_zero_kill), and with --comm-timeout 20
when they are (test_train_pipe_kill, test_train_tp_kill): the default's 30 s wait is
covered once, not three times (suite time, issue 34).

usage: test_train_zero_kill.py MPIEXEC ZO_TRAIN [FLAG...]
(the flags are added to every rank's command: test_train_pipe_kill passes
--pipeline-stages 3, so rank 1 is the middle stage of a pipeline)
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from mpi_test_util import check, failures

MPIEXEC, EXE, EXTRA = sys.argv[1], sys.argv[2], sys.argv[3:]
BOUND_S = 60


def rank_pids(tag):
    """rank -> pid of the zo-train processes carrying our tag."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/comm" % pid) as f:
                if f.read().strip() != "zo-train":
                    continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"ZT_KILL_TAG") == tag.encode():
            out[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(pid)
    return out


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def scenario(sig, extra):
    name = signal.Signals(sig).name
    tag = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   ZT_KILL_TAG=tag)
        # (not under a shell: mpirun ends the job when a process it started exits
        # without MPI_Init while the others called it)
        cmd = [MPIEXEC, "--oversubscribe", "--bind-to", "none", "--mca",
               "orte_abort_on_non_zero_status", "0", "-x", "ZT_KILL_TAG", "-np", "3",
               EXE, "--steps", "100000", "--micro-batch", "2", "--seq", "32", "--offload-param",
               "cpu", "--offload-optimizer", "cpu", "--nvme-path", d, "--log-every", "1",
               "--progress", "log"] + EXTRA + extra
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        lines, started = [], threading.Event()

        def read():
            for line in p.stderr:
                lines.append(line)
                if line.startswith("[rank 0] step 2/"):
                    started.set()
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if not started.wait(120):
            p.kill()
            failures.append("%s: the ranks never reached step 2:\n%s" % (name, "".join(lines)))
            return
        pids = rank_pids(tag)
        check(sorted(pids) == [0, 1, 2], "%s: found ranks %r" % (name, sorted(pids)))
        if 1 not in pids:
            p.kill()
            return
        os.kill(pids[1], sig)
        t0 = time.time()
        survivors = [pids[r] for r in (0, 2) if r in pids]
        while any(alive(s) for s in survivors) and time.time() - t0 < BOUND_S + 30:
            time.sleep(0.2)
        waited = time.time() - t0
        if sig == signal.SIGSTOP:  # the stopped rank never exits by itself
            os.kill(pids[1], signal.SIGKILL)
        try:  # with a rank gone without MPI_Finalize, mpirun 4.1 waits for good: ended here
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.terminate()
            p.wait(30)
        reader.join(10)
        text = "".join(lines)
        print("%s: survivors out after %.1f s" % (name, waited))
        check(waited <= BOUND_S, "%s: the survivors took %.1f s (bound %d s)" %
              (name, waited, BOUND_S))
        for r in (0, 2):
            mine = [l for l in lines if l.startswith("[rank %d]" % r)]
            check(any("lost rank(s) 1" in l for l in mine),
                  "%s: rank %d does not name rank 1 as lost:\n%s" % (name, r, text[-3000:]))
            check(any(re.search(r"zo-train: step \d+ failed: .*lost rank\(s\) 1", l)
                      for l in mine),
                  "%s: rank %d does not fail its step:\n%s" % (name, r, text[-3000:]))


scenario(signal.SIGKILL, ["--comm-timeout", "20"] if EXTRA else [])
scenario(signal.SIGSTOP, ["--comm-timeout", "20"])
for f in failures:
    print("FAIL:", f)
print("%s: %d failure(s)" % ("test_train_pipe_kill" if EXTRA else "test_train_zero_kill",
                            len(failures)))
sys.exit(1 if failures else 0)
