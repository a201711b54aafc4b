"""The exceptions the package raises: one base class, and the C statuses mapped onto Python's
own exception types where one fits, so that `except ValueError` and `except MemoryError` work."""
from __future__ import annotations


class ZoError(RuntimeError):
    """A zoffload failure. `status` is the C library's zo_status (0 when the check was
    Python's own), `detail` the library's message with its file and line."""

    def __init__(self, message: str, status: int = 0, status_name: str = "", detail: str = ""):
        super().__init__(message)
        self.status = status
        self.status_name = status_name
        self.detail = detail


class ZoConfigError(ZoError, ValueError):
    """A bad configuration key or value (the strict DeepSpeed config parser's verdict)."""


class ZoArgumentError(ZoError, ValueError):
    """A bad argument: a model without parameters, a parameter outside every layer..."""


class ZoStateError(ZoError):
    """A call that is not valid now: step() before backward(), initialize() twice..."""


class ZoOutOfMemoryError(ZoError, MemoryError):
    """A tier's budget cannot hold the plan (device, pinned host, host or NVMe)."""


class ZoIOError(ZoError):
    """An NVMe or checkpoint I/O failure, or stored data that failed its checksum."""


_BY_STATUS = {-1: ZoArgumentError, -2: ZoOutOfMemoryError, -3: ZoOutOfMemoryError,
              -4: ZoOutOfMemoryError, -6: ZoIOError, -7: ZoIOError, -8: ZoIOError,
              -15: ZoConfigError, -16: ZoStateError, -17: ZoIOError}


def error_for_status(status: int, message: str, name: str = "", detail: str = "") -> ZoError:
    cls = _BY_STATUS.get(status, ZoError)
    return cls(message, status, name, detail)
