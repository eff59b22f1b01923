"""cuBLASLt's logger, fed into Python ``logging`` (logger ``nvblaslt``)."""

from __future__ import annotations

import logging
import threading
from typing import Any

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
    lib = library()
    with _lock:
        if _callback is None:
            _callback = lib.api.cublasLtLoggerCallback_t(_forward)
            lib.cublasLtLoggerSetCallback(_callback)
            # without a file the library writes nowhere but the callback (by default it also prints to stdout)
            lib.cublasLtLoggerSetFile(None)
    lib.cublasLtLoggerSetLevel(level)
