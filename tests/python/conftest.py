"""pytest set-up for the zoffload package's tests: the package from this checkout (unless one
is installed), the library from ZOFFLOAD_BUILD_DIR or build/, and no GPU assumed."""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
try:
    import zoffload  # noqa: F401  (an installed package wins)
except ImportError:
    sys.path.insert(0, str(ROOT / "tools" / "python"))

os.environ.setdefault("ZOFFLOAD_DEVICE", "cpu")
# One thread per op, as the engine's reference runs: results repeat bit for bit.
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("ZO_TEST_TORCH_THREADS", "1")))
