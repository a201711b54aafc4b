"""zoffload for PyTorch: any nn.Module trained by the zoffload C engine, with DeepSpeed's calls.

    model_engine, optimizer, _, scheduler = zoffload.initialize(
        model=model, model_parameters=model.parameters(), config="ds_config.json")
    loss = model_engine(**batch).loss
    model_engine.backward(loss)
    model_engine.step()

The config is DeepSpeed's JSON, read by zo-train's own strict parser (an unknown key is an
error naming the key you meant). The model's parameters live in the engine's tiers (device,
pinned host, NVMe); the engine's C Adam updates their fp32 masters on the CPU. See engine.py
for what each call does and layers.py for how the model is cut into layers.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import warnings
from typing import Any, Iterable, Optional

from . import _native
from ._native import library_path
from .config import resolve_config
from .engine import ZoEngine, _adam_of
from .errors import (ZoArgumentError, ZoConfigError, ZoError, ZoIOError, ZoOutOfMemoryError,
                     ZoStateError)

__version__ = "0.1.0"
__all__ = ["initialize", "ZoEngine", "resolve_config", "library_path", "ZoError",
           "ZoConfigError", "ZoArgumentError", "ZoStateError", "ZoOutOfMemoryError",
           "ZoIOError", "ZoOptimizer", "World"]


class World:
    """The job's ranks as the launcher describes them (mpirun, srun or torchrun), and the
    engine's communicator over them when there are several."""

    def __init__(self, device_backend: str = "cpu"):
        lib = _native.lib()
        lc = _native.sized(_native.LaunchConfig, rank=-1, world_size=-1, local_rank=-1)
        ri = _native.sized(_native.RankInfo)
        _native.check(lib.zo_launch_discover(ctypes.byref(lc), ctypes.byref(ri)), "launcher")
        self.rank, self.size, self.local_rank = ri.rank, ri.world_size, ri.local_rank
        self.launcher = ri.launcher.decode()
        self.comm = ctypes.c_void_p()
        self._device = None

    def open(self, device) -> None:
        """The communicator over device's streams (several ranks only)."""
        if self.size <= 1:
            return
        lib = _native.lib()
        cc = _native.sized(_native.CommConfig, backend=b"auto", device=device.handle,
                           launch=_native.sized(_native.LaunchConfig, rank=-1, world_size=-1,
                                                local_rank=-1))
        _native.check(lib.zo_comm_init(ctypes.byref(self.comm), ctypes.byref(cc)),
                      f"communicator over {self.size} ranks ({self.launcher})")

    def close(self) -> None:
        if self.comm:
            _native.lib().zo_comm_free(self.comm)
            self.comm = ctypes.c_void_p()


class ZoOptimizer:
    """What initialize returns as the optimizer: a view of the engine's C Adam, with DeepSpeed's
    param_groups (lr reads the rate of the next update). The update itself is engine.step()."""

    def __init__(self, engine: ZoEngine, adam: dict):
        self.engine = engine
        self.adam = adam

    @property
    def param_groups(self):
        """The parameter groups in the order they were given (one when none were), each with
        its settings as the engine applies them: lr is the rate of the next update."""
        return self.engine.param_groups()

    @property
    def loss_scale(self) -> float:
        return self.engine.loss_scale

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.engine.zero_grad()

    def step(self, closure=None):
        raise ZoStateError("the engine's optimizer runs inside engine.step(): call that after "
                           "engine.backward(loss)")

    def state_dict(self):
        raise ZoStateError("optimizer states live in the engine's tiers: use "
                           "engine.save_checkpoint(dir) / load_checkpoint(dir)")


def _config_from(args, config, config_params):
    if config is not None and config_params is not None:
        raise ZoConfigError("give the config once: as config= or as config_params=, not both")
    cfg = config if config is not None else config_params
    if cfg is None and args is not None:
        cfg = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if cfg is None:
        raise ZoConfigError("no config: pass config= (a DeepSpeed JSON path, dict or JSON text) "
                            "or args.deepspeed_config")
    return cfg


def _raw_dict(cfg) -> dict:
    if isinstance(cfg, dict):
        return cfg
    text = cfg if isinstance(cfg, str) and cfg.lstrip().startswith("{") else None
    if text is None:
        try:
            with _native.open_input(os.fspath(cfg), "config file") as f:
                text = f.read()
        except ZoError as e:
            raise ZoConfigError(f"{e}; pass a DeepSpeed JSON file, a dict or JSON text") from None
    return json.loads(text)


def _client_adam(optimizer, config: dict) -> Optional[dict]:
    """A torch Adam/AdamW given as the client optimizer, as the engine's Adam settings (the
    first group's; _group_settings reads what the others set differently)."""
    if optimizer is None:
        return None
    if callable(optimizer) and not hasattr(optimizer, "param_groups"):
        raise ZoArgumentError("optimizer: a callable that builds one is not supported; zoffload "
                              "runs its own C Adam/AdamW: configure it in the config's "
                              "'optimizer' section")
    if config.get("_optimizer_given"):
        raise ZoConfigError("both a client optimizer and the config's 'optimizer' section were "
                            "given: keep one (DeepSpeed refuses this too)")
    import torch
    kind = type(optimizer)
    if kind not in (torch.optim.Adam, torch.optim.AdamW):
        raise ZoArgumentError(f"optimizer {kind.__name__} is not supported: zoffload's engine "
                              f"runs Adam and AdamW (its C CPU Adam); pass torch.optim.Adam or "
                              f"AdamW, or set the config's 'optimizer' section")
    groups = optimizer.param_groups
    first = {k: groups[0][k] for k in _GROUP_KEYS}
    for i, g in enumerate(groups):
        if g.get("amsgrad"):
            raise ZoArgumentError(f"amsgrad (parameter group {i}) is not supported by the "
                                  f"engine's Adam")
    return {"lr": float(first["lr"]), "betas": [float(b) for b in first["betas"]],
            "eps": float(first["eps"]), "weight_decay": float(first["weight_decay"]),
            "bias_correction": True, "adamw": kind is torch.optim.AdamW}


_GROUP_KEYS = ("lr", "betas", "eps", "weight_decay")
# DeepSpeed's WarmupLR and WarmupDecayLR set every group's lr to the schedule's (their
# warmup_min_lr/warmup_max_lr, one value for all groups); WarmupCosineLR scales each group's.
_SCHEDULES_OVERRIDING_LR = ("WarmupLR", "WarmupDecayLR")


def _differs(a, b) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return [float(x) for x in a] != [float(x) for x in b]
    return float(a) != float(b)


def _checked_setting(i: int, k: str, x):
    """Group i's own value of k, checked as the engine's Adam checks it."""
    def bad(what):
        return ZoArgumentError(f"parameter group {i}: {k}={x!r} {what}")
    if k == "betas":
        try:
            b = [float(v) for v in x]
        except (TypeError, ValueError):
            raise bad("must be a pair of numbers") from None
        if len(b) != 2 or not all(0.0 <= v < 1.0 for v in b):
            raise bad("must be two numbers in [0, 1)")
        return b
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise bad("must be a number") from None
    if not (v >= 0.0 and math.isfinite(v)):
        raise bad("must be finite and >= 0")
    return v


def _group_settings(groups, model, adam: dict, schedule: Optional[str]) -> list:
    """The parameter groups as the engine trains them, in the order given: each
    {"params": [...], "own": {key: value}} with the settings it sets apart from adam's
    (lr, betas, eps, weight_decay). No groups given: one group of every parameter."""
    dicts = [g for g in groups if isinstance(g, dict)]
    if not dicts:
        params = [p for p in groups] if groups else list(model.parameters())
        return [{"params": params, "own": {}}]
    out = []
    for i, g in enumerate(dicts):
        own = {}
        for k in _GROUP_KEYS:
            if k in g:
                v = _checked_setting(i, k, g[k])
                if _differs(v, adam[k]):
                    own[k] = v
        if "lr" in own and schedule in _SCHEDULES_OVERRIDING_LR:
            warnings.warn(f"parameter group {i}'s lr {own['lr']!r} is replaced by the "
                          f"{schedule} schedule's rate, as DeepSpeed's {schedule} sets every "
                          f"group's lr (WarmupCosineLR scales each group's own)", stacklevel=3)
            del own["lr"]
        if "lr" in own and float(adam["lr"]) == 0.0:
            raise ZoArgumentError(f"parameter group {i} sets lr={own['lr']!r} while the first "
                                  f"group's is 0: the engine scales every group's rate from "
                                  f"the first group's; put a group with a non-zero lr first")
        out.append({"params": list(g.get("params", [])), "own": own})
    return out


def _check_model_parameters(model, model_parameters, adam: dict) -> list:
    """DeepSpeed's model_parameters: the engine trains every trainable parameter of the model,
    so a list that leaves some out must say so by freezing them; parameter groups may set
    their own weight_decay (the engine decays per tensor: Hugging Face's Trainer exempts
    biases and norms) and their own lr, betas and eps. Returns the list, consumed."""
    if model_parameters is None:
        return []
    given = set()
    items = list(model_parameters)
    for i, x in enumerate(items):
        if isinstance(x, dict):
            x["params"] = list(x.get("params", []))
            given.update(id(p) for p in x["params"])
        else:
            given.add(id(x))
    left = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in given]
    if left:
        raise ZoArgumentError(f"model_parameters leaves out {len(left)} trainable parameter(s) "
                              f"of the model (first {left[0]!r}): the engine trains every "
                              f"parameter with requires_grad; set requires_grad=False on those "
                              f"it must not train")
    return items


def initialize(args: Optional[argparse.Namespace] = None, model=None, optimizer=None,
               model_parameters: Optional[Iterable] = None, training_data=None,
               lr_scheduler=None, distributed_port: Optional[int] = None, mpu=None,
               dist_init_required: Optional[bool] = None, collate_fn=None, config=None,
               config_params=None, *, layers=None, device: Optional[str] = None,
               config_overrides: Iterable[str] = (), max_layer_params: Optional[int] = None):
    """DeepSpeed's initialize: returns (engine, optimizer, training_dataloader, lr_scheduler).

    zoffload's own keywords: layers (the modules that are the engine's layers, in execution
    order; default: chosen from the module tree), device ("cpu" for the emulated device, "cuda";
    default: where the model's parameters are), config_overrides ("key=value" strings, as
    zo-train's --set), max_layer_params (the largest module kept as one layer by default)."""
    import torch
    if model is None or not isinstance(model, torch.nn.Module):
        raise ZoArgumentError("initialize(model=...) needs a torch.nn.Module")
    if mpu is not None:
        raise ZoArgumentError("mpu (Megatron's model-parallel unit) is not supported: zoffload "
                              "has no tensor parallelism in the PyTorch front end yet")
    if lr_scheduler is not None:
        raise ZoArgumentError("a client lr_scheduler cannot drive the engine's optimizer: use "
                              "the config's 'scheduler' section (WarmupLR, WarmupDecayLR, "
                              "WarmupCosineLR)")
    cfg = _config_from(args, config, config_params)
    raw = _raw_dict(cfg)
    backend = device or ("cuda" if next(model.parameters(), torch.empty(0)).is_cuda else "cpu")
    world = World(backend)
    resolved = resolve_config(cfg, world.size, config_overrides)
    resolved["_optimizer_given"] = "optimizer" in raw
    adam = _client_adam(optimizer, resolved)
    groups = _check_model_parameters(model, model_parameters, adam or _adam_of(resolved))
    if optimizer is not None:
        groups = list(optimizer.param_groups)
    schedule = (resolved.get("scheduler") or {}).get("type")
    settings = _group_settings(groups, model, adam or _adam_of(resolved), schedule)
    eng = _make_engine(model, resolved, raw, layers, adam, world, device, max_layer_params,
                       settings)
    opt = ZoOptimizer(eng, adam or eng._adam)
    loader = None
    if training_data is not None:
        sampler = None
        if world.size > 1:
            sampler = torch.utils.data.distributed.DistributedSampler(
                training_data, num_replicas=world.size, rank=world.rank)
        loader = torch.utils.data.DataLoader(training_data, batch_size=eng.micro_batch_size,
                                             sampler=sampler, collate_fn=collate_fn)
    return eng, opt, loader, eng.lr_scheduler


def _make_engine(model, resolved, raw, layers, adam, world, device, max_layer_params, groups):
    if world.size > 1:
        # The communicator rides on the engine's device: made once the device exists.
        return _RankedEngine(model, resolved, raw, layers, adam, world, device, max_layer_params,
                             groups)
    return ZoEngine(model, resolved, raw, layers=layers, client_adam=adam, world=None,
                    device=device, max_unit_params=max_layer_params, groups=groups)


class _RankedEngine(ZoEngine):
    """A ZoEngine whose communicator opens over its device before the engine is made."""

    def __init__(self, model, resolved, raw, layers, adam, world, device, max_layer_params,
                 groups):
        self._world_pending = world
        super().__init__(model, resolved, raw, layers=layers, client_adam=adam, world=world,
                         device=device, max_unit_params=max_layer_params, groups=groups)

    def _make_engine(self):
        self._world_pending.open(self.device)
        super()._make_engine()
