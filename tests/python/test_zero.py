"""ZeRO through the front end: N ranks equal one rank accumulating N times the micro-batches,
bit for bit, at stages 1, 2 and 3, under mpirun (the cpu device's mpi communicator) and under
torchrun (no MPI world: the tcp communicator, met through torchrun's own store). Both reduce in
rank order, so the two launchers' runs are the same bits too."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
STEPS, ACCUM, N = 3, 2, 2


def mpirun():
    exe = shutil.which("mpirun")
    if exe is None:
        pytest.skip("mpirun is not installed (Debian's openmpi-bin): the multi-rank test needs it")
    return exe


def torchrun(n):
    """torchrun as the venv has it (python -m torch.distributed.run is the same program)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n)]


def run(n, stage, accum, out, params="cpu", extra=(), launcher="mpirun"):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
    script = [str(HERE / "zero_worker.py"), str(stage), str(STEPS), str(accum), str(out), params,
              *map(str, extra)]
    cmd = [sys.executable] + script
    if n > 1 and launcher == "torchrun":
        env["ZO_TEST_EXPECT_COMM"] = "tcp"
        cmd = torchrun(n) + script
    elif n > 1:
        env["ZO_TEST_EXPECT_COMM"] = "mpi"
        cmd = [mpirun(), "--oversubscribe", "-np", str(n)] + cmd
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    parts = [torch.load(f"{out}.rank-{i}.pt") for i in range(n)]
    for p in parts[1:]:  # every rank holds every weight, gathered from its owner
        assert all(torch.equal(p["weights"][k], parts[0]["weights"][k]) for k in p["weights"])
    if "save_error" in parts[0]:
        return [p["save_error"] for p in parts], parts[0]["weights"]
    return [p["losses"] for p in parts], parts[0]["weights"]


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """One rank accumulating N*ACCUM micro-batches (placements train alike: test_placements)."""
    return run(1, 0, ACCUM * N, tmp_path_factory.mktemp("one") / "one")


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
@pytest.mark.parametrize("stage,params", [(1, "none"), (2, "cpu"), (3, "cpu")])
def test_ranks_equal_one_rank_bitwise(tmp_path, one_rank, stage, params, launcher):
    one_losses, one_w = one_rank
    many_losses, many_w = run(N, stage, ACCUM, tmp_path / "many", params, launcher=launcher)
    # rank r's j-th micro-batch of a step is the step's (j*N + r)-th
    for r in range(N):
        mine = [one_losses[0][s * ACCUM * N + j * N + r] for s in range(STEPS) for j in range(ACCUM)]
        assert many_losses[r] == mine
    assert set(many_w) == set(one_w)
    for name, w in one_w.items():
        assert torch.equal(many_w[name], w), name


@pytest.mark.parametrize("stage", [2, 3])
def test_checkpoint_resumes_bitwise_at_any_world_size(tmp_path, stage):
    """N ranks save after step 1 and go on; N ranks, and one rank accumulating N times the
    micro-batches, resume from the checkpoint (sharded: each rank wrote its own tensors) and
    end with the same weights bit for bit; one rank's checkpoint resumes at N ranks too."""
    ckpt = tmp_path / "ckpt"
    _, full_w = run(N, stage, ACCUM, tmp_path / "full", extra=("save", 1, ckpt))
    latest = ckpt / (ckpt / "latest").read_text().strip()
    assert (latest / "model.safetensors.index.json").exists()
    assert sorted(p.name for p in latest.glob("checksums-*.json")) == \
        [f"checksums-{r + 1:05d}-of-{N:05d}.json" for r in range(N)]
    _, back_w = run(N, stage, ACCUM, tmp_path / "back", extra=("resume", ckpt))
    _, one_w = run(1, 0, ACCUM * N, tmp_path / "one", extra=("resume", ckpt))
    for name, w in full_w.items():
        assert torch.equal(back_w[name], w), name
        assert torch.equal(one_w[name], w), name
    # and back: one rank's (unsharded) checkpoint at N ranks
    ckpt1 = tmp_path / "ckpt1"
    run(1, 0, ACCUM * N, tmp_path / "one-save", extra=("save", 1, ckpt1))
    _, many_w = run(N, stage, ACCUM, tmp_path / "many", extra=("resume", ckpt1))
    for name, w in full_w.items():
        assert torch.equal(many_w[name], w), name


def test_checkpoint_save_failing_on_one_rank(tmp_path):
    """A rank's shard cannot be written (its file size limit: EFBIG): every rank raises,
    that rank its own error and the others one naming it; nothing of the checkpoint is kept
    (no TAG, no TAG.tmp, 'latest' still names the last good one, which resumes bitwise), and
    training goes on unharmed."""
    ckpt = tmp_path / "ckpt"
    # rank 0 writes this small model's every tensor (one chunk, which it owns)
    errors, fail_w = run(N, 2, ACCUM, tmp_path / "fail", extra=("savefail", ckpt, 0))
    assert errors[0].startswith("ZoIOError") and "File too large" in errors[0], errors[0]
    assert errors[1].startswith("ZoStateError") and "failed on rank 0" in errors[1], errors[1]
    assert sorted(p.name for p in ckpt.iterdir() if p.name != ".zoffload.lock") == \
        ["latest", "step-00000001"]
    assert (ckpt / "latest").read_text().strip() == "step-00000001"
    _, full_w = run(N, 2, ACCUM, tmp_path / "full")
    _, back_w = run(N, 2, ACCUM, tmp_path / "back", extra=("resume", ckpt))
    for name, w in full_w.items():
        assert torch.equal(fail_w[name], w), name
        assert torch.equal(back_w[name], w), name


@pytest.fixture(scope="module")
def zo_train_tiny(tmp_path_factory):
    """zo-train's tiny run and one rank of it accumulating N micro-batches."""
    from test_zotrain_ckpt import zo_train
    exe = zo_train()
    swap = tmp_path_factory.mktemp("swap")
    tiny = [exe, "--steps", "3", "--micro-batch", "2", "--seq", "32", "--val-batches", "2",
            "--offload-param", "cpu", "--json", "--weights-digest", "--nvme-path", str(swap)]
    r = subprocess.run(tiny + ["--grad-accum", str(N)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return tiny, json.loads(r.stdout)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zo_train_under_torchrun_equals_one_rank(zo_train_tiny, stage):
    """zo-train launched by torchrun (no MPI world: the tcp communicator, the host default)
    at ZeRO stage S: the losses, the validation loss and the master weights' digest are one
    rank's accumulating N micro-batches, bit for bit, as they are under mpirun
    (tests/train/test_train_zero.py)."""
    tiny, one = zo_train_tiny
    cmd = torchrun(N) + ["--no-python"] + tiny + ["--zero-stage", str(stage), "-v"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    many = json.loads(r.stdout)
    for rank in range(N):
        assert f"rank {rank} of {N} joined the others over the tcp communicator" in r.stderr, \
            r.stderr[-2000:]
    for key in ("losses", "val_loss", "weights_digest"):
        assert many[key] == one[key], (key, many[key], one[key])
