"""Finding and loading libzoffload, and the C API as ctypes sees it.

The C library is the implementation; this module only declares its functions
(argument and result types) and mirrors the structs the package passes across
the boundary. tests/python/test_layout.py checks every mirrored struct against
the C compiler's layout (sizes and offsets), so the two cannot drift.

Where the library is looked for, in order:
  1. the file ZOFFLOAD_LIBRARY names (an error if it cannot be loaded);
  2. an installed prefix: the package's own lib/ folder, sys.prefix/lib, then
     the dynamic linker's search path (ldconfig, LD_LIBRARY_PATH);
  3. the build tree of the checkout this package sits in (build/ beside
     tools/, or ZOFFLOAD_BUILD_DIR).
library_path() says which file was loaded.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import sys
from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int, c_int64,
                    c_size_t, c_uint, c_uint32, c_uint64, c_void_p)
from pathlib import Path
from typing import Dict

from .errors import ZoError, error_for_status

_LIB_NAME = "libzoffload.so"
_CONFIG_LIB_NAME = "libzoffload_dsconfig.so"

# ---- enums (zo/dtype.h, zo/engine.h, zo/optim_mode.h, zo/status.h) ----
DTYPE_F32, DTYPE_BF16, DTYPE_F16, DTYPE_NONE = 0, 1, 2, 3
DTYPE_U8, DTYPE_I8 = 8, 9
TIER_DEVICE, TIER_HOST, TIER_NVME = 0, 1, 2
TIER_NAMES = ("device", "host", "nvme")
TIER_COUNT, TIER_MAX = 3, 8  # the tiers built in; the entries of an array a tier indexes
PHASE_FORWARD, PHASE_BACKWARD = 0, 1
OPTIM_SYNC, OPTIM_OVERLAP, OPTIM_DPU = 0, 1, 2
REDUCE_ORDER_GLOBAL, REDUCE_ORDER_RANK = 0, 1
DEVCAP_REAL_GPU, DEVCAP_HOST_ADDRESSABLE = 1 << 0, 1 << 1
ERR_UNSUPPORTED = -9


# ---- structs (field order and types exactly as in the C headers) ----
class DeviceConfig(Structure):  # zo_device_config, zo/device.h
    _fields_ = [("struct_size", c_size_t), ("backend", c_char_p), ("ordinal", c_int),
                ("mem_budget", c_uint64), ("cpu_copy_threads", c_int)]


class DeviceInfo(Structure):  # zo_device_info
    _fields_ = [("struct_size", c_size_t), ("backend", c_char * 16), ("name", c_char * 256),
                ("ordinal", c_int), ("total_mem", c_uint64), ("budget", c_uint64),
                ("cc_major", c_int), ("cc_minor", c_int), ("multiprocessors", c_int),
                ("pci_bus_id", c_char * 32), ("caps", c_uint)]


class DeviceMemStats(Structure):  # zo_device_mem_stats
    _fields_ = [("budget", c_uint64), ("in_use", c_uint64), ("high_water", c_uint64),
                ("n_allocs", c_uint64), ("n_failed", c_uint64)]


class AdamParams(Structure):  # zo_adam_params, zo/optim.h
    _fields_ = [("struct_size", c_size_t), ("lr", c_float), ("beta1", c_float),
                ("beta2", c_float), ("eps", c_float), ("weight_decay", c_float),
                ("step", c_int64), ("adamw", c_int), ("bias_correction", c_int),
                ("grad_scale", c_float), ("simd_level", c_int)]


class LossScalerConfig(Structure):  # zo_loss_scaler_config
    _fields_ = [("struct_size", c_size_t), ("loss_scale", c_double),
                ("initial_scale_power", c_int), ("loss_scale_window", c_int),
                ("hysteresis", c_int), ("consecutive_hysteresis", c_int),
                ("min_loss_scale", c_double), ("raise_error_at_min_scale", c_int)]


class StateFormat(Structure):  # zo_state_format, zo/optim.h (one of Adam's moment formats)
    _fields_ = [("name", c_char_p), ("dtype", c_int), ("code_dtype", c_int), ("code_bits", c_uint),
                ("block", c_size_t), ("min_numel", c_size_t), ("fused", c_int),
                ("summary", c_char_p), ("moment_bytes", c_void_p), ("encode", c_void_p),
                ("decode", c_void_p)]


class EngineCaps(Structure):  # zo_engine_caps, zo/engine.h
    _fields_ = [("bytes", c_uint64 * TIER_MAX)]  # by tier


class EngineConfig(Structure):  # zo_engine_config
    _fields_ = [("struct_size", c_size_t), ("device", c_void_p), ("rank", c_int),
                ("world_size", c_int), ("param_dtype", c_int), ("chunk_bytes", c_size_t),
                ("param_home", c_int), ("optim_home", c_int), ("device_bytes", c_uint64),
                ("pinned_bytes", c_uint64), ("nvme_paths", POINTER(c_char_p)),
                ("n_nvme_paths", c_size_t), ("nvme_bytes", c_uint64), ("nvme_engine", c_char_p),
                ("lookahead", c_int), ("mode", c_int), ("grad_accum_steps", c_int),
                ("optim_threads", c_int), ("adam", AdamParams), ("max_grad_norm", c_float),
                ("loss_scaler", LossScalerConfig), ("nvme_name", c_char_p),
                ("nvme_queue_depth", c_uint32), ("nvme_block_size", c_uint32),
                ("param_caps", EngineCaps), ("optim_caps", EngineCaps), ("host_bytes", c_uint64),
                ("micro_group", c_int), ("state_dtype", c_int), ("zero_stage", c_int),
                ("comm", c_void_p), ("zero_persist_elems", c_uint64), ("master_split", c_int),
                ("host_node", c_int), ("pipe_comm", c_void_p), ("reduce_order", c_int),
                ("update_behind", c_int)]


class EngineFootprint(Structure):  # zo_engine_footprint
    _fields_ = [("struct_size", c_size_t), ("bytes", c_uint64 * TIER_MAX), ("pinned", c_uint64),
                ("chunk_bytes", c_uint64),
                ("n_chunks", c_uint32), ("max_chunks_per_layer", c_uint32),
                ("device_param_slots", c_uint32), ("device_grad_slots", c_uint32),
                ("n_params", c_uint64), ("param_staging", c_uint64), ("grad_pinned", c_uint64),
                ("grad_host", c_uint64), ("grad_nvme", c_uint64), ("grad_stage", c_uint64),
                ("param_gather", c_uint64)]


class StepStats(Structure):  # zo_step_stats
    _fields_ = [("struct_size", c_size_t), ("step", c_int64), ("grad_norm", c_double),
                ("overflow", c_int), ("clipped", c_int), ("loss_scale", c_double),
                ("rollbacks", c_int), ("h2d_bytes", c_uint64), ("d2h_bytes", c_uint64),
                ("nvme_read_bytes", c_uint64), ("nvme_write_bytes", c_uint64),
                ("step_seconds", c_double), ("stall_seconds", c_double),
                ("optim_seconds", c_double), ("h2d_seconds", c_double),
                ("d2h_seconds", c_double), ("nvme_seconds", c_double),
                ("peak", c_uint64 * TIER_MAX), ("peak_pinned", c_uint64),
                ("fetch_hits", c_uint64), ("fetch_misses", c_uint64),
                ("evictions", c_uint64), ("prefetches", c_uint64)]


class EngineStepState(Structure):  # zo_engine_step_state
    _fields_ = [("struct_size", c_size_t), ("updates", c_int64), ("steps", c_int64),
                ("loss_scale", c_double), ("scaler_iter", c_int64),
                ("scaler_last_overflow_iter", c_int64), ("scaler_hysteresis", c_int)]


class LaunchConfig(Structure):  # zo_launch_config, zo/launch.h
    _fields_ = [("struct_size", c_size_t), ("rank", c_int), ("world_size", c_int),
                ("local_rank", c_int), ("master_addr", c_char_p), ("master_port", c_int)]


class RankInfo(Structure):  # zo_rank_info
    _fields_ = [("struct_size", c_size_t), ("rank", c_int), ("world_size", c_int),
                ("local_rank", c_int), ("launcher", c_char * 16), ("master_addr", c_char * 256),
                ("master_port", c_int)]


class CommConfig(Structure):  # zo_comm_config, zo/comm.h
    _fields_ = [("struct_size", c_size_t), ("backend", c_char_p), ("device", c_void_p),
                ("launch", LaunchConfig), ("timeout_s", c_double),
                ("exact_segment_bytes", c_size_t), ("device_buffers_only", c_int)]


class EngineLayout(Structure):  # zo_engine_layout, zo/engine.h
    _fields_ = [("struct_size", c_size_t), ("n_tensors", c_size_t), ("numel", POINTER(c_size_t)),
                ("layer", POINTER(c_int)), ("keep_f32", POINTER(ctypes.c_ubyte))]


class StTensorInfo(Structure):  # zo_st_tensor_info, zo/safetensors.h
    _fields_ = [("struct_size", c_size_t), ("name", c_char_p), ("dtype", c_int), ("ndim", c_int),
                ("shape", c_int64 * 8), ("nbytes", c_uint64), ("file_offset", c_uint64),
                ("data", c_void_p)]


MIRRORED = {"zo_st_tensor_info": StTensorInfo, "zo_engine_layout": EngineLayout, "zo_device_config": DeviceConfig, "zo_device_info": DeviceInfo,
            "zo_device_mem_stats": DeviceMemStats, "zo_adam_params": AdamParams,
            "zo_loss_scaler_config": LossScalerConfig, "zo_state_format": StateFormat,
            "zo_engine_caps": EngineCaps,
            "zo_engine_config": EngineConfig, "zo_engine_footprint": EngineFootprint,
            "zo_step_stats": StepStats, "zo_engine_step_state": EngineStepState,
            "zo_launch_config": LaunchConfig, "zo_rank_info": RankInfo,
            "zo_comm_config": CommConfig}


def sized(cls, **fields):
    """An instance of a mirrored struct with struct_size set, as the C *_INIT macros do."""
    s = cls()
    if "struct_size" in dict(cls._fields_):
        s.struct_size = ctypes.sizeof(cls)
    for k, v in fields.items():
        setattr(s, k, v)
    return s


def adam_params_init() -> AdamParams:  # ZO_ADAM_PARAMS_INIT
    return sized(AdamParams, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, step=1, adamw=1,
                 bias_correction=1, grad_scale=1.0, simd_level=-1)


def loss_scaler_init() -> LossScalerConfig:  # ZO_LOSS_SCALER_CONFIG_INIT
    return sized(LossScalerConfig, initial_scale_power=16, loss_scale_window=1000,
                 hysteresis=2, min_loss_scale=1.0, raise_error_at_min_scale=1)


def engine_config_init() -> EngineConfig:  # ZO_ENGINE_CONFIG_INIT
    return sized(EngineConfig, world_size=1, param_dtype=DTYPE_BF16, param_home=TIER_HOST,
                 optim_home=TIER_HOST, nvme_engine=b"auto", lookahead=2, mode=OPTIM_SYNC,
                 grad_accum_steps=1, adam=adam_params_init(), loss_scaler=loss_scaler_init(),
                 host_node=-1)


# ---- the functions: name -> (result type, argument types) ----
_P = c_void_p
_SIGNATURES = {
    "zo_status_str": (c_char_p, [c_int]),
    "zo_last_error": (c_char_p, []),
    "zo_clear_error": (None, []),
    "zo_file_open_read": (c_int, [c_char_p, POINTER(c_int)]),
    "zo_device_cuda_count": (c_int, []),
    "zo_device_cuda_built": (c_int, []),
    "zo_device_init": (c_int, [POINTER(_P), POINTER(DeviceConfig)]),
    "zo_device_free": (None, [_P]),
    "zo_device_backend": (c_char_p, [_P]),
    "zo_device_caps": (c_uint, [_P]),
    "zo_device_get_info": (c_int, [_P, POINTER(DeviceInfo)]),
    "zo_device_mem_get_stats": (c_int, [_P, POINTER(DeviceMemStats)]),
    "zo_device_mem_reset_high_water": (None, [_P]),
    "zo_device_synchronize": (c_int, [_P]),
    "zo_stream_create": (c_int, [_P, POINTER(_P)]),
    "zo_stream_destroy": (c_int, [_P]),
    "zo_stream_synchronize": (c_int, [_P]),
    "zo_state_format_at": (POINTER(StateFormat), [c_size_t]),
    "zo_engine_init": (c_int, [POINTER(_P), POINTER(EngineConfig)]),
    "zo_engine_free": (None, [_P]),
    "zo_engine_register": (c_int, [_P, c_int, c_char_p, c_size_t, _P, POINTER(c_int)]),
    "zo_engine_keep_f32_states": (c_int, [_P, c_int]),
    "zo_engine_set_weight_decay": (c_int, [_P, c_int, c_float]),
    "zo_engine_set_tensor_adam": (c_int, [_P, c_int, c_double, c_float, c_float, c_float]),
    "zo_engine_plan": (c_int, [_P, POINTER(EngineFootprint), POINTER(c_int), c_char_p, c_size_t]),
    "zo_engine_finalize": (c_int, [_P]),
    "zo_engine_footprint_for": (c_int, [POINTER(EngineConfig), POINTER(EngineLayout),
                                        POINTER(EngineFootprint), POINTER(c_int), c_char_p,
                                        c_size_t]),
    "zo_engine_fetch": (c_int, [_P, c_int, c_int, _P, POINTER(_P), POINTER(_P), c_int]),
    "zo_engine_release": (c_int, [_P, c_int, _P]),
    "zo_engine_grads_ready": (c_int, [_P, c_int, _P]),
    "zo_engine_end_step": (c_int, [_P, POINTER(StepStats)]),
    "zo_engine_abandon_step": (c_int, [_P]),
    "zo_engine_read_master": (c_int, [_P, c_int, _P]),
    "zo_engine_set_lr": (c_int, [_P, c_float]),
    "zo_engine_lr": (c_float, [_P]),
    "zo_engine_loss_scale": (c_double, [_P]),
    "zo_engine_footprint_get": (c_int, [_P, POINTER(EngineFootprint)]),
    "zo_engine_homes": (c_int, [_P, POINTER(c_uint32), POINTER(c_uint32)]),
    "zo_engine_read_state": (c_int, [_P, c_int, _P, _P, _P]),
    "zo_engine_write_state": (c_int, [_P, c_int, _P, _P, _P]),
    "zo_engine_read_state_raw": (c_int, [_P, c_int, _P, _P, _P]),
    "zo_engine_write_state_raw": (c_int, [_P, c_int, _P, _P, _P]),
    "zo_engine_state_dtype": (c_int, [_P]),
    "zo_engine_tensor_state_dtype": (c_int, [_P, c_int]),
    "zo_engine_flush": (c_int, [_P]),
    "zo_engine_tensor_owner": (c_int, [_P, c_int]),
    "zo_engine_share_params": (c_int, [_P]),
    "zo_engine_get_step_state": (c_int, [_P, POINTER(EngineStepState)]),
    "zo_engine_set_step_state": (c_int, [_P, POINTER(EngineStepState)]),
    "zo_launch_discover": (c_int, [POINTER(LaunchConfig), POINTER(RankInfo)]),
    "zo_launch_rendezvous": (c_int, [POINTER(RankInfo), c_void_p, c_void_p, c_size_t, c_double]),
    "zo_comm_backend_built": (c_int, [c_char_p]),
    "zo_comm_init": (c_int, [POINTER(_P), POINTER(CommConfig)]),
    "zo_comm_free": (None, [_P]),
    "zo_comm_rank": (c_int, [_P]),
    "zo_comm_size": (c_int, [_P]),
    "zo_comm_backend": (c_char_p, [_P]),
    "zo_comm_barrier": (c_int, [_P, _P]),
    "zo_comm_broadcast": (c_int, [_P, _P, _P, c_size_t, c_int, c_int]),
    "zo_comm_all_reduce": (c_int, [_P, _P, _P, _P, c_size_t, c_int, c_int]),
    "zo_st_writer_init": (c_int, [POINTER(_P), c_char_p]),
    "zo_st_writer_set_metadata": (c_int, [_P, c_char_p, c_char_p]),
    "zo_st_writer_declare": (c_int, [_P, c_char_p, c_int, c_int, POINTER(c_int64)]),
    "zo_st_writer_write": (c_int, [_P, c_char_p, _P, c_size_t]),
    "zo_st_writer_commit": (c_int, [_P]),
    "zo_st_writer_free": (None, [_P]),
    "zo_st_reader_open": (c_int, [POINTER(_P), c_char_p]),
    "zo_st_reader_free": (None, [_P]),
    "zo_st_reader_count": (c_size_t, [_P]),
    "zo_st_reader_at": (c_int, [_P, c_size_t, POINTER(StTensorInfo)]),
    "zo_st_reader_find": (c_int, [_P, c_char_p, POINTER(StTensorInfo)]),
    "zo_st_reader_metadata": (c_char_p, [_P, c_char_p]),
    "zo_st_checksum": (c_uint64, [_P, c_size_t]),
    "zo_dir_lock": (c_int, [POINTER(_P), c_char_p, c_char_p]),
    "zo_dir_unlock": (None, [_P]),
    "zo_atomic_write_file": (c_int, [c_char_p, _P, c_size_t]),
    "zo_fsync_parent_dir": (c_int, [c_char_p]),
}
# Present only in builds that have them (checked with hasattr before use).
_OPTIONAL = {
    "zo_stream_wrap": (c_int, [_P, _P, POINTER(_P)]),
}
_CONFIG_SIGNATURES = {
    "zo_pyconfig_resolve": (c_int, [c_char_p, c_char_p, POINTER(c_char_p), c_int, c_int64,
                                    POINTER(c_void_p), c_char_p, c_size_t]),
    "zo_pyconfig_free": (None, [c_void_p]),
}


def _checkout_build_dirs():
    """Build folders of the checkout this package sits in (tools/python/zoffload)."""
    dirs = []
    if os.environ.get("ZOFFLOAD_BUILD_DIR"):
        dirs.append(Path(os.environ["ZOFFLOAD_BUILD_DIR"]))
    root = Path(__file__).resolve().parents[3]
    if (root / "CMakeLists.txt").is_file() and (root / "offload").is_dir():
        dirs.append(root / "build")
    return dirs


def _installed_candidates(name):
    here = Path(__file__).resolve().parent
    cands = [here / "lib" / name, Path(sys.prefix) / "lib" / name]
    found = ctypes.util.find_library(name[3:-3])
    if found:
        cands.append(Path(found))
    cands.append(Path(name))  # the dynamic linker's own search (LD_LIBRARY_PATH, ld.so.cache)
    return cands


def _try_load(path):
    try:
        return ctypes.CDLL(str(path)), None
    except OSError as e:
        return None, str(e)


def _locate(name, env_var):
    """(CDLL, path, how) for the first loadable candidate; raises naming every place tried."""
    env = os.environ.get(env_var)
    if env:
        lib, why = _try_load(env)
        if lib is None:
            raise ZoError(f"{env_var}={env} cannot be loaded: {why}; point it at a built "
                          f"{name} (cmake --build build makes build/{name})")
        return lib, env, env_var
    tried = []
    for cand in _installed_candidates(name):
        if cand.is_absolute() and not cand.exists():
            tried.append(str(cand))
            continue
        lib, why = _try_load(cand)
        if lib is not None:
            return lib, _loaded_path(lib, cand), "installed prefix"
        tried.append(f"{cand} ({why})" if cand.is_absolute() else str(cand))
    for d in _checkout_build_dirs():
        cands = [d / name] + sorted(d.glob(f"**/{name}"))
        for cand in cands:
            if cand.exists():
                lib, why = _try_load(cand)
                if lib is not None:
                    return lib, str(cand), "build tree"
                tried.append(f"{cand} ({why})")
        tried.append(str(d / name))
    raise ZoError(f"{name} not found (tried {', '.join(tried)}): build the C library "
                  f"(cmake -S . -B build && cmake --build build), install it, or set {env_var}")


def _loaded_path(lib, cand):
    """The file the dynamic linker actually opened for lib."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip().endswith(Path(str(cand)).name.split(".so")[0] + ".so") or \
                        Path(str(cand)).name in line:
                    return line.split()[-1]
    except OSError:
        pass
    return str(cand)


def _declare(lib, sigs, optional=False):
    for fname, (res, args) in sigs.items():
        try:
            fn = getattr(lib, fname)
        except AttributeError:
            if optional:
                continue
            raise ZoError(f"{fname} is missing from the loaded library: it is older than this "
                          f"package; rebuild libzoffload from the same checkout")
        fn.restype = res
        fn.argtypes = args


class _Native:
    """The loaded libraries, loaded once on first use."""

    def __init__(self):
        self._lib = None
        self._cfg = None
        self.path = self.how = None
        self.config_path = None

    @property
    def lib(self):
        if self._lib is None:
            lib, self.path, self.how = _locate(_LIB_NAME, "ZOFFLOAD_LIBRARY")
            _declare(lib, _SIGNATURES)
            _declare(lib, _OPTIONAL, optional=True)
            self._lib = lib
        return self._lib

    @property
    def config_lib(self):
        if self._cfg is None:
            _ = self.lib
            # Beside the library that was loaded first, so the two always come from one build.
            beside = Path(self.path).parent / _CONFIG_LIB_NAME
            if beside.exists() and not os.environ.get("ZOFFLOAD_CONFIG_LIBRARY"):
                lib, why = _try_load(beside)
                if lib is None:
                    raise ZoError(f"{beside} cannot be loaded: {why}")
                self.config_path = str(beside)
            else:
                lib, self.config_path, _ = _locate(_CONFIG_LIB_NAME, "ZOFFLOAD_CONFIG_LIBRARY")
            _declare(lib, _CONFIG_SIGNATURES)
            self._cfg = lib
        return self._cfg


native = _Native()


def lib():
    return native.lib


@functools.lru_cache(maxsize=None)
def state_formats() -> Dict[str, int]:
    """{name: zo_dtype} of Adam's moment formats, in the table's order (zo_state_format_at):
    the names optimizer_state_dtype and checkpoints spell."""
    out, i = {}, 0
    while True:
        f = lib().zo_state_format_at(i)
        if not f:
            return out
        out[f.contents.name.decode()] = f.contents.dtype
        i += 1


def library_path() -> str:
    """The libzoffload file this process loaded (loading it if needed), and how it was found."""
    _ = native.lib
    return native.path


def check(status: int, what: str) -> int:
    """Raise the status's exception with the library's last error text when status < 0."""
    if status >= 0:
        return status
    l = native.lib
    text = l.zo_last_error()
    text = text.decode(errors="replace") if text else ""
    name = l.zo_status_str(status)
    name = name.decode() if name else str(status)
    l.zo_clear_error()
    raise error_for_status(status, f"{what}: {_cause(text) or name}", name, text)


def open_input(path, what: str, binary: bool = False):
    """Open a file the package reads the library's one way (zo/file.h): a FIFO, a device, a
    socket or a directory is refused by name before a byte is read (a FIFO would block)."""
    fd = c_int(-1)
    check(lib().zo_file_open_read(os.fsencode(path), ctypes.byref(fd)), what)
    return os.fdopen(fd.value, "rb" if binary else "r", encoding=None if binary else "utf-8")


_FRAME = re.compile(r"(?<![A-Za-z0-9])[A-Za-z0-9_-]+\.[A-Za-z]{1,3}:[0-9]+: ")


def _cause(text: str) -> str:
    """The cause in the library's message: the text after its innermost 'file.c:LINE: status: '
    frame (each layer that passed the error on added one; all are kept in ZoError.detail)."""
    frames = list(_FRAME.finditer(text))
    if not frames:
        return text
    rest = text[frames[-1].end():]
    head, sep, tail = rest.partition(": ")
    known = {"invalid argument", "out of host memory", "out of device memory", "budget exceeded",
             "I/O error", "no space left on device", "data corruption detected", "not supported",
             "configuration error", "invalid state", "not found", "already exists",
             "system error", "internal error", "numeric overflow", "pinning host memory failed"}
    return tail if sep and head in known else rest
