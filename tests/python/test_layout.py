"""Every struct the package mirrors with ctypes has the C compiler's size and field offsets
(zo_py_layout prints them), and the mirrors name every C field."""
import ctypes
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from zoffload import _native as N

ROOT = Path(__file__).resolve().parents[2]


def layout_tool():
    for d in (os.environ.get("ZOFFLOAD_BUILD_DIR"), ROOT / "build"):
        if d and (Path(d) / "tests/python/zo_py_layout").exists():
            return Path(d) / "tests/python/zo_py_layout"
    pytest.fail("zo_py_layout is not built: cmake --build build (or set ZOFFLOAD_BUILD_DIR)")


def test_mirrored_structs_match_the_c_layout():
    c = json.loads(subprocess.run([str(layout_tool())], check=True, capture_output=True,
                                  text=True).stdout)
    assert set(c) == set(N.MIRRORED)
    for name, cls in N.MIRRORED.items():
        assert ctypes.sizeof(cls) == c[name]["size"], f"{name}: size"
        for field, off in c[name]["fields"].items():
            assert getattr(cls, field).offset == off, f"{name}.{field}: offset"
        assert [f[0] for f in cls._fields_] == list(c[name]["fields"]), f"{name}: fields"


def test_the_library_says_where_it_came_from():
    path = N.library_path()
    assert Path(path).name.startswith("libzoffload.so")
    assert N.native.how in ("ZOFFLOAD_LIBRARY", "installed prefix", "build tree")


def test_a_bad_library_path_is_named(monkeypatch, tmp_path):
    bogus = tmp_path / "libzoffload.so"
    bogus.write_text("not a library")
    monkeypatch.setenv("ZOFFLOAD_LIBRARY", str(bogus))
    with pytest.raises(N.ZoError, match="ZOFFLOAD_LIBRARY=.*cannot be loaded"):
        N._locate("libzoffload.so", "ZOFFLOAD_LIBRARY")


def test_pip_install_carries_the_built_library(tmp_path):
    """pip install ./tools/python from a built checkout: the installed package loads the
    libraries it carries, not the checkout's."""
    import sys
    build = os.environ.get("ZOFFLOAD_BUILD_DIR") or str(ROOT / "build")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--no-build-isolation", "--target", str(tmp_path / "site"),
                        str(ROOT / "tools" / "python")], capture_output=True, text=True,
                       env={**os.environ, "ZOFFLOAD_BUILD_DIR": build})
    assert r.returncode == 0, r.stderr
    for leftover in ("build", "zoffload.egg-info"):  # pip's scratch stays out of the checkout
        shutil.rmtree(ROOT / "tools" / "python" / leftover, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZOFFLOAD_")}
    env["PYTHONPATH"] = str(tmp_path / "site")
    out = subprocess.run([sys.executable, "-m", "zoffload", "--json"], capture_output=True,
                         text=True, env=env, cwd=tmp_path, check=True).stdout
    info = json.loads(out)
    assert info["library"].startswith(str(tmp_path / "site" / "zoffload" / "lib"))
    assert info["found_by"] == "installed prefix"
