"""DeepSpeed JSON configs, read by zo-train's own strict parser (libzoffload_dsconfig).

`resolve_config` takes what deepspeed.initialize takes as `config` (a path, a dict or JSON
text), hands it to the C parser with any "key=value" overrides, and returns the effective
config as a dict: every key, batch sizes derived as DeepSpeed derives them. Unknown or
misspelled keys raise ZoConfigError naming the key's path and the nearest valid key (where
DeepSpeed would ignore them silently).
"""
from __future__ import annotations

import ctypes
import json
import os
from typing import Any, Iterable, Mapping, Union

from . import _native
from .errors import ZoConfigError, ZoError

ConfigLike = Union[str, os.PathLike, Mapping[str, Any]]


def _text_of(config: ConfigLike) -> tuple[str, str]:
    """(JSON text, origin for messages) of a path, a mapping or JSON text."""
    if isinstance(config, Mapping):
        try:
            return json.dumps(config), "<config dict>"
        except TypeError as e:
            raise ZoConfigError(f"the config dict is not JSON-serializable: {e}") from None
    if isinstance(config, os.PathLike) or (isinstance(config, str)
                                           and not config.lstrip().startswith("{")):
        path = os.fspath(config)
        try:
            with _native.open_input(path, "config file") as f:
                return f.read(), path
        except ZoError as e:
            raise ZoConfigError(f"{e}; pass a DeepSpeed JSON file, a dict or JSON text") from None
        except OSError as e:
            raise ZoConfigError(f"config file {path!r} cannot be read: {e.strerror}; pass a "
                                f"DeepSpeed JSON file, a dict or JSON text") from None
    if isinstance(config, str):
        return config, "<config string>"
    raise ZoConfigError(f"config must be a path, a dict or JSON text, not "
                        f"{type(config).__name__}")


def resolve_config(config: ConfigLike, world_size: int = 1,
                   overrides: Iterable[str] = ()) -> dict:
    """The effective config for a job of world_size ranks (see the module's comment)."""
    text, origin = _text_of(config)
    sets = [s.encode() for s in overrides]
    arr = (ctypes.c_char_p * max(1, len(sets)))(*sets)
    out = ctypes.c_void_p()
    err = ctypes.create_string_buffer(4096)
    lib = _native.native.config_lib
    st = lib.zo_pyconfig_resolve(text.encode(), origin.encode(), arr, len(sets), int(world_size),
                                 ctypes.byref(out), err, len(err))
    if st < 0:
        msg = err.value.decode(errors="replace")
        raise ZoConfigError(_native._cause(msg) or f"config rejected (status {st})", st,
                            "ZO_ERR_CONFIG", msg)
    try:
        resolved = json.loads(ctypes.string_at(out.value).decode())
    finally:
        lib.zo_pyconfig_free(out)
    if "sparse_attention" in resolved:  # emitted only when the section is given
        raise ZoConfigError("'sparse_attention' is a block layout of zo-train's fused attention; "
                            "the PyTorch front end runs the model's own attention modules: leave "
                            "it out")
    return resolved
