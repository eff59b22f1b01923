"""cuBLASLt's logger, fed into Python ``logging`` (logger ``nvblaslt``)."""

from __future__ import annotations

import logging

from ._loader import library

logger = logging.getLogger("nvblaslt")
_LEVELS = {1: logging.ERROR, 2: logging.INFO, 3: logging.INFO, 4: logging.DEBUG, 5: logging.DEBUG}
_callback = None  # the ctypes callback must outlive every call the library makes


def _forward(level: int, function: bytes, message: bytes) -> None:
    logger.log(_LEVELS.get(level, logging.DEBUG), "%s: %s", (function or b"").decode(), (message or b"").decode())


def set_log_level(level: int) -> None:
    """Send cuBLASLt's log (0 off, 1 errors … 5 API trace) to the ``nvblaslt`` logger."""
    global _callback
    lib = library()
    if _callback is None:
        _callback = lib.api.cublasLtLoggerCallback_t(_forward)
        lib.cublasLtLoggerSetCallback(_callback)
    lib.cublasLtLoggerSetLevel(level)
