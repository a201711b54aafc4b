"""DeepSpeed's csv_monitor section writes each step's figures (lr, gradient norm, loss scale,
bytes moved, the tiers' peaks, the loss the caller records) as DeepSpeed names them."""
import csv

import pytest
import torch

import zoffload
from models import MAKERS, batches, loss_of
from test_models import config


def test_csv_monitor_logs_every_step(tmp_path):
    cfg = config("bf16", clip=0.5)
    cfg["csv_monitor"] = {"enabled": True, "output_path": str(tmp_path), "job_name": "run"}
    eng, *_ = zoffload.initialize(model=MAKERS["mlp"](), config=cfg)
    fn = loss_of("mlp", torch.bfloat16)
    norms = []
    for b in batches("mlp", 3):
        loss = fn(eng, b)
        eng.monitor.record_loss(loss.item())
        eng.backward(loss)
        eng.step()
        norms.append(eng.get_global_grad_norm())
    eng.destroy()
    rows = list(csv.reader(open(tmp_path / "run" / "Train_Samples_grad_norm.csv")))
    assert rows[0] == ["step", "Train/Samples/grad_norm"]
    assert [float(r[1]) for r in rows[1:]] == pytest.approx(norms)
    assert [int(r[0]) for r in rows[1:]] == [2, 4, 6]  # samples seen, as DeepSpeed counts
    for name in ("lr", "loss_scale", "train_loss", "d2h_bytes", "peak_device_bytes"):
        assert len(list(csv.reader(open(tmp_path / "run" / f"Train_Samples_{name}.csv")))) == 4
