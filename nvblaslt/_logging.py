"""cuBLASLt's logger, fed into Python ``logging`` (logger ``nvblaslt``)."""

from __future__ import annotations

import logging
import operator
import threading
from typing import Any

from ._errors import NvblasltTypeError, NvblasltValueError, argument_error
from ._loader import library

logger = logging.getLogger("nvblaslt")
_LEVELS = {1: logging.ERROR, 2: logging.INFO, 3: logging.INFO, 4: logging.DEBUG, 5: logging.DEBUG}
_callback: Any = None  # the ctypes callback must outlive every call the library makes
_lock = threading.Lock()


def _forward(level: int, function: bytes, message: bytes) -> None:
    logger.log(_LEVELS.get(level, logging.DEBUG), "%s: %s", (function or b"").decode(), (message or b"").decode())


def set_log_level(level: int) -> None:
    """Send cuBLASLt's log (0 off, 1 errors … 5 API trace) to the ``nvblaslt`` logger, and only there."""
    global _callback
    if isinstance(level, bool):
        raise argument_error(NvblasltTypeError, "level", repr(level), "an int from 0 (off) to 5 (API trace)")
    try:
        level = operator.index(level)
    except TypeError:
        raise argument_error(NvblasltTypeError, "level", f"{type(level).__name__} {level!r}",
                             "an int from 0 (off) to 5 (API trace)") from None
    if not 0 <= level <= 5:
        raise argument_error(NvblasltValueError, "level", level, "an int from 0 (off) to 5 (API trace)")
    lib = library()
    with _lock:
        if _callback is None:
            _callback = lib.api.cublasLtLoggerCallback_t(_forward)
            lib.cublasLtLoggerSetCallback(_callback)
            # without a file the library writes nowhere but the callback (by default it also prints to stdout)
            lib.cublasLtLoggerSetFile(None)
    lib.cublasLtLoggerSetLevel(level)
