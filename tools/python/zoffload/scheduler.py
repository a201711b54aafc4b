"""DeepSpeed's learning-rate schedules (WarmupLR, WarmupDecayLR, WarmupCosineLR), with the
formulas zo-train uses (tools/zo-train/schedule.c), so both trainers agree step for step.

The engine calls step() once per optimizer update that was applied (an fp16 overflow skips
the update and the schedule with it, as DeepSpeed does); get_lr() is the rate of the next
update."""
from __future__ import annotations

import math
from typing import List, Optional

from .errors import ZoConfigError

NAMES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")


class WarmupSchedule:
    """One of DeepSpeed's three warmup schedules, from the config's scheduler section."""

    def __init__(self, kind: str, base_lr: float, params: dict):
        if kind not in NAMES:
            raise ZoConfigError(f"scheduler type {kind!r} is not one of {', '.join(NAMES)}")
        self.kind = kind
        self.base_lr = float(base_lr)
        self.min_lr = float(params.get("warmup_min_lr", 0.0))
        self.max_lr = float(params.get("warmup_max_lr", 1e-3))
        self.warmup_num_steps = int(params.get("warmup_num_steps", 1000))
        self.warmup_type = params.get("warmup_type", "log")
        self.total_num_steps = int(params.get("total_num_steps") or 0)
        self.warmup_min_ratio = float(params.get("warmup_min_ratio", 0.0))
        self.cos_min_ratio = float(params.get("cos_min_ratio", 1e-4))
        self.last_batch_iteration = int(params.get("last_batch_iteration", -1))
        if kind != "WarmupLR" and self.total_num_steps <= 0:
            raise ZoConfigError(f"'scheduler.params.total_num_steps' is required by {kind}")
        if kind == "WarmupCosineLR" and self.total_num_steps == self._warmup():
            raise ZoConfigError(f"WarmupCosineLR: 'scheduler.params.total_num_steps' "
                                f"({self.total_num_steps}) must differ from max(2, "
                                f"warmup_num_steps) ({self._warmup()}): the cosine divides by "
                                f"their difference")

    def _warmup(self) -> int:
        return max(self.warmup_num_steps, 2)

    def _fraction(self, it: int) -> float:
        w = float(self._warmup())
        if self.warmup_type == "linear":
            return it / w
        return math.log(it + 1.0) / math.log(w)

    def _warmup_lr(self, it: int) -> float:
        delta = self.max_lr - self.min_lr
        if it < 0:
            return self.min_lr
        if it < self._warmup():
            return self.min_lr + delta * self._fraction(it)
        if self.kind == "WarmupLR":
            return self.max_lr
        rest = (self.total_num_steps - it) / max(1.0, float(self.total_num_steps - self._warmup()))
        return self.min_lr + delta * max(0.0, rest)

    def _cosine_ratio(self, it: int) -> float:
        if it < self._warmup():
            return self.warmup_min_ratio + self._fraction(it) * (1.0 - self.warmup_min_ratio)
        done = float(it - self._warmup() + 1)
        total = float(self.total_num_steps - self._warmup())
        r = (1.0 + math.cos(math.pi * done / total)) / 2.0
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * r)

    def lr_at(self, it: int) -> float:
        if self.kind == "WarmupCosineLR":
            return 0.0 if it < 0 else self.base_lr * self._cosine_ratio(it)
        return self._warmup_lr(it)

    # ---- DeepSpeed's scheduler interface ----
    def get_lr(self) -> List[float]:
        return [self.lr_at(self.last_batch_iteration)]

    def get_last_lr(self) -> List[float]:
        return self.get_lr()

    def step(self, last_batch_iteration: Optional[int] = None) -> None:
        self.last_batch_iteration = (self.last_batch_iteration + 1 if last_batch_iteration is None
                                     else int(last_batch_iteration))

    def state_dict(self) -> dict:
        return {"type": self.kind, "last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, sd: dict) -> None:
        self.last_batch_iteration = int(sd["last_batch_iteration"])


def from_config(cfg: dict) -> Optional[WarmupSchedule]:
    """The config's schedule, or None without a scheduler section."""
    sched = cfg.get("scheduler")
    if not sched or sched.get("type") in (None, "none"):
        return None
    return WarmupSchedule(sched["type"], cfg["optimizer"]["params"]["lr"], sched.get("params", {}))
