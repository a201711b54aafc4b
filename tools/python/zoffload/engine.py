"""ZoEngine: a PyTorch model trained by the C engine, with DeepSpeed's engine interface.

The model's trainable parameters live in the engine's tiers (device slots, pinned host, NVMe),
never in PyTorch's own memory: around each unit's forward and backward (layers.py) the engine
fetches the unit's layer and each parameter's `.data` is pointed at its slot in the engine's
device memory (on the cpu device: a tensor over the emulated device's host memory; on CUDA:
over the device pointer). Gradients go into the engine's gradient buffers and the engine's C
Adam updates the fp32 master weights, in sync, overlap or dpu mode, on whatever tier holds them.

The three calls DeepSpeed's users make keep their meaning:
  loss = engine(batch)          the module's forward (its output, unchanged)
  engine.backward(loss)         the loss scaled by 1/gradient_accumulation_steps (and by the
                                fp16 loss scale), gradients handed to the engine layer by layer
  engine.step()                 after every micro-batch; the update at the accumulation boundary
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from . import _native as N
from .errors import ZoArgumentError, ZoConfigError, ZoStateError
from . import tiles as T
from .layers import (EngineParam, UnitRun, assign, find_units, join_tensors, outputs_and_grads,
                     split_tensors, tile_bounds)

_TORCH_DTYPE = {N.DTYPE_BF16: torch.bfloat16, N.DTYPE_F16: torch.float16,
                N.DTYPE_F32: torch.float32}
_HOMES = {"none": N.TIER_DEVICE, "cpu": N.TIER_HOST, "nvme": N.TIER_NVME}
_MODES = {"sync": N.OPTIM_SYNC, "overlap": N.OPTIM_OVERLAP, "dpu": N.OPTIM_DPU}
_ENGINES_OF_MODEL = "_zoffload_engine"


def _mib(x: float) -> str:
    return f"{x / 2**20:.1f} MiB"


class _Tensor:
    """A trainable parameter as the model and checkpoints see it: one engine tensor, or the
    row tiles (tiles.py) that hold it, in row order."""

    def __init__(self, parts: List[EngineParam]):
        self.parts = parts
        self.param, self.name = parts[0].param, parts[0].param_name
        self.shape = tuple(parts[0].param.shape)

    @property
    def numel(self) -> int:
        return sum(ep.numel for ep in self.parts)


class _Device:
    """The engine's device and its compute stream (PyTorch's current stream on CUDA)."""

    def __init__(self, backend: str, capacity: int):
        lib = N.lib()
        cfg = N.sized(N.DeviceConfig, backend=backend.encode(), mem_budget=int(capacity))
        h = ctypes.c_void_p()
        N.check(lib.zo_device_init(ctypes.byref(h), ctypes.byref(cfg)), f"{backend} device")
        self.handle = h
        self.backend = lib.zo_device_backend(h).decode()
        self.cuda = self.backend == "cuda"
        self.stream = ctypes.c_void_p()
        self.wrapped = False
        if self.cuda and hasattr(lib, "zo_stream_wrap"):
            native = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
            N.check(lib.zo_stream_wrap(h, native, ctypes.byref(self.stream)),
                    "wrapping PyTorch's current CUDA stream")
            self.wrapped = True
        else:
            N.check(lib.zo_stream_create(h, ctypes.byref(self.stream)), "compute stream")

    def sync(self) -> None:
        """PyTorch's ops see what the engine enqueued: on the cpu device they run on the
        calling thread, so the stream's queue must have drained; on CUDA with PyTorch's own
        stream wrapped, stream order already does it."""
        if not self.wrapped:
            N.check(N.lib().zo_stream_synchronize(self.stream), "compute stream")

    def mem_stats(self) -> N.DeviceMemStats:
        s = N.DeviceMemStats()
        N.check(N.lib().zo_device_mem_get_stats(self.handle, ctypes.byref(s)), "device memory")
        return s

    def close(self) -> None:
        lib = N.lib()
        if self.stream:
            lib.zo_stream_synchronize(self.stream)
            lib.zo_stream_destroy(self.stream)
            self.stream = ctypes.c_void_p()
        if self.handle:
            lib.zo_device_free(self.handle)
            self.handle = ctypes.c_void_p()


@dataclass(frozen=True)
class _SlotRef:
    """What autograd keeps of a saved tensor over a parameter's slot (refetch mode): the
    tensor and the view of it, to be made again over wherever the backward fetch puts it."""
    ep: EngineParam
    shape: tuple
    stride: tuple
    offset: int


class _HostView:
    """torch tensors over engine memory, cached by address (slots are reused, not remade)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.cache: Dict[tuple, torch.Tensor] = {}

    def __call__(self, ptr: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        key = (ptr, numel, dtype)
        t = self.cache.get(key)
        if t is None:
            t = self._make(ptr, numel, dtype)
            self.cache[key] = t
        return t

    def _make(self, ptr: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        size = torch.empty(0, dtype=dtype).element_size()
        if not self.cuda:
            buf = (ctypes.c_char * (numel * size)).from_address(ptr)
            return torch.frombuffer(buf, dtype=dtype, count=numel)
        typestr = {2: "<i2", 4: "<f4"}[size]

        class _Cai:  # __cuda_array_interface__ v3 over the engine's device pointer
            __cuda_array_interface__ = {"shape": (numel,), "typestr": typestr,
                                        "data": (ptr, False), "version": 3, "strides": None,
                                        "stream": None}
        t = torch.as_tensor(_Cai(), device="cuda")
        return t.view(dtype) if t.dtype != dtype else t


class _UseCheck(TorchFunctionMode):
    """During the first forward: any engine parameter passed to a torch function while no
    unit holding its layer is fetched is an error naming it (its data there would be stale)."""

    def __init__(self, eng: "ZoEngine"):
        super().__init__()
        self.eng = eng

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("__get__", "__set__"):  # metadata, .data, .grad
            return func(*args, **kwargs)
        for a in tree_flatten((args, kwargs))[0]:
            if isinstance(a, nn.Parameter):
                ep = self.eng._by_param.get(id(a))
                if ep is not None and self.eng._fetched[ep.layer] == 0:
                    name = getattr(func, "__name__", str(func))
                    raise ZoArgumentError(
                        f"parameter {ep.name!r} is used by {name}() outside the layer that "
                        f"holds it (layer {ep.layer}, module {self.eng._units_of_layer[ep.layer]!r})"
                        f": the engine pages it in only around that module's forward; use it "
                        f"through that module, or pass initialize(layers=...) with a module "
                        f"that contains every use")
        return func(*args, **kwargs)


class _Runner:
    """One unit's recompute-mode calls (layers.UnitRun calls back into these)."""

    def __init__(self, eng: "ZoEngine", unit, forward):
        self.eng, self.unit, self.forward = eng, unit, forward
        self.cuda_rng = eng.device.cuda

    def run_forward(self, args, kwargs):
        with self.eng._fetched_for(self.unit, N.PHASE_FORWARD), torch.no_grad():
            return self.forward(*args, **kwargs)

    def run_backward(self, args, kwargs, rng, grad_outs, want):
        unit = self.unit
        params = [ep.param for ep in unit.owned + unit.borrowed]
        with self.eng._fetched_for(unit, N.PHASE_BACKWARD):
            devices = [torch.cuda.current_device()] if self.cuda_rng else []
            with torch.random.fork_rng(devices=devices), torch.enable_grad():
                rng.restore()
                out = self.forward(*args, **kwargs)
            outs, gouts = outputs_and_grads(out, grad_outs)
            targets = list(want) + params
            grads = (torch.autograd.grad(outs, targets, gouts, allow_unused=True)
                     if outs else [None] * len(targets))
            self.eng._take_unit_grads(unit, grads[len(want):])
        return grads[:len(want)]


class ZoEngine:
    """What zoffload.initialize returns first (DeepSpeed's DeepSpeedEngine)."""

    def __init__(self, model: nn.Module, config: dict, raw_config: dict, layers=None,
                 client_adam: Optional[dict] = None, world=None, device: Optional[str] = None,
                 max_unit_params: Optional[int] = None, groups: Optional[list] = None):
        if getattr(model, _ENGINES_OF_MODEL, None) is not None:
            raise ZoStateError("zoffload.initialize was already called on this model: its "
                               "parameters live in that engine now; keep using the engine it "
                               "returned (or call engine.destroy() first)")
        self.module = model
        self.config = config
        self.world = world
        self.rank = world.rank if world else 0
        self.world_size = world.size if world else 1
        self._closed = False
        self.micro_batch_size = config["train_micro_batch_size_per_gpu"]
        self.gradient_accumulation_steps_ = config["gradient_accumulation_steps"]
        self.train_batch_size_ = config["train_batch_size"]
        self.param_dtype = (N.DTYPE_F16 if config["fp16"]["enabled"] else
                            N.DTYPE_BF16 if config["bf16"]["enabled"] else N.DTYPE_F32)
        self.torch_dtype = _TORCH_DTYPE[self.param_dtype]
        self._adam = client_adam or _adam_of(config)
        # The parameter groups (zoffload._group_settings), and id(parameter) -> the settings
        # its group sets apart from self._adam's.
        self._groups = groups or [{"params": list(model.parameters()), "own": {}}]
        self.own_of = {id(p): g["own"] for g in self._groups if g["own"] for p in g["params"]}
        self._units_given = layers
        self._partition(layers, max_unit_params)
        backend = device or _device_backend(model)
        self.device = _Device(backend, self._device_capacity(backend))
        self.views = _HostView(self.device.cuda)
        self._eng = ctypes.c_void_p()
        try:
            self._make_engine()
            self._register()
            N.check(N.lib().zo_engine_finalize(self._eng), "zo_engine_finalize")
            self._read_plan()
            self._adopt_model()
            self._no_cache_when_recomputing()
        except BaseException:
            self._free_native()
            raise
        self._reset_step_state()
        self.global_steps = 0
        self.micro_steps = 0
        self.global_samples = 0
        self.skipped_steps = 0
        self.last_stats: Optional[N.StepStats] = None
        self._checked_first_forward = False
        from . import scheduler as S  # the config's schedule, stepped by step()
        self.lr_scheduler = S.from_config(config)
        self._set_engine_lr()
        setattr(model, _ENGINES_OF_MODEL, self)
        from .monitor import Monitors
        self.monitor = Monitors(config, raw_config, self.rank)

    # ---- set-up ----
    def _partition(self, layers, max_unit_params) -> None:
        model = self.module
        if not any(p.requires_grad for p in model.parameters()):
            raise ZoArgumentError(f"the model ({type(model).__name__}) has no trainable "
                                  f"parameters: there is nothing for the engine to train")
        if layers is not None:
            names = {id(m): n for n, m in model.named_modules()}
            units = []
            for m in layers:
                if not isinstance(m, nn.Module) or id(m) not in names:
                    raise ZoArgumentError(f"layers must be modules of the model; "
                                          f"{type(m).__name__} is not one of them")
                units.append((names[id(m)], m))
        else:
            units = find_units(model, max_unit_params)
        size = torch.empty(0, dtype=self.torch_dtype).element_size()
        self._cut(units, {}, size)
        rows = self._tile_plan(units, size)
        if rows:
            self._cut(units, rows, size)

    def _cut(self, units, tile_rows, size) -> None:
        self.tile_rows = tile_rows
        self.units, self.layers, self.params = assign(self.module, units,
                                                      self._layer_bytes(size), size, tile_rows)
        self._by_param = {id(ep.param): ep for ep in self.params if ep.rows is None}
        self.tensors: List[_Tensor] = []
        seen: Dict[int, _Tensor] = {}
        for ep in self.params:
            if id(ep.param) in seen:
                seen[id(ep.param)].parts.append(ep)
            else:
                seen[id(ep.param)] = _Tensor([ep])
                self.tensors.append(seen[id(ep.param)])
        for t in self.tensors:
            t.parts.sort(key=lambda ep: ep.rows or (0, 0))
        self._tensor_of = {id(t.param): t for t in self.tensors}
        self._units_of_layer: Dict[int, str] = {}
        self._n_units = [0] * len(self.layers)
        for u in self.units:
            if u.layer is not None:
                prev = self._units_of_layer.get(u.layer)
                self._units_of_layer[u.layer] = u.name if prev is None else f"{prev}+{u.name}"
                self._n_units[u.layer] += 1
            if u.tile_owner:
                for ep in u.tiles:
                    self._units_of_layer[ep.layer] = f"{u.name} rows {ep.rows[0]}:{ep.rows[1]}"
                    self._n_units[ep.layer] = 1

    def _tile_plan(self, units, size: int) -> Dict[int, int]:
        """Which weights to cut into row tiles (tiles.py), and how many rows a tile holds:
        zoffload.tile_size > 0 tiles every tileable weight above it; 0 (auto) tiles those above
        the chunk (zoffload.chunk_size, else the engine's 4 MiB), and only when the device
        budget cannot hold the untiled plan (a resident run keeps its weights whole: tiling
        costs a loop, not memory)."""
        want = int(self.config["zoffload"]["tile_size"])
        if want == 0:
            if not int(self.config["zoffload"]["device_mem"]) or self._fits_device():
                return {}
            want = int(self.config["zoffload"]["chunk_size"]) or 4 << 20
        return T.plan(units, want, size, self.config["zoffload"]["optimizer_state_dtype"] == "int8")

    def _fits_device(self) -> bool:
        """Whether the engine's plan of the current layout fits zoffload.device_mem."""
        return bool(self._footprint_for(self._engine_config(probe=True))[1])

    def _layer_bytes(self, size: int) -> int:
        """What one engine layer may hold: the chunk (zoffload.chunk_size, else the engine's
        4 MiB, raised to the largest tensor as the engine raises it), so that consecutive small
        units share chunks instead of each padding one."""
        largest = max(self._tensor_sizes()) * size
        chunk = int(self.config["zoffload"]["chunk_size"]) or (4 << 20)
        return max(chunk, (largest + 4095) // 4096 * 4096)

    def _tensor_sizes(self) -> List[int]:
        """The engine tensors' elements: a tiled weight's largest tile, else the parameter."""
        rows = getattr(self, "tile_rows", {})
        out = []
        for p in self.module.parameters():
            if p.requires_grad and id(p) in rows:
                width = p.numel() // p.shape[0]
                out.append(max(hi - lo for lo, hi in tile_bounds(p.shape[0], width,
                                                                 *rows[id(p)])) * width)
            elif p.requires_grad:
                out.append(p.numel())
        return out

    def _param_bytes(self) -> int:
        return sum(ep.numel for ep in self.params) * torch.empty(0, dtype=self.torch_dtype).element_size()

    def _device_capacity(self, backend: str) -> int:
        """The cpu device's capacity: zoffload.device_mem, else what the plan needs with every
        parameter chunk resident (as on a GPU large enough for it). CUDA: the GPU's own."""
        want = int(self.config["zoffload"]["device_mem"])
        if want or backend == "cuda":
            return want
        return self._resident_need()

    def _resident_need(self) -> int:
        """Device bytes of the plan with every parameter chunk resident, from the engine's own
        accounting (zo_engine_footprint_for), before anything is allocated."""
        cfg = self._engine_config(probe=True)
        cfg.device_bytes = 0
        return int(self._footprint_for(cfg)[0].bytes[N.TIER_DEVICE])

    def _footprint_for(self, cfg: N.EngineConfig):
        """(footprint, fits) of the engine's plan of the current layout under cfg."""
        n = len(self.params)
        numel = (ctypes.c_size_t * n)(*[ep.numel for ep in self.params])
        layer = (ctypes.c_int * n)(*[ep.layer for ep in self.params])
        ly = N.sized(N.EngineLayout, n_tensors=n, numel=numel, layer=layer)
        fp, fits = N.sized(N.EngineFootprint), ctypes.c_int()
        N.check(N.lib().zo_engine_footprint_for(ctypes.byref(cfg), ctypes.byref(ly),
                                                ctypes.byref(fp), ctypes.byref(fits), None, 0),
                "planning the device")
        return fp, fits.value

    def _cuda_share(self) -> int:
        """On CUDA without zoffload.device_mem: the resident plan when it leaves PyTorch 40% of
        the free memory for activations, else 60% of the free memory (the engine pages)."""
        free, _ = torch.cuda.mem_get_info()
        return min(self._resident_need(), int(free * 0.6))

    def _engine_config(self, probe: bool = False) -> N.EngineConfig:
        """The engine's configuration from the DeepSpeed config (probe: for planning before the
        device exists, without a device or a communicator)."""
        cfg, z = self.config, self.config["zero_optimization"]
        zo = cfg["zoffload"]
        c = N.engine_config_init()
        c.device = None if probe else self.device.handle
        c.param_dtype = self.param_dtype
        c.chunk_bytes = int(zo["chunk_size"]) or self._default_chunk_bytes()
        c.param_home = _HOMES[z["offload_param"]["device"]]
        c.optim_home = _HOMES[z["offload_optimizer"]["device"]]
        c.device_bytes = int(zo["device_mem"])
        if not c.device_bytes and not probe and self.device.cuda:
            c.device_bytes = self._cuda_share()
        c.host_bytes = int(zo["host_mem"])
        self._paths = _nvme_paths(cfg)
        self._paths_c = (ctypes.c_char_p * max(1, len(self._paths)))(
            *[p.encode() for p in self._paths])
        if self._paths:
            c.nvme_paths = ctypes.cast(self._paths_c, ctypes.POINTER(ctypes.c_char_p))
            c.n_nvme_paths = len(self._paths)
        c.lookahead = int(zo["prefetch_lookahead"])
        c.mode = _MODES[zo["optimizer_mode"]]
        c.grad_accum_steps = int(cfg["gradient_accumulation_steps"])
        if int(zo["micro_group"]) > 1:
            raise ZoConfigError("'zoffload.micro_group' > 1 (layer-major micro-batches) is "
                                "zo-train's: a PyTorch model runs each micro-batch through "
                                "every layer; leave it at 1")
        a = self._adam
        c.adam.lr, c.adam.beta1, c.adam.beta2 = a["lr"], a["betas"][0], a["betas"][1]
        c.adam.eps, c.adam.weight_decay = a["eps"], a["weight_decay"]
        c.adam.adamw, c.adam.bias_correction = int(a["adamw"]), int(a["bias_correction"])
        c.max_grad_norm = float(cfg["gradient_clipping"])
        f16 = cfg["fp16"]
        c.loss_scaler.loss_scale = float(f16["loss_scale"])
        c.loss_scaler.initial_scale_power = int(f16["initial_scale_power"])
        c.loss_scaler.loss_scale_window = int(f16["loss_scale_window"])
        c.loss_scaler.hysteresis = int(f16["hysteresis"])
        c.loss_scaler.consecutive_hysteresis = int(bool(f16["consecutive_hysteresis"]))
        c.loss_scaler.min_loss_scale = float(f16["min_loss_scale"])
        c.nvme_queue_depth = int(cfg["aio"]["queue_depth"])
        c.nvme_block_size = int(cfg["aio"]["block_size"])
        pl = zo["placement"]
        if pl == "auto":
            raise ZoConfigError("'zoffload.placement' \"auto\" is zo-train's host-memory split; "
                                "give the bytes per tier, or leave it out")
        for caps, kind in ((c.param_caps, "params"), (c.optim_caps, "optimizer")):
            for t in (N.TIER_DEVICE, N.TIER_HOST):
                caps.bytes[t] = int(pl[kind][N.TIER_NAMES[t]])
        c.state_dtype = N.state_formats()[zo["optimizer_state_dtype"]]
        c.master_split = int(bool(zo["master_split"]))
        c.update_behind = int(bool(zo["update_behind"]))
        self._nvme_name = f"zoffload-py-{os.getpid()}-r{self.rank}".encode()
        c.nvme_name = self._nvme_name
        if self.world_size > 1:
            c.rank, c.world_size = self.rank, self.world_size
            c.zero_stage = int(z["stage"]) or 1
            c.comm = None if probe else self.world.comm
            c.zero_persist_elems = int(z["stage3_param_persistence_threshold"])
            c.reduce_order = (N.REDUCE_ORDER_RANK if zo["reduce_order"] == "rank"
                              else N.REDUCE_ORDER_GLOBAL)
        return c

    def _default_chunk_bytes(self) -> int:
        """The engine's 4 MiB, or the largest layer when every layer is smaller: a small
        model then pins and moves what it holds, not 4 MiB a layer (4 KiB granularity)."""
        size = torch.empty(0, dtype=self.torch_dtype).element_size()
        largest = max(sum(ep.numel for ep in layer) for layer in self.layers) * size
        tensor = max(ep.numel for ep in self.params) * size
        return max(min(4 << 20, (largest + 4095) // 4096 * 4096), (tensor + 4095) // 4096 * 4096)

    def _make_engine(self) -> None:
        self._cfg = self._engine_config()
        N.check(N.lib().zo_engine_init(ctypes.byref(self._eng), ctypes.byref(self._cfg)),
                "zo_engine_init")

    def _register(self) -> None:
        lib = N.lib()
        for ep in self.params:
            init = ep.param.detach()
            if ep.rows is not None:
                init = init[ep.rows[0]:ep.rows[1]]
            init = init.to(device="cpu", dtype=torch.float32).contiguous()
            tid = ctypes.c_int()
            N.check(lib.zo_engine_register(self._eng, ep.layer, ep.name.encode(), ep.numel,
                                           ctypes.c_void_p(init.data_ptr()), ctypes.byref(tid)),
                    f"registering {ep.name}")
            ep.id = tid.value
            if id(ep.param) in self.own_of:
                self._set_group_settings(ep, self.own_of[id(ep.param)])

    def _set_group_settings(self, ep, own: dict) -> None:
        """The settings ep's parameter group sets apart from the optimizer's. The rate goes as a
        scale of the engine's, from the two rates as fp32 (what the engine holds), so that the
        engine's double product rounds back to the group's fp32 rate exactly."""
        lib = N.lib()
        if "weight_decay" in own:
            N.check(lib.zo_engine_set_weight_decay(self._eng, ep.id, own["weight_decay"]),
                    f"{ep.name}'s weight decay")
        if not own.keys() & {"lr", "betas", "eps"}:
            return
        b1, b2 = own.get("betas", self._adam["betas"])
        N.check(lib.zo_engine_set_tensor_adam(self._eng, ep.id, self._group_scale(own), b1, b2,
                                              own.get("eps", self._adam["eps"])),
                f"{ep.name}'s parameter group settings")

    def _group_scale(self, own: dict) -> float:
        return _f32(own["lr"]) / _f32(self._adam["lr"]) if "lr" in own else 1.0

    def param_groups(self) -> List[dict]:
        """The parameter groups, each with the settings the engine applies to it (lr: the rate
        of the next update)."""
        lr = float(N.lib().zo_engine_lr(self._eng))
        out = []
        for g in self._groups:
            d = {k: self._adam[k] for k in ("lr", "betas", "eps", "weight_decay",
                                            "bias_correction")}
            d.update(g["own"])
            d["lr"] = _f32(lr * self._group_scale(g["own"]))
            d["params"] = list(g["params"])
            out.append(d)
        return out

    def _read_plan(self) -> None:
        lib = N.lib()
        fp = N.sized(N.EngineFootprint)
        N.check(lib.zo_engine_footprint_get(self._eng, ctypes.byref(fp)), "footprint")
        self.footprint = fp
        ph, oh = (ctypes.c_uint32 * N.TIER_MAX)(), (ctypes.c_uint32 * N.TIER_MAX)()
        N.check(lib.zo_engine_homes(self._eng, ph, oh), "homes")
        self.param_homes, self.optim_homes = list(ph)[:N.TIER_COUNT], list(oh)[:N.TIER_COUNT]
        # Every chunk with a slot of its own: slots never move, autograd may keep its tensors.
        # (ZeRO stage 3 gathers other ranks' chunks into reused buffers: always recompute.)
        stage3 = self.world_size > 1 and int(self.config["zero_optimization"]["stage"]) >= 3
        self.direct = fp.device_param_slots >= fp.n_chunks and not stage3
        # Below that, autograd's saved parameters are fetched again in the backward (refetch)
        # unless a unit uses another's untiled parameter (a tied layer would stay open from
        # the first backward use to the last) or recompute is asked for: then each unit's
        # backward recomputes its forward (layers.py).
        self.refetch = (not self.direct and not stage3 and
                        not self.config["zoffload"]["recompute"] and
                        not any(u.borrowed for u in self.units if not u.tiles))
        self._fetched = [0] * len(self.layers)

    @property
    def layer_mode(self) -> str:
        """How layers run: direct, refetch or recompute (layers.py)."""
        return "direct" if self.direct else "refetch" if self.refetch else "recompute"

    def _adopt_model(self) -> None:
        """Buffers and frozen parameters go where the compute is (cast as DeepSpeed casts
        the module); trainable parameters give up their memory: the engine holds them."""
        target = "cuda" if self.device.cuda else "cpu"
        owned = set(self._tensor_of)
        for m in self.module.modules():
            for k, b in list(m._buffers.items()):
                if b is not None:
                    m._buffers[k] = b.to(device=target, dtype=self.torch_dtype
                                         if b.is_floating_point() else b.dtype)
            for k, p in list(m._parameters.items()):
                if p is not None and id(p) not in owned:
                    p.data = p.data.to(device=target, dtype=self.torch_dtype
                                       if p.is_floating_point() else p.dtype)
        self._placeholder = torch.empty(0, dtype=self.torch_dtype, device=target)
        self._zero = torch.zeros(1, dtype=self.torch_dtype, device=target)
        for ep in self.params:
            ep.param.data = self._away(ep)
            ep.param.grad = None
        self._hooks = []
        for u in self.units:
            if u.tiles:
                self._wrap_tiled(u)
            elif self.direct or self.refetch:
                self._hooks.append(u.module.register_forward_pre_hook(self._direct_pre(u)))
                self._hooks.append(u.module.register_forward_hook(self._direct_post(u)))
            else:
                self._wrap_forward(u)
        if self.direct or self.refetch:
            for ep in self.params:
                if ep.rows is None:
                    self._hooks.append(
                        ep.param.register_post_accumulate_grad_hook(self._grad_hook))

    def _no_cache_when_recomputing(self) -> None:
        """A recomputed forward must not add to a key/value cache a second time: turn a
        transformers model's use_cache off, as its own gradient checkpointing does."""
        cfg = getattr(self.module, "config", None)
        if not self.direct and not self.refetch and getattr(cfg, "use_cache", False):
            cfg.use_cache = False

    # ---- fetching ----
    def _fetch_layer(self, layer: int, phase: int):
        lib = N.lib()
        n = len(self.layers[layer])
        ptrs, gptrs = (ctypes.c_void_p * n)(), (ctypes.c_void_p * n)()
        N.check(lib.zo_engine_fetch(self._eng, layer, phase, self.device.stream, ptrs, gptrs, n),
                f"fetching layer {layer} ({self._units_of_layer[layer]})")
        return ptrs, gptrs

    def _point_params(self, layer: int, ptrs) -> None:
        for ep, p in zip(self.layers[layer], ptrs):
            if ep.rows is None:  # a tile is read through its view, never as the parameter
                ep.param.data = self.views(p, ep.numel, self.torch_dtype).view(ep.shape)

    @contextmanager
    def _fetched_for(self, unit, phase: int):
        """The unit's layers fetched (its own for phase, borrowed ones for the forward) and its
        parameters pointed at their slots, for the body. In the backward phase its own layer
        stays fetched while the other units sharing it run their backward (a backward fetch
        zeroes the gradient buffers): the layer is handed over after the last of them."""
        done = []
        try:
            for layer in unit.needs:
                ph = phase if layer == unit.layer else N.PHASE_FORWARD
                if ph == N.PHASE_BACKWARD and self._bwd_open.get(layer) is not None:
                    continue  # open for an earlier unit of this backward: slots stay put
                ptrs, gptrs = self._fetch_layer(layer, ph)
                self._fetched[layer] += 1
                self._point_params(layer, ptrs)
                if ph == N.PHASE_BACKWARD:
                    self._bwd_open[layer] = [gptrs, 0]
                else:
                    done.append(layer)
            if phase == N.PHASE_BACKWARD and unit.layer is not None:
                self._grad_ptrs = self._bwd_open[unit.layer][0]
            self.device.sync()
            yield
            if phase == N.PHASE_BACKWARD and unit.layer is not None:
                self._bwd_open[unit.layer][1] += 1
                if self._bwd_open[unit.layer][1] == self._n_units[unit.layer]:
                    self._close_backward(unit.layer)
        finally:
            for layer in done:
                self._release(layer)

    def _release(self, layer: int) -> None:
        self._fetched[layer] -= 1
        st = N.lib().zo_engine_release(self._eng, layer, self.device.stream)
        if not self.direct and self._fetched[layer] == 0:
            for ep in self.layers[layer]:
                if ep.rows is None:
                    ep.param.data = self._away(ep)
        N.check(st, f"releasing layer {layer}")

    def _away(self, ep: EngineParam) -> torch.Tensor:
        """What a parameter's .data is while its layer is not fetched: nothing; in refetch
        mode a read-only zero view of its shape, since autograd accumulates its gradient
        (shaped as .data) whenever the backward gets there, fetched or not."""
        if self.refetch:
            return self._zero.expand(ep.shape)
        return self._placeholder

    def _close_backward(self, layer: int) -> None:
        """Hand an open backward layer's gradients over and release it."""
        self._bwd_open.pop(layer)
        try:
            N.check(N.lib().zo_engine_grads_ready(self._eng, layer, self.device.stream),
                    f"handing over layer {layer}'s gradients")
            self._handed[layer] = True
        finally:
            self._release(layer)

    # ---- direct mode ----
    def _direct_pre(self, unit):
        def pre(module, args):
            self._enter_direct(unit)
        return pre

    def _direct_post(self, unit):
        def post(module, args, output):
            self._leave_direct(unit)
        return post

    def _enter_direct(self, unit) -> None:
        for layer in unit.needs:
            ptrs, _ = self._fetch_layer(layer, N.PHASE_FORWARD)
            self._fetched[layer] += 1
            self._point_params(layer, ptrs)
            self._fwd_ptrs[layer] = [p for p in ptrs]
            if self.refetch:  # what autograd saves from these slots is a reference to them
                for ep, p in zip(self.layers[layer], ptrs):
                    if ep.rows is None:
                        self._slot_of[p] = ep
        self.device.sync()

    def _leave_direct(self, unit) -> None:
        lib = N.lib()
        for layer in unit.needs:
            if self.refetch:
                self._release(layer)
                continue
            self._fetched[layer] -= 1
            N.check(lib.zo_engine_release(self._eng, layer, self.device.stream),
                    f"releasing layer {layer}")

    # ---- refetch mode: autograd's saved parameters as references to their slots ----
    def _pack_saved(self, t: torch.Tensor):
        """A tensor autograd saves: one over a fetched parameter slot becomes a reference
        (the slot is reused once the layer is released); anything else is kept."""
        try:
            ep = self._slot_of.get(t.untyped_storage().data_ptr())
        except (RuntimeError, NotImplementedError):  # a tensor without storage
            return t
        if ep is None or t.dtype != self.torch_dtype:
            return t
        return _SlotRef(ep, tuple(t.shape), tuple(t.stride()), t.storage_offset())

    def _unpack_saved(self, packed):
        """In the backward: the reference's layer fetched again (once per backward) and the
        same view of its slot there."""
        if not isinstance(packed, _SlotRef):
            return packed
        ep = packed.ep
        ptrs, _ = self._open_backward(ep.layer)
        base = self.views(ptrs[ep.index], ep.numel, self.torch_dtype)
        return base.as_strided(packed.shape, packed.stride, packed.offset)

    def _open_backward(self, layer: int):
        """Layer fetched again for its backward's saved parameters (its slots, not yet its
        gradient buffers: layers merged from several modules finish their backward out of
        order, and the gradient slots are few) until its gradients are handed over."""
        ptrs = self._refetched.get(layer)
        if ptrs is None:
            ptrs, _ = self._fetch_layer(layer, N.PHASE_FORWARD)
            self._fetched[layer] += 1
            self._point_params(layer, ptrs)
            self.device.sync()
            self._refetched[layer] = ptrs
        return ptrs, None

    def _grad_hook(self, p: torch.Tensor) -> None:
        ep = self._by_param[id(p)]
        self._pending[ep.layer][ep.index] = p.grad
        p.grad = None
        self._arrived[ep.layer] += 1
        if self._arrived[ep.layer] == len(self.layers[ep.layer]):
            if self._refetched.pop(ep.layer, None) is not None:
                self._release(ep.layer)  # every use of its saved parameters has run
            self._hand_over_ready(final=False)

    def _hand_over_ready(self, final: bool) -> None:
        """Hand layers over in reverse layer order, each once all of its gradients are in (or,
        at the end of the backward, whatever came: a parameter without a gradient adds zero)."""
        while self._next_hand >= 0:
            layer = self._next_hand
            if self._handed[layer]:  # a tile's layer, handed over by its owner's backward
                self._next_hand -= 1
                continue
            if not final and self._arrived[layer] < len(self.layers[layer]):
                return
            self._hand_over_direct(layer)
            self._next_hand -= 1

    def _hand_over_direct(self, layer: int) -> None:
        lib = N.lib()
        reopened = self.refetch and self._refetched.pop(layer, None) is not None
        ptrs, gptrs = self._fetch_layer(layer, N.PHASE_BACKWARD)
        if reopened:  # the saved parameters' fetch: the backward has used them
            self._release(layer)
        try:
            if (not self.refetch and layer in self._fwd_ptrs and
                    [p for p in ptrs] != self._fwd_ptrs[layer]):
                raise ZoStateError(f"layer {layer}'s device slot moved between its forward and "
                                   f"backward although every chunk has a slot (a bug: please "
                                   f"report it)")
            self._copy_pending(layer, gptrs)
            N.check(lib.zo_engine_grads_ready(self._eng, layer, self.device.stream),
                    f"handing over layer {layer}'s gradients")
        finally:
            N.check(lib.zo_engine_release(self._eng, layer, self.device.stream),
                    f"releasing layer {layer}")
        self._pending[layer] = [None] * len(self.layers[layer])
        self._handed[layer] = True

    def _copy_pending(self, layer: int, gptrs) -> None:
        self.device.sync()
        for ep, g, gp in zip(self.layers[layer], self._pending[layer], gptrs):
            if g is None:  # a tile whose owner got no gradient: what borrowers left
                g = self._borrowed_grads.pop((ep.layer, ep.index), None)
            if g is not None:
                self.views(gp, ep.numel, self.torch_dtype).copy_(g.reshape(-1))

    # ---- recompute mode ----
    def _wrap_forward(self, unit) -> None:
        module = unit.module
        forward = module.forward
        runner = _Runner(self, unit, forward)
        eng = self

        def wrapped(*args, **kwargs):
            if not torch.is_grad_enabled():  # evaluation: fetch, run, release
                with eng._fetched_for(unit, N.PHASE_FORWARD):
                    return forward(*args, **kwargs)
            tensors, how = split_tensors(args, kwargs)
            box = {"in": how}
            outs = UnitRun.apply(runner, box, eng._anchor, *tensors)
            flat, spec, idx = box["out"]
            flat = list(flat)
            for i, t in zip(idx, outs):
                flat[i] = t
            return tree_unflatten(flat, spec)

        # The anchor makes every unit's output need a gradient, so that even a unit whose
        # inputs are integers (an embedding) gets its backward called.
        module.forward = wrapped
        unit.runner = runner
        self._wrapped.append((module, forward))

    @property
    def _wrapped(self) -> list:
        if not hasattr(self, "_wrapped_list"):
            self._wrapped_list = []
            self._anchor = torch.zeros((), requires_grad=True)
        return self._wrapped_list

    def _take_unit_grads(self, unit, grads) -> None:
        """Recompute mode: the unit's own gradients (plus what borrowers left for them) into
        its gradient buffers; a borrowed parameter's gradient waits for its owner."""
        params = unit.owned + unit.borrowed
        for ep, g in zip(params, grads):
            if ep.layer == unit.layer:
                waiting = self._borrowed_grads.pop((ep.layer, ep.index), None)
                if waiting is not None:
                    g = waiting if g is None else g + waiting
                if g is not None:
                    self.views(self._grad_ptrs[ep.index], ep.numel,
                               self.torch_dtype).copy_(g.reshape(-1))
            elif g is not None:
                if self._handed[ep.layer]:
                    raise ZoStateError(
                        f"parameter {ep.name!r} (layer {ep.layer}) got a gradient from module "
                        f"{unit.name!r} after its own layer's backward: its first user must run "
                        f"its backward last; pass initialize(layers=...) in execution order")
                self._leave_for_owner(ep, g)

    def _leave_for_owner(self, ep: EngineParam, g: torch.Tensor) -> None:
        key = (ep.layer, ep.index)
        prev = self._borrowed_grads.get(key)
        self._borrowed_grads[key] = g if prev is None else prev + g

    # ---- tiled units (tiles.py) ----
    def _wrap_tiled(self, unit) -> None:
        module = unit.module
        op = T.TiledOp(self, unit)
        eng = self

        def tiled(x):
            if not torch.is_grad_enabled():
                return op.forward(x)
            return T.TiledRun.apply(op, eng._anchor, x)

        module.forward = tiled
        self._wrapped.append((module, module.__class__.forward))

    @contextmanager
    def _tile_use(self, ep: EngineParam, backward_owner: bool):
        """The tile's layer fetched for the body: (its weight, its gradient slot). The
        gradient slot comes only with the owner's backward in recompute mode (a backward
        fetch); the body then hands the gradient over with _tile_grad and the tile's layer is
        released after it. Direct mode's slots never move: its gradients wait in _pending."""
        layer = ep.layer
        phase = N.PHASE_BACKWARD if backward_owner and not self.direct else N.PHASE_FORWARD
        ptrs, gptrs = self._fetch_layer(layer, phase)
        self._fetched[layer] += 1
        if phase == N.PHASE_BACKWARD:
            self._bwd_open[layer] = [gptrs, 0]
        try:
            self.device.sync()
            w = self.views(ptrs[ep.index], ep.numel, self.torch_dtype).view(ep.shape)
            slot = (self.views(gptrs[ep.index], ep.numel, self.torch_dtype)
                    if phase == N.PHASE_BACKWARD else None)
            yield w, slot
        finally:
            if phase == N.PHASE_BACKWARD:
                self._close_backward(layer)
            else:
                self._release(layer)

    def _tile_grad(self, ep: EngineParam, g: Optional[torch.Tensor], owner: bool,
                   slot: Optional[torch.Tensor]) -> None:
        """A tile's gradient from one of its users: a borrower's waits for the owner; the
        owner's (with what waits) goes to the engine: into its slot (recompute mode, handed
        over as the tile's layer is released) or _pending (direct mode, handed in order)."""
        if not owner:
            if self._handed[ep.layer]:
                raise ZoStateError(f"{ep.name} got a gradient after its own layer's backward: "
                                   f"its first user must run its backward last")
            if g is not None:
                self._leave_for_owner(ep, g)
            return
        waiting = self._borrowed_grads.pop((ep.layer, ep.index), None)
        if waiting is not None:
            g = waiting if g is None else g + waiting
        if self.direct:
            self._pending[ep.layer][ep.index] = g
            self._arrived[ep.layer] += 1
            self._hand_over_ready(final=False)
        elif g is not None:
            slot.copy_(g.reshape(-1))
        else:
            slot.zero_()

    # ---- DeepSpeed's engine interface ----
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        self._check_open()
        if self.lr_scheduler is not None and not self._step_lr_set:
            self._set_engine_lr()
        with self._saving():
            if not self._checked_first_forward:
                self._checked_first_forward = True
                with _UseCheck(self):
                    return self.module(*args, **kwargs)
            return self.module(*args, **kwargs)

    def _saving(self):
        """Refetch mode: autograd's saved tensors through _pack_saved/_unpack_saved."""
        if not self.refetch or not torch.is_grad_enabled():
            return nullcontext()
        return torch.autograd.graph.saved_tensors_hooks(self._pack_saved, self._unpack_saved)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True):
        """loss.backward() with the loss scaled by 1/gradient_accumulation_steps (and the fp16
        loss scale); each layer's gradients reach the engine as soon as they are complete."""
        self._check_open()
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ZoArgumentError("backward(loss): loss must be a one-element tensor (the "
                                  "micro-batch's mean loss)")
        if not loss.requires_grad:
            raise ZoArgumentError("backward(loss): the loss does not require a gradient: compute "
                                  "it from engine(...)'s output with autograd enabled (not under "
                                  "torch.no_grad(), and the engine in train() mode)")
        if self._micro_in_step >= self.gradient_accumulation_steps_:
            raise ZoStateError(f"backward() called {self._micro_in_step + 1} times since the "
                               f"last step() with gradient_accumulation_steps "
                               f"{self.gradient_accumulation_steps_}: call engine.step() after "
                               f"every backward()")
        scale = N.lib().zo_engine_loss_scale(self._eng)
        div = (self.gradient_accumulation_steps_ if scale_wrt_gas else 1) * self.world_size
        factor = scale / div
        self._begin_micro()
        scaled = loss * factor if factor != 1.0 else loss
        try:
            scaled.backward(retain_graph=retain_graph)
            if self.direct or self.refetch:
                self._hand_over_ready(final=True)
            else:
                self._hand_over_untouched()
        except BaseException:
            self._abandon()
            raise
        self._micro_in_step += 1
        self._backward_done = True
        return loss

    def _hand_over_untouched(self) -> None:
        """Recompute mode, after the backward: layers still open (a unit sharing them got no
        gradient) are handed over, and layers whose backward never ran hand over zeros (plus
        what borrowers left), so the step counts every micro-batch for every layer."""
        for layer in range(len(self.layers) - 1, -1, -1):
            if layer in self._bwd_open:
                self._close_backward(layer)
            if self._handed[layer]:
                continue
            ptrs, gptrs = self._fetch_layer(layer, N.PHASE_BACKWARD)
            self._fetched[layer] += 1
            self._bwd_open[layer] = [gptrs, 0]
            self.device.sync()
            for ep in self.layers[layer]:
                g = self._borrowed_grads.pop((ep.layer, ep.index), None)
                if g is not None:
                    self.views(gptrs[ep.index], ep.numel, self.torch_dtype).copy_(g.reshape(-1))
            self._close_backward(layer)

    def _begin_micro(self) -> None:
        n = len(self.layers)
        self._pending = [[None] * len(l) for l in self.layers]
        self._arrived = [0] * n
        self._handed = [False] * n
        self._next_hand = n - 1
        self._borrowed_grads = {}
        self._bwd_open: Dict[int, list] = {}  # layer -> [gradient pointers, units done]
        self._refetched: Dict[int, tuple] = {}  # refetch mode: layer -> (slots, grad buffers)
        self._slot_of: Dict[int, EngineParam] = {}  # refetch mode: slot address -> tensor

    def is_gradient_accumulation_boundary(self) -> bool:
        return self._micro_in_step == self.gradient_accumulation_steps_

    def step(self, lr_kwargs=None) -> None:
        """After every backward(): at the accumulation boundary the engine's update runs (or
        was running: overlap and dpu modes), the schedule advances, the monitors log."""
        self._check_open()
        if not self._backward_done:
            raise ZoStateError("step() called before backward(): call engine.backward(loss) on "
                               "the micro-batch's loss first")
        self._backward_done = False
        self.micro_steps += 1
        self.global_samples += self.micro_batch_size * self.world_size
        if not self.is_gradient_accumulation_boundary():
            return
        stats = N.sized(N.StepStats)
        t0 = time.perf_counter()
        try:
            N.check(N.lib().zo_engine_end_step(self._eng, ctypes.byref(stats)), "end of step")
        except BaseException:
            self._abandon()
            raise
        self.last_stats = stats
        self._micro_in_step = 0
        self.global_steps += 1
        if stats.overflow:
            self.skipped_steps += 1
        elif self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self._step_lr_set = False
        self._set_engine_lr()
        self.monitor.log_step(self, stats, time.perf_counter() - t0)

    def _abandon(self) -> None:
        N.lib().zo_engine_abandon_step(self._eng)
        self._bwd_open = {}
        self._refetched = {}
        self._micro_in_step = 0
        self._backward_done = False
        self._fetched = [0] * len(self.layers)

    def _reset_step_state(self) -> None:
        self._micro_in_step = 0
        self._backward_done = False
        self._step_lr_set = False
        self._fwd_ptrs: Dict[int, list] = {}
        self._begin_micro()

    def _set_engine_lr(self) -> None:
        if self.lr_scheduler is None:
            return
        lr = self.lr_scheduler.get_lr()[0]
        N.check(N.lib().zo_engine_set_lr(self._eng, float(lr)), "learning rate")
        self._step_lr_set = True

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients live in the engine and are consumed by each step: nothing to clear. Kept
        for scripts written for DeepSpeed."""

    def train(self, mode: bool = True) -> "ZoEngine":
        self.module.train(mode)
        return self

    def eval(self) -> "ZoEngine":
        return self.train(False)

    def get_lr(self) -> List[float]:
        """The rate of the next update of each parameter group, in their order."""
        return [g["lr"] for g in self.param_groups()]

    def get_global_grad_norm(self) -> Optional[float]:
        return None if self.last_stats is None else float(self.last_stats.grad_norm)

    @property
    def loss_scale(self) -> float:
        return float(N.lib().zo_engine_loss_scale(self._eng))

    def gradient_accumulation_steps(self) -> int:
        return self.gradient_accumulation_steps_

    def train_batch_size(self) -> int:
        return self.train_batch_size_

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.micro_batch_size

    # ---- weights ----
    def master_weight(self, name_or_param) -> torch.Tensor:
        """The fp32 master weights of one parameter (by name or object), as a new tensor. With
        several ranks it is collective (every rank asks for the same tensors in the same order):
        the tensor's owner reads it and broadcasts it to the others."""
        t = self._find(name_or_param)
        out = torch.empty(t.shape, dtype=torch.float32)
        flat = out.view(-1)
        at = 0
        for ep in t.parts:
            flat[at:at + ep.numel] = self._read_master(ep)
            at += ep.numel
        return out

    def _read_master(self, ep: EngineParam) -> torch.Tensor:
        lib = N.lib()
        owner = lib.zo_engine_tensor_owner(self._eng, ep.id) if self.world_size > 1 else 0
        out = torch.empty(ep.numel, dtype=torch.float32)
        if owner == self.rank:
            N.check(lib.zo_engine_read_master(self._eng, ep.id, ctypes.c_void_p(out.data_ptr())),
                    f"reading {ep.name}")
        if self.world_size > 1:
            buf = out.to("cuda") if self.device.cuda else out
            N.check(lib.zo_comm_broadcast(self.world.comm, self.device.stream,
                                          ctypes.c_void_p(buf.data_ptr()), ep.numel, N.DTYPE_F32,
                                          owner), f"broadcasting {ep.name} from rank {owner}")
            N.check(lib.zo_stream_synchronize(self.device.stream), f"broadcast of {ep.name}")
            out = buf.cpu() if self.device.cuda else buf
        return out

    def _find(self, key) -> _Tensor:
        if isinstance(key, nn.Parameter):
            t = self._tensor_of.get(id(key))
        else:
            t = next((e for e in self.tensors if e.name == key), None)
            if t is None:
                names = dict(self.module.named_parameters(remove_duplicate=False))
                if key in names:
                    t = self._tensor_of.get(id(names[key]))
        if t is None:
            raise ZoArgumentError(f"{key!r} is not a trainable parameter of the model")
        return t

    def module_state_dict(self, exclude_frozen_parameters: bool = False) -> Dict[str, torch.Tensor]:
        """The trained weights under the module's own names: fp32 masters for the engine's
        parameters (every name of a tied one), PyTorch's values for buffers and frozen ones."""
        out = {}
        for name, t in self.module.state_dict(keep_vars=True).items():
            if id(t) in self._tensor_of:
                out[name] = self.master_weight(t)
            elif not (exclude_frozen_parameters and isinstance(t, nn.Parameter)):
                out[name] = t.detach().clone()
        return out

    def export_to_model(self, model: Optional[nn.Module] = None,
                        dtype: torch.dtype = torch.float32) -> nn.Module:
        """Copy the trained weights into `model` (a fresh instance of the same class), or
        detach this engine from its own module and give the module back with ordinary PyTorch
        parameters holding them: then `model.save_pretrained(dir)` works as on any model."""
        sd = self.module_state_dict()
        if model is None:
            model = self.module
            self.destroy()
        for name, t in model.state_dict(keep_vars=True).items():
            if name in sd:
                src = sd[name]
                t.data = src.to(dtype=dtype if src.is_floating_point() else src.dtype)
        return model

    # ---- checkpoints ----
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True) -> str:
        from .checkpoint import save
        return save(self, save_dir, tag, client_state or {}, save_latest)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True,
                        load_optimizer_states=True, load_lr_scheduler_states=True,
                        load_module_only=False):
        from .checkpoint import load
        return load(self, load_dir, tag, load_optimizer_states and not load_module_only,
                    load_lr_scheduler_states and not load_module_only)

    # ---- figures ----
    def device_memory(self) -> Dict[str, int]:
        s = self.device.mem_stats()
        return {"budget": s.budget, "in_use": s.in_use, "high_water": s.high_water}

    def plan_summary(self) -> str:
        fp = self.footprint
        n_tiles = sum(len(t.parts) for t in self.tensors if len(t.parts) > 1)
        tiled = f" ({len(self.tile_rows)} weights in {n_tiles} row tiles)" if n_tiles else ""
        return (f"zoffload: {len(self.layers)} layers, {len(self.params)} tensors{tiled}, "
                f"{fp.n_chunks} chunks of {_mib(fp.chunk_bytes)}; device {_mib(fp.bytes[N.TIER_DEVICE])}, "
                f"pinned {_mib(fp.pinned)}, host {_mib(fp.bytes[N.TIER_HOST])}, nvme {_mib(fp.bytes[N.TIER_NVME])}; "
                f"params homed device/host/nvme {self.param_homes}, optimizer "
                f"{self.optim_homes}; {self.layer_mode} mode on the "
                f"{self.device.backend} device")

    def effective_config(self) -> Dict[str, Any]:
        """What this engine trains with, as resolved from the config (and a client optimizer):
        the optimizer and its hyper-parameters, clipping, precision and loss scaling, the
        schedule, batch sizes, ZeRO stage and where each state lives. zoffload_config() gives
        the parser's whole resolved config."""
        cfg = self.config
        f16 = cfg["fp16"]
        sched = cfg.get("scheduler")
        return {
            "optimizer": {"type": "AdamW" if self._adam["adamw"] else "Adam", **{
                k: self._adam[k] for k in ("lr", "betas", "eps", "weight_decay",
                                           "bias_correction")},
                "own_weight_decay": {t.name: self.own_of[id(t.param)]["weight_decay"]
                                     for t in self.tensors if "weight_decay"
                                     in self.own_of.get(id(t.param), {})},
                "own_adam": {t.name: {k: v for k, v in self.own_of[id(t.param)].items()
                                      if k != "weight_decay"}
                             for t in self.tensors
                             if self.own_of.get(id(t.param), {}).keys() - {"weight_decay"}}},
            "gradient_clipping": cfg["gradient_clipping"],
            "dtype": {N.DTYPE_BF16: "bf16", N.DTYPE_F16: "fp16", N.DTYPE_F32: "fp32"}[
                self.param_dtype],
            "loss_scale": (None if not f16["enabled"] else
                           {"dynamic": f16["loss_scale"] == 0,
                            "initial": self.loss_scale,
                            "window": f16["loss_scale_window"],
                            "hysteresis": f16["hysteresis"],
                            "min": f16["min_loss_scale"]}),
            "scheduler": sched,
            "batch": {"train_batch_size": self.train_batch_size_,
                      "micro_batch": self.micro_batch_size,
                      "gradient_accumulation_steps": self.gradient_accumulation_steps_,
                      "world_size": self.world_size},
            "zero_stage": int(cfg["zero_optimization"]["stage"]),
            "offload_param": cfg["zero_optimization"]["offload_param"]["device"],
            "offload_optimizer": cfg["zero_optimization"]["offload_optimizer"]["device"],
            "optimizer_mode": cfg["zoffload"]["optimizer_mode"],
            "optimizer_state_dtype": cfg["zoffload"]["optimizer_state_dtype"],
            "layers": len(self.layers), "mode": self.layer_mode,
        }

    def zoffload_config(self) -> Dict[str, Any]:
        """The parser's resolved config (every key, derived values filled in)."""
        return json.loads(json.dumps(self.config))

    # ---- teardown ----
    def _check_open(self) -> None:
        if self._closed:
            raise ZoStateError("this engine was destroyed (export_to_model or destroy): "
                               "initialize a new one")

    def destroy(self) -> None:
        """Give the module its ordinary PyTorch parameters back (the fp32 masters, in the
        dtype the engine computed in) and free every tier."""
        if self._closed:
            return
        for h in getattr(self, "_hooks", []):
            h.remove()
        for module, forward in getattr(self, "_wrapped_list", []):
            if module.__dict__.get("forward") is not None:
                del module.__dict__["forward"]
        for t in self.tensors:
            t.param.data = self.master_weight(t.param).to(
                device="cuda" if self.device.cuda else "cpu")
        self._free_native()
        setattr(self.module, _ENGINES_OF_MODEL, None)
        self._closed = True

    def _free_native(self) -> None:
        lib = N.lib()
        for lock in getattr(self, "_save_locks", {}).values():
            lib.zo_dir_unlock(lock)
        self._save_locks = {}
        if self._eng:
            lib.zo_engine_free(self._eng)
            self._eng = ctypes.c_void_p()
        if getattr(self, "world", None) is not None:
            self.world.close()  # before the device: its collectives ride on the device's streams
        if getattr(self, "device", None) is not None:
            self.device.close()

    def __del__(self):
        try:
            if not self._closed:
                self._free_native()
        except Exception:
            pass


def _device_backend(model: nn.Module) -> str:
    """cuda when the model's parameters are on a GPU (or ZOFFLOAD_DEVICE says so), else the
    emulated cpu device."""
    want = os.environ.get("ZOFFLOAD_DEVICE")
    if want:
        if want not in ("cpu", "cuda", "auto"):
            raise ZoConfigError(f"ZOFFLOAD_DEVICE={want!r}: use cpu, cuda or auto")
        return want
    dev = next(iter(model.parameters())).device
    return "cuda" if dev.type == "cuda" else "cpu"


def _nvme_paths(cfg: dict) -> List[str]:
    z, zo = cfg["zero_optimization"], cfg["zoffload"]
    paths = list(zo.get("nvme_paths") or [])
    if not paths:
        for part in ("offload_optimizer", "offload_param"):
            p = z[part]
            if p["device"] == "nvme" and p.get("nvme_path") and p["nvme_path"] not in paths:
                paths.append(p["nvme_path"])
    return paths


def _f32(x: float) -> float:
    """x rounded to fp32, as the engine holds its hyper-parameters."""
    return ctypes.c_float(float(x)).value


def _adam_of(cfg: dict) -> dict:
    o = cfg["optimizer"]
    p = o["params"]
    return {"lr": p["lr"], "betas": p["betas"], "eps": p["eps"],
            "weight_decay": p["weight_decay"], "bias_correction": p["bias_correction"],
            "adamw": o["type"].lower() == "adamw" or p["adam_w_mode"]}
