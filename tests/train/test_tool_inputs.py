"""What the tools do with bad inputs and outputs (issue 29, items 6-11): every file a tool
reads is opened the one way (zo/file.h), so a FIFO, a device or a directory is refused by
name at once instead of blocking; a failed write of the results exits non-zero. Each check
runs the program under a timeout: the old code blocked forever on a FIFO.
Run by ctest: test_tool_inputs.py ZO_TRAIN ZO_PLAN ZO_REPORT ZO_BENCH."""
import os
import shutil
import subprocess
import sys
import tempfile

TRAIN, PLAN, REPORT, BENCH = sys.argv[1:5]
TINY = ["--device", "cpu", "--dim", "32", "--layers", "2", "--heads", "2", "--ffn", "64",
        "--seq", "16", "--val-batches", "2"]


def run(argv, timeout=120, stdout=subprocess.PIPE):
    try:
        p = subprocess.run(argv, stdout=stdout, stderr=subprocess.PIPE, timeout=timeout,
                           text=True)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{argv} did not end within {timeout} s (blocked?)") from None
    return p


def refused(argv, *needles, status=None, timeout=30):
    """argv exits non-zero (status when given) at once, stderr holding every needle."""
    p = run(argv, timeout=timeout)
    assert p.returncode != 0, f"{argv}: exit 0\n{p.stderr}"
    if status is not None:
        assert p.returncode == status, f"{argv}: exit {p.returncode}, not {status}\n{p.stderr}"
    for n in needles:
        assert n in p.stderr, f"{argv}: stderr lacks {n!r}:\n{p.stderr}"
    return p


def ok(argv, timeout=300):
    p = run(argv, timeout=timeout)
    assert p.returncode == 0, f"{argv}: exit {p.returncode}\n{p.stderr}"
    return p


def fifo(path):
    if os.path.lexists(path):
        os.unlink(path)
    os.mkfifo(path)


def test_fifos_are_refused(tmp):
    """Every input a user names: a FIFO is refused naming it (it used to block the open)."""
    f = os.path.join(tmp, "fifo")
    fifo(f)
    refused([PLAN, "--hf-config", f], f"'{f}' is a FIFO: expected a regular file")
    refused([PLAN, "--hf-config", tmp], "is a directory: expected a regular file")
    refused([PLAN, "--bench-json", f], "is a FIFO")
    refused([TRAIN, "--steps", "1", "--config", f] + TINY, "is a FIFO")
    refused([TRAIN, "--steps", "1", "--data", f] + TINY, "is a FIFO")
    refused([TRAIN, "--steps", "1", "--metrics", f] + TINY, "is a FIFO that nobody reads")
    refused([TRAIN, "--steps", "1", "--trace", f] + TINY, "is a FIFO that nobody reads")
    refused([TRAIN, "--steps", "1", "--hf-model", f] + TINY, "is a FIFO: expected a directory")
    refused([TRAIN, "--steps", "1", "--metrics", tmp] + TINY, "is a directory")

    # a Hugging Face directory and a checkpoint, each file in turn a FIFO
    ck = os.path.join(tmp, "ck")
    ok([TRAIN, "--steps", "1", "--save", ck] + TINY)
    step = os.path.join(ck, "step-00000001")
    hf = os.path.join(ck, "hf-model")
    for d, name in ((hf, "config.json"), (hf, "model.safetensors")):
        bad = os.path.join(tmp, "bad-hf")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(hf, bad)
        fifo(os.path.join(bad, name))
        refused([TRAIN, "--steps", "1", "--hf-model", bad, "--seq", "16", "--device", "cpu"],
                f"{name}' is a FIFO")
    for name in ("trainer_state.json", "optimizer.safetensors", "model.safetensors"):
        bad = os.path.join(tmp, "bad-ck")
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(step, bad)
        fifo(os.path.join(bad, name))
        refused([TRAIN, "--steps", "2", "--resume", bad] + TINY, f"{name}' is a FIFO")
    bad = os.path.join(tmp, "bad-latest")
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(ck, bad)
    fifo(os.path.join(bad, "latest"))
    refused([TRAIN, "--steps", "2", "--resume", bad] + TINY, "latest' is a FIFO")
    refused([TRAIN, "--steps", "1", "--init-weights", "/dev/zero"] + TINY,
            "is a character device: expected a regular file")


def test_failed_output_exits_nonzero(tmp):
    """Results written to a full device: the tool says so and exits 1 (it used to exit 0)."""
    with open("/dev/full", "w") as full:
        for argv in ([TRAIN, "--steps", "1", "--json"] + TINY, [PLAN, "--json"], [PLAN],
                     [REPORT, "--json"], [REPORT], [BENCH, "--help"]):
            p = run(argv, stdout=full)
            assert p.returncode == 1, f"{argv} > /dev/full: exit {p.returncode}\n{p.stderr}"
            assert "cannot write the output to stdout" in p.stderr, p.stderr


TESTS = [test_fifos_are_refused, test_failed_output_exits_nonzero]

if __name__ == "__main__":
    only = os.environ.get("ZO_TEST_ONLY")
    for t in TESTS:
        if only and only not in t.__name__:
            continue
        d = tempfile.mkdtemp(prefix="zo-inputs-")
        try:
            t(d)
            print(f"ok {t.__name__}", flush=True)
        finally:
            shutil.rmtree(d, ignore_errors=True)
