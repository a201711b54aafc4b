"""DeepSpeed's monitor sections (tensorboard, csv_monitor, wandb) for the front end, with the
figure names and file layout zo-train's monitors use (tools/zo-train/monitor.c).

Each step's figures go to every enabled monitor on rank 0, under DeepSpeed's names where it
has them (Train/Samples/train_loss is the caller's: record_loss), plus zoffload's own:
gradient norm, loss scale, tokens/s, bytes moved per link and the tiers' peaks. The config's
monitor sections are validated by the C parser (unknown keys refused); csv_monitor and
tensorboard come from its resolved form, wandb (which zo-train ignores) from the config as
given.
"""
from __future__ import annotations

import csv
import importlib
import os
from typing import List, Optional

from . import _native as N
from .errors import ZoConfigError


def _section(raw: dict, name: str) -> Optional[dict]:
    sec = raw.get(name) if isinstance(raw, dict) else None
    if not isinstance(sec, dict) or not sec.get("enabled", False):
        return None
    return sec


def _job_dir(sec: dict, default_path: str) -> str:
    """output_path/job_name, with DeepSpeed's defaults (as zo-train's monitors use them)."""
    return os.path.join(sec.get("output_path") or default_path,
                        sec.get("job_name") or "DeepSpeedJobName")


def _import(module: str, section: str, package: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ZoConfigError(f"'{section}.enabled' is true but {module} cannot be imported ({e}): "
                            f"pip install {package}, or disable it") from None


class _Csv:
    def __init__(self, sec: dict):
        self.root = _job_dir(sec, "csv_monitor")
        os.makedirs(self.root, exist_ok=True)

    def write(self, events: List[tuple]) -> None:
        for name, value, step in events:
            path = os.path.join(self.root, name.replace("/", "_") + ".csv")
            new = not os.path.exists(path)
            with open(path, "a", newline="") as f:
                w = csv.writer(f)
                if new:
                    w.writerow(["step", name])
                w.writerow([step, value])


class _TensorBoard:
    def __init__(self, sec: dict):
        tb = _import("torch.utils.tensorboard", "tensorboard", "tensorboard")
        self.w = tb.SummaryWriter(log_dir=_job_dir(sec, "runs"))

    def write(self, events: List[tuple]) -> None:
        for name, value, step in events:
            self.w.add_scalar(name, value, step)
        self.w.flush()


class _Wandb:
    def __init__(self, sec: dict):
        wandb = _import("wandb", "wandb", "wandb")
        self.run = wandb.init(project=sec.get("project"), group=sec.get("group"),
                              entity=sec.get("team"))

    def write(self, events: List[tuple]) -> None:
        for name, value, step in events:
            self.run.log({name: value}, step=step)


class Monitors:
    """The enabled monitors (none off rank 0)."""

    def __init__(self, resolved: dict, raw: dict, rank: int):
        self.sinks = []
        self.loss: Optional[float] = None
        if rank != 0:
            return
        for name, cls, src in (("csv_monitor", _Csv, resolved), ("tensorboard", _TensorBoard,
                                                                  resolved),
                               ("wandb", _Wandb, raw)):
            sec = _section(src, name)
            if sec is not None:
                self.sinks.append(cls(sec))

    @property
    def enabled(self) -> bool:
        return bool(self.sinks)

    def record_loss(self, loss: float) -> None:
        self.loss = float(loss)

    def log_step(self, eng, stats, seconds: float) -> None:
        if not self.sinks:
            return
        step = eng.global_samples
        tokens = getattr(eng, "tokens_in_step", 0)
        ev = [("Train/Samples/lr", eng.get_lr()[0], step),
              ("Train/Samples/grad_norm", stats.grad_norm, step),
              ("Train/Samples/loss_scale", stats.loss_scale, step),
              ("Train/Samples/h2d_bytes", stats.h2d_bytes, step),
              ("Train/Samples/d2h_bytes", stats.d2h_bytes, step),
              ("Train/Samples/nvme_read_bytes", stats.nvme_read_bytes, step),
              ("Train/Samples/nvme_write_bytes", stats.nvme_write_bytes, step),
              ("Train/Samples/peak_device_bytes", stats.peak[N.TIER_DEVICE], step),
              ("Train/Samples/peak_pinned_bytes", stats.peak_pinned, step),
              ("Train/Samples/peak_host_bytes", stats.peak[N.TIER_HOST], step),
              ("Train/Samples/peak_nvme_bytes", stats.peak[N.TIER_NVME], step)]
        if self.loss is not None:
            ev.append(("Train/Samples/train_loss", self.loss, step))
        if tokens and stats.step_seconds > 0:
            ev.append(("Train/Samples/tokens_per_second", tokens / stats.step_seconds, step))
        for s in self.sinks:
            s.write(ev)
