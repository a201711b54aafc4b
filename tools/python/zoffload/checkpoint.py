"""Checkpoints in zo-train's format, so that each trainer reads the other's:

    DIR/TAG/model.safetensors       fp32 master weights under the module's parameter names
    DIR/TAG/optimizer.safetensors   NAME.exp_avg, NAME.exp_avg_sq in the engine's state format
                                    (fp32, bf16, or int8 codes with NAME.exp_avg.absmax scales),
                                    metadata optimizer_state_dtype
    DIR/TAG/trainer_state.json      format, version, step, the engine's step state, the
                                    schedule, the model, the batch, the caller's client_state
    DIR/TAG/checksums.json          every tensor's xxh64 per file (zo_st_checksum, the C
                                    library's: Python's stdlib has no xxHash)
    DIR/latest                      the newest complete TAG (written last, atomically)

With several ranks (ZeRO), as zo-train writes them: each rank writes the tensors it owns to
model-0000R-of-0000N.safetensors, optimizer-0000R-of-0000N.safetensors and
checksums-0000R-of-0000N.json, and rank 0 the indices (model.safetensors.index.json,
optimizer.safetensors.index.json: Hugging Face's weight_map) and trainer_state.json. A
checkpoint loads at any number of ranks, sharded or not: each rank reads the tensors it owns.

A save builds DIR/TAG.tmp and renames it only when complete, so a crash leaves the previous
checkpoint and `latest` as they were. Tensors stream one at a time through the C safetensors
writer: saving never holds the whole model in host memory. Loading checks every name, dtype
and shape and refuses another model's checkpoint by name, then every tensor's checksum and
values (NaN/Inf, a negative second moment, moments no gradient makes) before the engine is
touched; a checkpoint saved before checksums existed loads with a warning."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import warnings
from typing import Optional

import torch

from . import _native as N
from .errors import ZoArgumentError, ZoIOError, ZoStateError

FORMAT, VERSION = "zoffload-checkpoint", 1
STATE_KEY = "optimizer_state_dtype"
_ELEM = {N.DTYPE_F32: 4, N.DTYPE_BF16: 2, N.DTYPE_U8: 1, N.DTYPE_I8: 1}
Q8_BLOCK = 256
SUMS = "checksums.json"
SUMS_FORMAT, SUMS_ALGO = "zoffload-checksums", "xxh64"
# zo-train's limits (checkpoint.c): a gradient of 1e10 bounds m, its square v.
MOMENT_LIMIT = {"exp_avg": 1e10, "exp_avg_sq": 1e20}


def _state_name(fmt: int):
    """The moment format's name (zo_state_format's), None for no format."""
    return next((n for n, d in N.state_formats().items() if d == fmt), None)


def _checksum(ptr: int, n: int) -> str:
    return f"{N.lib().zo_st_checksum(ctypes.c_void_p(ptr), n):016x}"


def _view(ptr: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
    """The bytes at ptr as a tensor (no copy; valid while the reader is open)."""
    if nbytes == 0:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(ptr), dtype=dtype)


def _moment_bytes(fmt: int, numel: int) -> int:
    """zo_adam_moment_bytes: the raw layout read_state_raw fills."""
    if fmt == N.DTYPE_I8:
        return ((numel + 3) & ~3) + _q8_blocks(numel) * 4
    return numel * _ELEM[fmt]


def _q8_blocks(numel: int) -> int:
    return (numel + Q8_BLOCK - 1) // Q8_BLOCK


def _file_dtype(fmt: int) -> int:
    return N.DTYPE_U8 if fmt == N.DTYPE_I8 else fmt


class _Writer:
    def __init__(self, path: str):
        self.path = path
        self.sums = {}
        self.h = ctypes.c_void_p()
        N.check(N.lib().zo_st_writer_init(ctypes.byref(self.h), path.encode()), path)

    def meta(self, k: str, v: str) -> None:
        N.check(N.lib().zo_st_writer_set_metadata(self.h, k.encode(), v.encode()), self.path)

    def declare(self, name: str, dtype: int, shape) -> None:
        dims = (ctypes.c_int64 * max(1, len(shape)))(*shape)
        N.check(N.lib().zo_st_writer_declare(self.h, name.encode(), dtype, len(shape), dims),
                f"{self.path}: {name}")

    def write(self, name: str, ptr: int, n: int) -> None:
        N.check(N.lib().zo_st_writer_write(self.h, name.encode(), ctypes.c_void_p(ptr), n),
                f"{self.path}: {name}")
        self.sums[name] = _checksum(ptr, n)

    def commit(self) -> None:
        N.check(N.lib().zo_st_writer_commit(self.h), self.path)

    def close(self) -> None:
        N.lib().zo_st_writer_free(self.h)
        self.h = ctypes.c_void_p()


class _Reader:
    def __init__(self, path: str):
        if not os.path.exists(path):
            raise ZoIOError(f"{path} does not exist: not a zoffload checkpoint directory")
        self.path = path
        self.h = ctypes.c_void_p()
        N.check(N.lib().zo_st_reader_open(ctypes.byref(self.h), path.encode()), path)

    def count(self) -> int:
        return N.lib().zo_st_reader_count(self.h)

    def meta(self, k: str) -> Optional[str]:
        v = N.lib().zo_st_reader_metadata(self.h, k.encode())
        return v.decode() if v else None

    def find(self, name: str) -> Optional[N.StTensorInfo]:
        info = N.sized(N.StTensorInfo)
        st = N.lib().zo_st_reader_find(self.h, name.encode(), ctypes.byref(info))
        if st < 0:
            N.lib().zo_clear_error()
            return None
        return info

    def expect(self, name: str, dtype: int, shape) -> N.StTensorInfo:
        info = self.find(name)
        if info is None:
            raise ZoArgumentError(f"{self.path} has no tensor {name!r}: the checkpoint is "
                                  f"another model's")
        got = tuple(info.shape[i] for i in range(info.ndim))
        if info.dtype != dtype or got != tuple(shape):
            raise ZoArgumentError(f"{self.path}: {name!r} is dtype {info.dtype} shape {got}, the "
                                  f"model needs dtype {dtype} shape {tuple(shape)}: the checkpoint "
                                  f"is another model's")
        return info

    def close(self) -> None:
        N.lib().zo_st_reader_free(self.h)
        self.h = ctypes.c_void_p()


def shard_name(base: str, rank: int, ranks: int, ext: str = ".safetensors") -> str:
    """zo-train's names (zt_st_shard_name): BASE.safetensors with one rank, else
    BASE-0000R-of-0000N.safetensors (R counted from 1)."""
    return f"{base}{ext}" if ranks == 1 else f"{base}-{rank + 1:05d}-of-{ranks:05d}{ext}"


class _Files:
    """One part of a checkpoint (model or optimizer): BASE.safetensors, or the shards its
    index BASE.safetensors.index.json maps every tensor to; readers open on first use."""

    def __init__(self, path: str, base: str):
        self.dir, self.base = path, base
        index = os.path.join(path, f"{base}.safetensors.index.json")
        self.index = None
        self.readers = {}
        if os.path.exists(index):
            try:
                with open(index) as f:
                    doc = json.load(f)
                wm, md = doc["weight_map"], doc.get("metadata", {})
                if not isinstance(wm, dict) or not all(isinstance(v, str) and "/" not in v
                                                       for v in wm.values()):
                    raise ValueError("weight_map must map names to file names")
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise ZoIOError(f"checkpoint index {index}: {e}") from None
            self.index, self.metadata = wm, md if isinstance(md, dict) else {}
        else:
            self._open(f"{base}.safetensors")

    def _open(self, file: str) -> _Reader:
        if file not in self.readers:
            self.readers[file] = _Reader(os.path.join(self.dir, file))
        return self.readers[file]

    def count(self) -> int:
        return len(self.index) if self.index is not None else self._open(
            f"{self.base}.safetensors").count()

    def meta(self, k: str) -> Optional[str]:
        if self.index is not None:
            v = self.metadata.get(k)
            return str(v) if v is not None else None
        return self._open(f"{self.base}.safetensors").meta(k)

    def reader(self, name: str) -> _Reader:
        """The file holding tensor name (an unknown name: the single file, which refuses it)."""
        if self.index is None:
            return self._open(f"{self.base}.safetensors")
        file = self.index.get(name)
        if file is None:
            raise ZoArgumentError(f"{self.dir}/{self.base}.safetensors.index.json has no tensor "
                                  f"{name!r}: the checkpoint is another model's")
        return self._open(file)

    def expect(self, name: str, dtype: int, shape):
        return self.reader(name).expect(name, dtype, shape)

    def close(self) -> None:
        for r in self.readers.values():
            r.close()
        self.readers = {}


def _sums_files(path: str) -> list:
    """checksums.json, or a sharded checkpoint's checksums-0000R-of-0000N.json."""
    names = sorted(n for n in os.listdir(path)
                   if n == SUMS or (n.startswith("checksums-") and n.endswith(".json")))
    return [os.path.join(path, n) for n in names]


def _read_sums(path: str) -> Optional[dict]:
    """The checksums of every file (all ranks' lists merged), or None (with a warning) for a
    checkpoint saved before checkpoints carried them."""
    files = _sums_files(path)
    if not files:
        warnings.warn(f"{path} has no {SUMS} (saved before checkpoints carried checksums): "
                      f"loading it unverified", stacklevel=3)
        return None
    out = {}
    for p in files:
        out.update(_read_sums_file(p))
    return out


def _read_sums_file(p: str) -> dict:
    try:
        with open(p) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise ZoIOError(f"checkpoint file {p}: {e}") from None
    if (not isinstance(doc, dict) or doc.get("format") != SUMS_FORMAT or
            doc.get("algorithm") != SUMS_ALGO or not isinstance(doc.get("files"), dict)):
        raise ZoIOError(f"checkpoint file {p} is not a {SUMS_FORMAT} list (expected \"format\": "
                        f"\"{SUMS_FORMAT}\", \"algorithm\": \"{SUMS_ALGO}\" and a \"files\" "
                        f"object)")
    return doc["files"]


def _verify(sums: Optional[dict], rd: _Reader, name: str, info, dtype: torch.dtype,
            limit: Optional[float] = None, nonneg: bool = False) -> None:
    """Tensor name of rd: its checksum (a corrupted file is named first), then its values."""
    file = os.path.basename(rd.path)
    if sums is not None:
        want = sums.get(file, {}).get(name) if isinstance(sums.get(file), dict) else None
        if want is None:
            raise ZoIOError(f"checkpoint file {rd.path}: no checksum recorded for tensor "
                            f"{name!r} ({SUMS} is incomplete): load another checkpoint")
        have = _checksum(info.data, info.nbytes)
        if have != want:
            raise ZoIOError(f"checkpoint file {rd.path}: tensor {name!r} does not match its "
                            f"checksum (xxh64 {want} recorded, {have} now): the file is "
                            f"corrupted; load another checkpoint")
    if dtype is None:
        return
    x = _view(info.data, info.nbytes, dtype).float()
    bad = ~torch.isfinite(x)
    why = "not finite"
    if nonneg and not bad.any():
        bad, why = x < 0, "second moments are squares, never negative"
    if limit is not None and not bad.any():
        bad, why = x.abs() > limit, f"beyond {limit:g}"
    if bad.any():
        i = int(bad.nonzero()[0, 0])
        raise ZoIOError(f"checkpoint {os.path.dirname(rd.path)}: tensor {name!r} in {file} has "
                        f"{x[i].item():g} at index {i} ({why}): the checkpoint is corrupted or "
                        f"was saved from a diverged run; load another checkpoint")


def _check_moments(sums, orr: "_Files", ep, tf: int) -> None:
    for k in ("exp_avg", "exp_avg_sq"):
        rd = orr.reader(f"{ep.name}.{k}")
        info = rd.expect(f"{ep.name}.{k}", _file_dtype(tf), ep.shape)
        if tf == N.DTYPE_I8:  # any code is a value; a block's scale bounds its magnitudes
            _verify(sums, rd, f"{ep.name}.{k}", info, None)
            sr = orr.reader(f"{ep.name}.{k}.absmax")
            sc = sr.expect(f"{ep.name}.{k}.absmax", N.DTYPE_F32, (_q8_blocks(ep.numel),))
            _verify(sums, sr, f"{ep.name}.{k}.absmax", sc, torch.float32, MOMENT_LIMIT[k],
                    True)
        else:
            _verify(sums, rd, f"{ep.name}.{k}", info,
                    torch.bfloat16 if tf == N.DTYPE_BF16 else torch.float32, MOMENT_LIMIT[k],
                    k == "exp_avg_sq")


def _buffers(eng, ep, fmt):
    master = torch.empty(ep.numel, dtype=torch.float32)
    nb = _moment_bytes(fmt, ep.numel)
    return master, torch.empty(nb, dtype=torch.uint8), torch.empty(nb, dtype=torch.uint8)


def _tensor_state_dtype(eng, t) -> int:
    """The state format of a (possibly tiled) tensor: every tile's, which must agree."""
    lib = N.lib()
    fmts = {lib.zo_engine_tensor_state_dtype(eng._eng, ep.id) for ep in t.parts}
    if len(fmts) != 1:
        raise ZoStateError(f"{t.name}'s tiles keep their optimizer states in different formats: "
                           f"not one tensor in a checkpoint")
    return fmts.pop()


def _joined(t):
    """For each tile of t: (elements before it, int8 blocks before it); tiles.py keeps every
    tile but the last a whole number of blocks, so a tiled tensor's codes and scales are the
    untiled tensor's, in the same places."""
    at, blocks = 0, 0
    for ep in t.parts:
        yield ep, at, blocks
        at += ep.numel
        blocks += _q8_blocks(ep.numel)


def _owner(eng, ep) -> int:
    """The rank holding an engine tensor's states (0 with one rank)."""
    return N.lib().zo_engine_tensor_owner(eng._eng, ep.id) if eng.world_size > 1 else 0


def _writer(eng, t) -> int:
    """The rank that writes tensor t to its shard: its first part's owner."""
    return _owner(eng, t.parts[0])


def _read_states(eng, t, fmt):
    """(master, m, v) of a tensor in the raw layout of one engine tensor of t.numel, on the
    rank that writes it (_writer; None on the others). Collective when t has parts owned by
    other ranks (a tiled tensor under ZeRO): each such part comes from its owner by
    broadcast, every rank taking part in the same order."""
    lib = N.lib()
    me, dest = eng.rank if eng.world_size > 1 else 0, _writer(eng, t)
    whole = _buffers(eng, t, fmt) if me == dest else None
    for ep, at, blocks in _joined(t):
        owner = _owner(eng, ep)
        if owner != me and owner == dest:
            continue  # the writer reads it itself
        part = whole if len(t.parts) == 1 else _buffers(eng, ep, fmt)
        if owner == me:
            N.check(lib.zo_engine_read_state_raw(eng._eng, ep.id,
                                                 ctypes.c_void_p(part[0].data_ptr()),
                                                 ctypes.c_void_p(part[1].data_ptr()),
                                                 ctypes.c_void_p(part[2].data_ptr())),
                    f"reading {ep.name}'s states")
        if owner != dest:
            part = [_broadcast(eng, x, owner, ep.name) for x in part]
        if me == dest and len(t.parts) > 1:
            whole[0][at:at + ep.numel] = part[0]
            for dst, src in zip(whole[1:], part[1:]):
                _copy_moment(dst, t.numel, at, blocks, src, ep.numel, fmt)
    return whole


def _broadcast(eng, x: torch.Tensor, root: int, name: str) -> torch.Tensor:
    """x's bytes from rank root to every rank (a device copy on CUDA)."""
    lib = N.lib()
    buf = x.to("cuda") if eng.device.cuda else x
    nbytes = buf.numel() * buf.element_size()
    N.check(lib.zo_comm_broadcast(eng.world.comm, eng.device.stream,
                                  ctypes.c_void_p(buf.data_ptr()), nbytes, N.DTYPE_U8, root),
            f"sending {name}'s states from rank {root}")
    N.check(lib.zo_stream_synchronize(eng.device.stream), f"broadcast of {name}")
    return buf.cpu() if eng.device.cuda else buf


def _copy_moment(dst, n_dst, at, blocks, src, n_src, fmt) -> None:
    """A tile's raw moments (codes, then int8 scales) into a whole tensor's at its place."""
    e = _ELEM[fmt]
    dst[at * e:(at + n_src) * e] = src[:n_src * e]
    if fmt == N.DTYPE_I8:
        d0, s0 = (n_dst + 3) & ~3, (n_src + 3) & ~3
        nb = _q8_blocks(n_src) * 4
        dst[d0 + blocks * 4:d0 + blocks * 4 + nb] = src[s0:s0 + nb]


def _write_states(eng, t, fmt, master_ptr: int, raws) -> None:
    """Restore a tensor's master (and raw moments, when raws) tile by tile: the tiles this
    rank owns (with several ranks each writes its own; zo_engine_share_params follows)."""
    lib = N.lib()
    me = eng.rank if eng.world_size > 1 else 0
    for ep, at, blocks in _joined(t):
        if _owner(eng, ep) != me:
            continue
        mp = ctypes.c_void_p(master_ptr + at * 4)
        if raws is None:
            N.check(lib.zo_engine_write_state(eng._eng, ep.id, mp, None, None),
                    f"restoring {ep.name}")
            continue
        parts = raws
        if len(t.parts) > 1:
            parts = [torch.empty(_moment_bytes(fmt, ep.numel), dtype=torch.uint8) for _ in raws]
            for dst, src in zip(parts, raws):
                _take_moment(dst, ep.numel, src, t.numel, at, blocks, fmt)
        N.check(lib.zo_engine_write_state_raw(eng._eng, ep.id, mp,
                                              ctypes.c_void_p(parts[0].data_ptr()),
                                              ctypes.c_void_p(parts[1].data_ptr())),
                f"restoring {ep.name}")


def _take_moment(dst, n_dst, src, n_src, at, blocks, fmt) -> None:
    """The inverse of _copy_moment: a tile's raw moments out of a whole tensor's."""
    e = _ELEM[fmt]
    dst[:n_dst * e] = src[at * e:(at + n_dst) * e]
    if fmt == N.DTYPE_I8:
        d0, s0 = (n_dst + 3) & ~3, (n_src + 3) & ~3
        nb = _q8_blocks(n_dst) * 4
        dst[d0:d0 + nb] = src[s0 + blocks * 4:s0 + blocks * 4 + nb]


def _write_tensors(eng, tmp: str, rank: int, ranks: int) -> None:
    """This rank's shard: the tensors it writes (_writer), their checksums beside them.
    Every rank walks every tensor, since a tensor with parts on other ranks is collective."""
    lib = N.lib()
    fmt = lib.zo_engine_state_dtype(eng._eng)
    names = [shard_name(b, rank, ranks) for b in ("model", "optimizer")]
    mw = _Writer(os.path.join(tmp, names[0]))
    ow = _Writer(os.path.join(tmp, names[1]))
    try:
        mw.meta("zoffload", "fp32 master weights")
        ow.meta(STATE_KEY, _state_name(fmt))
        fmts = {}
        for ep in eng.tensors:
            tf = _tensor_state_dtype(eng, ep)
            fmts[ep.name] = tf
            if _writer(eng, ep) != rank:
                continue
            mw.declare(ep.name, N.DTYPE_F32, ep.shape)
            for k in ("exp_avg", "exp_avg_sq"):
                ow.declare(f"{ep.name}.{k}", _file_dtype(tf), ep.shape)
                if tf == N.DTYPE_I8:
                    ow.declare(f"{ep.name}.{k}.absmax", N.DTYPE_F32, (_q8_blocks(ep.numel),))
        for ep in eng.tensors:
            tf = fmts[ep.name]
            got = _read_states(eng, ep, tf)
            if got is None:
                continue
            master, m, v = got
            if not torch.isfinite(master).all():
                raise ZoStateError(f"{ep.name}'s master weights hold NaN or Inf: not saving a "
                                   f"diverged model over good checkpoints")
            mw.write(ep.name, master.data_ptr(), ep.numel * 4)
            for k, raw in (("exp_avg", m), ("exp_avg_sq", v)):
                codes = ep.numel * _ELEM[tf]
                ow.write(f"{ep.name}.{k}", raw.data_ptr(), codes)
                if tf == N.DTYPE_I8:
                    ow.write(f"{ep.name}.{k}.absmax", raw.data_ptr() + ((ep.numel + 3) & ~3),
                             _q8_blocks(ep.numel) * 4)
        mw.commit()
        ow.commit()
        text = json.dumps({"format": SUMS_FORMAT, "algorithm": SUMS_ALGO,
                           "files": {names[0]: mw.sums, names[1]: ow.sums}},
                          indent=1, sort_keys=True).encode()
        sums = shard_name("checksums", rank, ranks, ".json")
        N.check(N.lib().zo_atomic_write_file(os.path.join(tmp, sums).encode(), text, len(text)),
                sums)
    finally:
        mw.close()
        ow.close()


def _write_indices(eng, tmp: str, ranks: int) -> None:
    """Rank 0, after every shard: Hugging Face's index of each part (zo-train's), naming
    every tensor's shard, the optimizer's with the state format and the ranks."""
    fmt = N.lib().zo_engine_state_dtype(eng._eng)
    model, optim, mbytes, obytes = {}, {}, 0, 0
    for ep in eng.tensors:
        r = _writer(eng, ep)
        tf = _tensor_state_dtype(eng, ep)
        model[ep.name] = shard_name("model", r, ranks)
        mbytes += ep.numel * 4
        for k in ("exp_avg", "exp_avg_sq"):
            optim[f"{ep.name}.{k}"] = shard_name("optimizer", r, ranks)
            obytes += ep.numel * _ELEM[tf]
            if tf == N.DTYPE_I8:
                optim[f"{ep.name}.{k}.absmax"] = shard_name("optimizer", r, ranks)
                obytes += _q8_blocks(ep.numel) * 4
    for base, meta, wm in (("model", {"total_size": mbytes}, model),
                           ("optimizer", {"total_size": obytes, STATE_KEY: _state_name(fmt),
                                          "world_size": ranks}, optim)):
        text = json.dumps({"metadata": meta, "weight_map": wm}, indent=2).encode()
        name = f"{base}.safetensors.index.json"
        N.check(N.lib().zo_atomic_write_file(os.path.join(tmp, name).encode(), text, len(text)),
                name)


def _agree(eng, err: Optional[BaseException], what: str, cleanup=None) -> None:
    """Every rank learns whether any failed `what` (one all-reduce): a rank that failed
    raises its own error, the others an error naming the ranks that failed. cleanup runs
    (on every rank) before raising."""
    failed = [0] if err is not None else []
    if eng.world_size > 1:
        flags = torch.zeros(eng.world_size, dtype=torch.float32)
        flags[eng.rank] = 1.0 if err is not None else 0.0
        buf = flags.to("cuda") if eng.device.cuda else flags
        lib = N.lib()
        N.check(lib.zo_comm_all_reduce(eng.world.comm, eng.device.stream,
                                       ctypes.c_void_p(buf.data_ptr()),
                                       ctypes.c_void_p(buf.data_ptr()), eng.world_size,
                                       N.DTYPE_F32, N.REDUCE_ORDER_GLOBAL), what)
        N.check(lib.zo_stream_synchronize(eng.device.stream), what)
        failed = [r for r, f in enumerate(buf.cpu().tolist()) if f != 0]
    if not failed:
        return
    if cleanup is not None:
        cleanup()
    if err is not None:
        raise err
    raise ZoStateError(f"{what} failed on rank{'s' if len(failed) > 1 else ''} "
                       f"{', '.join(map(str, failed))} (their errors say why): nothing of this "
                       f"checkpoint was kept")


def _attempt(fn, *args) -> Optional[BaseException]:
    """fn(*args)'s exception, or None: a rank's part of a collective stage, whose failure
    every rank must hear of (_agree) before any of them raises."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 - handed to _agree, which raises it
        return e
    return None


def _state(eng, client_state: dict) -> dict:
    lib = N.lib()
    es = N.sized(N.EngineStepState)
    N.check(lib.zo_engine_get_step_state(eng._eng, ctypes.byref(es)), "step state")
    sched = eng.lr_scheduler
    return {"format": FORMAT, "version": VERSION, "step": eng.global_steps,
            "engine": {"updates": es.updates, "steps": es.steps, "loss_scale": es.loss_scale,
                       "scaler_iter": es.scaler_iter,
                       "scaler_last_overflow_iter": es.scaler_last_overflow_iter,
                       "scaler_hysteresis": es.scaler_hysteresis},
            "scheduler": {"type": sched.kind if sched else "none",
                          "last_batch_iteration": sched.last_batch_iteration if sched else -1,
                          "lr": eng.get_lr()[0]},
            "model": {"class": type(eng.module).__name__, "tensors": len(eng.tensors),
                      "n_params": sum(t.numel for t in eng.tensors),
                      "dtype": {N.DTYPE_BF16: "bf16", N.DTYPE_F16: "fp16",
                                N.DTYPE_F32: "fp32"}[eng.param_dtype]},
            "batch": {"micro_batch": eng.micro_batch_size,
                      "grad_accum": eng.gradient_accumulation_steps_,
                      "world_size": eng.world_size},
            "counters": {"global_steps": eng.global_steps, "global_samples": eng.global_samples,
                         "micro_steps": eng.micro_steps, "skipped_steps": eng.skipped_steps},
            "client_state": client_state}


def _lock(eng, save_dir: str) -> None:
    """Hold save_dir for this engine until destroy (zo/dir_lock.h, zo-train's lock): another
    process saving there is refused, naming it, instead of mixing its checkpoints in."""
    locks = eng.__dict__.setdefault("_save_locks", {})
    key = os.path.realpath(save_dir)
    if key in locks:
        return
    h = ctypes.c_void_p()
    N.check(N.lib().zo_dir_lock(ctypes.byref(h), save_dir.encode(), b"save_checkpoint directory"),
            save_dir)
    locks[key] = h


def save(eng, save_dir, tag, client_state: dict, save_latest: bool) -> str:
    """Collective with several ranks: every rank calls it with the same directory and tag."""
    eng._check_open()
    if eng._micro_in_step:
        raise ZoStateError("save_checkpoint in the middle of gradient accumulation: call it "
                           "after the step() that ends the accumulation")
    try:
        json.dumps(client_state)
    except TypeError as e:
        raise ZoArgumentError(f"client_state must be JSON-serializable: {e}") from None
    N.check(N.lib().zo_engine_flush(eng._eng), "flushing the delayed update")
    save_dir = os.fspath(save_dir)
    tag = str(tag) if tag is not None else f"step-{eng.global_steps:08d}"
    if "/" in tag or tag in ("", ".", "..") or tag.endswith(".tmp"):
        raise ZoArgumentError(f"tag {tag!r} must be a plain directory name")
    rank, ranks = (eng.rank, eng.world_size) if eng.world_size > 1 else (0, 1)
    final = os.path.join(save_dir, tag)
    tmp = final + ".tmp"

    def drop_tmp():
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)

    def prepare():
        os.makedirs(save_dir, exist_ok=True)
        _lock(eng, save_dir)
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp)

    def finish():
        if ranks > 1:
            _write_indices(eng, tmp, ranks)
        text = json.dumps(_state(eng, client_state), indent=2).encode()
        N.check(N.lib().zo_atomic_write_file(os.path.join(tmp, "trainer_state.json").encode(),
                                             text, len(text)), "trainer_state.json")
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        N.check(N.lib().zo_fsync_parent_dir(final.encode()), final)
        if save_latest:
            line = f"{tag}\n".encode()
            N.check(N.lib().zo_atomic_write_file(os.path.join(save_dir, "latest").encode(),
                                                 line, len(line)), "latest")

    # rank 0 prepares the directory, every rank writes its shard, rank 0 the rest; each
    # stage ends with the ranks agreeing, so one rank failing fails all, naming it
    _agree(eng, _attempt(prepare) if rank == 0 else None, "preparing the checkpoint directory")
    _agree(eng, _attempt(_write_tensors, eng, tmp, rank, ranks), "writing the checkpoint",
           drop_tmp)
    _agree(eng, _attempt(finish) if rank == 0 else None, "finishing the checkpoint", drop_tmp)
    return final


def _resolve(load_dir: str, tag) -> str:
    if tag is None:
        latest = os.path.join(load_dir, "latest")
        if not os.path.exists(latest):
            raise ZoIOError(f"{load_dir} has no 'latest' file: pass tag=, or a directory written "
                            f"by save_checkpoint or zo-train --save")
        with N.open_input(latest, "the checkpoint's 'latest'") as f:
            tag = f.read().strip()
    path = os.path.join(load_dir, str(tag))
    if not os.path.isdir(path):
        raise ZoIOError(f"checkpoint {path} does not exist")
    return path


def load(eng, load_dir, tag, load_optimizer: bool, load_schedule: bool):
    """Restore the masters (and, asked, the moments, step state and schedule). Returns
    (path, client_state) as DeepSpeed's load_checkpoint does. Collective with several ranks:
    each rank checks and restores the tensors it owns, from whichever shard holds them (a
    checkpoint saved at any number of ranks), and nothing is restored anywhere unless every
    rank's checks passed; then the owners' weights reach every rank's 16-bit copies."""
    eng._check_open()
    lib = N.lib()
    path = _resolve(os.fspath(load_dir), tag)
    with N.open_input(os.path.join(path, "trainer_state.json"), "trainer_state.json") as f:
        state = json.load(f)
    if state.get("format") != FORMAT or state.get("version") != VERSION:
        raise ZoArgumentError(f"{path}/trainer_state.json is format {state.get('format')!r} "
                              f"version {state.get('version')!r}, not {FORMAT!r} {VERSION}")
    opened = []
    try:
        _agree(eng, _attempt(_open_checked, eng, path, load_optimizer, opened),
               f"checking checkpoint {path}")
        mr, orr = opened
        _agree(eng, _attempt(_restore, eng, mr, orr), f"restoring checkpoint {path}")
    finally:
        for f in opened:
            if f is not None:
                f.close()
    if eng.world_size > 1:
        N.check(lib.zo_engine_share_params(eng._eng), "sharing the restored weights")
    if load_optimizer:
        _restore_counters(eng, state)
    if load_schedule and eng.lr_scheduler is not None and state["scheduler"]["type"] != "none":
        eng.lr_scheduler.last_batch_iteration = int(state["scheduler"]["last_batch_iteration"])
        eng._set_engine_lr()
    return path, state.get("client_state", {})


def _mine(eng, t) -> bool:
    me = eng.rank if eng.world_size > 1 else 0
    return any(_owner(eng, ep) == me for ep in t.parts)


def _open_checked(eng, path: str, load_optimizer: bool, opened: list) -> None:
    """Open the checkpoint's model (and optimizer) files into opened, and check them before
    the engine is touched: every name, dtype and shape, then the checksums and values of the
    tensors this rank owns."""
    lib = N.lib()
    sums = _read_sums(path)
    mr = _Files(path, "model")
    opened.append(mr)
    orr = _Files(path, "optimizer") if load_optimizer else None
    opened.append(orr)
    if mr.count() != len(eng.tensors):
        raise ZoArgumentError(f"{path} holds {mr.count()} model tensors, this model "
                              f"{len(eng.tensors)}: the checkpoint is another model's")
    fmt = N.state_formats().get(orr.meta(STATE_KEY) or "fp32") if orr else None
    if orr is not None and fmt != lib.zo_engine_state_dtype(eng._eng):
        raise ZoArgumentError(f"{path}'s optimizer holds {orr.meta(STATE_KEY)} states, the "
                              f"engine {_state_name(lib.zo_engine_state_dtype(eng._eng))}"
                              f": set zoffload.optimizer_state_dtype to match")
    for ep in eng.tensors:  # every name, dtype and shape first: all or nothing
        mr.expect(ep.name, N.DTYPE_F32, ep.shape)
    for ep in eng.tensors:  # then every checksum and value this rank will restore
        if not _mine(eng, ep):
            continue
        rd = mr.reader(ep.name)
        _verify(sums, rd, ep.name, rd.expect(ep.name, N.DTYPE_F32, ep.shape), torch.float32)
        if orr is not None:
            _check_moments(sums, orr, ep, _tensor_state_dtype(eng, ep))


def _restore(eng, mr: "_Files", orr: Optional["_Files"]) -> None:
    for ep in eng.tensors:
        if not _mine(eng, ep):
            continue
        ptr = mr.expect(ep.name, N.DTYPE_F32, ep.shape).data
        if orr is None:
            _write_states(eng, ep, None, ptr, None)
            continue
        tf = _tensor_state_dtype(eng, ep)
        raw = [_moment_raw(orr, ep, k, tf) for k in ("exp_avg", "exp_avg_sq")]
        _write_states(eng, ep, tf, ptr, raw)


def _restore_counters(eng, state: dict) -> None:
    e = state["engine"]
    es = N.sized(N.EngineStepState, updates=e["updates"], steps=e["steps"],
                 loss_scale=e["loss_scale"], scaler_iter=e["scaler_iter"],
                 scaler_last_overflow_iter=e["scaler_last_overflow_iter"],
                 scaler_hysteresis=e["scaler_hysteresis"])
    N.check(N.lib().zo_engine_set_step_state(eng._eng, ctypes.byref(es)), "step state")
    c = state.get("counters", {})
    eng.global_steps = int(c.get("global_steps", state.get("step", 0)))
    eng.global_samples = int(c.get("global_samples", 0))
    eng.micro_steps = int(c.get("micro_steps", 0))
    eng.skipped_steps = int(c.get("skipped_steps", 0))


def _moment_raw(orr: "_Files", ep, k: str, tf: int) -> torch.Tensor:
    info = orr.expect(f"{ep.name}.{k}", _file_dtype(tf), ep.shape)
    raw = torch.empty(_moment_bytes(tf, ep.numel), dtype=torch.uint8)
    ctypes.memmove(raw.data_ptr(), info.data, ep.numel * _ELEM[tf])
    if tf == N.DTYPE_I8:
        sc = orr.expect(f"{ep.name}.{k}.absmax", N.DTYPE_F32, (_q8_blocks(ep.numel),))
        ctypes.memmove(raw.data_ptr() + ((ep.numel + 3) & ~3), sc.data, _q8_blocks(ep.numel) * 4)
    return raw
