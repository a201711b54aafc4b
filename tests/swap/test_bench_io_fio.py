#!/usr/bin/env python3
"""zo-bench io's fio peer: with fio on PATH, read and write passes come with
fio's figure on the same directory (its best configuration), the ratio of
the medians and the pass-by-pass ratios' median and middle half; without fio, or with --no-fio, the report says why there is none.
Usage: test_bench_io_fio.py ZO_BENCH [EMULATOR...] (a cross build's, e.g. qemu-aarch64)"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

BENCH = sys.argv[1]
EMULATOR = sys.argv[2:]


def run(d, rw, *extra, env=None):
    cmd = [*EMULATOR, BENCH, "io", "--path", d, "--size", "8M", "--bs", "1M", "--qd", "4", "--rw", rw,
           "--passes", "2", "--extent", "2M", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, f"{cmd}: status {out.returncode}: {out.stderr}"
    return out.stdout


def check_without_fio(d):
    # zo-bench (and an emulator) are started by their paths
    env = dict(os.environ, PATH="/nonexistent")
    r = json.loads(run(d, "read", "--json", env=env))
    assert "fio_gbps" not in r and "not installed" in r["fio_note"], r
    r = json.loads(run(d, "write", "--json", "--no-fio"))
    assert "fio_gbps" not in r and "--no-fio" in r["fio_note"], r
    r = json.loads(run(d, "update", "--json"))
    assert "fio_gbps" not in r and "update" in r["fio_note"], r


def check_with_fio(d):
    for rw in ("read", "write"):
        r = json.loads(run(d, rw, "--json"))
        assert r["fio_gbps"] > 0 and len(r["fio_passes_gbps"]) == 2, r
        assert abs(r["ratio_fio"] - r["gbps"] / r["fio_gbps"]) < 1e-9 * r["ratio_fio"], r
        # each pass over the fio pass beside it: their median and middle half
        pairs = sorted(r["size"] / t / 1e9 / f for t, f in zip(r["passes"], r["fio_passes_gbps"]))
        p = r["ratio_fio_paired"]

        def near(a, b):
            return abs(a - b) < 1e-9 * b

        assert p["passes"] == 2 and near(p["median"], (pairs[0] + pairs[1]) / 2), r
        assert near(p["q1"], pairs[0]) and near(p["q3"], pairs[1]), r
        assert "--fixedbufs --registerfiles" in r["fio_config"], r
        huge = "shmhuge" in r["fio_config"]
        # on malloc'd buffers only when huge pages failed, and then it says so
        assert huge or "huge pages it failed" in r.get("fio_note", ""), r
        assert not os.path.exists(os.path.join(d, "zo-bench-fio.0.0")), "fio's file left behind"
    human = run(d, "read")
    assert "zo-bench / fio:" in human and "fio " in human, human
    assert "pass by pass" not in human, "a spread of two passes says nothing: " + human
    human = run(d, "read", "--passes", "4")
    assert "pass by pass: median" in human and "middle half" in human, human


def main():
    d = tempfile.mkdtemp(prefix="zo-bench-fio-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    try:
        check_without_fio(d)
        if shutil.which("fio"):
            check_with_fio(d)
        else:
            print("fio is not installed: only the reports without it were checked")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
