"""Whether this process may read a host address, asked without reading it.

A pointer the caller passes as an int (``options.handle``, an ``__array_interface__``'s data) is
handed to the kernel as the buffer of a ``write`` into a pipe: the kernel copies from user memory
with the page protections a C read would meet, and answers EFAULT where that read would crash.
No Python or C code of this process touches the address.
"""

from __future__ import annotations

import ctypes
import errno
import os


def readable(address: int, size: int) -> bool | None:
    """Whether ``size`` bytes (1 to 4096) from ``address`` can be read here: True, False, or None
    where the kernel cannot be asked (not a POSIX system, no pipe)."""
    if os.name != "posix":
        return None
    try:
        read_end, write_end = os.pipe()
    except OSError:  # out of file descriptors: no answer, not a refusal
        return None
    try:
        # a ctypes array over the address is a buffer object: made without reading the memory
        view = (ctypes.c_char * size).from_address(address)
        try:
            written = os.write(write_end, view)  # at most PIPE_BUF bytes: all or nothing
        except OSError as exc:
            if exc.errno == errno.EFAULT:
                return False
            return None
        return written == size
    finally:
        os.close(read_end)
        os.close(write_end)


def readable_range(start: int, end: int) -> bool | None:
    """Whether the first and the last byte of ``[start, end)`` can be read (a cheap probe of a
    claimed buffer's two ends, not of every page between them)."""
    if end <= start:
        return True
    first = readable(start, 1)
    if first is not True:
        return first
    return readable(end - 1, 1)


__all__ = ["readable", "readable_range"]
