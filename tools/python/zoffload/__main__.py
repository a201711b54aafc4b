"""python -m zoffload: which libzoffload this package loaded, and what it sees."""
import argparse
import json
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m zoffload",
                                description="Say which libzoffload the package loads and what it "
                                            "sees (devices, the config parser).")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    a = p.parse_args(argv)
    from . import __version__, _native
    lib = _native.lib()
    _ = _native.native.config_lib
    info = {"version": __version__, "library": _native.native.path, "found_by": _native.native.how,
            "config_library": _native.native.config_path,
            "cuda_built": bool(lib.zo_device_cuda_built()),
            "cuda_devices": lib.zo_device_cuda_count()}
    if a.json:
        print(json.dumps(info))
    else:
        print(f"zoffload {info['version']}: {info['library']} (found in the {info['found_by']})")
        print(f"config parser: {info['config_library']}")
        print(f"CUDA: {'built' if info['cuda_built'] else 'not built'}, "
              f"{info['cuda_devices']} GPU(s); the emulated cpu device is always there")
    return 0


if __name__ == "__main__":
    sys.exit(main())
