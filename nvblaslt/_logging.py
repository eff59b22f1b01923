"""The ``nvblaslt`` logger of Python ``logging``: nvblaslt's own records, and cuBLASLt's log fed into it."""

from __future__ import annotations

import operator
import sys
import threading
from typing import Any

from ._errors import NvblasltTypeError, NvblasltValueError, argument_error
from ._loader import library

NAME = "nvblaslt"


class _Records:
    """``logger.debug(…)`` and ``logger.info(…)`` for ``logging.getLogger("nvblaslt")``, without importing
    ``logging`` for them: until some module imports it, no handler or level can have been set and such a
    record would be dropped unseen. ``import logging`` is 3 ms of a cold start beside CuPy, which does not
    import it, and every plan logs at debug level. A record keeps its call site (``stacklevel``)."""

    def debug(self, message: str, *args: Any) -> None:
        if "logging" in sys.modules:
            import logging  # the module already imported (or, mid-import in another thread, once it is whole)

            logging.getLogger(NAME).debug(message, *args, stacklevel=2)

    def info(self, message: str, *args: Any) -> None:
        if "logging" in sys.modules:
            import logging

            logging.getLogger(NAME).info(message, *args, stacklevel=2)


logger = _Records()
_LEVELS = {1: 40, 2: 20, 3: 20, 4: 10, 5: 10}  # cuBLASLt's levels as logging's ERROR (40), INFO (20), DEBUG (10)
_callback: Any = None  # the ctypes callback must outlive every call the library makes
_lock = threading.Lock()


def _forward(level: int, function: bytes, message: bytes) -> None:
    import logging  # set_log_level imported it: a lookup

    logging.getLogger(NAME).log(_LEVELS.get(level, logging.DEBUG), "%s: %s", (function or b"").decode(),
                                (message or b"").decode())


def set_log_level(level: int) -> None:
    """Set cuBLASLt's log level, and send its log to the ``nvblaslt`` logger, and only there.

    The first call installs a logger callback in the loaded libcublasLt that forwards each message
    to Python's ``logging.getLogger("nvblaslt")`` (level 1's errors at ``ERROR``, levels 2 and 3
    at ``INFO``, levels 4 and 5 at ``DEBUG``), and turns off the library's own printing. The logger
    shows nothing until it has a handler and a level that let the messages through
    (``logging.basicConfig(level=logging.DEBUG)``, for example). The level applies to the whole
    process. ``CUBLASLT_LOG_LEVEL=5`` in the environment is the same without Python's logging.

    Parameters
    ----------
    level : int
        cuBLASLt's log levels: 0 off, 1 errors, 2 a trace of the calls that launch kernels,
        3 performance hints, 4 general information (the heuristics' status), 5 a trace of every
        API call. NumPy integers are accepted; bools are not.

    Raises
    ------
    NvblasltTypeError
        ``level`` is not an int (or is a bool).
    NvblasltValueError
        ``level`` is not from 0 to 5.
    LibraryNotFoundError
        libcublasLt could not be loaded.

    Examples
    --------
    >>> import nvblaslt
    >>> nvblaslt.set_log_level(0)           # off (loads libcublasLt; no GPU needed)
    >>> nvblaslt.set_log_level("trace")
    Traceback (most recent call last):
        ...
    nvblaslt.NvblasltTypeError: level: expected an int from 0 (off) to 5 (API trace), got str 'trace'

    To see every cuBLASLt call of a program:

    .. code-block:: python

        import logging

        logging.basicConfig(level=logging.DEBUG)
        nvblaslt.set_log_level(5)
    """
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
    import logging  # only now: the callback installed below forwards to it

    lib = library()
    with _lock:
        if _callback is None:
            _callback = lib.api.cublasLtLoggerCallback_t(_forward)
            lib.cublasLtLoggerSetCallback(_callback)
            # without a file the library writes nowhere but the callback (by default it also prints to stdout)
            lib.cublasLtLoggerSetFile(None)
    lib.cublasLtLoggerSetLevel(level)
