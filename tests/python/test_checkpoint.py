"""Checkpoints: a run saved, loaded into a fresh process and continued equals the run that
never stopped, bit for bit (schedule, accumulation, clipping, NVMe states included); a
checkpoint of another model is refused by name; the files are zo-train's format; a flipped bit
is refused by its checksum naming the file and tensor, a NaN or a negative second moment by the
value checks, and a checkpoint without checksums loads with a warning."""
from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import zoffload  # noqa: E402
from models import MAKERS, batches, loss_of  # noqa: E402
from test_models import config  # noqa: E402

STEPS, SPLIT, ACCUM = 6, 3, 2


def cfg_for(swap: str, state: str = "fp32"):
    cfg = config("bf16", accum=ACCUM, clip=0.3, optimizer_state_dtype=state)
    cfg["scheduler"] = {"type": "WarmupDecayLR", "params": {"warmup_max_lr": 3e-3,
                                                            "warmup_num_steps": 2,
                                                            "total_num_steps": 10}}
    cfg["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": swap}
    return cfg


def train(eng, first: int, last: int):
    fn = loss_of("gpt2", torch.bfloat16)
    b = batches("gpt2", STEPS * ACCUM)
    losses = []
    for i in range(first * ACCUM, last * ACCUM):
        loss = fn(eng, b[i])
        losses.append(loss.item())
        eng.backward(loss)
        eng.step()
    return losses


def weights(eng):
    return {ep.name: eng.master_weight(ep.name) for ep in eng.params}


def worker(phase: str, ckpt: str, swap: str, out: str, state: str) -> None:
    eng, *_ = zoffload.initialize(model=MAKERS["gpt2"](), config=cfg_for(swap, state))
    if phase == "first":
        losses = train(eng, 0, SPLIT)
        eng.save_checkpoint(ckpt, client_state={"epoch": 3})
    else:
        path, client = eng.load_checkpoint(ckpt)
        assert client == {"epoch": 3}
        losses = train(eng, SPLIT, STEPS)
    torch.save({"losses": losses, "weights": weights(eng), "lr": eng.get_lr()}, out)
    eng.destroy()


@pytest.mark.parametrize("state", ["fp32", "int8"])
def test_save_load_in_a_fresh_process_continues_bitwise(tmp_path, state):
    swap = tmp_path / "swap"
    swap.mkdir()
    eng, *_ = zoffload.initialize(model=MAKERS["gpt2"](), config=cfg_for(str(swap), state))
    whole = train(eng, 0, STEPS)
    w_whole, lr_whole = weights(eng), eng.get_lr()
    eng.destroy()
    ckpt = tmp_path / "ckpt"
    for phase in ("first", "second"):
        subprocess.run([sys.executable, __file__, phase, str(ckpt), str(swap),
                        str(tmp_path / f"{phase}.pt"), state], check=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    first = torch.load(tmp_path / "first.pt")
    second = torch.load(tmp_path / "second.pt")
    assert first["losses"] + second["losses"] == whole
    assert second["lr"] == lr_whole
    for name, w in w_whole.items():
        assert torch.equal(second["weights"][name], w), name
    # zo-train's layout
    tag = (ckpt / "latest").read_text().strip()
    assert tag == f"step-{SPLIT:08d}"
    st = json.loads((ckpt / tag / "trainer_state.json").read_text())
    assert st["format"] == "zoffload-checkpoint" and st["step"] == SPLIT
    assert sorted(p.name for p in (ckpt / tag).iterdir()) == [
        "checksums.json", "model.safetensors", "optimizer.safetensors", "trainer_state.json"]


def test_another_models_checkpoint_is_refused(tmp_path):
    eng, *_ = zoffload.initialize(model=MAKERS["gpt2"](), config=config("bf16"))
    eng.save_checkpoint(tmp_path)
    eng.destroy()
    other, *_ = zoffload.initialize(model=MAKERS["llama"](), config=config("bf16"))
    before = weights(other)
    with pytest.raises(zoffload.ZoArgumentError, match="another model's"):
        other.load_checkpoint(tmp_path)
    after = weights(other)
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing half-loaded
    other.destroy()


def tensor_at(path: Path, name: str):
    """(offset in the file, bytes) of tensor name in a safetensors file."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    begin, end = json.loads(raw[8:8 + n])[name]["data_offsets"]
    return 8 + n + begin, end - begin


def poke(path: Path, name: str, index: int, value: bytes, resum: bool) -> None:
    """Overwrite element index of tensor name; with resum, record its new checksum so that
    only the value checks can catch it."""
    at, nbytes = tensor_at(path, name)
    raw = bytearray(path.read_bytes())
    raw[at + index * len(value):at + (index + 1) * len(value)] = value
    path.write_bytes(bytes(raw))
    if resum:
        from zoffload import checkpoint
        sums_path = path.parent / "checksums.json"
        doc = json.loads(sums_path.read_text())
        buf = (ctypes.c_uint8 * nbytes).from_buffer(raw, at)
        doc["files"][path.name][name] = checkpoint._checksum(ctypes.addressof(buf), nbytes)
        del buf
        sums_path.write_text(json.dumps(doc))


def test_corrupted_checkpoints_are_refused(tmp_path):
    eng, *_ = zoffload.initialize(model=MAKERS["gpt2"](), config=config("bf16"))
    train(eng, 0, 1)
    before = weights(eng)
    tags = {}
    for tag in ("flip", "nan", "neg", "old"):
        eng.save_checkpoint(tmp_path, tag=tag)
        tags[tag] = tmp_path / tag
    name = eng.params[1].name
    at, _ = tensor_at(tags["flip"] / "model.safetensors", name)
    raw = bytearray((tags["flip"] / "model.safetensors").read_bytes())
    raw[at + 3] ^= 0x40
    (tags["flip"] / "model.safetensors").write_bytes(bytes(raw))
    poke(tags["nan"] / "optimizer.safetensors", f"{name}.exp_avg", 2,
         struct.pack("<f", float("nan")), True)
    poke(tags["neg"] / "optimizer.safetensors", f"{name}.exp_avg_sq", 1, struct.pack("<f", -1.0),
         True)
    (tags["old"] / "checksums.json").unlink()
    with pytest.raises(zoffload.ZoIOError, match=f"model.safetensors: tensor '{name}' does not "
                       "match its checksum"):
        eng.load_checkpoint(tmp_path, tag="flip")
    with pytest.raises(zoffload.ZoIOError, match=r"exp_avg' in optimizer.safetensors has nan at "
                       r"index 2 \(not finite\)"):
        eng.load_checkpoint(tmp_path, tag="nan")
    with pytest.raises(zoffload.ZoIOError, match="has -1 at index 1 \\(second moments are "
                       "squares"):
        eng.load_checkpoint(tmp_path, tag="neg")
    after = weights(eng)
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing half-loaded
    with pytest.warns(UserWarning, match="has no checksums.json"):
        eng.load_checkpoint(tmp_path, tag="old")
    eng.destroy()


def test_a_save_directory_is_held_by_its_engine(tmp_path):
    """A second engine (another process in practice: the lock is an flock, per open file) saving
    into a directory the first saved into is refused, naming the holder; after destroy it may."""
    a, *_ = zoffload.initialize(model=MAKERS["gpt2"](), config=config("bf16"))
    b, *_ = zoffload.initialize(model=MAKERS["gpt2"](), config=config("bf16"))
    a.save_checkpoint(tmp_path)
    with pytest.raises(zoffload.ZoError, match=f"save_checkpoint directory {tmp_path} is in use "
                       f"by another run \\(pid {os.getpid()} on "):
        b.save_checkpoint(tmp_path, tag="other")
    assert not (tmp_path / "other").exists()
    a.destroy()
    b.save_checkpoint(tmp_path, tag="other")
    b.destroy()


if __name__ == "__main__":
    torch.set_num_threads(1)
    worker(*sys.argv[1:6])
